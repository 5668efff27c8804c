"""Verification rules: pure functions from target rows and a draft to a `Verdict`.

Terms (as in the papers and in vLLM's rejection sampler):
- accepted tokens: the drafted tokens kept, always a prefix of the draft;
- repair token: drawn from a residual distribution after the first rejection;
- bonus token: drawn from the target after every drafted token was accepted.
A round therefore emits `n_accepted + 1` tokens: the accepted prefix, then `next_token`.

Inputs, all on the host (CPU; `verispec.sampling.rule_rows` moves them there once a round):
`p` float64 [k+1, V], p[i] the target distribution after the context and the first i drafted
tokens (row k is the bonus position), after the same sampling transforms as q. The greedy
rules read each row's argmax only: `rule_rows` gives the argmax ids [k+1], taken where the
logits are (only they cross to the host), and raw rows [k+1, V] (logits or p) work too. `draft.q` float64 [k, V], or None for chosen (not
sampled) drafts, which every sampled rule treats as point masses.

Trees (`TreeDraft`): the rows are p [n + 1, V], row 0 after the pending token and row i + 1
after node i; `tree_greedy` and `tree_recursive` walk them from the root and return a
`TreeVerdict` (the accepted root path). A chain is the tree whose nodes each have one child,
and on it these rules reduce to `greedy`, `point_mass` and `token_level`.

All randomness comes from the injected `rng`, and no rule divides by a zero residual. The
engine hands a rule the round's view of it (`verispec.randomness.Round`): `rng.race(i, p[i])`
is the keyed sample of row i, at absolute position start + i.

The coupled rule (`coupled`, `tree_coupled`): every emitted token is the target's keyed sample
at its position, argmin_x E_x / p_i(x) with the noise E keyed by (seed, position) alone; a
drafted token is accepted iff it equals that sample. The tokens are therefore those of plain
decoding with the same seed whatever was drafted (k, proposer, tree, batch), and each has the
law p_i given its prefix (the noise of a position is independent of every other position's, so
of the prefix). Drafts sampled from q with the same keyed noise (`Random.draw` in a keyed
round) agree with the target's sample with probability sum_x 1 / sum_y max(p(y)/p(x), q(y)/q(x))
>= (1 - TV) / (1 + TV); a chosen draft x is the sample with probability p(x), as under
point-mass verification.

Zero residual. In exact arithmetic a rejection never meets a residual without mass. In floating
point it can: when p and q agree up to the last ulp with q >= p everywhere (a draft that is the
target with its logits shifted by a constant; about 1e-16 per round), a rejection is possible
and max(p - q, 0) is all zero. The rules then draw the repair token from p_i itself, the limit
of the exact law as q -> p, and mark the verdict (`Verdict.fallback`, counted in
`Stats.fallbacks`). The fallback changes the round's law only on the event E that a rejection
lands on a residual of zero computed mass, so the total-variation distance to the exact rule on
the same rows is at most P(E). For the token-level and point-mass rules, a zero residual at
position i means p_i <= q_i entrywise, and P(E) <= sum_x max(q_i(x) - p_i(x), 0) = sum q_i -
sum p_i: the rejection mass equals the residual mass (0) plus the rows' normalisation error,
~V * 1e-16 in float64. The block rule reaches E through the same rounding (h_i = 1 with
w_i = 1 and Z_i = 0, or tau = 0 with Z_0 = 0); E needs tau < k, so P(E) <= P(tau < k) <=
E[1 - w_k] <= sum_i sum_x max(q_i(x) - p_i(x), 0) (w_k >= prod_i min(1, p_i(x_i) / q_i(x_i))),
the same normalisation errors summed over the k positions.
"""

from __future__ import annotations

from collections.abc import Callable
import torch

from verispec.drafts import ROOT, Draft, TreeDraft, TreeVerdict, Verdict
from verispec.randomness import Random

Verifier = Callable[[torch.Tensor, Draft, Random], Verdict]
TreeVerifier = Callable[[torch.Tensor, TreeDraft, Random], TreeVerdict]


def argmax_ids(rows: torch.Tensor) -> list[int]:
    """Each row's argmax: `rows` are the ids [n] already taken (where the logits are, by
    `sampling.rule_rows`), or rows [n, V] on the host (logits or p: the same argmax; the first
    index on ties, as torch's)."""
    if rows.ndim == 1:
        return rows.tolist()
    return rows.numpy().argmax(axis=-1).tolist()  # numpy's: faster than torch's on the host (docs/results/implementation-choices.md)


