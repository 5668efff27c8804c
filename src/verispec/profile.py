"""Measure the cost model's inputs on this machine: v(n) and c.

v(n) is the target's time to score n new tokens after the request's context, over the time of
one plain step (n = 1), so v(1) = 1; a round of k drafts scores n = k + 1 positions. c is the
proposer's time per drafted token over the same plain step. Both are measured at the actual
context length, the way the engine runs them: the context is prefilled once, then every
timed forward is `extend(n tokens)` followed by the `rollback` that a round performs. The n
values are interleaved and rotated across repeats so drift (thermal, other processes) spreads
over all of them instead of biasing the last; warm-up repeats are discarded.

A prompt-lookup proposer costs a dictionary probe per round: its c is honestly ~0.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from verispec.cost import check_survival, check_v_curve
from verispec.machine import describe
from verispec.models.base import CausalLM
from verispec.policies import AutoK
from verispec.proposers.base import Proposer
from verispec.randomness import TorchRandom
from verispec.sampling import SamplingParams


@dataclass(frozen=True)
class Timing:
    """Seconds over the measured repeats: median, quartiles and extremes."""

    median: float
    q1: float
    q3: float
    minimum: float
    maximum: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Timing:
        if not seconds:
            raise ValueError("a timing needs at least one measurement")
        quartiles = (
            statistics.quantiles(seconds, n=4, method="inclusive") if len(seconds) > 1 else [seconds[0]] * 3
        )
        return cls(statistics.median(seconds), quartiles[0], quartiles[2], min(seconds), max(seconds))


@dataclass
class Profile:
    """Measured costs in plain target steps, with the raw seconds behind them.

    v: v[n - 1] = v(n) = score[n - 1].median / score[0].median, n = 1..k_max + 1 (v[0] = 1).
    c: draft.median / score[0].median, one drafted token in plain target steps.
    score: seconds to score n new tokens and roll back, n = 1..k_max + 1.
    draft: seconds per drafted token (one `propose(context, k_max)` / k_max).
    drafted: mean tokens the proposer returned when asked for k_max (prompt lookup returns
        fewer, or none, where the context has no match).
    survival: optional measured s_i = P(first i drafted tokens accepted), i = 1..
    """

    c: float
    v: list[float]
    score: list[Timing]
    draft: Timing
    drafted: float
    context_tokens: int
    repeats: int
    machine: dict = field(default_factory=dict)
    target: str = ""
    proposer: str = ""
    survival: list[float] | None = None

    def __post_init__(self) -> None:
        check_v_curve(self.v)
        if len(self.v) < 2 or len(self.score) != len(self.v):
            raise ValueError(
                f"a profile needs v(n) and its timings for n = 1..k_max + 1 with k_max >= 1, got "
                f"{len(self.v)} v values and {len(self.score)} timings"
            )
        if not self.c >= 0:
            raise ValueError(f"c must be >= 0, got {self.c!r}")
        if self.survival is not None:
            check_survival(self.survival)

    @property
    def k_max(self) -> int:
        return len(self.v) - 1

    @property
    def step_seconds(self) -> float:
        """One plain target step (score one token, roll back), median seconds."""
        return self.score[0].median

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Profile:
        try:
            return cls(
                **{
                    **data,
                    "score": [Timing(**t) for t in data["score"]],
                    "draft": Timing(**data["draft"]),
                }
            )
        except (KeyError, TypeError) as error:
            raise ValueError(
                f"not a verispec profile ({error}); write one with `verispec profile --out FILE.json`"
            ) from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        text = Path(path).read_text()  # FileNotFoundError names the path
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not JSON ({error}); give a file from `verispec profile --out`") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} holds no profile object; give a file from `verispec profile --out`")
        return cls.from_dict(data)


def measure_profile(
    target: CausalLM,
    proposer: Proposer,
    prompt_ids: Sequence[int],
    *,
    k_max: int = 8,
    repeats: int = 7,
    warmup: int = 2,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> Profile:
    """Time the target's scoring of n = 1..k_max + 1 tokens and the proposer's drafting after
    `prompt_ids` (the context; its last token plays the round's pending token). `clock` reads
    seconds.

    Leaves the target's cache holding the context minus its last token; a request prefills
    anew.
    """
    for name, value, least in (("k_max", k_max, 1), ("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    context = [int(t) for t in prompt_ids]
    if not context:
        raise ValueError("the profile needs a nonempty context; give a prompt or --context-tokens")
    if not all(0 <= t < target.vocab_size for t in context):
        raise ValueError(f"context token ids must lie in the vocabulary [0, {target.vocab_size})")
    sampling = sampling or SamplingParams()
    rng = TorchRandom(seed)
    # A round scores [pending, x_1..x_k]; which ids fill the x_i does not change the time.
    block = [context[-1], *(context * (k_max // len(context) + 1))[:k_max]]
    ns = list(range(1, k_max + 2))
    score: dict[int, list[float]] = {n: [] for n in ns}
    draft: list[float] = []
    drafted: list[int] = []

    target.prefill(context[:-1])
    proposer.begin(context, sampling)
    for repeat in range(warmup + repeats):
        shift = repeat % len(ns)
        for n in ns[shift:] + ns[:shift]:
            start = clock()
            target.extend(block[:n])
            target.rollback(len(context) - 1)
            synchronize()
            score[n].append(clock() - start)
        start = clock()
        tokens = proposer.propose(context, k_max, rng)
        synchronize()
        draft.append((clock() - start) / k_max)
        proposer.commit(context)
        drafted.append(len(tokens))

    measured = slice(warmup, None)
    timings = [Timing.of(score[n][measured]) for n in ns]
    step = timings[0].median
    return Profile(
        c=Timing.of(draft[measured]).median / step,
        v=[t.median / step for t in timings],
        score=timings,
        draft=Timing.of(draft[measured]),
        drafted=statistics.fmean(drafted[measured]),
        context_tokens=len(context),
        repeats=repeats,
        machine=describe(),
    )


def measured_autok(
    target: CausalLM,
    proposer: Proposer,
    prompt_ids: Sequence[int],
    *,
    k_max: int = 8,
    sampling: SamplingParams | None = None,
    **options,
) -> AutoK:
    """An AutoK from a brief profile of this target and proposer after this prompt (two
    timed repeats after one warm-up: about a second on the default model); `options` go to
    `AutoK`."""
    profile = measure_profile(target, proposer, prompt_ids, k_max=k_max, repeats=2, warmup=1, sampling=sampling)
    return AutoK(profile, **options)


def synchronize() -> None:
    """Wait for queued GPU work, so a timer reads the forward and not only its launch."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
