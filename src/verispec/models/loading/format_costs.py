"""What a target forward costs in each weight format and runtime, and `--dtype auto`'s choice
between formats by the tokens per second the cost model expects of each.

A forward of n rows costs t(1) v(n): t(1) the one-row forward's seconds, v(n) its growth with
the rows (`verispec.cost.BatchCosts`). Formats grow differently: torch's int4 kernel (q4)
costs nearly in proportion to the rows past 4, oneDNN's bfloat16 products do not, so q4 may
win plain decoding and lose speculative decoding, whose rounds score k + 1 rows, or a
server's batch. So `choose` weighs a `Workload` (the requests in flight and how each drafts:
its proposer's expected acceptance and draft cost, its k policy) and takes the candidate
whose expected tokens per second is highest, at the k each would then choose (`expect`, the
speed equation of `verispec.cost` with v(n) of each candidate's own curve). Plain decoding of
one request reduces to the cheapest one-row forward.

The curves are this machine's where `verispec profile` measured them (`record`, read back by
`measured`: a cache beside the converted models, per file, CPU model and thread count), else
the documented defaults (`DEFAULTS`, measured on a 2-core AMD EPYC). Measured and default
curves are never mixed in one comparison: another machine's t(1) says nothing of this one's.
A runtime measured slower than transformers in the same format is never the auto choice
(`hf_faster`).

    >>> plain = choose((WeightFormat.Q4, WeightFormat.BFLOAT16), measured_curves := ())
    >>> str(plain.chosen.cost.weight_format), plain.chosen.k, plain.measured
    ('q4', 'k = 0', False)
    >>> server = Workload(slots=8, drafting=Drafting("lookup", KSpec("constant", k=2)))
    >>> str(choose((WeightFormat.Q4, WeightFormat.BFLOAT16), measured_curves, workload=server).chosen.cost.weight_format)
    'bfloat16'
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from verispec.checks import is_int
from verispec.cost import K_MAX, MARGIN, PRIOR_RATE, BatchCosts, check_alpha, check_costs
from verispec.k_spec import KSpec
from verispec.models.loading.parts import cache_root
from verispec.models.runtime import Runtime
from verispec.models.weight_format import WeightFormat


@dataclass(frozen=True)
class FormatCost:
    """One runtime's forward in one weight format: t1 seconds for one row, v [P] at `rows` [P]
    (from 1, v(1) = 1; linear between and beyond, as `BatchCosts`), and where they come from."""

    runtime: Runtime
    weight_format: WeightFormat
    t1: float
    rows: tuple[int, ...]
    v: tuple[float, ...]
    source: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "runtime", Runtime(self.runtime))  # a name (a JSON file's) is read once
        object.__setattr__(self, "weight_format", WeightFormat(self.weight_format))
        object.__setattr__(self, "rows", tuple(self.rows))
        object.__setattr__(self, "v", tuple(float(x) for x in self.v))
        if not (isinstance(self.t1, (int, float)) and math.isfinite(self.t1) and self.t1 > 0):
            raise ValueError(f"t(1) must be a finite number of seconds > 0, got {self.t1!r}")
        BatchCosts(self.rows, self.v)  # refuses a curve that is no curve

    @property
    def label(self) -> str:
        return f"{self.weight_format} on {self.runtime.named}"

    def seconds(self, rows: int) -> float:
        """One forward over `rows` rows: t(1) v(rows)."""
        return self.t1 * BatchCosts(self.rows, self.v).at(rows)

    def describe(self, rows: int) -> str:
        ms = 1000 * self.seconds(rows)
        return (f"{self.label}: {1000 * self.t1:.2f} ms x v({rows}) {self.seconds(rows) / self.t1:.2f} = "
                f"{ms:.2f} ms per step, {ms / rows:.2f} ms per row; {self.source}")

    def to_dict(self) -> dict:
        return {"runtime": str(self.runtime), "format": str(self.weight_format), "t1": self.t1, "rows": list(self.rows),
                "v": list(self.v), "source": self.source}

    @classmethod
    def from_dict(cls, data: dict) -> FormatCost:
        return cls(Runtime(data["runtime"]), WeightFormat(data["format"]), data["t1"], tuple(data["rows"]), tuple(data["v"]),
                   data["source"])


# The fast runtime on the default model, 2-core AMD EPYC with native bf16, 2 torch threads,
# nothing else running. t(1): one over plain decoding's tokens/s (docs/results/q4.md: 75.5;
# docs/results/fast-runtime-bf16.md: 62.3). v: bfloat16's batched forward over 1..64 rows
# (docs/results/concurrency-bf16-r3.json, header.batch_costs); q4's projections at 2..9 rows on
# the same CPU (docs/runtime.md, exact q4 layers) and its whole forward at 8 and 64 rows on a
# 2-core Intel Xeon with AMX, the only q4 batch measured.
DEFAULT_Q4 = FormatCost(
    Runtime.FAST, WeightFormat.Q4, 1 / 75.5,
    (1, 2, 4, 5, 8, 9, 64), (1.0, 1.26, 1.49, 2.05, 2.69, 3.00, 13.85),
    "documented defaults (2-core AMD EPYC; v(8), v(64) a 2-core Intel Xeon)",
)
DEFAULT_BF16 = FormatCost(
    Runtime.FAST, WeightFormat.BFLOAT16, 1 / 62.3,
    (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64),
    (1.0, 1.244, 1.305, 1.392, 1.700, 2.183, 2.534, 2.659, 2.974, 3.247, 4.196, 4.557),
    "documented defaults (2-core AMD EPYC)",
)
DEFAULTS = (DEFAULT_Q4, DEFAULT_BF16)


@dataclass(frozen=True)
class Drafting:
    """How a request drafts, as `--dtype auto` expects it to before any round: its proposer
    (a name, for the reason), its k policy, each drafted token accepted with probability
    `acceptance` (independently: `verispec.cost.expected_tokens`), and a drafted token's
    seconds as a share `draft` of the fastest candidate's one-row forward (a proposer drafts in
    its own format whatever the target's, so its seconds are the same beside every candidate)."""

    proposer: str
    k: KSpec
    acceptance: float = PRIOR_RATE
    draft: float = 0.0

    def __post_init__(self) -> None:
        check_alpha(self.acceptance)
        check_costs(self.draft, 1.0)

    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """The plans a round may take: a tree's widths per depth ((1,) * k a chain of k, ()
        plain). A constant k or tree is its own; an adaptive policy (auto, heuristic, a
        profiled tree) may take plain decoding or any chain up to `K_MAX` and is expected to
        take the best (`Expectation`), as `AutoK` does with these priors."""
        if self.k.kind == "constant":
            return ((1,) * self.k.k,)
        if self.k.kind == "tree" and self.k.widths is not None:
            return (self.k.widths,)
        return tuple((1,) * k for k in range(K_MAX + 1))


