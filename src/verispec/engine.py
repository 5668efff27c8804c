"""The round loop: propose -> score -> verify -> commit.

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

Trees: a policy may answer a `TreeShape` instead of k. The proposer (a `TreeProposer`) fills
it, the target (a `TreeScoring` model) scores [pending, nodes] in one forward with each node
seeing its own ancestors, a tree rule picks the accepted root path, and the cache keeps that
path only (`keep_path`) before the usual rollback. A tree deeper than `remaining - 1` is cut
to that depth before proposing, and nodes below an EOS are dropped.

Sources: a proposer that drafts each round from one of several sources (`SourcedProposer`:
copying or a head) names the round's source first, and that source's own policy picks k from
its own rounds (`verispec.policies.PerSource`, `Stats.by_source`).

Batches: the round's stages are public (`propose`, `score`, `settle`), so the batch scheduler
(`verispec.batching.Scheduler`) runs the same code for each request of a step, replacing
only `score` by one forward over every request's rows. A request is data (`Request`);
`Decoding.of` builds its decoding, and the keyword form below stays for library calls.

Devices: the target and the proposer may run on any torch device. Their logits cross to the
host once a round, as the rows the rule reads (`sampling.rule_rows`); the rules, the random
draws and the bookkeeping run on the host.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

import torch

from verispec import verify
from verispec.checks import is_int
from verispec.drafts import EMPTY_DRAFT, ROOT, Draft, TreeDraft, TreeVerdict, Verdict
from verispec.models.base import CausalLM, TreeScoring
from verispec.policies import KPolicy, PerSource, as_policy
from verispec.proposers.base import ObservingProposer, Proposer, draft_source
from verispec.randomness import Random, TorchRandom
from verispec.request import Request
from verispec.sampling import SamplingParams, penalised, rule_rows
from verispec.stats import Stats
from verispec.tree_shape import TreeShape, describe_plan

EosIds = int | Collection[int] | None  # one EOS id, several, or none


@dataclass
class Generation:
    tokens: list[int]
    stats: Stats


class Decoding:
    """One request. Iterate it to receive tokens as they are committed; `tokens` and `stats`
    hold what has been emitted so far.

    eos_token_id: an id, a collection of ids (the output ends at the first of any), or None.
    clock: reads seconds for `stats` (a fake clock makes the timings, and so the choices of a
        policy that reads them, reproducible).
    """

    def __init__(
        self,
        target: CausalLM,
        proposer: Proposer | None,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        eos_token_id: EosIds = None,
        rng: Random | None = None,
        seed: int = 0,
        k: int | KPolicy = 4,
        verifier: str | verify.Verifier = "auto",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.target = target
        self.clock = clock
        self.sampling = sampling or SamplingParams()
        self.prompt, self.eos_ids = check_request(target.vocab_size, prompt_ids, max_new_tokens, eos_token_id)
        if proposer is None and k != 0:
            raise ValueError("without a proposer, k must be 0 (plain decoding)")
        self.proposer = proposer
        self.max_new_tokens = max_new_tokens
        self.rng = rng if rng is not None else TorchRandom(seed)
        self.policy = as_policy(k)
        self.policies = PerSource(self.policy)
        self._source: str | None = None  # which source drafts this round (`SourcedProposer`)
        self._source_known: tuple[str | None] | None = None  # `next_source`'s answer until `propose`
        if getattr(self.policy, "trees", False) and verifier == "block":
            raise ValueError("block verification is defined for chains; verify trees with auto or token, or give a chain k")
        self.choose_rule = verify.rule_chooser(verifier, self.sampling.greedy)
        self.tokens: list[int] = []
        self.stats = Stats()
        self._context: list[int] = []  # prompt + emitted; its last token is the pending token
        self._draft_seconds = 0.0  # this round's proposer and target seconds, for its commit
        self._target_seconds = 0.0
        self._batch_rows: int | None = None  # the rows of this round's forward in all, if shared

    @classmethod
    def of(
        cls,
        target: CausalLM,
        proposer: Proposer | None,
        request: Request,
        *,
        policy: KPolicy | None = None,
        rng: Random | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> Decoding:
        """The decoding of `request` on `target` with `proposer` (built from `request.proposer`
        by the caller); `policy`: the k policy built from `request.k` (needed when it is a spec
        such as 'auto'; an integer k needs none); rng: default `TorchRandom(request.seed)`."""
        return cls(
            target, proposer, request.prompt_ids, max_new_tokens=request.max_new_tokens, sampling=request.sampling,
            eos_token_id=request.eos_token_ids, rng=rng, seed=request.seed, k=request.k_for_decoding(policy),
            verifier=request.verifier,
            clock=clock,
        )

    @property
    def done(self) -> bool:
        """Whether the output is complete: the budget is spent or the last token is an EOS."""
        return len(self.tokens) == self.max_new_tokens or bool(self.tokens and self.tokens[-1] in self.eos_ids)

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
        if self.max_new_tokens == 0:
            return
        self.begin()
        while not self.done:
            yield from self.round()

    def begin(self) -> None:
        """Prefill the prompt (all but its last token, the first round's pending token) and
        start the proposer and the policy."""
        self._context = list(self.prompt)
        start = self.clock()
        self.target.prefill(self._context[: self._processed])
        self.stats.prefill_seconds = self.clock() - start
        if self.proposer is not None:
            self.proposer.begin(self.prompt, self.sampling)
        self.policies.begin()

    def round(self) -> list[int]:
        """One round: the tokens it emits (at least one)."""
        draft = self.propose()
        logits = self.score(draft)
        return self.settle(draft, logits)

    def settle(self, draft: Draft | TreeDraft, logits: torch.Tensor) -> list[int]:
        """Stages 2b-4 on the round's scored rows logits[k' + 1, V]: observe, verify, commit."""
        self._observe(draft, logits)
        verdict = self._verify(logits, draft)
        return self._commit(draft, verdict)

    def next_source(self) -> str | None:
        """The source that drafts the next round (`SourcedProposer`; None for one source),
        decided from the context alone; `propose` drafts from it."""
        if self._source_known is None:
            self._source_known = (draft_source(self.proposer, self._context),)
        return self._source_known[0]

    def propose(self, plan: int | TreeShape | None = None) -> Draft | TreeDraft:
        """Stage 1: ask the policy for k (or a tree shape), unless a batch scheduler gives the
        `plan`, then the proposer for up to k tokens (or at most the shape's nodes), cut after
        EOS."""
        self._source = self.next_source()
        self._source_known = None
        if plan is None:
            plan = self.policies.choose(self.stats, self._source)
        plan = budgeted(plan, self.max_new_tokens - len(self.tokens))
        self.stats.record_plan(describe_plan(plan), self._source)
        self._draft_seconds = 0.0
        if not plan:
            return EMPTY_DRAFT
        start = self.clock()
        if isinstance(plan, TreeShape):
            draft = self.proposer.propose_tree(self._context, plan, self.rng)
        else:
            draft = self.proposer.propose(self._context, plan, self.rng)
        self._draft_seconds = self.clock() - start
        check_draft(draft, plan, self.target.vocab_size)
        return cut_after_eos(draft, self.eos_ids)

    def score(self, draft: Draft | TreeDraft) -> torch.Tensor:
        """Stage 2: one target forward over [pending, drafts]: logits[k' + 1, V] (a tree's
        row i + 1 after node i), on the target's device."""
        self.check_cache()
        start = self.clock()
        if isinstance(draft, TreeDraft):
            logits = tree_target(self.target).extend_tree([self._pending, *draft.tokens], scored_parents(draft))
        else:
            logits = self.target.extend(self.scored_tokens(draft))
        self.record_target_seconds(self.clock() - start)
        return logits

    def scored_tokens(self, draft: Draft) -> list[int]:
        """What a chain round's forward scores after the cached prefix: [pending, *drafts]."""
        return [self._pending, *draft.tokens]

    def check_cache(self) -> None:
        """Refuse to score on a cache that does not hold exactly the processed prefix."""
        if self.target.length != self._processed:
            raise RuntimeError(
                f"target cache holds {self.target.length} tokens, expected "
                f"{self._processed}: the model's rollback broke the cache contract"
            )

    def record_target_seconds(self, seconds: float, batch_rows: int | None = None) -> None:
        """The round's scoring time; a batch's forward: the whole forward this request waited
        on, which scored `batch_rows` rows in all (None: this round's own)."""
        self._target_seconds = seconds
        self._batch_rows = batch_rows

    def _observe(self, draft: Draft | TreeDraft, logits: torch.Tensor) -> None:
        """Stage 2b: a proposer that learns from the target's rows (`ObservingProposer`, e.g.
        lookahead's Jacobi iteration) sees this round's logits[k' + 1, V] before the verdict;
        its seconds count as drafting."""
        if isinstance(self.proposer, ObservingProposer):
            start = self.clock()
            self.proposer.observe(self._context, draft, logits)
            self._draft_seconds += self.clock() - start

    def _verify(self, logits: torch.Tensor, draft: Draft | TreeDraft) -> Verdict | TreeVerdict:
        """Stage 3: build the rule's rows on the host (p with the request's transforms, the
        penalties that read each row's context first, or the checked logits when greedy) and
        apply the rule chosen for this draft."""
        start = self.clock()
        logits = penalised(logits, self.sampling, self._context, drafted_before_rows(draft), len(self.tokens),
                           self.eos_ids)
        verdict = self.choose_rule(draft)(rule_rows(logits, self.sampling), draft, self.rng)
        self.stats.verify_seconds += self.clock() - start
        return verdict

    def _commit(self, draft: Draft | TreeDraft, verdict: Verdict | TreeVerdict) -> list[int]:
        """Stage 4: emit accepted + next (cut at EOS), crop the caches to the emitted prefix
        but the new pending token (a tree's cache first keeps its accepted path only)."""
        start = self.clock()
        emitted = emitted_tokens(draft, verdict, self.eos_ids)
        self._context.extend(emitted)
        if isinstance(draft, TreeDraft):
            tree_target(self.target).keep_path([0, *(node + 1 for node in verdict.path)])
        self.target.rollback(self._processed)
        self.tokens.extend(emitted)
        if self.proposer is not None:
            self.proposer.commit(self._context)
        self.stats.record_round(
            len(draft),
            verdict.n_accepted,
            verdict.fallback,
            draft_seconds=self._draft_seconds,
            target_seconds=self._target_seconds,
            offers=draft.offers(verdict.path) if isinstance(draft, TreeDraft) else None,
            source=self._source,
            batch_rows=self._batch_rows,
        )
        self.stats.new_tokens = len(self.tokens)
        if self._source is not None:
            self.stats.source(self._source).new_tokens += len(emitted)
        self.stats.commit_seconds += self.clock() - start
        return emitted


def generate(target: CausalLM, proposer: Proposer | None, prompt_ids: Sequence[int], **options) -> Generation:
    """Run a request to the end; options as for `Decoding` (max_new_tokens is required)."""
    run = Decoding(target, proposer, prompt_ids, **options)
    for _ in run:
        pass
    return Generation(run.tokens, run.stats)


def stream(target: CausalLM, proposer: Proposer | None, prompt_ids: Sequence[int], **options) -> Decoding:
    """A request whose tokens arrive as they are committed: `for token in stream(...)`."""
    return Decoding(target, proposer, prompt_ids, **options)


def check_request(
    vocab_size: int, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id: EosIds
) -> tuple[list[int], frozenset[int]]:
    """The prompt as a list of ints and the EOS ids as a set, or ValueError saying what is wrong."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("the prompt is empty; give at least one token")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    if not is_int(max_new_tokens, least=0):
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    return prompt, eos_set(eos_token_id, vocab_size)


def eos_set(eos_token_id: EosIds, vocab_size: int) -> frozenset[int]:
    """{id} for one EOS id, the set of a collection of them, {} for None.

    >>> sorted(eos_set([2, 0, 2], vocab_size=3))
    [0, 2]
    """
    if eos_token_id is None:
        return frozenset()
    given = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    ids = []
    for eos in given:
        if not is_int(eos, integral=True):
            raise ValueError(f"eos_token_id must be a token id or a collection of them, got {eos!r}")
        if not 0 <= eos < vocab_size:
            raise ValueError(f"eos_token_id {eos} is outside the vocabulary [0, {vocab_size})")
        ids.append(int(eos))
    return frozenset(ids)


def budgeted(plan: int | TreeShape, remaining: int) -> int | TreeShape:
    """The policy's k or tree shape within the budget: at most `remaining - 1` tokens deep
    (0 or an empty shape: a plain step)."""
    if isinstance(plan, TreeShape):
        return plan.truncated(remaining - 1)
    return max(0, min(plan, remaining - 1))


def tree_target(target: CausalLM) -> TreeScoring:
    """The target as a `TreeScoring` model, or ValueError saying it cannot score trees."""
    if not isinstance(target, TreeScoring):
        raise ValueError(
            f"{type(target).__name__} cannot score a token tree in one forward; use a chain "
            "(an integer k or auto) or a model with tree scoring (the fast runtime, the HF adapter)"
        )
    return target


def scored_parents(tree: TreeDraft) -> list[int]:
    """The parents of [pending, nodes] as `extend_tree` takes them: the pending token first
    (after the cached prefix), then each node under its parent shifted by one."""
    return [ROOT, *(parent + 1 for parent in tree.parents)]


def check_draft(draft: Draft | TreeDraft, plan: int | TreeShape, vocab_size: int) -> None:
    if isinstance(plan, TreeShape):
        if not isinstance(draft, TreeDraft):
            raise ValueError(f"the proposer answered a tree shape with {type(draft).__name__}, not a TreeDraft")
        if len(draft) > len(plan) or draft.depth > plan.depth:
            raise ValueError(
                f"the proposer drafted a tree of {len(draft)} nodes and depth {draft.depth} for a "
                f"shape of {len(plan)} nodes and depth {plan.depth}"
            )
    elif len(draft) > plan:
        raise ValueError(f"the proposer drafted {len(draft)} tokens when asked for at most {plan}")
    bad = [t for t in draft.tokens if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"drafted token id {bad[0]} is outside the target vocabulary [0, {vocab_size})")
    if draft.q is not None and draft.q.shape[-1] != vocab_size:
        raise ValueError(f"proposal q has vocabulary {draft.q.shape[-1]}, the target {vocab_size}")


def cut_after_eos(draft: Draft | TreeDraft, eos_ids: frozenset[int]) -> Draft | TreeDraft:
    """Drafted tokens after an EOS can never be emitted: drop them before scoring (in a tree,
    every node below an EOS node)."""
    if isinstance(draft, TreeDraft):
        return draft.pruned(lambda node: draft.parents[node] == ROOT or draft.tokens[draft.parents[node]] not in eos_ids)
    end = _through_first_eos(draft.tokens, eos_ids)
    return draft if end == len(draft) else draft.truncated(end)


def drafted_before_rows(draft: Draft | TreeDraft) -> list[tuple[int, ...]]:
    """For each scored row, the drafted tokens between the context and it: a chain's row r
    follows its first r drafts, a tree's row i + 1 follows node i's root path."""
    if isinstance(draft, TreeDraft):
        return [(), *(draft.path_tokens(draft.path_to(node)) for node in range(len(draft)))]
    return [tuple(draft.tokens[:r]) for r in range(len(draft) + 1)]


def emitted_tokens(draft: Draft | TreeDraft, verdict: Verdict | TreeVerdict, eos_ids: frozenset[int]) -> list[int]:
    """The accepted prefix (a tree's accepted path) and the repair/bonus token, ending at the
    first EOS."""
    if isinstance(draft, TreeDraft):
        accepted = draft.path_tokens(verdict.path)
    else:
        accepted = draft.tokens[: verdict.n_accepted]
    emitted = [*accepted, verdict.next_token]
    return emitted[: _through_first_eos(emitted, eos_ids)]


def _through_first_eos(tokens: Sequence[int], eos_ids: frozenset[int]) -> int:
    """How many of `tokens` to keep: through the first EOS, or all of them."""
    return next((i + 1 for i, token in enumerate(tokens) if token in eos_ids), len(tokens))
