"""`verispec check-runtime`: test an engine's speculative decoding for exactness
(docs/check-runtime.md)."""

from __future__ import annotations

import shlex
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Optional

import typer

from verispec.bench.workloads import data_file
from verispec.cli import app
from verispec.cli.paths import FORCE_HELP, check_input_file, check_output_directory, nothing_left_on_failure
from verispec.models import DEFAULT_MODEL
from verispec.runtime_check.check import Settings
from verispec.runtime_check.engines import ENGINES, Unavailable
from verispec.runtime_check.jobs import command_words, run_jobs
from verispec.runtime_check.run import check_options, outputs, write

GREEDY_FILE = "specbench_dev.jsonl"


def refuse_combinations(*, n, tv, prompts, cells, length, alpha, sample_prompt, sampled, parameter, greedy_prompts,
                        greedy_tokens, concurrency, prompts_file, jobs) -> None:
    """Refuse options that do not combine (one would be dropped without a word): ValueError
    naming the pair and what to do. None: an option not given."""
    pairs = [
        (n is not None and tv is not None, "--n and --tv both choose the samples per side; give one"),
        (prompts is not None and bool(sample_prompt), "--prompts picks spread prompts, which --sample-prompt replaces; give one"),
        (not sampled and jobs > 1, "--jobs splits the sampled law, which --no-sampled turns off; drop one"),
    ]
    sampling = {"--n": n is not None, "--tv": tv is not None, "--prompts": prompts is not None, "--cells": cells is not None,
                "--length": length is not None, "--alpha": alpha is not None, "--sample-prompt": bool(sample_prompt),
                "--parameter": bool(parameter)}
    pairs += [(not sampled and given, f"{name} sets the sampled law, which --no-sampled turns off; drop one")
              for name, given in sampling.items()]
    greedy_options = {"--greedy-tokens": greedy_tokens is not None, "--concurrency": concurrency is not None,
                      "--prompts-file": prompts_file is not None}
    pairs += [(greedy_prompts == 0 and given, f"{name} sets greedy identity, which --greedy-prompts 0 turns off; drop one")
              for name, given in greedy_options.items()]
    for clash, message in pairs:
        if clash:
            raise ValueError(message)