@dataclass(frozen=True)
class Workload:
    """What a step decodes, as `--dtype auto` weighs it: `slots` requests in flight, each
    drafting as `drafting` says (None: plain decoding; `note` says why where a proposer was
    named but has no draft cost to expect)."""

    slots: int = 1
    drafting: Drafting | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if not is_int(self.slots, least=1):
            raise ValueError(f"requests in flight must be an integer >= 1, got {self.slots!r}")

    def describe(self) -> str:
        requests = f"{self.slots} request{'s' if self.slots > 1 else ''} in flight"
        d = self.drafting
        if d is None:
            return f"plain decoding, {requests}{f' ({self.note})' if self.note else ''}"
        prior = " (AutoK's prior)" if d.acceptance == PRIOR_RATE else ""
        return (f"{d.proposer} at k {d.k.text or d.k.kind}, {requests}; expected acceptance {d.acceptance:.2f} per "
                f"drafted token{prior}, a drafted token {d.draft:.3f} of the fastest one-row forward")

    def to_dict(self) -> dict:
        d = self.drafting
        return {"slots": self.slots, "proposer": None if d is None else d.proposer,
                "k": None if d is None else (d.k.text or d.k.kind), "acceptance": None if d is None else d.acceptance,
                "draft": None if d is None else d.draft, "note": self.note}


