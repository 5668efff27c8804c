"""`verispec check-runtime` as one call: load verispec's copy of the weights, open the engine,
pick the prompts, check; and the report's two files."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from verispec.bench.workloads import read_workloads, select
from verispec.runtime_check.cases import default_cases
from verispec.runtime_check.check import Reference, Settings, check_runtime
from verispec.runtime_check.engines import check_spec, open_engine
from verispec.runtime_check.report import Report


def outputs(engine_spec: str, methods: Sequence[str] | None = None) -> tuple[str, str]:
    """The report's file names for an engine (and the methods named, if any):
    check-runtime-NAME[-METHOD...].md and .json.

    >>> outputs("openai:http://127.0.0.1:8000")
    ('check-runtime-openai.md', 'check-runtime-openai.json')
    >>> outputs("verispec", ["layerskip:8"])
    ('check-runtime-verispec-layerskip-8.md', 'check-runtime-verispec-layerskip-8.json')
    """
    name = "-".join([engine_spec.partition(":")[0], *(re.sub(r"[^A-Za-z0-9_.]+", "-", m) for m in methods or ())])
    return f"check-runtime-{name}.md", f"check-runtime-{name}.json"


def parameter_names() -> list[str]:
    """The grid's parameters, in its order."""
    return [case.name for case in default_cases(())]


def check_options(engine_spec: str, parameters: Sequence[str] | None) -> None:
    """Refuse an unknown engine or parameter name before any model loads."""
    check_spec(engine_spec)
    names = parameter_names()
    wrong = [p for p in parameters or () if p not in names]
    if wrong:
        raise ValueError(f"unknown parameter {wrong[0]!r}; choose from {', '.join(names)}")


def run(
    engine_spec: str,
    *,
    model: str,
    dtype: str,
    methods: Sequence[str] | None,
    settings: Settings,
    greedy_file: Path | None,
    greedy_count: int,
    api_key: str | None = None,
) -> Report:
    """Check `engine_spec` on `model`: `methods` (None: all the engine's); greedy identity on
    the first prompt of each category of `greedy_file`, at most `greedy_count` of them (None
    or 0: no greedy check)."""
    from verispec.models.load import load_model

    check_options(engine_spec, settings.parameters)
    workloads = select(read_workloads(greedy_file), limit_per_category=1)[:greedy_count] if greedy_file and greedy_count else []
    loaded = load_model(model, dtype=dtype)
    engine = open_engine(engine_spec, loaded, dtype, api_key)
    chosen = list(engine.methods if methods is None else methods)
    unknown = [m for m in chosen if m not in engine.methods]
    if unknown:
        raise ValueError(f"{engine.name} has no method {unknown[0]!r}; choose from {', '.join(engine.methods)}")
    reference = Reference(loaded.lm.score, lambda text: loaded.encode(text, chat=False), loaded.eos_token_ids)
    greedy_prompts = [w.token_ids(loaded) for w in workloads]
    return check_runtime(engine, reference, chosen, replace(settings, greedy_prompts=greedy_prompts))


def write(report: Report, directory: Path, names: tuple[str, str]) -> list[Path]:
    """The report as markdown and JSON in `directory`, under `names` (`outputs`)."""
    md, js = names
    (directory / md).write_text(report.markdown() + "\n", encoding="utf-8")
    (directory / js).write_text(json.dumps(report.as_dict(), indent=1, default=str) + "\n", encoding="utf-8")
    return [directory / md, directory / js]
