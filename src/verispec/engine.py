"""The round loop: propose -> score -> verify -> commit.

Cache contract (the seed's): the target has processed every emitted token but the last, the
*pending* token. A round feeds the target `[pending, x_1..x_k']` in one forward, whose k' + 1
rows are the target distributions at the k' drafted positions and at the bonus position. After
the verdict the target is rolled back to the emitted prefix (minus the new pending token), so
the next forward starts from the same logical prefix as a full recomputation
(`verispec.reference` checks exactly that, token for token).

EOS ends the output at once and a drafted suffix after it never leaks; the budget is exact
because a round drafts at most `remaining - 1` tokens (the +1 is the repair or bonus token).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from verispec import verify
from verispec.models.base import CausalLM
from verispec.policies import KPolicy, as_policy
from verispec.proposers.base import EMPTY_DRAFT, Draft, Proposer
from verispec.randomness import Random, TorchRandom
from verispec.sampling import SamplingParams, check_logits, probabilities
from verispec.stats import Stats


@dataclass
class Generation:
    tokens: list[int]
    stats: Stats


class Decoding:
    """One request. Iterate it to receive tokens as they are committed; `tokens` and `stats`
    hold what has been emitted so far."""

    def __init__(
        self,
        target: CausalLM,
        proposer: Proposer | None,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        eos_token_id: int | None = None,
        rng: Random | None = None,
        seed: int = 0,
        k: int | KPolicy = 4,
        verifier: str | verify.Verifier = "auto",
    ) -> None:
        self.target = target
        self.sampling = sampling or SamplingParams()
        self.prompt = check_request(target.vocab_size, prompt_ids, max_new_tokens, eos_token_id)
        if proposer is None and k != 0:
            raise ValueError("without a proposer, k must be 0 (plain decoding)")
        self.proposer = proposer
        self.max_new_tokens = max_new_tokens
        self.eos_token_id = eos_token_id
        self.rng = rng if rng is not None else TorchRandom(seed)
        self.policy = as_policy(k)
        self.rule = resolve_rule(verifier, self.sampling)
        self.tokens: list[int] = []
        self.stats = Stats()
        self._context: list[int] = []

    def __iter__(self) -> Iterator[int]:
        if self.max_new_tokens == 0:
            return
        self._begin()
        while True:
            emitted = self._round()
            yield from emitted
            if len(self.tokens) == self.max_new_tokens or emitted[-1] == self.eos_token_id:
                return

    def _begin(self) -> None:
        start = time.perf_counter()
        self.target.prefill(self.prompt[:-1])
        self.stats.prefill_seconds = time.perf_counter() - start
        self._context = list(self.prompt)
        if self.proposer is not None:
            self.proposer.begin(self.prompt, self.sampling)
        self.policy.begin()

    def _round(self) -> list[int]:
        draft = self._propose()
        rows = self._score(draft)
        verdict = self._verify(rows, draft)
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
        return cut_after_eos(draft, self.eos_token_id)

    def _score(self, draft: Draft) -> torch.Tensor:
        """Stage 2: one target forward over [pending, drafts]: logits[k' + 1, V]."""
        if self.target.length != len(self._context) - 1:
            raise RuntimeError(
                f"target cache holds {self.target.length} tokens, expected "
                f"{len(self._context) - 1}: the model's rollback broke the cache contract"
            )
        start = time.perf_counter()
        logits = self.target.extend([self._context[-1], *draft.tokens])
        self.stats.target_seconds += time.perf_counter() - start
        return logits

    def _verify(self, logits: torch.Tensor, draft: Draft) -> verify.Verdict:
        """Stage 3: build p with the request's transforms and apply the verification rule."""
        start = time.perf_counter()
        if self.sampling.greedy:
            check_logits(logits)  # the argmax of a row with NaN or +inf would pass silently
            rows = logits
        else:
            rows = probabilities(logits, self.sampling)
        rule = self.rule or verify.default_rule(self.sampling.greedy, draft)
        verdict = rule(rows, draft, self.rng)
        self.stats.verify_seconds += time.perf_counter() - start
        return verdict

    def _commit(self, draft: Draft, verdict: verify.Verdict) -> list[int]:
        """Stage 4: emit accepted + next (cut at EOS), crop the caches to the emitted prefix."""
        start = time.perf_counter()
        emitted = emitted_tokens(draft, verdict, self.eos_token_id)
        self.target.rollback(len(self._context) + verdict.n_accepted)
        self._context.extend(emitted)
        self.tokens.extend(emitted)
        if self.proposer is not None:
            self.proposer.commit(self._context)
        self.stats.record_round(len(draft), verdict.n_accepted)
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


def resolve_rule(verifier: str | verify.Verifier, sampling: SamplingParams) -> verify.Verifier | None:
    """The fixed rule to use, or None for the per-draft default ("auto")."""
    if callable(verifier):
        return verifier
    if verifier != "auto" and verifier not in verify.RULES:
        raise ValueError(f"unknown verifier {verifier!r}; choose auto or one of {sorted(verify.RULES)}")
    if sampling.greedy:
        if verifier not in ("auto", "greedy"):
            raise ValueError(f"temperature 0 verifies greedily; {verifier!r} needs temperature > 0")
        return verify.greedy
    if verifier == "greedy":
        raise ValueError("the greedy rule is exact only at temperature 0; use auto, token or block")
    return None if verifier == "auto" else verify.RULES[verifier]


def check_request(vocab_size: int, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id: int | None) -> list[int]:
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("the prompt is empty; give at least one token")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if eos_token_id is not None and not 0 <= eos_token_id < vocab_size:
        raise ValueError(f"eos_token_id {eos_token_id} is outside the vocabulary [0, {vocab_size})")
    return prompt


def check_draft(draft: Draft, k: int, vocab_size: int) -> None:
    if len(draft) > k:
        raise ValueError(f"the proposer drafted {len(draft)} tokens when asked for at most {k}")
    bad = [t for t in draft.tokens if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"drafted token id {bad[0]} is outside the target vocabulary [0, {vocab_size})")
    if draft.q is not None and draft.q.shape[-1] != vocab_size:
        raise ValueError(f"proposal q has vocabulary {draft.q.shape[-1]}, the target {vocab_size}")


def cut_after_eos(draft: Draft, eos_token_id: int | None) -> Draft:
    """Drafted tokens after an EOS can never be emitted: drop them before scoring."""
    if eos_token_id is None or eos_token_id not in draft.tokens:
        return draft
    return draft.truncated(draft.tokens.index(eos_token_id) + 1)


def emitted_tokens(draft: Draft, verdict: verify.Verdict, eos_token_id: int | None) -> list[int]:
    """The accepted prefix and the repair/bonus token, ending at the first EOS."""
    emitted = [*draft.tokens[: verdict.n_accepted], verdict.next_token]
    if eos_token_id is not None and eos_token_id in emitted:
        return emitted[: emitted.index(eos_token_id) + 1]
    return emitted
