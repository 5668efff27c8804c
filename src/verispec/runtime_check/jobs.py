"""`verispec check-runtime --jobs J`: the sampled law's parameters split over J processes.

A check's time is its samples. On 2 cores two processes of one thread each draw more samples
than one process with two threads: somewhat more for verispec's batched sampler (its Python
stages run on one core), up to twice for an engine that decodes one sequence at a time (hf,
llamacpp; docs/results/implementation-choices.md). Each process runs the same `verispec check-runtime` command on its share of the
parameters (round robin over the grid) with `--greedy-prompts 0 --seeded 0`, writing its JSON report to
a scratch directory, which is read back here. A sample's seed depends on its method, prompt
and index only, so the rows are those one process would write. `run_jobs` is the whole check,
split or not; `command_words` spells the command line a report records, from the options the
command was given, as the processes' command lines are spelled (`law_options`).

    >>> shares(["default", "temperature", "top_k"], 2)
    [['default', 'top_k'], ['temperature']]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from verispec.runtime_check.check import Settings
from verispec.runtime_check.report import LawRow, Report
from verispec.runtime_check.run import parameter_names, run


def run_jobs(
    engine: str, *, model: str, dtype: str, methods: Sequence[str] | None, settings: Settings, greedy_file: Path | None,
    greedy_count: int, api_key: str | None = None, jobs: int = 1,
) -> Report:
    """`run.run`, the sampled law's parameters split over `jobs` processes when jobs > 1 (the
    threads of this machine's cores shared among them), the rest of the check run here."""
    if jobs == 1 or not settings.sampled:
        return run(engine, model=model, dtype=dtype, methods=methods, settings=settings, greedy_file=greedy_file,
                   greedy_count=greedy_count, api_key=api_key)
    argv = [*common_options(engine, methods, model, dtype), *law_options(settings)]
    names = [p for p in parameter_names() if not settings.parameters or p in settings.parameters]
    started = time.perf_counter()
    law_rows, prompts, drafts = sampled_rows(argv, names, jobs, max(1, len(os.sched_getaffinity(0)) // jobs), api_key)
    seconds = time.perf_counter() - started
    report = run(engine, model=model, dtype=dtype, methods=methods, settings=replace(settings, sampled=False),
                 greedy_file=greedy_file, greedy_count=greedy_count, api_key=api_key)
    report.law_rows, report.prompts, report.drafts = law_rows, prompts, drafts
    report.seconds = {"sampled law": seconds, **report.seconds}
    return report


def common_options(engine: str, methods: Sequence[str] | None, model: str, dtype: str) -> list[str]:
    """`check-runtime ENGINE` with its methods, model and dtype."""
    return ["check-runtime", engine, *[w for m in methods or () for w in ("--method", m)], "--model", model,
            "--dtype", dtype]


def law_options(settings: Settings) -> list[str]:
    """The sampled law's options (--tv or --n, cells, length, prompts, alpha), then --seed."""
    return [*(["--tv", f"{settings.tv:g}"] if settings.tv is not None else ["--n", str(settings.n)]),
            "--cells", str(settings.cells), "--length", str(settings.length),
            *([] if settings.sample_texts else ["--prompts", str(settings.prompts)]),
            *[w for t in settings.sample_texts for w in ("--sample-prompt", t)], "--alpha", f"{settings.alpha:g}",
            "--seed", str(settings.seed)]


def command_words(
    engine: str, methods: Sequence[str] | None, model: str, dtype: str, settings: Settings, *, greedy_count: int,
    prompts_file: Path | None, jobs: int, out: Path | None,
) -> list[str]:
    """The `verispec check-runtime` command line of a check, every default spelled out, for its
    report (`Report.command`)."""
    law = [*law_options(settings)[:-2], *[w for p in settings.parameters or () for w in ("--parameter", p)]]
    greedy = ["--greedy-tokens", str(settings.greedy_tokens), "--concurrency", str(max((1, *settings.concurrency)))]
    return ["verispec", *common_options(engine, methods, model, dtype), *(law if settings.sampled else ["--no-sampled"]),
            "--seed", str(settings.seed), "--seeded", str(settings.seeded), "--greedy-prompts", str(greedy_count),
            *(greedy if greedy_count else []), *(["--prompts-file", str(prompts_file)] if prompts_file else []),
            *(["--jobs", str(jobs)] if jobs > 1 else []), *(["--out", str(out)] if out else [])]


def shares(names: Sequence[str], jobs: int) -> list[list[str]]:
    """`names` dealt round robin into at most `jobs` non-empty shares."""
    return [list(names[i::jobs]) for i in range(min(jobs, len(names)))]


def sampled_rows(
    argv: Sequence[str], names: Sequence[str], jobs: int, threads: int, api_key: str | None = None
) -> tuple[list[LawRow], list[dict], list[tuple[str, str]]]:
    """The sampled-law rows of `names` (in their order), the prompts and the drafts the check
    chose (`merged_drafts`), from one process per share, each `verispec` `argv` (a check-runtime command line without --parameter,
    --greedy-prompts, --seeded and --out) with `threads` threads. A process that fails stops the others
    and raises ValueError (its own `error:` line is on stderr)."""
    env = os.environ | {"OMP_NUM_THREADS": str(threads)} | ({"VERISPEC_API_KEY": api_key} if api_key else {})
    with tempfile.TemporaryDirectory(prefix="verispec-check-") as scratch:
        running = []
        for i, share in enumerate(shares(names, jobs)):
            out = Path(scratch) / f"share-{i}"
            command = [sys.executable, "-m", "verispec", *argv, *[w for name in share for w in ("--parameter", name)],
                       "--greedy-prompts", "0", "--seeded", "0", "--out", str(out)]
            out.mkdir()
            running.append((subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env), out))
        try:
            for process, _ in running:
                if process.wait() not in (0, 1):  # 1: a check failed, which its report says
                    raise ValueError(f"a --jobs process of the check exited with {process.returncode} (its error is "
                                       "above); run without --jobs to see it alone")
        finally:
            for process, _ in running:
                if process.poll() is None:
                    process.kill()
        reports = [json.loads(next(out.glob("*.json")).read_text(encoding="utf-8")) for _, out in running]
    rows = [LawRow.from_dict(row) for report in reports for row in report["sampled_law"]]
    order = {name: i for i, name in enumerate(names)}
    return sorted(rows, key=lambda row: order[row.parameter]), reports[0]["prompts"], merged_drafts(reports, names)


def merged_drafts(reports: Sequence[dict], names: Sequence[str]) -> list[tuple[str, str]]:
    """The drafts the shares' `reports` chose, as one process lists them (`Report.drafts`): in
    the order of the parameters `names` they were chosen before, a draft that several
    processes chose alike listed once (a draft fitted once and kept for every parameter, as
    vLLM's, is fitted by each process: by the first of its parameters).

    >>> share = lambda *pairs: {"drafts": [{"parameter": p, "draft": d} for p, d in pairs]}
    >>> merged_drafts([share(("a", "x a"), ("c", "x c")), share(("b", "x b"))], ["a", "b", "c"])
    [('a', 'x a'), ('b', 'x b'), ('c', 'x c')]
    >>> merged_drafts([share(("a", "once")), share(("b", "once"))], ["a", "b"])
    [('a', 'once')]
    """
    order = {name: i for i, name in enumerate(names)}
    chosen = sorted(((d["parameter"], d["draft"]) for report in reports for d in report["drafts"]),
                    key=lambda pair: order[pair[0]])
    first: dict[str, str] = {}  # a draft's line -> the first parameter it was chosen before
    for parameter, line in chosen:
        first.setdefault(line, parameter)
    return [(parameter, line) for line, parameter in first.items()]
