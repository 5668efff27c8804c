"""The round loop: plan (choose, plan) -> propose -> score -> settle (observe, verify, commit).

It is `verispec.reference`'s round with caches: each stage returns a value (the `Plan`, a
`Proposal`, the `Scored` rows, the emitted tokens) that the next one takes, and the decoding
keeps only what lasts between rounds (the context, the tokens, `Stats`, the proposer's and
the policies' state).

Cache contract (the seed's): the target has processed every emitted token but the last, the
*pending* token. A round feeds the target `[pending, x_1..x_k']` in one forward, whose k' + 1
rows are the target distributions at the k' drafted positions and at the bonus position. After
the verdict the target is rolled back to the emitted prefix (minus the new pending token), so
the next forward starts from the same logical prefix as a full recomputation
(`verispec.reference` checks exactly that, token for token).

EOS ends the output at once and a drafted suffix after it never leaks; a request may name
several EOS ids (a generation config can list more than one) and stops at the first of any.
The budget is exact because a round drafts at most `remaining - 1` tokens (the +1 is the
repair or bonus token).

Observation: a proposer that learns from the target's rows (`ObservingProposer`) receives
each round's scored logits between scoring and verification.

Trees: a policy may plan a tree shape instead of a chain's k (`Plan.shape`). The proposer (a
`TreeProposer`) fills it, the target (a `TreeScoring` model) scores [pending, nodes] in one
forward with each node seeing its own ancestors, a tree rule picks the accepted root path, and
the cache keeps that path only (`keep_path`) before the usual rollback. A tree deeper than `remaining - 1` is cut
to that depth before proposing, and nodes below an EOS are dropped.

Sources: a proposer that drafts each round from one of several sources (`SourcedProposer`:
copying or a head) names the round's source first, and that source's own policy picks k from
its own rounds (`verispec.policies.PerSource`, `Stats.by_source`); the plan names the source.

Batches: the round's stages are public (`choose`, `plan`, `propose`, `score`, `settle`), so
the batch scheduler (`verispec.batching.Scheduler`) runs the same code for each request of a
step, replacing only `score` by one forward over every request's rows (a `Scored` per
request). The plan stays each request's: its policy chooses, `BatchK` weighs every request's
choice and passes each its adjustment (a k, for a plan whose policy lets a batch choose), and
the request's own `plan` applies it within the policy's bounds and the budget.

Requests: a request is data (`Request`, greedy unless its sampling says otherwise); the
keyword form (`generate(target, proposer, prompt_ids, max_new_tokens=..., ...)`) builds one,
so both forms validate and default alike.

Randomness: each round's proposer and rule see the request's `Random` as a `Round` (positions
counted from the round's first new token). Under the coupled rule (the default at temperature
> 0) every token is the target's sample keyed by (seed, position) and sampled drafts race on the
same noise, so the tokens are plain decoding's for the seed whatever the plan
(`verispec.verify.coupled`).

Devices: the target and the proposer may run on any torch device. A round's logits cross to
the host once, as what the rule reads (`sampling.rule_input`: greedy brings back each row's
argmax and its check, never the rows), in one copy that the scheduler shares among every
request of its step (`arrive`); the rules, the random draws and the bookkeeping run on the
host. Nothing else in a round reads the device (tests/test_sync_budget.py counts), so the
host waits for the device once a round (and once after a prefill, `prefill_and_wait`), and that
wait, the device's work on the forward, counts in the forward's seconds: on a GPU the forward call returns as soon as its kernels are
queued, and a clock read then would charge its work to whatever synchronises next.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from verispec import verify
from verispec.drafts import EMPTY_DRAFT, ROOT, Draft, TreeDraft, TreeVerdict, Verdict, through_first_eos
from verispec.grammar import within_grammar
from verispec.logprobs import TokenLogprob, prompt_token_logprobs, token_logprobs
from verispec.models.base import CausalLM, TreeScoring
from verispec.plan import Plan
from verispec.policies import KPolicy, PerSource, as_policy
from verispec.proposers.base import ObservingProposer, Proposer, draft_source
from verispec.randomness import Random, Round, TorchRandom
from verispec.request import Request
from verispec.sampling import SamplingParams, penalised, rule_input, rule_rows_of
from verispec.stats import Stats
from verispec.transfers import synchronize, to_host_all

EosIds = int | Collection[int] | None  # one EOS id, several, or none
T = TypeVar("T")


@dataclass
class Generation:
    """The tokens, the statistics and the seed they were drawn with (the request's, drawn when
    it named none: `Request.seed`); the tokens' logprobs and the prompt's, when the request
    asks (`Request.logprobs`, `Request.prompt_logprobs`)."""

    tokens: list[int]
    stats: Stats
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one a token when the request asks
    seed: int = 0
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)  # one a prompt token


@dataclass(frozen=True)
class Proposal:
    """Stage 1's value: the round's plan (cut to the budget), the draft (cut after an EOS) and
    the proposer's seconds."""

    plan: Plan
    draft: Draft | TreeDraft
    seconds: float

    @property
    def source(self) -> str | None:
        return self.plan.source


