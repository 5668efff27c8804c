"""The sampling parameters a runtime check varies, and the exact law they define.

A `SamplingCase` is one point of the grid: a temperature and at most one other parameter
away from its neutral value, so that the order in which an engine applies its transforms
never matters to the check (HF applies top-k before min-p, vLLM after; llama.cpp filters
before the temperature). `next_token_law` is verispec's own float64 law for a case, written
here from the parameters' definitions: the penalties and the logit bias on the logits, then
`verispec.sampling.probabilities` (temperature, top-k, top-p, min-p).

Penalties, as the engines document them:
- repetition_penalty (CTRL, HF and vLLM): every token seen in the prompt or the output has its
  logit divided by the penalty when positive, multiplied by it when negative;
- frequency_penalty, presence_penalty (OpenAI, vLLM): a token's logit minus
  frequency x (its count in the output) minus presence x (1 if it occurs in the output);
- logit_bias (OpenAI): a constant added to a token's logit.

    >>> law = next_token_law(torch.tensor([0.0, 0.0, 1.0]), SamplingCase("bias", logit_bias=((0, 1.0),)), [5], [])
    >>> [round(x, 3) for x in law.tolist()]
    [0.422, 0.155, 0.422]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from verispec.sampling import SamplingParams, probabilities

PENALTIES = ("frequency_penalty", "presence_penalty", "logit_bias")  # what `SamplingParams` lacks


@dataclass(frozen=True)
class SamplingCase:
    """name: the table's parameter column. The fields are OpenAI's and vLLM's names; None (or
    an empty bias) is the neutral value. logit_bias: (token id, bias) pairs."""

    name: str
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def sampling(self) -> SamplingParams:
        """The transforms verispec's `SamplingParams` holds (the rest are `penalties`)."""
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                              repetition_penalty=self.repetition_penalty or 1.0)

    @property
    def penalties(self) -> tuple[str, ...]:
        """The parameters set here that verispec's `SamplingParams` has no field for."""
        return tuple(name for name in PENALTIES if getattr(self, name))

    def settings(self) -> dict:
        """The fields away from neutral, by name (for reports and request bodies)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "name" and value not in (None, ()) and not (f.name == "temperature" and value == 1.0):
                out[f.name] = [list(pair) for pair in value] if f.name == "logit_bias" else value
        return out


def default_cases(bias: tuple[tuple[int, float], ...]) -> list[SamplingCase]:
    """The grid: plain sampling, then each parameter alone. bias: the logit bias to test (the
    check picks tokens likely at its prompts, so the bias moves the law)."""
    return [
        SamplingCase("default"),
        SamplingCase("temperature", temperature=0.6),
        SamplingCase("top_k", top_k=5),
        SamplingCase("top_p", top_p=0.8),
        SamplingCase("min_p", min_p=0.1),
        SamplingCase("repetition_penalty", repetition_penalty=1.5),
        SamplingCase("frequency_penalty", frequency_penalty=1.5),
        SamplingCase("presence_penalty", presence_penalty=1.5),
        SamplingCase("logit_bias", logit_bias=bias),
    ]


def neutral(case: SamplingCase) -> SamplingCase:
    """The same case with every parameter at its neutral value (what an engine that dropped
    them would sample)."""
    return SamplingCase(f"{case.name} dropped")


def without_penalties(case: SamplingCase) -> SamplingCase:
    return replace(case, repetition_penalty=None, frequency_penalty=None, presence_penalty=None, logit_bias=())


def next_token_law(logits: torch.Tensor, case: SamplingCase, context: Sequence[int], output: Sequence[int]) -> torch.Tensor:
    """logits[V] after `context` (prompt + output so far) -> float64 probabilities[V] under
    `case`; output: the generated tokens so far (what frequency and presence count)."""
    scaled = logits.double().clone()  # [V]
    if case.repetition_penalty:
        seen = torch.tensor(sorted(set(context)), dtype=torch.long)
        values = scaled[seen]
        scaled[seen] = torch.where(values > 0, values / case.repetition_penalty, values * case.repetition_penalty)
    counts = Counter(output)
    for token, count in counts.items():
        scaled[token] -= (case.frequency_penalty or 0.0) * count + (case.presence_penalty or 0.0)
    for token, bias in case.logit_bias:
        scaled[token] += bias
    return probabilities(scaled[None], case.sampling)[0]
