"""`verispec bench`: verispec's methods beside plain decoding and HF transformers, side by side."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from verispec.bench.methods import DEFAULT_METHODS
from verispec.cli import BadInput, app
from verispec.cli.runtime_options import CacheTypeVOption, DeterministicOption, DeviceOption, RuntimeOption
from verispec.cli.paths import FORCE_HELP, check_output_directory, nothing_left_on_failure
from verispec.models import DEFAULT_MODEL
from verispec.registry import proposer_grammar
from verispec.sampling import SamplingParams

if TYPE_CHECKING:
    from verispec.bench.settings import Settings


@app.command()
def bench(
    out: Annotated[
        Path,
        typer.Option(
            help="A new or empty directory for runs.jsonl, summary.json, report.md and the plots; one that "
            "already holds results is refused unless --force."
        ),
    ],
    prompts: Annotated[
        Optional[list[Path]],
        typer.Option(
            help="A Spec-Bench or HumanEval .jsonl file, read in place; repeat for several.",
            show_default="none; --quick: built-in prompts",
        ),
    ] = None,
    categories: Annotated[
        Optional[str],
        typer.Option(help="Comma-separated categories to keep (HumanEval rows: humaneval).", show_default="all"),
    ] = None,
    limit_per_category: Annotated[
        Optional[int],
        typer.Option("--limit-per-category", min=1, help="The first N prompts of each category.", show_default="all"),
    ] = None,
    methods: Annotated[
        Optional[str],
        typer.Option(
            help=f"Comma-separated: verispec-plain, verispec-<{proposer_grammar(' | ')}>-"
            "<kN|auto|heuristic|tree|tree:W1xW2x...>, hf-generate, hf-lookup[-kN], hf-early-exit:L[-kN], hf-assisted[:PATH][-kN], llamacpp-plain, "
            "llamacpp-lookup[-kN] (llama.cpp on the same GGUF file: pip install -e '.[llamacpp]').",
            show_default=f"{DEFAULT_METHODS.replace(',', ', ')}; --quick: every kind",
        ),
    ] = None,
    max_new_tokens: Annotated[
        Optional[int],
        typer.Option("--max-new-tokens", min=1, help="New tokens per request at most.", show_default="128; --quick: 16"),
    ] = None,
    repeats: Annotated[
        Optional[int],
        typer.Option(min=1, help="Measured runs of every method on every prompt.", show_default="3; --quick: 1"),
    ] = None,
    warmup: Annotated[int, typer.Option(min=0, help="Discarded runs of every method before measuring.")] = 1,
    model: Annotated[str, typer.Option(help="Embedded name, HF checkpoint directory or .gguf file.")] = DEFAULT_MODEL,
    dtype: Annotated[str, typer.Option(help="auto (bf16 where the CPU has it natively), float32, bfloat16 or q4.")] = "auto",
    runtime: RuntimeOption = "auto",
    deterministic: DeterministicOption = None,
    cache_type_v: CacheTypeVOption = None,
    device: DeviceOption = "auto",
    threads: Annotated[
        Optional[int],
        typer.Option(min=1, help="torch threads for every method.", show_default="torch's; --quick: 1"),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option("--quick", help="A tiny random model built in code: every code path in seconds, no real numbers."),
    ] = False,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    temperature: Annotated[
        float, typer.Option(help="0 is greedy; above 0 every method samples (HF with do_sample) with the same transforms.")
    ] = 0.0,
    top_k: Annotated[Optional[int], typer.Option("--top-k", help="Keep the k most likely tokens (T > 0).")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Nucleus: keep this much mass (T > 0).")] = None,
    min_p: Annotated[
        Optional[float], typer.Option("--min-p", help="Keep tokens at least this times the top one (T > 0).")
    ] = None,
    seed: Annotated[int, typer.Option(help="The random stream of every sampled request.")] = 0,
    concurrency: Annotated[
        str,
        typer.Option(
            help="Requests in flight, comma-separated levels, e.g. 1,2,4,8: each level a closed loop over the "
            "prompts (a finished request replaced by the next prompt), reporting aggregate tokens/s, time to "
            "first token and per output token, acceptance, the k chosen and memory. 1 alone: the "
            "single-request benchmark.",
        ),
    ] = "1",
) -> None:
    """Benchmark speculative decoding against plain decoding and HF transformers.

    Every method runs on the same model object, dtype, thread count and sampling transforms,
    interleaved per prompt with the order rotated. Greedy outputs are checked token for token
    against verispec-plain; sampled runs report acceptance and tokens per round instead (their
    exactness is the audit's and the statistical test's). With --concurrency above 1, each
    level serves the prompts with that many requests in flight, every method at every level
    (verispec's continuous batching, llama.cpp's batch API, HF's padded batches).
    """
    from verispec.bench.settings import Settings
    from verispec.bench.suite import OUTPUTS, run  # transformers: imported when needed

    from verispec.bench.sweep import is_sweep, parse_concurrency

    levels = parse_concurrency(concurrency)
    if quick:
        ignored = [option for option, given in (
            ("--model", model != DEFAULT_MODEL), ("--dtype", dtype != "auto"), ("--runtime", runtime != "auto"),
            ("--deterministic", deterministic is not None), ("--device", device != "auto"),
            ("--cache-type-v", cache_type_v is not None)) if given]
        if ignored:
            raise BadInput(f"--quick benchmarks a tiny model built in code on transformers, which {', '.join(ignored)} "
                           "would not change; drop them, or drop --quick to benchmark --model")
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    if sampling.greedy and any(f is not None for f in (top_k, top_p, min_p)):
        raise ValueError("--top-k, --top-p and --min-p filter sampled tokens; give a --temperature above 0")

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
        runtime=runtime,
        deterministic=deterministic,
        cache_type_v=cache_type_v,
        device=device,
        threads=threads,
        quick=quick,
        sampling=sampling,
        seed=seed,
        concurrency=levels,
    )
    settings.command = command_line(settings)
    with nothing_left_on_failure(out, OUTPUTS):  # a refused run leaves no --out behind
        check_output_directory(out, "--out", OUTPUTS, force)
        summary = run(settings)
    runs = "runs.jsonl, loops.jsonl" if is_sweep(levels) else "runs.jsonl"
    print(f"wrote {out}/report.md, summary.json, {runs} and {len(summary['plots'])} plots", file=sys.stderr)


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
    if tuple(settings.concurrency) != (1,):
        words += ["--concurrency", ",".join(str(c) for c in settings.concurrency)]
    words += ["--max-new-tokens", str(settings.max_new_tokens), "--repeats", str(settings.repeats),
              "--warmup", str(settings.warmup)]
    if settings.quick:
        words.append("--quick")
    else:
        words += ["--model", settings.model, "--dtype", settings.dtype, "--runtime", settings.runtime]
        if settings.device != "auto":
            words += ["--device", settings.device]
        if settings.deterministic is not None:
            words.append("--deterministic" if settings.deterministic else "--no-deterministic")
        if settings.cache_type_v is not None:
            words += ["--cache-type-v", settings.cache_type_v]
    if settings.threads is not None:
        words += ["--threads", str(settings.threads)]
    s = settings.sampling
    if not s.greedy:
        words += ["--temperature", f"{s.temperature:g}"]
        for option, value in (("--top-k", s.top_k), ("--top-p", s.top_p), ("--min-p", s.min_p)):
            if value is not None:
                words += [option, f"{value:g}"]
        words += ["--seed", str(settings.seed)]
    return shlex.join([*words, "--out", str(settings.out)])