def greedy(logits: torch.Tensor, draft: Draft, rng: Random) -> Verdict:
    """Greedy verification: accept while the drafted token is the target argmax, then emit the
    target argmax. Reproduces plain greedy decoding token for token. `logits`: the argmax ids
    [k+1] or the rows [k+1, V] on the host (`argmax_ids`); `rng` is never used."""
    target_ids = argmax_ids(logits)
    n = 0
    while n < len(draft) and draft.tokens[n] == target_ids[n]:
        n += 1
    return Verdict(n, target_ids[n])


def token_level(p: torch.Tensor, draft: Draft, rng: Random) -> Verdict:
    """Token-level speculative sampling (Leviathan et al. 2211.17192, Alg. 1; Chen et al.
    2302.01318): accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first
    rejection draw the repair token from norm(max(p_i - q_i, 0)); all accepted: bonus ~ p_k.
    Example (the seed's): p = (.1, .3, .6), q = (.4, .4, .2): accepted mass min(p, q) =
    (.1, .3, .2); the rejection mass .4 all goes to token 2 through the residual (0, 0, .4).
    """
    if draft.q is None:
        return point_mass(p, draft, rng)
    for i, x in enumerate(draft.tokens):
        p_x, q_x = float(p[i, x]), float(draft.q[i, x])
        if q_x <= 0:
            raise ValueError(f"draft token {x} at position {i} has proposal probability 0")
        if p_x >= q_x or rng.bernoulli(p_x / q_x):
            continue
        return _repair(i, (p[i] - draft.q[i]).clamp_min(0.0), p[i], rng)
    return Verdict(len(draft), rng.categorical(p[len(draft)]))


def point_mass(p: torch.Tensor, draft: Draft, rng: Random) -> Verdict:
    """Verification of chosen drafts (prompt lookup, suffix index, argmax candidates): the
    proposal is a point mass on x_i, so accept with probability p_i(x_i); on rejection draw
    from p_i with x_i removed, renormalised. Using a draft model's softmax as q for a token
    picked by argmax would be wrong (HF transformers issue 32867), and so is the converse:
    a draft sampled from q must be verified against q (token or block)."""
    if draft.q is not None:
        raise ValueError("point-mass verification is for chosen drafts; this draft was sampled "
                         "from q, so verify it with the token or block rule")
    for i, x in enumerate(draft.tokens):
        if rng.bernoulli(float(p[i, x])):
            continue
        residual = p[i].clone()
        residual[x] = 0.0
        return _repair(i, residual, p[i], rng)
    return Verdict(len(draft), rng.categorical(p[len(draft)]))


def block(p: torch.Tensor, draft: Draft, rng: Random) -> Verdict:
    """Block verification (Sun et al. 2403.10444, Alg. 2): exact, same target cost, and never
    fewer expected tokens than token-level verification.

    Prefix weights w_0 = 1, w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)). For i < k,
    h_i = Z_i / (Z_i + 1 - w_i) with Z_i = sum_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0) (1 when
    the denominator is 0); h_k = w_k. tau is the last i with eta_i <= h_i, eta_i ~ U(0, 1)
    independent (0 if none): drawn here from i = k downwards, stopping at the first success.
    Emit x_1..x_tau, then y ~ p_{k+1} if tau = k, else y ~ norm(max(w_tau p_{tau+1} -
    q_{tau+1}, 0)). Chosen drafts use a one-hot q. A residual of zero computed mass falls back
    to y ~ p_{tau+1} (see the module docstring).
    """
    k = len(draft)
    q = draft.q if draft.q is not None else _one_hot(draft.tokens, p.shape[-1])
    if k == 0:
        return Verdict(0, rng.categorical(p[0]))
    idx = torch.arange(k)
    tokens = torch.tensor(draft.tokens)
    p_x, q_x = p[idx, tokens], q[idx, tokens]
    if bool((q_x <= 0).any()):
        i = int((q_x <= 0).nonzero()[0])
        raise ValueError(f"draft token {draft.tokens[i]} at position {i} has proposal probability 0")
    w = [1.0]
    for i in range(k):
        w.append(min(1.0, w[-1] * float(p_x[i]) / float(q_x[i])))
    # residual_mass[i] = Z_i for i = 0..k-1 (Z_0 with w_0 = 1 is the token-level residual).
    weights = torch.tensor(w[:k], dtype=torch.float64).unsqueeze(-1)
    residuals = (weights * p[:k] - q).clamp_min(0.0)
    residual_mass = residuals.sum(dim=-1).tolist()
    tau = 0
    for i in range(k, 0, -1):
        if i == k:
            h = w[k]
        else:
            # (1 - w_i) first: Z + 1 - 1 rounds, and h_i must be exactly 1 when w_i = 1.
            denominator = residual_mass[i] + (1.0 - w[i])
            h = residual_mass[i] / denominator if denominator > 0 else 1.0
        if rng.bernoulli(h):
            tau = i
            break
    if tau == k:
        return Verdict(k, rng.categorical(p[k]))
    return _repair(tau, residuals[tau], p[tau], rng)


