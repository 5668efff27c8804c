"""`verispec check-runtime --jobs J`: the sampled law's parameters split over J processes.

A check's time is its samples. On 2 cores two processes of one thread each draw more samples
than one process with two threads: somewhat more for verispec's batched sampler (its Python
stages run on one core), up to twice for an engine that decodes one sequence at a time (hf,
llamacpp; docs/results/implementation-choices.md). Each process runs the same `verispec check-runtime` command on its share of the
parameters (round robin over the grid) with `--greedy-prompts 0 --seeded 0`, writing its JSON report to
a scratch directory, which is read back here. A sample's seed depends on its method, prompt
and index only, so the rows are those one process would write.

    >>> shares(["default", "temperature", "top_k"], 2)
    [['default', 'top_k'], ['temperature']]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from verispec.runtime_check.report import LawRow


def shares(names: Sequence[str], jobs: int) -> list[list[str]]:
    """`names` dealt round robin into at most `jobs` non-empty shares."""
    return [list(names[i::jobs]) for i in range(min(jobs, len(names)))]


def sampled_rows(
    argv: Sequence[str], names: Sequence[str], jobs: int, threads: int, api_key: str | None = None
) -> tuple[list[LawRow], list[dict]]:
    """The sampled-law rows of `names` (in their order) and the prompts, from one process per
    share, each `verispec` `argv` (a check-runtime command line without --parameter,
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
    return sorted(rows, key=lambda row: order[row.parameter]), reports[0]["prompts"]
