"""Writes the results tables of README.md and docs/*.md from the kept runs' summaries.

    .venv/bin/python benchmarks/results_tables.py           # rewrite the tables in place
    .venv/bin/python benchmarks/results_tables.py --check   # exit 1 where a table is stale

A table lives between two markers naming the runs it shows (each run is
docs/results/NAME.json, the `summary.json` that `verispec bench --out NAME` wrote):

    <!-- results: eagle-int8-bf16 -->
    ...generated...
    <!-- /results -->

One run gives one row per method (tok/s, ratio to plain, tau, greedy identity); several runs
give one column pair per run (ratio to plain, tau), so one table compares dtypes or
temperatures of one command; a concurrency sweep gives, per method, each level's aggregate
tok/s, ratio to plain and k. Every number is read from the summaries, never typed by hand, so
`tests/test_docs.py` fails when a table and its summary disagree.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
BLOCK = re.compile(r"(<!-- results: ([\w.,+-]+) -->\n).*?(<!-- /results -->)", re.S)


def summary(name: str) -> dict:
    """The kept summary of run NAME (docs/results/NAME.json)."""
    return json.loads((RESULTS / f"{name}.json").read_text())


def _label(method: str, run: dict) -> str:
    return f"{method} (a peer)" if run["methods"][method].get("peer") else method


def _ratio(overall: dict) -> str:
    return f"{overall['speedup_median']:.2f}x ({overall['speedup_q1']:.2f}-{overall['speedup_q3']:.2f})"


def _identity(method: str, run: dict, overall: dict) -> str:
    if run["methods"][method]["family"] == "verispec" and run["methods"][method]["proposer"] is None:
        return "-"
    if overall["matching_runs"] is None:
        return "sampled"
    return f"{overall['matching_runs']}/{overall['runs']}"


def _machine(run: dict) -> str:
    h = run["header"]
    bf16 = "native bf16" if h["native_bf16"] else "no native bf16"
    return (
        f"{h['cpu']} ({bf16}), {h['logical_cpus']} logical CPUs, {h['torch_threads']} torch threads, "
        f"torch {h['torch']}, transformers {h['transformers']}"
    )


def _settings(run: dict) -> str:
    h = run["header"]
    t = h["sampling"]["temperature"]
    decoding = "greedy" if t == 0 else f"T = {t:g}"
    return f"{h['dtype']}, {decoding}, {h['prompts']} prompts x {h['repeats']}"


def single_table(name: str) -> str:
    """One run: a row per method, with the machine it ran on."""
    run = summary(name)
    rows = [
        "| method | tok/s (median) | x verispec-plain per prompt, median (IQR) | tau | equal to plain |",
        "|---|---|---|---|---|",
    ]
    for method, by_category in run["results"].items():
        o = by_category["overall"]
        rows.append(
            f"| {_label(method, run)} | {o['tokens_per_second_median']:.1f} | {_ratio(o)} "
            f"| {o['tokens_per_round']:.2f} | {_identity(method, run, o)} |"
        )
    rows.append("")
    rows.append(f"Run `{name}` ({_settings(run)}) on {_machine(run)}.")
    return "\n".join(rows)


def multi_table(names: list[str]) -> str:
    """Several runs of one command: per run, the ratio to plain and tau of each method."""
    runs = [summary(n) for n in names]
    methods = list(dict.fromkeys(m for run in runs for m in run["results"] if m != "verispec-plain"))
    head = "| method |" + "".join(
        f" {_settings(run)} (plain {run['results']['verispec-plain']['overall']['tokens_per_second_median']:.1f} tok/s) | tau |"
        for run in runs
    )
    rows = [head, "|---|" + "---|---|" * len(runs)]
    for method in methods:
        cells = []
        for run in runs:
            o = run["results"].get(method, {}).get("overall")
            cells.append(f" {_ratio(o)} | {o['tokens_per_round']:.2f} |" if o else " | |")
        label = next(_label(method, run) for run in runs if method in run["results"])
        rows.append(f"| {label} |" + "".join(cells))
    rows.append("")
    machines = dict.fromkeys(_machine(run) for run in runs)
    rows.append(f"Runs {', '.join(f'`{n}`' for n in names)} on {'; '.join(machines)}.")
    return "\n".join(rows)


def sweep_table(name: str) -> str:
    """A concurrency sweep (`verispec bench --concurrency`): per method and level, aggregate
    tok/s and its ratio to verispec-plain at the same level, the k drafted per round, and where
    speculation stops paying."""
    run = summary(name)
    levels = [str(c) for c in run["levels"]]
    head = "| method |" + "".join(f" c = {c}: tok/s | x plain | k |" for c in levels)
    rows = [head, "|---|" + "---|---|---|" * len(levels)]
    for method, by_level in run["results"].items():
        cells = []
        for c in levels:
            r = by_level.get(c)
            if r is None:
                cells.append(" | | |")
                continue
            k = "-" if r.get("drafted_per_round") is None else f"{r['drafted_per_round']:.2f}"
            cells.append(f" {r['tokens_per_second']['median']:.1f} | {r['over_plain']['median']:.2f}x | {k} |")
        rows.append(f"| {_label(method, run)} |" + "".join(cells))
    rows.append("")
    crossover = run.get("crossover", {})
    stops = [
        f"{method} at c = {x['concurrency']} ({x['rows']:.1f} rows a step, v = {x['v_rows']:.2f} against plain's "
        f"{x['v_plain_rows']:.2f} at {x['plain_rows']})"
        for method, x in crossover.items() if x.get("concurrency") is not None
    ]
    if stops:
        rows += ["Speculation stops paying: " + "; ".join(stops) + ".", ""]
    elif crossover:  # a run without speculative verispec methods says nothing of them
        rows += ["Every speculative verispec method is at or above verispec-plain (median) at every level measured.", ""]
    rows.append(f"Run `{name}` ({_settings(run)}, concurrency {', '.join(levels)}) on {_machine(run)}.")
    return "\n".join(rows)


def table(names: list[str]) -> str:
    if len(names) == 1 and "levels" in summary(names[0]):
        return sweep_table(names[0])
    return single_table(names[0]) if len(names) == 1 else multi_table(names)


def render(text: str) -> str:
    """TEXT with every marked block regenerated from its runs' summaries."""
    return BLOCK.sub(lambda m: f"{m.group(1)}{table(m.group(2).split(','))}\n{m.group(3)}", text)


def documents() -> list[Path]:
    """The files that may hold results tables: README.md and docs/*.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def stale() -> list[Path]:
    """The documents whose tables differ from their summaries."""
    return [p for p in documents() if render(p.read_text()) != p.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale tables; exit 1 if any")
    args = parser.parse_args(argv)
    if args.check:
        paths = stale()
        for p in paths:
            print(f"stale results table in {p.relative_to(ROOT)}; run benchmarks/results_tables.py", file=sys.stderr)
        return 1 if paths else 0
    for p in documents():
        text = p.read_text()
        if render(text) != text:
            p.write_text(render(text))
            print(f"rewrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