@app.command("check-runtime")
def check_runtime(
    engine: Annotated[str, typer.Argument(help=f"The engine to check: {ENGINES}.", show_default=False)],
    method: Annotated[
        Optional[list[str]],
        typer.Option("--method", help="A speculative method of the engine (repeatable): verispec lookup, "
                     "layerskip:8; hf assisted, lookup; llamacpp lookup; vllm ngram, eagle3, draft_model; openai served.", show_default="all of the engine's"),
    ] = None,
    model: Annotated[str, typer.Option(help="The weights the engine serves, loaded by verispec for the exact "
                                       "law and the greedy diagnosis; none: an openai:URL,PLAIN_URL server whose model "
                                       "verispec cannot load, checked by its replies alone (spec vs plain and seeded "
                                       "identity on --sample-prompt texts).")] = DEFAULT_MODEL,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, ... as for `verispec generate` (the engine's "
                                       "precision: it sets the near-tie tolerance).")] = "float32",
    n: Annotated[Optional[int], typer.Option("--n", min=2, show_default="1200", help="Samples per side per method and "
                                   "parameter, split over the prompts; at 1200 a TV of ~0.14 between the two samples (~0.11 against the exact law) is detected with 90 % power on the default model (--tv chooses N for a TV instead).")] = None,
    tv: Annotated[Optional[float], typer.Option("--tv", min=0.001, max=0.999, show_default=False, help="Choose --n "
                  "instead: the fewest samples per side at which every test detects this total variation with 90 % power "
                  "(the two-sample test's need; at the default 24 cells a prompt 0.1 needs 3366, 0.05 needs 13458).")] = None,
    cells: Annotated[Optional[int], typer.Option(min=2, max=1000, show_default="24", help="The most cells a prompt's tests keep: the most likely "
                                       "outcomes (first two tokens) each in one, the rest pooled; the TV detected is "
                                       "the TV on them (docs/check-runtime.md).")] = None,
    length: Annotated[Optional[int], typer.Option(min=2, max=8, show_default="3", help="New tokens per sample, "
                      "every one tested: an engine drafting k tokens a round needs k + 1 for its bonus token.")] = None,
    prompts: Annotated[Optional[int], typer.Option(min=1, max=8, show_default="3",
                                                   help="Spread prompts the samples are split over.")] = None,
    sample_prompt: Annotated[
        Optional[list[str]],
        typer.Option("--sample-prompt", help="Sample after this raw text instead (repeatable; replaces --prompts): "
                     "a prompt on which the method drafts, e.g. one that repeats itself for lookup.",
                     show_default="the spread prompts"),
    ] = None,
    parameter: Annotated[
        Optional[list[str]],
        typer.Option("--parameter", help="Check only this parameter (repeatable): default, temperature, top_k, top_p, "
                     "min_p, repetition_penalty, frequency_penalty, presence_penalty, logit_bias.",
                     show_default="all"),
    ] = None,
    alpha: Annotated[Optional[float], typer.Option(min=1e-4, max=0.5, show_default="0.001", help="Each test's "
                     "false-failure probability (exact: its p-value is simulated with 20 / alpha draws).")] = None,
    sampled: Annotated[bool, typer.Option("--sampled/--no-sampled", help="Run the sampled-law checks.")] = True,
    seeded: Annotated[int, typer.Option("--seeded", min=0, max=64, help="Seeded identity on this many seeds per sampled "
                      "prompt (the same tokens with and without speculation, one at a time and all at once) and the "
                      "probe of as many unseeded requests in flight for a shared random stream (0: neither).")] = 8,
    greedy_prompts: Annotated[
        int, typer.Option("--greedy-prompts", min=0, help="Greedy identity on the first prompt of this many "
                          "categories of --prompts-file (0: no greedy check).")] = 8,
    greedy_tokens: Annotated[Optional[int], typer.Option("--greedy-tokens", min=1, show_default="256",
                                                         help="Greedy budget per prompt.")] = None,
    concurrency: Annotated[Optional[int], typer.Option(min=1, show_default="8",
                                                       help="Requests in flight in the second greedy run.")] = None,
    prompts_file: Annotated[
        Optional[Path], typer.Option("--prompts-file", help="Spec-Bench JSONL for greedy identity.",
                                     show_default="../shared/data/specbench_dev.jsonl"),
    ] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="VERISPEC_API_KEY", show_default=False,
                                                   help="Bearer token for openai:URL.")] = None,
    seed: Annotated[int, typer.Option(min=0, help="The first sample's seed.")] = 0,
    jobs: Annotated[int, typer.Option(min=1, max=64, help="Split the sampled law's parameters over this many "
                                      "processes, the threads shared among them (2 on 2 cores: one thread each; "
                                      "docs/check-runtime.md).")] = 1,
    out: Annotated[Optional[Path], typer.Option(help="Write check-runtime-ENGINE.md and .json here.")] = None,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
) -> None:
    """Test an engine's speculative decoding for exactness: the sampled law with and without
    speculation and against verispec's exact law, per parameter; greedy identity at 1 and
    --concurrency requests. Exit 1 when a check fails."""
    check_options(engine, parameter)
    refuse_combinations(n=n, tv=tv, prompts=prompts, cells=cells, length=length, alpha=alpha, sample_prompt=sample_prompt,
                        sampled=sampled,
                        parameter=parameter, greedy_prompts=greedy_prompts, greedy_tokens=greedy_tokens,
                        concurrency=concurrency, prompts_file=prompts_file, jobs=jobs)
    n, prompts = 1200 if n is None else n, 3 if prompts is None else prompts
    cells, length, alpha = 24 if cells is None else cells, 3 if length is None else length, 1e-3 if alpha is None else alpha
    greedy_tokens, concurrency = 256 if greedy_tokens is None else greedy_tokens, 8 if concurrency is None else concurrency
    if any(not text.strip() for text in sample_prompt or ()):
        raise ValueError("--sample-prompt is empty; give the raw text the samples continue")
    greedy_file = None
    if greedy_prompts:
        greedy_file = prompts_file or data_file(GREEDY_FILE, Path.cwd())
        check_input_file(greedy_file, "--prompts-file", "a Spec-Bench JSONL file (or --greedy-prompts 0)")
    settings = Settings(
        n=n, length=length, prompts=prompts, alpha=alpha, greedy_tokens=greedy_tokens,
        concurrency=(concurrency,) if concurrency > 1 else (), seed=seed, sampled=sampled, parameters=parameter, tv=tv, cells=cells,
        seeded=seeded,
        sample_texts=tuple(sample_prompt or ()),
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    names = outputs(engine, method)
    with nothing_left_on_failure(out, names) if out is not None else nullcontext():
        if out is not None:
            check_output_directory(out, "--out", names, force)
        try:
            report = run_jobs(engine, model=model, dtype=dtype, methods=method, settings=settings, greedy_file=greedy_file,
                              greedy_count=greedy_prompts, api_key=api_key, jobs=jobs)
        except Unavailable as error:
            raise ValueError(str(error)) from None
        report.command = shlex.join(command_words(engine, method, model, dtype, settings, greedy_count=greedy_prompts,
                                                  prompts_file=prompts_file, jobs=jobs, out=out))
        if out is not None:
            write(report, out, names)
    print(report.markdown())
    if not report.passed:
        raise typer.Exit(code=1)