PLAIN = Workload()


def tokens_per_round(shape: tuple[int, ...], acceptance: float) -> float:
    """Expected tokens a round of this tree shape emits: 1 + the sum over depths d of the chance
    that every level down to d holds an accepted token, a level of w candidates holding one
    with chance 1 - (1 - acceptance)^w (a chain of k: `verispec.cost.expected_tokens`).

    >>> tokens_per_round((1, 1), 0.5), tokens_per_round((2,), 0.5)
    (1.75, 1.75)
    """
    survive, total = 1.0, 1.0
    for width in shape:
        survive *= 1 - (1 - acceptance) ** width
        total += survive
    return total


def scored_rows(shape: tuple[int, ...]) -> int:
    """Rows a request scores in a round of this shape: its pending token and every node."""
    return 1 + sum(math.prod(shape[:depth + 1]) for depth in range(len(shape)))


@dataclass(frozen=True)
class Expectation:
    """One candidate under a workload: the shape each round is expected to take (() plain, (1,)
    * k a chain of k) and the tokens per second the cost model expects of it, every request
    together: slots E / (slots D d + t(1) v(slots n)) with E the tokens a round emits, D its
    depth, d a drafted token's seconds and n the rows a request scores."""

    cost: FormatCost
    shape: tuple[int, ...]
    tokens_per_s: float
    plain_tokens_per_s: float

    @property
    def k(self) -> str:
        if all(w == 1 for w in self.shape):
            return f"k = {len(self.shape)}"
        return "tree " + "x".join(map(str, self.shape))

    def describe(self) -> str:
        return (f"{self.cost.label}: {self.tokens_per_s:.1f} tok/s expected at {self.k} (plain {self.plain_tokens_per_s:.1f} "
                f"tok/s, one-row forward {1000 * self.cost.t1:.2f} ms); {self.cost.source}")

    def to_dict(self) -> dict:
        return {**self.cost.to_dict(), "tokens_per_s": self.tokens_per_s, "k": self.k,
                "plain_tokens_per_s": self.plain_tokens_per_s}


def expect(cost: FormatCost, workload: Workload, draft_seconds: float) -> Expectation:
    """What `cost`'s forward is expected to decode under `workload`, a drafted token taking
    `draft_seconds`: the best of the shapes its k policy may take, a drafting shape only where it
    beats plain decoding by `MARGIN` (as `AutoK` speculates)."""
    slots = workload.slots

    def rate(shape: tuple[int, ...], acceptance: float) -> float:
        seconds = slots * len(shape) * draft_seconds + cost.seconds(slots * scored_rows(shape))
        return slots * tokens_per_round(shape, acceptance) / seconds

    plain = rate((), 0.0)
    drafting = workload.drafting
    if drafting is None:
        return Expectation(cost, (), plain, plain)
    shapes = drafting.shapes()
    best = max(shapes, key=lambda shape: rate(shape, drafting.acceptance))
    if len(shapes) > 1 and rate(best, drafting.acceptance) <= (1 + MARGIN) * plain:
        best = ()
    return Expectation(cost, best, rate(best, drafting.acceptance), plain)


@dataclass(frozen=True)
class FormatChoice:
    """`choose`'s answer: the workload weighed, each candidate's expectation (every format on
    every runtime offered that has a curve), the winner, the seconds of a drafted token, and
    whether the curves are this machine's (`measured`)."""

    workload: Workload
    candidates: tuple[Expectation, ...]
    chosen: Expectation
    measured: bool
    draft_seconds: float = 0.0

    @property
    def losers(self) -> tuple[Expectation, ...]:
        return tuple(c for c in self.candidates if c is not self.chosen)

    def why(self) -> str:
        """Why the winner won, in one clause."""
        won = self.chosen
        against = ", ".join(f"{c.tokens_per_s:.1f} in {c.cost.label} at {c.k}" for c in self.losers)
        origin = ("measured on this machine" if self.measured
                  else "on the documented curves (`verispec profile --keep-costs` measures this machine's)")
        return (f"{won.cost.label} is expected to decode {won.tokens_per_s:.1f} tok/s at {won.k} against {against} "
                f"(for {self.workload.describe()}), {origin}")

    def to_dict(self) -> dict:
        return {"workload": self.workload.to_dict(), "measured": self.measured, "draft_seconds": self.draft_seconds,
                "candidates": [c.to_dict() for c in self.candidates]}


