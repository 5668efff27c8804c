"""Runners: one request of one method, timed the same way for every method and every caller
(`generate --compare`, `demo`, `bench` and the greedy identity suite).

Every runner streams its output and notes when tokens arrive: the verispec engine by iterating
its `Decoding`, HF `generate` through a streamer (which it calls once per decoding step, and
once per assisted round with all the round's tokens). So the same clock measures, for every
method, the end-to-end wall time of the request (the primary number), the time to the first
new token (prompt prefill plus the first round) and the tokens emitted per round.

Every method of a comparison gets the same `SamplingParams` and seed. HF calls decode with
`do_sample` exactly when the transforms sample (temperature > 0) and then with the same
temperature, top-k, top-p and min-p; they get an all-ones attention mask, `pad_token_id` = the
EOS id, and the same single EOS id as the verispec engine, so their greedy outputs must equal
verispec-plain's token for token.

    >>> runner = VerispecRunner(target, PromptLookup(), 4, eos_token_ids=())
    >>> outcome = runner(prompt_ids, 32, on_token=print)   # prints each token as it commits
    >>> outcome.tokens_per_s, outcome.stats.mean_accepted
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig
from transformers.generation.streamers import BaseStreamer

from verispec.engine import stream
from verispec.models.base import CausalLM
from verispec.policies import KPolicy
from verispec.proposers.base import Proposer
from verispec.sampling import GREEDY, SamplingParams
from verispec.stats import Stats


@dataclass
class Outcome:
    """One request's result.

    tokens: the new token ids (EOS included when it ended the request).
    wall_seconds: from the call to the return. first_token_seconds: from the call to the first
    emitted token(s); first_tokens: how many arrived then (a speculative round emits several).
    tokens_per_round: new tokens emitted by each target forward after the prompt's.
    stats: the verispec engine's counters (None for HF methods).
    logits: float32 [len(tokens), V], row i the logits new token i was chosen from (HF with
    keep_logits only).
    peer: None when the tokens come from the target itself (verispec's engine, HF on the same
    model object), so greedy identity with plain decoding is required; else what other
    computation produced them (a peer runtime), whose output is compared but may differ.
    """

    tokens: list[int]
    wall_seconds: float
    first_token_seconds: float
    first_tokens: int
    tokens_per_round: list[int]
    stats: Stats | None = None
    logits: torch.Tensor | None = None
    peer: str | None = None

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of wall time, end to end (prefill included)."""
        return len(self.tokens) / self.wall_seconds if self.wall_seconds > 0 else float("inf")


@dataclass
class Clock:
    """Arrival times of emitted tokens: `emitted(n)` when n tokens came out together, or just
    `arrived()` when the round sizes are known otherwise."""

    start: float = field(default_factory=time.perf_counter)
    first_seconds: float | None = None
    per_round: list[int] = field(default_factory=list)

    def arrived(self) -> None:
        if self.first_seconds is None:
            self.first_seconds = time.perf_counter() - self.start

    def emitted(self, n: int) -> None:
        self.arrived()
        self.per_round.append(n)

    def outcome(self, tokens: list[int], stats: Stats | None = None) -> Outcome:
        wall = time.perf_counter() - self.start
        first = wall if self.first_seconds is None else self.first_seconds
        return Outcome(tokens, wall, first, self.per_round[0] if self.per_round else 0, self.per_round, stats)


class VerispecRunner:
    """The verispec engine: plain (no proposer, k = 0) or speculative, under `sampling` (greedy
    by default) with the random stream of `seed`, the same for every request."""

    def __init__(
        self,
        target: CausalLM,
        proposer: Proposer | None,
        policy: int | KPolicy,
        eos_token_ids: Sequence[int],
        sampling: SamplingParams = GREEDY,
        seed: int = 0,
    ) -> None:
        self.target = target
        self.proposer = proposer
        self.policy = policy
        self.eos_token_ids = tuple(eos_token_ids)
        self.sampling = sampling
        self.seed = seed

    def __call__(
        self, prompt_ids: Sequence[int], max_new_tokens: int, on_token: Callable[[int], None] | None = None
    ) -> Outcome:
        """One request; on_token(token) is called as each new token is committed."""
        clock = Clock()
        decoding = stream(
            self.target,
            self.proposer,
            prompt_ids,
            max_new_tokens=max_new_tokens,
            sampling=self.sampling,
            eos_token_id=self.eos_token_ids,
            k=self.policy,
            seed=self.seed,
        )
        for token in decoding:
            clock.arrived()
            if on_token is not None:
                on_token(token)
        clock.per_round = emitted_per_round(decoding.stats.accepted, len(decoding.tokens))
        return clock.outcome(list(decoding.tokens), decoding.stats)


