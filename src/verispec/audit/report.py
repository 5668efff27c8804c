"""The whole exactness audit in one call: the rational oracle, the exhaustive engine
configurations and the negative controls, gathered in an `AuditReport`.

The audit passes when every oracle check holds, every configuration matches the target's
exact distribution within `TOLERANCE`, and every negative control is caught (reported as a
failure): a control that slips through means the audit has gone blind.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction

from verispec.audit.controls import NEGATIVE_CONTROLS
from verispec.audit.exhaustive import TOLERANCE, Configuration, Result, audit_configuration, default_configurations
from verispec.audit.oracle import (
    block_verdicts,
    expected_accepted,
    one_step_failures,
    quarter_simplex,
    repair_by_resampling_p,
    round_distribution,
    round_is_exact,
    token_level_verdicts,
    tree_round_is_exact,
)
from verispec.audit.trees import tree_configurations
from verispec.registry import ProposerKind
from verispec.tree_shape import TreeShape


@dataclass(frozen=True)
class OracleCheck:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class AuditReport:
    oracle: list[OracleCheck]
    results: list[Result]
    controls: dict[str, Result | OracleCheck]
    seconds: float

    @property
    def failures(self) -> list[Result | OracleCheck]:
        return [c for c in self.oracle if not c.passed] + [r for r in self.results if not r.passed]

    @property
    def max_abs_diff(self) -> float:
        """The largest engine-vs-exact difference over configurations that ran to the end."""
        return max((r.max_abs_diff for r in self.results if r.error is None), default=0.0)

    @property
    def caught(self) -> dict[str, bool]:
        return {name: not control.passed for name, control in self.controls.items()}

    @property
    def passed(self) -> bool:
        return not self.failures and all(self.caught.values())

    def as_dict(self) -> dict:
        return {
            "passed": self.passed,
            "configurations": len(self.results),
            "failures": [_failure(f) for f in self.failures],
            "max_abs_diff": self.max_abs_diff,
            "tolerance": TOLERANCE,
            "paths": sum(r.paths for r in self.results),
            "negative_controls": {n: "caught" if c else "missed" for n, c in self.caught.items()},
            "oracle": [{"name": c.name, "passed": c.passed, "detail": c.detail} for c in self.oracle],
            "results": [
                {"name": r.name, "passed": r.passed, "paths": r.paths, "sequences": r.sequences,
                 "drafted": r.drafted, "max_abs_diff": _finite(r.max_abs_diff), "error": r.error, "unlike_plain": r.unlike_plain,
                 "seconds": round(r.seconds, 4)}
                for r in self.results
            ],
            "seconds": round(self.seconds, 3),
        }


def run_audit(
    configurations: list[Configuration] | None = None,
    controls: dict[str, Configuration] | None = None,
) -> AuditReport:
    """Run the oracle checks, every configuration (default: `default_configurations()`) and
    every negative control (default: `NEGATIVE_CONTROLS`, plus the oracle's own)."""
    start = time.perf_counter()
    configurations = all_configurations() if configurations is None else configurations
    controls = NEGATIVE_CONTROLS if controls is None else controls
    control_results: dict[str, Result | OracleCheck] = {"oracle: repair by resampling p": resampling_oracle_check()}
    control_results.update((name, audit_configuration(config)) for name, config in controls.items())
    return AuditReport(
        oracle=oracle_checks(),
        results=[audit_configuration(config) for config in configurations],
        controls=control_results,
        seconds=time.perf_counter() - start,
    )


def all_configurations(proposers: list[ProposerKind] | None = None) -> list[Configuration]:
    """The chain configurations (`default_configurations`), then the tree ones
    (`tree_configurations`), of these proposer kinds (default: every audited one)."""
    return default_configurations(proposers) + tree_configurations(proposers)


TREE_SHAPES = (TreeShape.of([(0,), (1,), (0, 0)]), TreeShape.of([(0,), (1,), (2,)]))
"""The oracle's tree rounds: two siblings with a child under the first, and three siblings."""


def oracle_checks() -> list[OracleCheck]:
    grid = quarter_simplex()
    pairs = [(p, q) for p in grid for q in grid]
    failures = one_step_failures(grid=grid)
    checks = [OracleCheck(
        f"one token-level step = p on the quarter-grid simplex ({len(pairs)} pairs)",
        not failures, f"{len(failures)} pairs differ",
    )]
    for rule_name, verdicts in (("token-level", token_level_verdicts), ("block", block_verdicts)):
        wrong = [(p, q) for p, q in pairs if not round_is_exact(_fixed(p), _fixed(q), 2, verdicts)]
        checks.append(OracleCheck(
            f"one {rule_name} round, k 2, continued by p = p on the quarter grid ({len(pairs)} pairs)",
            not wrong, f"{len(wrong)} pairs differ",
        ))
    for shape in TREE_SHAPES:
        for siblings, chosen in (("chosen", True), ("sampled", False)):
            wrong = [(p, q) for p, q in pairs if not tree_round_is_exact(_fixed(p), _fixed(q), shape, chosen)]
            checks.append(OracleCheck(
                f"one tree round ({shape.describe()}, {siblings} siblings) continued by p = p on the "
                f"quarter grid ({len(pairs)} pairs)",
                not wrong, f"{len(wrong)} pairs differ",
            ))
    third, two_thirds = Fraction(1, 3), Fraction(2, 3)
    p, q = _fixed((third, two_thirds)), _fixed((two_thirds, third))
    token = expected_accepted(round_distribution(p, q, 2, token_level_verdicts))
    block = expected_accepted(round_distribution(p, q, 2, block_verdicts))
    checks.append(OracleCheck(
        "expected accepted drafts, p (1/3, 2/3), q (2/3, 1/3), k 2: token-level 10/9, block 11/9",
        (token, block) == (Fraction(10, 9), Fraction(11, 9)), f"token-level {token}, block {block}",
    ))
    return checks


def resampling_oracle_check() -> OracleCheck:
    """The seed's negative control through the one-step oracle: it passes (is missed) only if
    the wrong repair looks exact."""
    p = (Fraction(1, 10), Fraction(3, 10), Fraction(6, 10))
    q = (Fraction(4, 10), Fraction(4, 10), Fraction(2, 10))
    wrong = repair_by_resampling_p(p, q)
    failures = one_step_failures(repair_by_resampling_p)
    return OracleCheck(
        "oracle: repair by resampling p",
        wrong == p and not failures,
        f"seed example emits {[str(x) for x in wrong]}; {len(failures)} quarter-grid pairs differ",
    )


def _fixed(row: tuple[Fraction, ...]):
    """Rows that ignore the drafted prefix (context-free p or q)."""
    return lambda prefix: row


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _failure(failure: Result | OracleCheck) -> dict:
    if isinstance(failure, OracleCheck):
        return {"name": failure.name, "detail": failure.detail}
    return {"name": failure.name, "max_abs_diff": _finite(failure.max_abs_diff), "error": failure.error}
