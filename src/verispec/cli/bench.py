"""`verispec bench`: verispec's methods beside plain decoding and HF transformers, side by side."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from verispec.bench.methods import DEFAULT_METHODS
from verispec.cli import app
from verispec.models import DEFAULT_MODEL

if TYPE_CHECKING:
    from verispec.bench.suite import Settings


@app.command()
def bench(
    out: Annotated[Path, typer.Option(help="Directory for runs.jsonl, summary.json, report.md and the plots.")],
    prompts: Annotated[
        Optional[list[Path]],
        typer.Option(help="A Spec-Bench or HumanEval .jsonl file, read in place; repeat for several."),
    ] = None,
    categories: Annotated[
        Optional[str], typer.Option(help="Comma-separated categories to keep (HumanEval rows: humaneval).")
    ] = None,
    limit_per_category: Annotated[
        Optional[int], typer.Option("--limit-per-category", help="The first N prompts of each category.")
    ] = None,
    methods: Annotated[
        Optional[str],
        typer.Option(
            help="Comma-separated: verispec-plain, verispec-<lookup|suffix|draft:PATH|layerskip:L[:N]|random>-"
            f"<kN|auto|heuristic>, hf-generate, hf-lookup[-kN], hf-early-exit:L[-kN], hf-assisted[:PATH][-kN], "
            "llamacpp-plain, llamacpp-lookup[-kN] (pip install -e '.[llamacpp]'). "
            f"Default: {DEFAULT_METHODS} (--quick: every kind)."
        ),
    ] = None,
    max_new_tokens: Annotated[
        Optional[int], typer.Option("--max-new-tokens", help="New tokens per request at most [default: 128; --quick 16].")
    ] = None,
    repeats: Annotated[
        Optional[int], typer.Option(help="Measured runs of every method on every prompt [default: 3; --quick 1].")
    ] = None,
    warmup: Annotated[int, typer.Option(help="Discarded runs of every method before measuring.")] = 1,
    model: Annotated[str, typer.Option(help="Embedded name, HF checkpoint directory or .gguf file.")] = DEFAULT_MODEL,
    dtype: Annotated[str, typer.Option(help="auto (bf16 where the CPU has it natively), float32 or bfloat16.")] = "auto",
    threads: Annotated[Optional[int], typer.Option(help="torch threads for every method (default: torch's).")] = None,
    quick: Annotated[
        bool,
        typer.Option("--quick", help="A tiny random model built in code: every code path in seconds, no real numbers."),
    ] = False,
) -> None:
    """Benchmark speculative decoding against plain decoding and HF transformers (greedy).

    Every method runs on the same model object, dtype and thread count, interleaved per prompt
    with the order rotated; outputs are checked token for token against verispec-plain.
    """
    from verispec.bench.suite import Settings, run  # transformers: imported when needed

    settings = Settings(
        out=out,
        prompts=prompts or [],
        categories=[c.strip() for c in categories.split(",") if c.strip()] if categories else [],
        limit_per_category=limit_per_category,
        methods=methods,
        max_new_tokens=max_new_tokens if max_new_tokens is not None else (16 if quick else 128),
        repeats=repeats if repeats is not None else (1 if quick else 3),
        warmup=warmup,
        model=model,
        dtype=dtype,
        threads=threads,
        quick=quick,
    )
    settings.command = command_line(settings)
    summary = run(settings)
    print(f"wrote {out}/report.md, summary.json, runs.jsonl and {len(summary['plots'])} plots", file=sys.stderr)


def command_line(settings: Settings) -> str:
    """The command that repeats this benchmark, every setting spelled out."""
    words = ["verispec", "bench"]
    for path in settings.prompts:
        words += ["--prompts", str(path)]
    if settings.categories:
        words += ["--categories", ",".join(settings.categories)]
    if settings.limit_per_category is not None:
        words += ["--limit-per-category", str(settings.limit_per_category)]
    if settings.methods:
        words += ["--methods", settings.methods]
    words += ["--max-new-tokens", str(settings.max_new_tokens), "--repeats", str(settings.repeats),
              "--warmup", str(settings.warmup)]
    if settings.quick:
        words.append("--quick")
    else:
        words += ["--model", settings.model, "--dtype", settings.dtype]
    if settings.threads is not None:
        words += ["--threads", str(settings.threads)]
    return shlex.join([*words, "--out", str(settings.out)])