class GreedyReference:
    """prompt -> the target's plain greedy continuation, as `prepare` decoded it before a timed
    run (what a `verispec-oracle` method's `ControlledAcceptance` drafts); [] for a prompt not
    prepared."""

    def __init__(self, target: CausalLM, eos_token_ids: Sequence[int]) -> None:
        self.target = target
        self.eos_token_ids = tuple(eos_token_ids)
        self.known: dict[tuple[int, ...], list[int]] = {}

    def prepare(self, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
        key = tuple(prompt_ids)
        known = self.known.get(key)
        if known is not None and (len(known) >= max_new_tokens or (known and known[-1] in self.eos_token_ids)):
            return
        decoding = stream(
            self.target, None, prompt_ids, max_new_tokens=max_new_tokens, sampling=GREEDY,
            eos_token_id=self.eos_token_ids, k=0,
        )
        self.known[key] = list(decoding)

    def __call__(self, prompt_ids: Sequence[int]) -> list[int]:
        return self.known.get(tuple(prompt_ids), [])


class OracleRunner:
    """A `verispec-oracle:ALPHA` method: the prompt's plain greedy continuation is decoded
    first, untimed (`GreedyReference`), then `runner` runs with the proposer that drafts it."""

    def __init__(self, runner: VerispecRunner, reference: GreedyReference) -> None:
        self.runner = runner
        self.reference = reference

    def __call__(
        self, prompt_ids: Sequence[int], max_new_tokens: int, on_token: Callable[[int], None] | None = None
    ) -> Outcome:
        self.reference.prepare(prompt_ids, max_new_tokens)
        return self.runner(prompt_ids, max_new_tokens, on_token)


def warm_up(target: CausalLM, prompt_ids: Sequence[int]) -> None:
    """One short plain run, so the first timed run does not pay for lazy initialisation."""
    VerispecRunner(target, None, 0, ())(prompt_ids, 2)


def emitted_per_round(accepted: Sequence[int], new_tokens: int) -> list[int]:
    """Tokens each round emitted: accepted + 1, except that EOS can cut the last round short."""
    per_round = [a + 1 for a in accepted]
    if per_round:
        per_round[-1] = new_tokens - sum(per_round[:-1])
    return per_round


class TokenClock(BaseStreamer):
    """An HF streamer that only notes when tokens arrive; the first `put` is the prompt."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.clock.emitted(int(value.numel()))

    def end(self) -> None:
        pass


class HFRunner:
    """HF `model.generate`, optionally assisted, under `sampling` (greedy by default; seeded
    with `seed` before every request when it samples).

    options: the assisted-generation keywords (`prompt_lookup_num_tokens`,
    `assistant_early_exit`, `assistant_model`). assistant_tokens: a fixed draft length for an
    assistant (its `num_assistant_tokens` with the constant schedule); None keeps HF's default.
    HF reads those from the assistant's own generation config and its heuristic schedule writes
    back into it, so that config is restored after every call: requests stay independent.
    keep_logits: return the raw logits each new token was chosen from (`Outcome.logits`).
    """

    def __init__(
        self,
        model,
        eos_token_ids: Sequence[int],
        options: dict | None = None,
        assistant_tokens: int | None = None,
        sampling: SamplingParams = GREEDY,
        seed: int = 0,
        keep_logits: bool = False,
    ) -> None:
        self.model = model
        self.sampling = sampling
        self.seed = seed
        self.keep_logits = keep_logits
        self.options = dict(options or {})
        self.assistant = self.options.get("assistant_model") or (
            model if "assistant_early_exit" in self.options else None
        )
        self.assistant_tokens = assistant_tokens
        self.eos_token_ids = tuple(eos_token_ids)

    def config(self, max_new_tokens: int) -> GenerationConfig:
        # HF fills every field left unset from the model's own generation config. The length
        # and repetition processors, which could change a greedy token, get neutral values
        # (at which HF builds no processor at all); any other such default would show up in
        # the identity check. Sampling gets exactly verispec's transforms, and HF's own defaults
        # (top_k 50, top_p 1) are overridden so that nothing else filters the distribution.
        s = self.sampling
        transforms = {} if s.greedy else dict(
            temperature=s.temperature, top_k=s.top_k if s.top_k is not None else 0,
            top_p=s.top_p if s.top_p is not None else 1.0, min_p=s.min_p,
        )
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            min_length=0,
            do_sample=not s.greedy,
            **transforms,
            num_beams=1,
            output_logits=self.keep_logits,
            return_dict_in_generate=self.keep_logits,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            eos_token_id=list(self.eos_token_ids) or None,
            pad_token_id=self.eos_token_ids[0] if self.eos_token_ids else None,  # HF wants one id
            **{k: v for k, v in self.options.items() if k != "assistant_model"},
        )

    def __call__(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Outcome:
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)  # [1, T]
        extra = {"assistant_model": self.options["assistant_model"]} if "assistant_model" in self.options else {}
        saved = self._configure_assistant()
        if not self.sampling.greedy:
            torch.manual_seed(self.seed)
        clock = Clock()
        try:
            with torch.inference_mode():
                out = self.model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    generation_config=self.config(max_new_tokens),
                    streamer=TokenClock(clock),
                    **extra,
                )
            sequences = out.sequences if self.keep_logits else out  # [1, T + n]
            tokens = [int(t) for t in sequences[0, ids.shape[1] :]]
            outcome = clock.outcome(tokens)
            if self.keep_logits:
                outcome.logits = torch.cat(out.logits).float()  # [n, V]
            return outcome
        finally:
            if saved is not None:
                self.assistant.generation_config = saved

    def _configure_assistant(self) -> GenerationConfig | None:
        if self.assistant is None:
            return None
        saved = copy.deepcopy(self.assistant.generation_config)
        if self.assistant_tokens is not None:
            config = self.assistant.generation_config
            config.num_assistant_tokens = self.assistant_tokens
            config.num_assistant_tokens_schedule = "constant"
            config.assistant_confidence_threshold = None
        return saved


Runner = Callable[[Sequence[int], int], Outcome]