def coupled(p: torch.Tensor, draft: Draft, rng: Random) -> Verdict:
    """Coupled verification: walk the rows p [k+1, V], accept x_i while it equals the target's
    keyed sample `rng.race(i, p[i])`; the first mismatch (or the bonus row) emits that sample.
    Exact for chosen and sampled drafts alike (module docstring); no residual, no fallback.

    >>> from verispec.randomness import Round, TorchRandom
    >>> p = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    >>> coupled(p, Draft((1,)), Round(TorchRandom(0), 5, keyed=True))
    Verdict(n_accepted=1, next_token=0, fallback=False)
    """
    for i, x in enumerate(draft.tokens):
        sample = rng.race(i, p[i])
        if sample != x:
            return Verdict(i, sample)
    return Verdict(len(draft), rng.race(len(draft), p[len(draft)]))


coupled.keyed = True  # its rounds draw sampled drafts with the keyed noise (`keyed_rounds`)


def tree_greedy(logits: torch.Tensor, tree: TreeDraft, rng: Random) -> TreeVerdict:
    """Greedy tree verification (SpecInfer 2305.09781, Medusa 2401.10774): the longest root
    path whose every token is the target's argmax after its ancestors, then that argmax.
    Reproduces plain greedy decoding token for token, as `greedy` does on a chain. `logits`:
    the argmax ids [n + 1] or the rows [n + 1, V] on the host; `rng` is never used."""
    target_ids = argmax_ids(logits)
    node, path = ROOT, []
    while True:
        wanted = target_ids[node + 1]
        child = next((c for c in tree.children(node) if tree.tokens[c] == wanted), None)
        if child is None:
            return TreeVerdict(tuple(path), wanted)
        path.append(child)
        node = child


def tree_recursive(p: torch.Tensor, tree: TreeDraft, rng: Random) -> TreeVerdict:
    """Recursive rejection sampling over a tree (SpecInfer's multi-step speculative sampling,
    2305.09781 Alg. 2; for chosen siblings, multi-draft point-mass verification without
    replacement). At an accepted node with target row p_u, start from r = p_u and try the
    children x_1, x_2, ... in order:

    - sampled child (q given, q_s = q[child]): accept x_s with probability min(1, r(x_s) /
      q_s(x_s)); on rejection r <- norm(max(r - q_s, 0));
    - chosen child (q is None, a point mass): accept x_s with probability r(x_s); on rejection
      r(x_s) <- 0 and r is renormalised, so a rejected sibling is never drawn again.

    An accepted child becomes the next node; when every child is rejected the repair token is
    drawn from r; an accepted leaf (or a root without children) draws the bonus from its p row.
    Each step is the two-candidate identity of token-level sampling applied to r, so the
    emitted token at every depth has the law p_u exactly, by induction over the siblings.
    Sampled siblings must be independent draws from their q rows (with replacement); a
    proposer that removes duplicates needs a different rule. Example: p_u = (.5, .3, .2) and
    chosen children (1, 0): accept 1 with .3; else r = (.5, 0, .2)/.7 and accept 0 with 5/7;
    else emit 2: P(0) = .7 * 5/7 = .5, P(2) = .7 * 2/7 = .2. A residual of zero computed mass
    draws from p_u and marks the verdict (see the module docstring).
    """
    node, path = ROOT, []
    while True:
        p_row = p[node + 1]
        children = tree.children(node)
        if not children:
            return TreeVerdict(tuple(path), rng.categorical(p_row))
        r, accepted = p_row, None
        for child in children:
            x = tree.tokens[child]
            if tree.q is None:
                if rng.bernoulli(min(1.0, float(r[x]))):
                    accepted = child
                    break
                r = r.clone()
                r[x] = 0.0
            else:
                q_x = float(tree.q[child, x])
                if q_x <= 0:
                    raise ValueError(f"tree node {child} (token {x}) has proposal probability 0")
                if float(r[x]) >= q_x or rng.bernoulli(float(r[x]) / q_x):
                    accepted = child
                    break
                r = (r - tree.q[child]).clamp_min(0.0)
            mass = float(r.sum())
            if mass <= 0:
                return TreeVerdict(tuple(path), rng.categorical(p_row), fallback=True)
            r = r / mass
        if accepted is None:
            return TreeVerdict(tuple(path), rng.categorical(r))
        path.append(accepted)
        node = accepted


