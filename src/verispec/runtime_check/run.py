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

NO_MODEL = "none"  # --model none: the engine's model is not one verispec can load


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
    from verispec.models.loading.load import load_model

    check_options(engine_spec, settings.parameters)
    if model == NO_MODEL:
        return run_without_model(engine_spec, methods, settings, api_key)
    workloads = select(read_workloads(greedy_file), limit_per_category=1)[:greedy_count] if greedy_file and greedy_count else []
    loaded = load_model(model, dtype=dtype)
    engine = open_engine(engine_spec, loaded, dtype, api_key)
    chosen = _methods(engine, methods)
    reference = Reference(loaded.lm.score, lambda text: loaded.encode(text, chat=False), loaded.eos_token_ids)
    greedy_prompts = [w.token_ids(loaded) for w in workloads]
    return check_runtime(engine, reference, chosen, replace(settings, greedy_prompts=greedy_prompts))


def run_without_model(engine_spec: str, methods: Sequence[str] | None, settings: Settings, api_key: str | None) -> Report:
    """An `openai:URL` server whose model verispec cannot load: its own samples only, on the
    `--sample-prompt` texts it encodes itself (`check_runtime` without a reference)."""
    from verispec.runtime_check.engines.openai import OpenAIEngine, parse_urls

    name, _, argument = engine_spec.partition(":")
    if name != "openai":
        raise ValueError(f"--model {NO_MODEL} checks a server by its replies alone, so the engine must be openai:URL,PLAIN_URL, "
                         f"not {engine_spec!r}")
    if not settings.sample_texts:
        raise ValueError(f"--model {NO_MODEL} needs --sample-prompt: the server encodes the prompts as text")
    url, plain = parse_urls(argument)
    if plain is None and settings.sampled:
        raise ValueError(f"--model {NO_MODEL} has no exact law to test against, so its sampled law needs a plain server: "
                         "openai:URL,PLAIN_URL (or --no-sampled for seeded identity alone)")
    engine = OpenAIEngine(url, plain, None, "unknown", api_key)
    return check_runtime(engine, None, _methods(engine, methods), replace(settings, greedy_prompts=()))


def _methods(engine, methods: Sequence[str] | None) -> list[str]:
    """The methods to check: those named (each the engine's), or all of them."""
    chosen = list(engine.methods if methods is None else methods)
    unknown = [m for m in chosen if m not in engine.methods]
    if unknown:
        raise ValueError(f"{engine.name} has no method {unknown[0]!r}; choose from {', '.join(engine.methods)}")
    return chosen


def write(report: Report, directory: Path, names: tuple[str, str]) -> list[Path]:
    """The report as markdown and JSON in `directory`, under `names` (`outputs`)."""
    md, js = names
    (directory / md).write_text(report.markdown() + "\n", encoding="utf-8")
    (directory / js).write_text(json.dumps(report.as_dict(), indent=1, default=str) + "\n", encoding="utf-8")
    return [directory / md, directory / js]