@dataclass(frozen=True)
class Scored:
    """Stage 2's value: the target's logits[k' + 1, V] over [pending, *draft] (a tree's row
    i + 1 after node i), on the target's device; the forward's seconds (until what the rule
    reads reached the host: `arrive`), the rows it scored in all (k' + 1, more when a batch's
    requests shared it), and what the rule reads, on the host (`sampling.rule_rows_of`)."""

    logits: torch.Tensor
    seconds: float
    rows: int
    rule_rows: torch.Tensor


class Decoding:
    """One request. Iterate it to receive tokens as they are committed; `tokens` and `stats`
    hold what has been emitted so far.

    request: a `Request` (its k an integer, or a spec whose built policy is given as `policy`;
        `generate` and `stream` also take the keyword form and build the `Request`).
    policy: the k policy (an integer or a policy object); default the request's integer k.
    rng: default `TorchRandom(request.seed)`.
    clock: reads seconds for `stats` (a fake clock makes the timings, and so the choices of a
        policy that reads them, reproducible).
    """

    def __init__(
        self,
        target: CausalLM,
        proposer: Proposer | None,
        request: Request,
        *,
        policy: int | KPolicy | None = None,
        rng: Random | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not isinstance(request, Request):
            raise TypeError(f"a Decoding takes a Request (got {type(request).__name__}); generate and stream take the keyword form")
        k = request.k_for_decoding(policy)
        check_request(request, target.vocab_size)
        if proposer is None and k != 0:
            raise ValueError("without a proposer, k must be 0 (plain decoding)")
        self.request = request
        self.target = target
        self.proposer = proposer
        self.observing = isinstance(proposer, ObservingProposer)  # asked once: a Protocol check inspects the class
        self.clock = clock
        self.rng = rng if rng is not None else TorchRandom(request.seed)
        self.policy = as_policy(k)
        self.policies = PerSource(self.policy)
        if self.policy.trees and request.verifier == "block":
            raise ValueError("block verification is defined for chains; verify trees with auto or token, or give a chain k")
        self.choose_rule = verify.rule_chooser(request.verifier, request.sampling.greedy)
        self.keyed = verify.keyed_rounds(request.verifier, request.sampling.greedy)
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] = []  # the target's, one a token (`Request.logprobs`)
        self.prompt_logprobs: list[TokenLogprob | None] = []  # one a prompt token (`Request.prompt_logprobs`)
        self.stats = Stats()
        self._context: list[int] = []  # prompt + emitted; its last token is the pending token

    @property
    def prompt(self) -> list[int]:
        return list(self.request.prompt_ids)

    @property
    def max_new_tokens(self) -> int:
        return self.request.max_new_tokens

    @property
    def sampling(self) -> SamplingParams:
        return self.request.sampling

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.request.eos_token_ids

    @property
    def remaining(self) -> int:
        """The tokens still to emit before the budget is spent."""
        return self.max_new_tokens - len(self.tokens)

    @property
    def done(self) -> bool:
        """Whether the output is complete: the budget is spent or the last token is an EOS."""
        return self.remaining == 0 or bool(self.tokens and self.tokens[-1] in self.eos_ids)

    @property
    def _pending(self) -> int:
        """The last token of the context (emitted, or the prompt's last): the target has not
        processed it yet, and the next round's forward starts with it."""
        return self._context[-1]

    @property
    def _processed(self) -> int:
        """How many tokens the target's cache holds between rounds: all but the pending one."""
        return len(self._context) - 1

    def __iter__(self) -> Iterator[int]:
        if self.max_new_tokens == 0:  # nothing to decode; the prompt may still be scored
            if self.request.prompt_logprobs is not None:
                self.prompt_logprobs = self._prompt_logprobs()
            return
        self.begin()
        while not self.done:
            yield from self.round()

    @property
    def prefix(self) -> list[int]:
        """What `begin` prefills: the prompt but its last token (the first round's pending one)."""
        return list(self.prompt[:-1])

    def begin(self, prefilled: float | None = None) -> None:
        """Prefill the prompt (`prefix`), score it when the request asks for its logprobs, and
        start the proposer and the policy. prefilled: the seconds it took when a scheduler
        already prefilled the target with `prefix` (with other requests' prompts:
        `BatchedPrefill`)."""
        self._context = list(self.prompt)
        if prefilled is None:
            _, prefilled = timed(self.clock, prefill_and_wait, self.target, self.prefix)
        if self.request.prompt_logprobs is not None:
            self.prompt_logprobs, scored = timed(self.clock, self._prompt_logprobs)
            prefilled += scored
        self.stats.prefill_seconds = prefilled
        if self.proposer is not None:
            self.proposer.begin(self.prompt, self.sampling)
        self.policies.begin()

    def _prompt_logprobs(self) -> list[TokenLogprob | None]:
        """The prompt's logprobs from one stateless forward over `prefix` (`target.score`: the
        cache is not touched, so the decoding is the same with them or without)."""
        rows = self.target.score(self.prefix) if self.prefix else torch.empty(0)  # [len(prompt) - 1, V]
        return prompt_token_logprobs(rows, self.prompt, self.request.prompt_logprobs)

    def round(self) -> list[int]:
        """One round: the tokens it emits (at least one)."""
        plan = self.plan(self.choose())
        proposal = self.propose(plan)
        return self.settle(proposal, self.score(proposal))

    def choose(self) -> Plan:
        """Stage 0, the policy's part: the plan that the policy of the source drafting next (named
        from the context alone) chooses, within the budget. Ask once per round: a policy learns
        from every answer it gives."""
        source = draft_source(self.proposer, self._context)
        self.stats.context_tokens = len(self._context)
        return self.policies.choose(self.stats, source).budgeted(self.request.round_room(len(self.tokens)))

    def plan(self, chosen: Plan, adjust: int | None = None) -> Plan:
        """Stage 0, the engine's part: the round's plan. `chosen` (`choose()`'s), or with
        `adjust` the k a batch chose for it (`verispec.policies.BatchK`), which only a plan whose
        policy lets a batch choose takes, up to what that policy allows (`Plan.adjusted`);
        within the budget and the request's `max_k`."""
        plan = chosen if adjust is None else chosen.adjusted(adjust)
        return plan.budgeted(self.request.round_room(len(self.tokens)))

    def propose(self, plan: Plan) -> Proposal:
        """Stage 1: the proposer drafts at most what `plan` (`plan()`'s) asks, cut after EOS."""
        if not plan.nodes:
            return Proposal(plan, EMPTY_DRAFT, 0.0)
        draft, seconds = timed(self.clock, drafted, self.proposer, plan, self._context, self._round_random())
        check_draft(draft, plan, self.target.vocab_size)
        draft = draft.cut_after(self.eos_ids)
        if self.sampling.grammar is not None:
            draft = within_grammar(draft, self.sampling.grammar, self.tokens, self.sampling.greedy)
        return Proposal(plan, draft, seconds)

    def score(self, proposal: Proposal) -> Scored:
        """Stage 2: one target forward over [pending, *drafts] (a tree's nodes each after its
        own ancestors)."""
        self.check_cache()
        draft = proposal.draft
        tokens = self.scored_tokens(draft)

        def forward() -> tuple[torch.Tensor, torch.Tensor]:
            if draft.is_tree:
                logits = tree_target(self.target).extend_tree(tokens, scored_parents(draft))
            else:
                logits = self.target.extend(tokens)
            return logits, arrive([self], [draft], [logits])[0]

        (logits, rule_rows), seconds = timed(self.clock, forward)
        return Scored(logits, seconds, len(tokens), rule_rows)

    def scored_tokens(self, draft: Draft | TreeDraft) -> list[int]:
        """What a round's forward scores after the cached prefix: [pending, *drafts] (a tree's
        nodes in their order)."""
        return [self._pending, *draft.tokens]

    def check_cache(self) -> None:
        """Refuse to score on a cache that does not hold exactly the processed prefix."""
        if self.target.length != self._processed:
            raise RuntimeError(
                f"target cache holds {self.target.length} tokens, expected "
                f"{self._processed}: the model's rollback broke the cache contract"
            )

    def settle(self, proposal: Proposal, scored: Scored) -> list[int]:
        """Stage 3 on the round's scored rows: observe, verify, commit; the emitted tokens."""
        observed = self._observe(proposal.draft, scored.logits)
        rule = self.choose_rule(proposal.draft)
        verdict, verify_seconds = timed(self.clock, rule, scored.rule_rows, proposal.draft, self._round_random())
        emitted, seconds = timed(self.clock, self._commit, proposal, scored, verdict, proposal.seconds + observed, verify_seconds)
        self.stats.commit_seconds += seconds
        return emitted

    def _observe(self, draft: Draft | TreeDraft, logits: torch.Tensor) -> float:
        """A proposer that learns from the target's rows (`ObservingProposer`, e.g. lookahead's
        Jacobi iteration) sees this round's logits[k' + 1, V] before the verdict; its seconds
        (returned) count as drafting."""
        if not self.observing:
            return 0.0
        return timed(self.clock, self.proposer.observe, self._context, draft, logits)[1]

    def rule_input(self, draft: Draft | TreeDraft, logits: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The round's rows after the transforms that read each row's context (the penalties),
        and what the rule chosen for this draft reads of them (`sampling.rule_input`), both
        where the logits are: nothing is read there."""
        logits = penalised(logits, self.sampling, self._context, draft.row_prefixes(), len(self.tokens), self.eos_ids)
        return logits, rule_input(logits, self.sampling)

    def _round_random(self) -> Round:
        """The request's `Random` as this round's proposer and rule see it: positions from the
        round's first new token, keyed drafts under the coupled rule."""
        return Round(self.rng, len(self._context), self.keyed)

    def _commit(
        self, proposal: Proposal, scored: Scored, verdict: Verdict | TreeVerdict, draft_seconds: float, verify_seconds: float
    ) -> list[int]:
        """Emit accepted + next (cut at EOS), crop the caches to the emitted prefix but the
        new pending token (a tree's cache first keeps its accepted path only), record the round."""
        draft = proposal.draft
        emitted = emitted_tokens(draft, verdict, self.eos_ids)
        self._context.extend(emitted)
        if draft.is_tree:
            tree_target(self.target).keep_path([0, *(node + 1 for node in verdict.path)])
        self.target.rollback(self._processed)
        self.tokens.extend(emitted)
        if self.request.logprobs is not None:  # token j's row: the j-th along the accepted path
            rows = [0, *(node + 1 for node in verdict.path)] if draft.is_tree else range(len(emitted))
            self.logprobs.extend(token_logprobs(scored.logits[list(rows)], emitted, self.request.logprobs))
        if self.proposer is not None:
            self.proposer.commit(self._context)
        self.stats.record(
            len(draft), verdict.n_accepted, len(emitted), plan=proposal.plan.describe(), fallback=verdict.fallback,
            draft_seconds=draft_seconds, target_seconds=scored.seconds, verify_seconds=verify_seconds,
            offers=draft.offered(verdict), source=proposal.source, batch_rows=scored.rows,
        )
        return emitted


def generate(
    target: CausalLM, proposer: Proposer | None, request: Request | Sequence[int], *,
    policy: int | KPolicy | None = None, rng: Random | None = None, clock: Callable[[], float] = time.perf_counter,
    **keywords,
) -> Generation:
    """Run a request to the end: a `Request`, or the keyword form (the prompt's token ids and
    `max_new_tokens`, `sampling` (default greedy), `eos_token_id` (an id, a collection of ids,
    or None), `seed`, `k` (an integer or a policy object, default 4) and `verifier`, from which
    a `Request` is built; it names no proposer or k spec: the decoding runs the proposer and
    the policy it is given)."""
    run = stream(target, proposer, request, policy=policy, rng=rng, clock=clock, **keywords)
    for _ in run:
        pass
    return Generation(run.tokens, run.stats, run.logprobs, run.request.seed, run.prompt_logprobs)


def stream(
    target: CausalLM, proposer: Proposer | None, request: Request | Sequence[int], *,
    policy: int | KPolicy | None = None, rng: Random | None = None, clock: Callable[[], float] = time.perf_counter,
    **keywords,
) -> Decoding:
    """A request whose tokens arrive as they are committed: `for token in stream(...)`; a
    `Request` or the keyword form, as `generate` takes them."""
    if isinstance(request, Request):
        if keywords:
            raise TypeError(f"give a Request or the keyword form, not both (got {', '.join(sorted(keywords))})")
    else:
        if policy is not None:
            raise TypeError("the keyword form takes the policy as k=")
        request, policy = keyword_request(request, **keywords)
    return Decoding(target, proposer, request, policy=policy, rng=rng, clock=clock)


def prefill_and_wait(target: CausalLM, prefix: Sequence[int]) -> None:
    """`target.prefill(prefix)`, then wait for the device: nothing of a prefill comes back to
    the host, so without the wait its work would count in the first round's forward."""
    target.prefill(prefix)
    synchronize()


def arrive(decodings: Sequence[Decoding], drafts: Sequence[Draft | TreeDraft], logits: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """What each request's rule reads, on the host, for one forward whose logits[i] score
    drafts[i]: every request's rule input (`Decoding.rule_input`) crosses in ONE copy
    (`transfers.to_host_all`), the step's one synchronisation. Time it with the forward: on a
    device the wait for it is the forward's work."""
    prepared = [decoding.rule_input(draft, rows) for decoding, draft, rows in zip(decodings, drafts, logits)]
    host = to_host_all([tensor for _, inputs in prepared for tensor in inputs])
    out, at = [], 0
    for decoding, (checked, inputs) in zip(decodings, prepared):
        out.append(rule_rows_of(host[at : at + len(inputs)], checked, decoding.sampling))
        at += len(inputs)
    return out


def timed(clock: Callable[[], float], work: Callable[..., T], *args) -> tuple[T, float]:
    """`work(*args)` and the seconds it took: two reads of `clock`, one on each side (on a
    `TickClock`, one tick whatever ran, so the engine and the reference record alike)."""
    start = clock()
    out = work(*args)
    return out, clock() - start


def keyword_request(
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    eos_token_id: EosIds = None,
    seed: int = 0,
    k: int | KPolicy = 4,
    verifier: str | verify.Verifier = "auto",
) -> tuple[Request, int | KPolicy]:
    """The keyword form as a `Request` (its sampling default, greedy, when none is given) and
    the k it runs with (an integer or a built policy)."""
    options = {} if sampling is None else {"sampling": sampling}
    request = Request(tuple(prompt_ids), max_new_tokens, eos_token_ids=eos_token_id, seed=seed, verifier=verifier, **options)
    return request, k


def check_request(request: Request, vocab_size: int) -> None:
    """ValueError unless the request's prompt and EOS ids are in the target's vocabulary and it
    asks for at most the vocabulary's logprobs a position (the rest of a request is checked
    when it is built)."""
    bad = [t for t in request.prompt_ids if t >= vocab_size]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    bad = sorted(t for t in request.eos_token_ids if t >= vocab_size)
    if bad:
        raise ValueError(f"eos_token_id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    for name in ("logprobs", "prompt_logprobs"):
        top = getattr(request, name)
        if top is not None and top > vocab_size:
            raise ValueError(f"{name} {top} asks for more tokens a position than the vocabulary's {vocab_size}; ask "
                             f"for at most {vocab_size}, or -1 for all of them")


def drafted(proposer: Proposer, plan: Plan, context: Sequence[int], rng: Random, stateless: bool = False) -> Draft | TreeDraft:
    """The proposer's draft for `plan`: a chain of at most k tokens, or a tree filling at most
    the plan's shape (`stateless`: recomputed from the context alone, as the reference asks)."""
    if plan.shape is not None:
        fill = proposer.propose_tree_stateless if stateless else proposer.propose_tree
        return fill(context, plan.shape, rng)
    chain = proposer.propose_stateless if stateless else proposer.propose
    return chain(context, plan.k, rng)


def tree_target(target: CausalLM) -> TreeScoring:
    """The target as a `TreeScoring` model, or ValueError saying it cannot score trees."""
    if not isinstance(target, TreeScoring):
        raise ValueError(
            f"{type(target).__name__} cannot score a token tree in one forward; use a chain "
            "(an integer k or auto) or a model with tree scoring (the fast, static, HF and llama.cpp runtimes)"
        )
    return target


def scored_parents(tree: TreeDraft) -> list[int]:
    """The parents of [pending, nodes] as `extend_tree` takes them: the pending token first
    (after the cached prefix), then each node under its parent shifted by one."""
    return [ROOT, *(parent + 1 for parent in tree.parents)]


def check_draft(draft: Draft | TreeDraft, plan: Plan, vocab_size: int) -> None:
    if draft.is_tree != plan.is_tree:
        asked = "a tree shape" if plan.is_tree else "a chain's k"
        raise ValueError(f"the proposer answered {asked} with {type(draft).__name__}")
    if len(draft) > plan.nodes:
        raise ValueError(f"the proposer drafted {len(draft)} tokens when asked for at most {plan.nodes}")
    if draft.depth > plan.depth:
        raise ValueError(f"the proposer drafted a tree of depth {draft.depth} for a shape of depth {plan.depth}")
    bad = [t for t in draft.tokens if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"drafted token id {bad[0]} is outside the target vocabulary [0, {vocab_size})")
    if draft.q is not None and draft.q.shape[-1] != vocab_size:
        raise ValueError(f"proposal q has vocabulary {draft.q.shape[-1]}, the target {vocab_size}")


def emitted_tokens(draft: Draft | TreeDraft, verdict: Verdict | TreeVerdict, eos_ids: frozenset[int]) -> list[int]:
    """The accepted prefix (a tree's accepted path) and the repair/bonus token, ending at the
    first EOS."""
    emitted = [*draft.accepted(verdict), verdict.next_token]
    return emitted[: through_first_eos(emitted, eos_ids)]
