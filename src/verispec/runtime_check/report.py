"""What a runtime check found: one row per engine x method x parameter x test, one per greedy
method and concurrency, as markdown and as JSON, with the engine's versions and the machine.

A row's status: `pass`, `fail` (a failed test, or the engine crashed on the request:
`Crashed`), `refused` (the engine refused the parameter or mode; its reason is kept) or `skipped` (a comparison with a side that was refused). The report's
false-failure probability is the union bound over its statistical tests (alpha each); greedy
identity is deterministic and fails only on a divergence that is not a near tie.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from verispec.machine import describe
from verispec.runtime_check.power import NOT_COMPUTED
from verispec.runtime_check.engines.base import Crashed, Refused
from verispec.statistics import TestResult

PASS, FAIL, REFUSED, SKIPPED = "pass", "fail", "refused", "skipped"
HOLDS, LACKS = "holds", "lacks"  # a property the engine does not claim: seeded identity


@dataclass(frozen=True)
class LawRow:
    """One test of the sampled law. effect: the total variation the parameter makes to the
    exact law (0 for plain sampling): a pass can show the parameter was applied only when the
    effect exceeds the test's detectable TV. drafts: the tokens the engine drafted, and those
    it accepted (None if it cannot tell), per speculative sample, where it says (`CountsDrafts`):
    a method that drafts nothing on the prompts has its law checked only where it is plain.
    power: per named bug class, the TV it would make on the test's cells and the test's power
    against it, or None for a class whose power is not computed (`power.NOT_COMPUTED` says why)
    (`verispec.runtime_check.power`)."""

    engine: str
    method: str
    parameter: str
    settings: dict
    test: str
    status: str = SKIPPED
    result: TestResult | None = None
    reason: str = ""
    effect: float = 0.0
    drafts: tuple[float, float | None] | None = None
    power: dict[str, tuple[float, float] | None] | None = None  # named bug class -> (its TV on the cells, the power)

    def tested(self, result: TestResult) -> LawRow:
        """A test with no degrees of freedom (every cell pooled into one) tests nothing: skipped."""
        if result.df == 0:
            return replace(self, status=SKIPPED, result=result,
                           reason="no two cells reach 5 expected samples, so nothing is tested; raise --n")
        return replace(self, status=PASS if result.passed else FAIL, result=result)

    def refused(self, refusal: Refused) -> LawRow:
        return replace(self, status=FAIL if isinstance(refusal, Crashed) else REFUSED, reason=str(refusal))

    def skipped(self, reason: str) -> LawRow:
        return replace(self, status=SKIPPED, reason=reason)

    @classmethod
    def from_dict(cls, row: dict) -> LawRow:
        """The row `as_dict` wrote (a report read back: `verispec.runtime_check.jobs`)."""
        drafts = (row["drafted_per_sample"], row["accepted_per_sample"]) if "drafted_per_sample" in row else None
        power = {name: None if value["power"] is None else (value["tv"], value["power"])
                 for name, value in row["power"].items()} if row.get("power") else None
        return cls(row["engine"], row["method"], row["parameter"], row["settings"], row["test"], row["status"],
                   TestResult.from_dict(row["result"]) if "result" in row else None, row["reason"], row["effect_tv"],
                   drafts, power)

    def as_dict(self) -> dict:
        return {"engine": self.engine, "method": self.method, "parameter": self.parameter, "settings": self.settings,
                "test": self.test, "status": self.status, "reason": self.reason, "effect_tv": self.effect,
                **({"drafted_per_sample": self.drafts[0], "accepted_per_sample": self.drafts[1]} if self.drafts else {}),
                **({"result": self.result.as_dict()} if self.result else {}),
                **({"power": {name: _power_dict(name, pair) for name, pair in self.power.items()}} if self.power else {})}


def _power_dict(name: str, pair: tuple[float, float] | None) -> dict:
    if pair is None:
        return {"tv": None, "power": None, "not_computed": NOT_COMPUTED[name]}
    return {"tv": pair[0], "power": pair[1]}


@dataclass(frozen=True)
class GreedyRow:
    """Greedy identity of one method at one concurrency against plain at one request.
    divergences: per diverging prompt, the position and the diagnosis."""

    engine: str
    method: str
    concurrency: int
    prompts: int
    max_new_tokens: int
    status: str = SKIPPED
    divergences: tuple[dict, ...] = ()
    reason: str = ""

    def compared(self, divergences: list[dict]) -> GreedyRow:
        failed = any(not d["near_tie"] for d in divergences)
        return replace(self, status=FAIL if failed else PASS, divergences=tuple(divergences))

    def refused(self, refusal: Refused) -> GreedyRow:
        return replace(self, status=FAIL if isinstance(refusal, Crashed) else REFUSED, reason=str(refusal))

    @property
    def summary(self) -> str:
        if self.status in (REFUSED, SKIPPED) or self.reason:
            return self.reason
        if not self.divergences:
            return f"identical on {self.prompts} prompts"
        parts = [f"prompt {d['prompt']} at token {d['position']}: {'near tie' if d['near_tie'] else 'NOT a near tie'} "
                 f"(top-2 margin {d['top2_margin']:.3g} in verispec's logits"
                 + (f", {d['engine_top2_margin']:.3g} in {self.engine}'s, the lower token {d['engine_behind_max']:.3g} "
                    "below its maximum)" if "engine_top2_margin" in d else ")") for d in self.divergences]
        return f"{self.prompts - len(self.divergences)} of {self.prompts} identical; " + "; ".join(parts)

    def as_dict(self) -> dict:
        return {"engine": self.engine, "method": self.method, "concurrency": self.concurrency, "prompts": self.prompts,
                "max_new_tokens": self.max_new_tokens, "status": self.status, "reason": self.reason,
                "divergences": list(self.divergences)}


@dataclass(frozen=True)
class SeededRow:
    """Seeded identity of one method at one level in flight against plain one at a time
    (`verispec.runtime_check.seeded`): `identical` of `samples` equal token for token.
    claimed: the engine claims the identity, so a difference fails instead of being a property."""

    engine: str
    method: str
    in_flight: int
    samples: int
    claimed: bool
    status: str = SKIPPED
    identical: int = 0
    reason: str = ""

    def compared(self, identical: int) -> SeededRow:
        same = identical == self.samples
        return replace(self, identical=identical, status=PASS if same and self.claimed else HOLDS if same
                       else FAIL if self.claimed else LACKS)

    def refused(self, refusal: Refused) -> SeededRow:
        return replace(self, status=FAIL if isinstance(refusal, Crashed) else REFUSED, reason=str(refusal))

    @property
    def summary(self) -> str:
        return self.reason or f"{self.identical} of {self.samples} identical"

    def as_dict(self) -> dict:
        return {"engine": self.engine, "method": self.method, "in_flight": self.in_flight, "samples": self.samples,
                "claimed": self.claimed, "status": self.status, "identical": self.identical, "reason": self.reason}


@dataclass(frozen=True)
class ProbeRow:
    """The shared-stream probe of one method (`verispec.runtime_check.seeded`): the largest
    group of identical samples among `count` unseeded requests in flight on any of `prompts`
    prompts; a group of `threshold` or more fails (independent samples reach it with
    probability at most `bound`)."""

    engine: str
    method: str
    count: int
    prompts: int
    threshold: int
    bound: float
    status: str = SKIPPED
    group: int = 0
    reason: str = ""

    def counted(self, group: int) -> ProbeRow:
        return replace(self, group=group, status=FAIL if group >= self.threshold else PASS)

    def refused(self, refusal: Refused) -> ProbeRow:
        return replace(self, status=FAIL if isinstance(refusal, Crashed) else REFUSED, reason=str(refusal))

    def skipped(self, reason: str) -> ProbeRow:
        return replace(self, status=SKIPPED, reason=reason)

    @property
    def summary(self) -> str:
        return self.reason or (f"at most {self.group} of {self.count} requests identical on {self.prompts} prompts "
                               f"({self.threshold} fail: independent samples reach it with probability {self.bound:.2g} at most)")

    def as_dict(self) -> dict:
        return {"engine": self.engine, "method": self.method, "count": self.count, "prompts": self.prompts,
                "threshold": self.threshold, "bound": self.bound, "status": self.status, "largest_group": self.group,
                "reason": self.reason}


@dataclass
class Report:
    engine: str
    versions: dict
    alpha: float
    law_rows: list[LawRow] = field(default_factory=list)
    greedy_rows: list[GreedyRow] = field(default_factory=list)
    seeded_rows: list[SeededRow] = field(default_factory=list)
    probe_rows: list[ProbeRow] = field(default_factory=list)
    prompts: list[dict] = field(default_factory=list)
    machine: dict = field(default_factory=describe)
    command: str = ""
    seconds: dict = field(default_factory=dict)  # wall time per part: "sampled law", "greedy identity"
    not_run: list[str] = field(default_factory=list)  # the checks this run could not do, and why
    # the draft models the check chose (`FitsDraft`): (the parameter whose samples it was chosen before, a line)
    drafts: list[tuple[str, str]] = field(default_factory=list)

    @property
    def tests(self) -> int:
        """The statistical tests: the sampled law's and the probe's."""
        return sum(1 for row in [*self.law_rows, *self.probe_rows] if row.status in (PASS, FAIL))

    @property
    def false_failure(self) -> float:
        """Union bound: the probability that a correct engine fails any statistical row."""
        return min(1.0, self.alpha * self.tests)

    @property
    def passed(self) -> bool:
        return all(row.status != FAIL for row in [*self.law_rows, *self.greedy_rows, *self.seeded_rows, *self.probe_rows])

    def as_dict(self) -> dict:
        return {"engine": self.engine, "versions": self.versions, "machine": self.machine, "command": self.command,
                "alpha_per_test": self.alpha, "statistical_tests": self.tests, "false_failure_bound": self.false_failure,
                "passed": self.passed, "seconds": self.seconds, "not_run": self.not_run, "prompts": self.prompts,
                "drafts": [{"parameter": p, "draft": line} for p, line in self.drafts], "sampled_law": [r.as_dict() for r in self.law_rows],
                "greedy_identity": [r.as_dict() for r in self.greedy_rows],
                "seeded_identity": [r.as_dict() for r in self.seeded_rows], "shared_stream_probe": [r.as_dict() for r in self.probe_rows]}

    def markdown(self) -> str:
        lines = [f"# verispec check-runtime: {self.engine}", ""]
        if self.command:
            lines += ["```bash", self.command, "```", ""]
        lines += [f"- {name}: {value}" for name, value in self.versions.items()]
        lines += [f"- machine: {self.machine.get('cpu')}, {self.machine.get('logical_cpus')} logical CPUs, "
                  f"torch threads {self.machine.get('torch_threads')}, load {self.machine.get('load_average_1min')}"]
        if self.seconds:
            lines += ["- wall time: " + ", ".join(f"{part} {seconds / 60:.1f} min" for part, seconds in self.seconds.items())]
        lines += [f"- verdict: {'PASS' if self.passed else 'FAIL'}; {self.tests} statistical tests at alpha "
                  f"{self.alpha:g} each: a correct engine fails one with probability at most {self.false_failure:.2g}"]
        lines += [f"- not run: {item}" for item in self.not_run] + [""]
        if self.law_rows:
            lines += ["## Sampled law", ""]
            if self.prompts:
                lines += ["Prompts (raw text; next-token entropy): " + "; ".join(
                    f"{p['text']!r}" + (f" ({p['entropy_nats']:.2f} nats)" if p["entropy_nats"] is not None else "")
                    for p in self.prompts), ""]
            lines += [f"Draft chosen by the check: {line}." for _, line in self.drafts] + ([""] if self.drafts else [])
            lines += ["| method | parameter | test | result | p-value | TV | N | TV at 90 % power | effect | drafted / accepted a sample | note |",
                      "|---|---|---|---|---|---|---|---|---|---|---|"]
            for r in self.law_rows:
                t = r.result
                cells = ([f"{t.p_value:.3g}", f"{t.tv:.3f}", str(t.n), f"{t.detectable_tv:.3f}"] if t
                         else ["", "", "", ""])
                setting = ", ".join(f"{k}={v}" for k, v in r.settings.items()) or "-"
                lines.append(f"| {r.method} | {r.parameter} ({setting}) | {r.test} | {r.status} | "
                             + " | ".join(cells) + f" | {r.effect:.3f} | {_drafts(r.drafts)} | {_cell(r.reason)} |")
            lines += ["", "TV: the estimated total variation between the two laws on the test's cells (plug-in, "
                      "with sampling noise); TV at 90 % power: the smallest difference the test detects with 90 % power at "
                      "this N; effect: the total variation the parameter itself makes to the exact law; drafted / "
                      "accepted: the engine's speculation on these samples, where it says (in brackets: the share of "
                      "drafted tokens accepted).", ""]
            lines += _power_table([r for r in self.law_rows if r.power])
        if self.greedy_rows:
            lines += ["## Greedy identity", "", "| method | in flight | result | detail |", "|---|---|---|---|"]
            for r in self.greedy_rows:
                lines.append(f"| {r.method} | {r.concurrency} | {r.status} | {_cell(r.summary)} |")
            lines.append("")
        if self.seeded_rows:
            claimed = self.seeded_rows[0].claimed
            lines += ["## Seeded identity", "", f"The same seed against plain sampling one request at a time; the engine "
                      f"{'claims' if claimed else 'does not claim'} the identity, so a difference "
                      f"{'fails' if claimed else 'is a property (lacks), not a failure'}.", "",
                      "| method | in flight | result | detail |", "|---|---|---|---|"]
            lines += [f"| {r.method} | {r.in_flight} | {r.status} | {_cell(r.summary)} |" for r in self.seeded_rows]
            lines.append("")
        if self.probe_rows:
            lines += ["## Unseeded requests in flight (shared random stream)", "", "| method | result | detail |",
                      "|---|---|---|"]
            lines += [f"| {r.method} | {r.status} | {_cell(r.summary)} |" for r in self.probe_rows]
            lines.append("")
        return "\n".join(lines)


def _power_table(rows: list[LawRow]) -> list[str]:
    """Per tested row, the power against each named bug class (and its TV on the cells), with
    a draft that accepts half (`verispec.runtime_check.power`)."""
    if not rows:
        return []
    names = list(dict.fromkeys(name for r in rows for name in r.power))
    lines = ["### Power against named bug classes", "",
             "The power of each test against each class, and (in brackets) the TV the class makes on its cells, computed "
             "from the exact law with a draft that accepts half its tokens; a row that cannot see a class says so with "
             "power near alpha. Not computed: "
             + "; ".join(f"{name} ({why})" for name, why in NOT_COMPUTED.items()) + ".", "",
             "| method | parameter | test | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for r in rows:
        cells = ["" if n not in r.power else "not computed" if r.power[n] is None
                 else f"{r.power[n][1]:.2f} ({r.power[n][0]:.3f})" for n in names]
        lines.append(f"| {r.method} | {r.parameter} | {r.test} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _drafts(drafts: tuple[float, float | None] | None) -> str:
    if drafts is None:
        return ""
    drafted, accepted = drafts
    if accepted is None:
        return f"{drafted:.2f} / ?"
    return f"{drafted:.2f} / {accepted:.2f}" + (f" ({accepted / drafted:.0%})" if drafted else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
