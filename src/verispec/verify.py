"""Verification rules: pure functions from target rows and a draft to a `Verdict`.

Terms (as in the papers and in vLLM's rejection sampler):
- accepted tokens: the drafted tokens kept, always a prefix of the draft;
- repair token: drawn from a residual distribution after the first rejection;
- bonus token: drawn from the target after every drafted token was accepted.
A round therefore emits `n_accepted + 1` tokens: the accepted prefix, then `next_token`.

Inputs: `p` float64 [k+1, V], p[i] the target distribution after the context and the first i
drafted tokens (row k is the bonus position), after the same sampling transforms as q. The
greedy rule reads only the argmax of each row and accepts raw logits. `draft.q` float64 [k, V]
or None for chosen (not sampled) drafts, which every sampled rule treats as point masses.

All randomness comes from the injected `rng`; no rule ever divides by a zero residual: a
rejection whose residual has no mass is impossible in exact arithmetic and raises
ArithmeticError naming the position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from verispec.proposers.base import Draft
from verispec.randomness import Random


@dataclass(frozen=True)
class Verdict:
    n_accepted: int
    next_token: int


Verifier = Callable[[torch.Tensor, Draft, Random], Verdict]


def greedy(p: torch.Tensor, draft: Draft, rng: Random) -> Verdict:
    """Greedy verification: accept while the drafted token is the target argmax, then emit the
    target argmax. Reproduces plain greedy decoding token for token. `p` may be logits."""
    target_ids = p.numpy().argmax(axis=-1).tolist()  # first index on ties, as torch; ~20x faster
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
        residual = (p[i] - draft.q[i]).clamp_min(0.0)
        return Verdict(i, _draw(residual, i, rng))
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
        return Verdict(i, _draw(residual, i, rng))
    return Verdict(len(draft), rng.categorical(p[len(draft)]))


def block(p: torch.Tensor, draft: Draft, rng: Random) -> Verdict:
    """Block verification (Sun et al. 2403.10444, Alg. 2): exact, same target cost, and never
    fewer expected tokens than token-level verification.

    Prefix weights w_0 = 1, w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)). For i < k,
    h_i = Z_i / (Z_i + 1 - w_i) with Z_i = sum_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0) (1 when
    the denominator is 0); h_k = w_k. tau is the last i with eta_i <= h_i, eta_i ~ U(0, 1)
    independent (0 if none): drawn here from i = k downwards, stopping at the first success.
    Emit x_1..x_tau, then y ~ p_{k+1} if tau = k, else y ~ norm(max(w_tau p_{tau+1} -
    q_{tau+1}, 0)). Chosen drafts use a one-hot q.
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
    return Verdict(tau, _draw(residuals[tau], tau, rng))


RULES: dict[str, Verifier] = {
    "greedy": greedy,
    "token": token_level,
    "point-mass": point_mass,
    "block": block,
}


def default_rule(greedy_sampling: bool, draft: Draft) -> Verifier:
    """Greedy at temperature 0; else point-mass for chosen drafts and block verification for
    sampled ones."""
    if greedy_sampling:
        return greedy
    return point_mass if draft.q is None else block


def _draw(residual: torch.Tensor, position: int, rng: Random) -> int:
    mass = float(residual.sum())
    if not mass > 0:
        raise ArithmeticError(
            f"rejection at draft position {position} left a zero residual; in exact arithmetic "
            "this has probability 0, so p and q disagree numerically (check the transforms)"
        )
    return rng.categorical(residual / mass)


def _one_hot(tokens: tuple[int, ...], vocab_size: int) -> torch.Tensor:
    q = torch.zeros(len(tokens), vocab_size, dtype=torch.float64)
    q[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0
    return q