def choose(formats: Sequence[WeightFormat], curves: Sequence[FormatCost], runtimes: Sequence[Runtime] = (Runtime.FAST,),
           workload: Workload = PLAIN) -> FormatChoice:
    """The format among `formats`, on one of `runtimes`, whose expected tokens per second under
    `workload` is highest (`expect`), from `curves` (this machine's measurements, `measured`):
    those where every format has one on some runtime given, else `DEFAULTS`. For plain decoding
    of one request that is the cheapest one-row forward; a drafted token costs the workload's
    share of the fastest candidate's one-row forward. Ties go to the earlier candidate."""
    usable = [c for c in curves if c.runtime in runtimes]
    measured = bool(usable) and all(any(c.weight_format == fmt for c in usable) for fmt in formats)
    pool = usable if measured else [c for c in DEFAULTS if c.runtime in runtimes]
    offered = []
    for fmt in formats:
        own = [c for c in pool if c.weight_format == fmt]
        if not own:
            raise ValueError(f"no cost curve for {fmt} on the {' or '.join(runtimes)} runtime")
        offered.extend(own)
    draft_seconds = 0.0 if workload.drafting is None else workload.drafting.draft * min(c.t1 for c in offered)
    candidates = tuple(expect(c, workload, draft_seconds) for c in offered)
    chosen = max(candidates, key=lambda c: c.tokens_per_s)  # the first of the best
    return FormatChoice(workload, candidates, chosen, measured, draft_seconds)


def hf_faster(fmt: WeightFormat, curves: Sequence[FormatCost],
              workload: Workload = PLAIN) -> tuple[Expectation, Expectation] | None:
    """(transformers' expectation, the fast runtime's) where both were measured in `fmt` and
    transformers is expected to decode `workload` faster, else None."""
    fast = [c for c in curves if c.runtime == Runtime.FAST and c.weight_format == fmt]
    hf = [c for c in curves if c.runtime == Runtime.HF and c.weight_format == fmt]
    if not (fast and hf):
        return None
    choice = choose((fmt,), (fast[0], hf[0]), (Runtime.FAST, Runtime.HF), workload)
    fast_runtime, transformers = choice.candidates
    return (transformers, fast_runtime) if transformers.tokens_per_s > fast_runtime.tokens_per_s else None


def costs_file(source: Path) -> Path:
    """Where the measured curves of a model file or checkpoint directory live; a changed file
    (or a directory's changed config) gets a new key, so stale timings are never read."""
    stat = (source / "config.json" if source.is_dir() else source).stat()
    identity = f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    return cache_root() / "costs" / f"{source.name}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.json"


def measured(source: Path, cpu: str, threads: int) -> tuple[FormatCost, ...]:
    """The curves `verispec profile` recorded for `source` on a CPU of this model name with this
    many torch threads (none where nothing was recorded, or the file cannot be read)."""
    try:
        entries = json.loads(costs_file(source).read_text())
        return tuple(FormatCost.from_dict(e["cost"]) for e in entries if e["cpu"] == cpu and e["threads"] == threads)
    except (OSError, ValueError, KeyError, TypeError):
        return ()


def record(source: Path, cost: FormatCost, cpu: str, threads: int) -> Path:
    """Keep `cost` as the curve of its runtime and format for `source` on this CPU and thread
    count (replacing an older one), where `measured` reads it; returns the file."""
    path = costs_file(source)
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        entries = []
    key = (str(cost.runtime), str(cost.weight_format), cpu, threads)
    entries = [e for e in entries if (e["cost"]["runtime"], e["cost"]["format"], e["cpu"], e["threads"]) != key]
    entries.append({"cpu": cpu, "threads": threads, "cost": cost.to_dict()})
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(entries, indent=1))
    temporary.replace(path)
    return path
