"""`verispec audit`: prove on exact rational models that the engine's output distribution is
the target's, and that the audit still catches known-broken parts."""

from __future__ import annotations

import json

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from verispec.audit.exhaustive import TOLERANCE
from verispec.audit.report import AuditReport, OracleCheck, run_audit
from verispec.cli import app


@app.command()
def audit(
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Exactness audit: rational oracle, every random branch of the engine on tiny table models
    against the target's exact distribution, and negative controls. Exit 1 on any failure."""
    report = run_audit()
    if json_output:
        print(json.dumps(report.as_dict()))
    else:
        _render(report, Console())
    if not report.passed:
        raise typer.Exit(code=1)


def _render(report: AuditReport, console: Console) -> None:
    oracle = Table(title="Exact rational oracle (Fractions)", box=box.SIMPLE_HEAD)
    oracle.add_column("check")
    oracle.add_column("detail")
    oracle.add_column("result")
    for check in report.oracle:
        oracle.add_row(check.name, check.detail, _verdict(check.passed))
    console.print(oracle)

    engine = Table(
        title="Engine, every random branch, vs the target's exact distribution",
        caption="V vocabulary, ord table order, k hN: HeuristicK from N, max new tokens; paths: "
        "random branches walked, outputs: distinct sequences compared",
        box=box.SIMPLE_HEAD,
    )
    for column in ("proposer", "rule", "V", "ord", "k", "max", "sampling", "EOS"):
        engine.add_column(column)
    for column in ("paths", "outputs", "max |diff|"):
        engine.add_column(column, justify="right")
    engine.add_column("result")
    for r in report.results:
        s = r.scenario
        engine.add_row(
            r.proposer, r.rule, str(s.vocab), str(s.order), f"h{s.k}" if s.heuristic_k else str(s.k), str(s.max_new_tokens),
            s.sampling_label, "-" if s.eos_token_id is None else str(s.eos_token_id),
            str(r.paths), str(r.sequences), r.error or f"{r.max_abs_diff:.1e}", _verdict(r.passed),
        )
    console.print(engine)

    controls = Table(title="Negative controls (must fail)", box=box.SIMPLE_HEAD)
    controls.add_column("broken part")
    controls.add_column("evidence")
    controls.add_column("audit")
    for name, control in report.controls.items():
        if isinstance(control, OracleCheck):
            evidence = control.detail
        else:
            evidence = control.error or f"max |diff| {control.max_abs_diff:.3g}"
        caught = report.caught[name]
        controls.add_row(name, evidence, "[green]caught[/]" if caught else "[red]missed[/]")
    console.print(controls)

    n_caught = sum(report.caught.values())
    console.print(
        f"{len(report.results)} configurations, {sum(r.paths for r in report.results)} paths, "
        f"{len(report.failures)} failures, max |diff| {report.max_abs_diff:.1e} "
        f"(tolerance {TOLERANCE:g}), {n_caught}/{len(report.caught)} negative "
        f"controls caught, {report.seconds:.1f} s: "
        + ("[bold green]PASS[/]" if report.passed else "[bold red]FAIL[/]")
    )


def _verdict(passed: bool) -> str:
    return "[green]pass[/]" if passed else "[red]FAIL[/]"
