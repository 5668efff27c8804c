"""HF transformers' `generate` as a peer decoding the same model object: one request at a time
(`HFRunner`, plain or assisted: prompt lookup, early exit, an assistant model) or a left-padded
batch (`HFBatchServer`, the closed loop's server). Every call decodes with exactly verispec's
sampling transforms, the same EOS ids and an all-ones attention mask, so a greedy output must
equal verispec-plain's token for token; tokens are noted as HF's streamer receives them.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence

import torch
from transformers import GenerationConfig
from transformers.generation.streamers import BaseStreamer

from verispec.peers.outcome import Clock, Outcome, Served
from verispec.sampling import GREEDY, SamplingParams


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


class StepClock(BaseStreamer):
    """An HF streamer noting when each decoding step's tokens arrive (all rows of the batch at
    once); the first `put` is the prompt."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.prompt_seen = False
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.times.append(self.clock())

    def end(self) -> None:
        pass


class HFBatchServer:
    """HF `generate` over a left-padded batch of the requests submitted since the last step,
    greedy or sampled like `HFRunner` (the same GenerationConfig). Whole batches: a step decodes
    its batch to the end, so a request that finishes early waits for the batch (its `finished`
    time is still when its last token arrived). Left padding with an attention mask (pad = the
    first EOS id): HF derives each row's positions from the mask, so a padded row decodes what
    it would alone, up to the batched arithmetic's rounding (`peer` says so when c > 1)."""

    def __init__(
        self,
        model,
        eos_token_ids: Sequence[int],
        sampling: SamplingParams = GREEDY,
        seed: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("a padded HF batch pads with the EOS id; the target names none")
        self.runner = HFRunner(model, eos_token_ids, sampling=sampling, seed=seed)
        self.clock = clock
        self.queue: list[tuple[int, list[int], int, float]] = []  # key, prompt, budget, submitted

    @property
    def in_flight(self) -> int:
        return len(self.queue)

    def submit(self, key: int, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
        self.queue.append((key, [int(t) for t in prompt_ids], max_new_tokens, self.clock()))

    def step(self) -> list[Served]:
        if not self.queue:
            return []
        batch, self.queue = self.queue, []
        budget = max(b for _, _, b, _ in batch)
        width = max(len(ids) for _, ids, _, _ in batch)
        pad = self.runner.eos_token_ids[0]
        ids = torch.tensor([[pad] * (width - len(p)) + p for _, p, _, _ in batch])  # [B, T]
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for _, p, _, _ in batch])  # [B, T]
        steps = StepClock(self.clock)
        if not self.runner.sampling.greedy:
            torch.manual_seed(self.runner.seed)
        with torch.inference_mode():
            out = self.runner.model.generate(
                ids, attention_mask=mask, generation_config=self.runner.config(budget), streamer=steps
            )  # [B, T + n]
        eos = set(self.runner.eos_token_ids)
        peer = None if len(batch) == 1 else f"HF generate, a left-padded batch of {len(batch)} (batched arithmetic)"
        served = []
        for row, (key, _, max_new, submitted) in enumerate(batch):
            tokens = []
            for token in out[row, width:].tolist()[:max_new]:
                tokens.append(int(token))
                if token in eos:
                    break
            first = steps.times[0] if tokens else None
            finished = steps.times[len(tokens) - 1] if tokens else self.clock()
            served.append(Served(key, tokens, submitted, first, finished, peer=peer))
        return served