def tree_coupled(p: torch.Tensor, tree: TreeDraft, rng: Random) -> TreeVerdict:
    """Coupled verification of a tree: at each accepted node (row u + 1 of p [n + 1, V], at
    depth d from the pending token) follow the child equal to the target's keyed sample
    `rng.race(d, p[u + 1])`; when no child is, emit that sample. The emitted tokens are plain
    decoding's for the seed, as on a chain."""
    node, path = ROOT, []
    while True:
        sample = rng.race(len(path), p[node + 1])
        child = next((c for c in tree.children(node) if tree.tokens[c] == sample), None)
        if child is None:
            return TreeVerdict(tuple(path), sample)
        path.append(child)
        node = child


tree_coupled.keyed = True


RULES: dict[str, Verifier] = {
    "greedy": greedy,
    "token": token_level,
    "point-mass": point_mass,
    "block": block,
    "coupled": coupled,
}

SAMPLED_DEFAULT = "coupled"
"""The rule `auto` picks at temperature > 0, for chosen and sampled drafts, chains and trees
(docs/exactness.md, "Which rule by default")."""


RuleChoice = Callable[[Draft | TreeDraft], Verifier | TreeVerifier]


def rule_chooser(verifier: str | Verifier, greedy_sampling: bool) -> RuleChoice:
    """The one place a rule is chosen: check `verifier` against the request now (a bad name or
    a rule that is not exact at this temperature raises ValueError), and return draft -> rule.

    verifier: "auto", a name in `RULES`, or a rule function (used as given, for chains and
    trees alike). "auto": greedy at temperature 0; else the coupled rule (`SAMPLED_DEFAULT`).
    Trees take `tree_greedy` at temperature 0, `tree_coupled` under the coupled rule and
    `tree_recursive` under the token and point-mass rules (their tree form); block
    verification is defined for chains only.

    >>> rule_chooser("auto", greedy_sampling=False)(Draft((3,))) is coupled
    True
    >>> rule_chooser("point-mass", greedy_sampling=False)(Draft((3,))) is point_mass
    True
    """
    if callable(verifier):
        return lambda draft: verifier
    if verifier != "auto" and verifier not in RULES:
        raise ValueError(f"unknown verifier {verifier!r}; choose auto or one of {sorted(RULES)}")
    if greedy_sampling:
        if verifier not in ("auto", "greedy"):
            raise ValueError(f"temperature 0 verifies greedily; {verifier!r} needs temperature > 0")
        return lambda draft: tree_greedy if draft.is_tree else greedy
    if verifier == "greedy":
        raise ValueError("the greedy rule is exact only at temperature 0; use auto, coupled, token or block")
    verifier = SAMPLED_DEFAULT if verifier == "auto" else verifier
    rule = RULES[verifier]
    return lambda draft: _tree_rule(draft, verifier) or rule


def _tree_rule(draft: Draft | TreeDraft, verifier: str) -> TreeVerifier | None:
    """The rule for a tree at temperature > 0 (None for a chain)."""
    if not draft.is_tree:
        return None
    if verifier == "block":
        raise ValueError("block verification is defined for chains; verify trees with auto, coupled or token")
    return tree_coupled if verifier == "coupled" else tree_recursive


def keyed_rounds(verifier: str | Verifier, greedy_sampling: bool) -> bool:
    """Whether a request's rounds are keyed (`verispec.randomness.Round`): its rule at this
    temperature is the coupled one (a rule function says so with `keyed = True`), so its
    proposers draw sampled drafts with the keyed noise of the positions they draft."""
    if callable(verifier):
        return getattr(verifier, "keyed", False)
    if greedy_sampling:
        return False
    return (SAMPLED_DEFAULT if verifier == "auto" else verifier) == "coupled"


def _repair(position: int, residual: torch.Tensor, p_row: torch.Tensor, rng: Random) -> Verdict:
    """The verdict after a rejection at `position`: the repair token from the residual
    (float64 [V], unnormalised), or from p_row when rounding left the residual no mass."""
    mass = float(residual.sum())
    if mass > 0:
        return Verdict(position, rng.categorical(residual / mass))
    return Verdict(position, rng.categorical(p_row), fallback=True)


def _one_hot(tokens: tuple[int, ...], vocab_size: int) -> torch.Tensor:
    q = torch.zeros(len(tokens), vocab_size, dtype=torch.float64)
    q[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0
    return q

