"""`verispec audit`: prove on exact rational models that the engine's output distribution is
the target's, and that the audit still catches known-broken parts."""

from __future__ import annotations

import json

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from verispec.audit.exhaustive import TOLERANCE, audited_proposers, select_proposers
from verispec.audit.report import AuditReport, OracleCheck, all_configurations, run_audit
from verispec.cli import app


@app.command()
def audit(
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    proposer: list[str] = typer.Option(
        None, "--proposer", help=f"Audit only this proposer (repeatable): {', '.join(kind.name for kind in audited_proposers())}."
    ),
) -> None:
    """Exactness audit: rational oracle, every random branch of the engine on tiny table models
    against the target's exact distribution, and negative controls. Exit 1 on any failure."""
    configurations = all_configurations(select_proposers(proposer)) if proposer else None
    report = run_audit(configurations)
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
        oracle.add_row(escape(check.name), escape(check.detail), _verdict(check.passed))
    console.print(oracle)

    engine = Table(
        title="Engine, every random branch, vs the target's exact distribution",
        caption="V vocabulary, order of the tables, max new tokens; paths: random branches walked",
        box=box.SIMPLE_HEAD,
    )
    # Names stay whole on a narrow terminal (80 columns when piped); the scenario wraps.
    engine.add_column("proposer", min_width=max((len(r.proposer) for r in report.results), default=8))
    engine.add_column("rule", min_width=len("point-mass"))
    engine.add_column("scenario")
    engine.add_column("paths", justify="right")
    engine.add_column("max |diff|", justify="right", min_width=len("max |diff|"))
    engine.add_column("result", min_width=len("result"))
    for r in report.results:
        diff = "error" if r.error else f"{r.max_abs_diff:.1e}"
        engine.add_row(r.proposer, r.rule, r.scenario.name, str(r.paths), diff, _verdict(r.passed))
    console.print(engine)
    for r in report.results:
        if r.error:
            console.print(f"[red]{escape(r.name)}[/]: {escape(r.error)}", highlight=False)

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
        controls.add_row(escape(name), escape(evidence), "[green]caught[/]" if caught else "[red]missed[/]")
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
