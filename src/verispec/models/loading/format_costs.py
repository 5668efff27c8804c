"""What a target forward costs in each weight format and runtime, and `--dtype auto`'s choice
between formats at the rows a step will score.

A forward of n rows costs t(1) v(n): t(1) the one-row forward's seconds, v(n) its growth with
the rows (`verispec.cost.BatchCosts`). Formats grow differently: torch's int4 kernel (q4)
costs nearly in proportion to the rows past 4, oneDNN's bfloat16 products do not, so q4 may
win a lone request and lose a server's batch. A step scores `step_rows` rows (1 for plain
decoding, k + 1 with k drafts, slots x (k + 1) with requests batched), and `choose` takes the
format whose forward at those rows costs least: t(1) v(rows), the same as t(1) v(rows) / rows
per row scored, and, since a step emits the same tokens in either format, per emitted token.

The curves are this machine's where `verispec profile` measured them (`record`, read back by
`measured`: a cache beside the converted models, per file, CPU model and thread count), else
the documented defaults (`DEFAULTS`, measured on a 2-core AMD EPYC). Measured and default
curves are never mixed in one comparison: another machine's t(1) says nothing of this one's.
A runtime measured slower than transformers in the same format is never the auto choice
(`hf_faster`).

    >>> choice = choose((WeightFormat.Q4, WeightFormat.BFLOAT16), 1, measured_curves := ())
    >>> str(choice.chosen.weight_format), choice.measured
    ('q4', False)
    >>> str(choose((WeightFormat.Q4, WeightFormat.BFLOAT16), 12, measured_curves).chosen.weight_format)
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
from verispec.cost import BatchCosts
from verispec.k_spec import KSpec
from verispec.models.loading.parts import cache_root
from verispec.models.runtime import Runtime
from verispec.models.weight_format import WeightFormat

AUTO_DRAFTED = 2  # drafted tokens per round assumed for k auto, heuristic or a profiled tree (see `drafted`)


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


def drafted(k: KSpec | None) -> int:
    """The tokens a round drafts per request under `k`: 0 without a proposer, k for a constant
    k, a fixed tree's nodes, else `AUTO_DRAFTED` (auto chose 2.1-3.5 per round at one request
    and 0.1-1.4 at 2-8 requests on the 2-core AMD EPYC: docs/results/concurrency-bf16-r3.md)."""
    if k is None:
        return 0
    if k.kind == "constant":
        return k.k
    if k.kind == "tree" and k.widths is not None:
        return sum(math.prod(k.widths[:depth + 1]) for depth in range(len(k.widths)))
    return AUTO_DRAFTED


def step_rows(slots: int, k: KSpec | None) -> int:
    """The rows one target forward scores with `slots` requests in flight, each drafting as `k`
    says: slots x (drafted + 1)."""
    if not is_int(slots, least=1):
        raise ValueError(f"requests in flight must be an integer >= 1, got {slots!r}")
    return slots * (drafted(k) + 1)


@dataclass(frozen=True)
class FormatChoice:
    """`choose`'s answer: the rows assumed, each candidate's cost (the cheapest runtime of each
    format), the winner, and whether the curves are this machine's (`measured`)."""

    rows: int
    candidates: tuple[FormatCost, ...]
    chosen: FormatCost
    measured: bool

    @property
    def losers(self) -> tuple[FormatCost, ...]:
        return tuple(c for c in self.candidates if c is not self.chosen)

    def why(self) -> str:
        """Why the winner won, in one clause."""
        against = ", ".join(f"{1000 * c.seconds(self.rows):.2f} ms in {c.label}" for c in self.losers)
        origin = ("measured on this machine" if self.measured
                  else "on the documented curves (`verispec profile --keep-costs` measures this machine's)")
        return (f"at {self.rows} row(s) per step a forward costs {1000 * self.chosen.seconds(self.rows):.2f} ms in "
                f"{self.chosen.label} against {against}, {origin}")

    def to_dict(self) -> dict:
        return {
            "rows": self.rows,
            "measured": self.measured,
            "candidates": [
                {**c.to_dict(), "step_seconds": c.seconds(self.rows), "row_seconds": c.seconds(self.rows) / self.rows}
                for c in self.candidates
            ],
        }


def choose(formats: Sequence[WeightFormat], rows: int, curves: Sequence[FormatCost],
           runtimes: Sequence[Runtime] = (Runtime.FAST,)) -> FormatChoice:
    """The format among `formats` whose forward over `rows` rows costs least on `runtimes`,
    from `curves` (this machine's measurements, `measured`): those where every format has one on some runtime given, else
    `DEFAULTS`. A format's cost is its cheapest runtime's (so the fast runtime is never chosen
    where transformers was measured faster in that format); ties go to the earlier format."""
    if not is_int(rows, least=1):
        raise ValueError(f"rows per step must be an integer >= 1, got {rows!r}")
    usable = [c for c in curves if c.runtime in runtimes]
    measured = bool(usable) and all(any(c.weight_format == fmt for c in usable) for fmt in formats)
    pool = usable if measured else [c for c in DEFAULTS if c.runtime in runtimes]
    candidates = []
    for fmt in formats:
        own = [c for c in pool if c.weight_format == fmt]
        if not own:
            raise ValueError(f"no cost curve for {fmt} on the {' or '.join(runtimes)} runtime")
        candidates.append(min(own, key=lambda c: c.seconds(rows)))
    chosen = min(candidates, key=lambda c: c.seconds(rows))
    return FormatChoice(rows, tuple(candidates), chosen, measured)


def hf_faster(fmt: WeightFormat, rows: int, curves: Sequence[FormatCost]) -> tuple[FormatCost, FormatCost] | None:
    """(transformers' cost, the fast runtime's) where both were measured in `fmt` and
    transformers' forward over `rows` rows is the faster, else None."""
    fast = [c for c in curves if c.runtime == Runtime.FAST and c.weight_format == fmt]
    hf = [c for c in curves if c.runtime == Runtime.HF and c.weight_format == fmt]
    if fast and hf and hf[0].seconds(rows) < fast[0].seconds(rows):
        return hf[0], fast[0]
    return None


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
