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

Devices: the target and the proposer may run on any torch device. Their logits cross to the
host once a round, as the rows the rule reads (`sampling.rule_rows`); the rules, the random
draws and the bookkeeping run on the host.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

import torch

from verispec import verify
from verispec.drafts import EMPTY_DRAFT, Draft, Verdict
from verispec.models.base import CausalLM
from verispec.policies import KPolicy, as_policy
from verispec.proposers.base import Proposer
from verispec.randomness import Random, TorchRandom
from verispec.sampling import SamplingParams, rule_rows
from verispec.stats import Stats

EosIds = int | Collection[int] | None  # one EOS id, several, or none


@dataclass
class Generation:
    tokens: list[int]
    stats: Stats


class Decoding:
    """One request. Iterate it to receive tokens as they are committed; `tokens` and `stats`
    hold what has been emitted so far.

    eos_token_id: an id, a collection of ids (the output ends at the first of any), or None.
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
    ) -> None:
        self.target = target
        self.sampling = sampling or SamplingParams()
        self.prompt, self.eos_ids = check_request(target.vocab_size, prompt_ids, max_new_tokens, eos_token_id)
        if proposer is None and k != 0:
            raise ValueError("without a proposer, k must be 0 (plain decoding)")
        self.proposer = proposer
        self.max_new_tokens = max_new_tokens
        self.rng = rng if rng is not None else TorchRandom(seed)
        self.policy = as_policy(k)
        self.choose_rule = verify.rule_chooser(verifier, self.sampling.greedy)
        self.tokens: list[int] = []
        self.stats = Stats()
        self._context: list[int] = []  # prompt + emitted; its last token is the pending token

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
        self._begin()
        while True:
            emitted = self._round()
            yield from emitted
            if len(self.tokens) == self.max_new_tokens or emitted[-1] in self.eos_ids:
                return

    def _begin(self) -> None:
        self._context = list(self.prompt)
        start = time.perf_counter()
        self.target.prefill(self._context[: self._processed])
        self.stats.prefill_seconds = time.perf_counter() - start
        if self.proposer is not None:
            self.proposer.begin(self.prompt, self.sampling)
        self.policy.begin()

    def _round(self) -> list[int]:
        draft = self._propose()
        logits = self._score(draft)
        verdict = self._verify(logits, draft)
        return self._commit(draft, verdict)

    def _propose(self) -> Draft:
        """Stage 1: ask the policy for k, then the proposer for up to k tokens (cut after EOS)."""
        remaining = self.max_new_tokens - len(self.tokens)
        k = min(self.policy.choose(self.stats), remaining - 1)
        if k <= 0:
            return EMPTY_DRAFT
        start = time.perf_counter()
        draft = self.proposer.propose(self._context, k, self.rng)
        self.stats.draft_seconds += time.perf_counter() - start
        check_draft(draft, k, self.target.vocab_size)
        return cut_after_eos(draft, self.eos_ids)

    def _score(self, draft: Draft) -> torch.Tensor:
        """Stage 2: one target forward over [pending, drafts]: logits[k' + 1, V], on the
        target's device."""
        if self.target.length != self._processed:
            raise RuntimeError(
                f"target cache holds {self.target.length} tokens, expected "
                f"{self._processed}: the model's rollback broke the cache contract"
            )
        start = time.perf_counter()
        logits = self.target.extend([self._pending, *draft.tokens])
        self.stats.target_seconds += time.perf_counter() - start
        return logits

    def _verify(self, logits: torch.Tensor, draft: Draft) -> Verdict:
        """Stage 3: build the rule's rows on the host (p with the request's transforms, or the
        checked logits when greedy) and apply the rule chosen for this draft."""
        start = time.perf_counter()
        verdict = self.choose_rule(draft)(rule_rows(logits, self.sampling), draft, self.rng)
        self.stats.verify_seconds += time.perf_counter() - start
        return verdict

    def _commit(self, draft: Draft, verdict: Verdict) -> list[int]:
        """Stage 4: emit accepted + next (cut at EOS), crop the caches to the emitted prefix
        but the new pending token."""
        start = time.perf_counter()
        emitted = emitted_tokens(draft, verdict, self.eos_ids)
        self._context.extend(emitted)
        self.target.rollback(self._processed)
        self.tokens.extend(emitted)
        if self.proposer is not None:
            self.proposer.commit(self._context)
        self.stats.record_round(len(draft), verdict.n_accepted, verdict.fallback)
        self.stats.new_tokens = len(self.tokens)
        self.stats.commit_seconds += time.perf_counter() - start
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
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
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
        if isinstance(eos, bool) or not isinstance(eos, numbers.Integral):
            raise ValueError(f"eos_token_id must be a token id or a collection of them, got {eos!r}")
        if not 0 <= eos < vocab_size:
            raise ValueError(f"eos_token_id {eos} is outside the vocabulary [0, {vocab_size})")
        ids.append(int(eos))
    return frozenset(ids)


def check_draft(draft: Draft, k: int, vocab_size: int) -> None:
    if len(draft) > k:
        raise ValueError(f"the proposer drafted {len(draft)} tokens when asked for at most {k}")
    bad = [t for t in draft.tokens if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"drafted token id {bad[0]} is outside the target vocabulary [0, {vocab_size})")
    if draft.q is not None and draft.q.shape[-1] != vocab_size:
        raise ValueError(f"proposal q has vocabulary {draft.q.shape[-1]}, the target {vocab_size}")


def cut_after_eos(draft: Draft, eos_ids: frozenset[int]) -> Draft:
    """Drafted tokens after an EOS can never be emitted: drop them before scoring."""
    end = _through_first_eos(draft.tokens, eos_ids)
    return draft if end == len(draft) else draft.truncated(end)


def emitted_tokens(draft: Draft, verdict: Verdict, eos_ids: frozenset[int]) -> list[int]:
    """The accepted prefix and the repair/bonus token, ending at the first EOS."""
    emitted = [*draft.tokens[: verdict.n_accepted], verdict.next_token]
    return emitted[: _through_first_eos(emitted, eos_ids)]


def _through_first_eos(tokens: Sequence[int], eos_ids: frozenset[int]) -> int:
    """How many of `tokens` to keep: through the first EOS, or all of them."""
    return next((i + 1 for i, token in enumerate(tokens) if token in eos_ids), len(tokens))
