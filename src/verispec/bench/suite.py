"""A whole benchmark: load, build the methods, run the protocol, write the outputs.

Output directory:
    runs.jsonl       one JSON object per measured run (`protocol.record`; a concurrency
                     sweep: per request, `sweep.request_record`)
    loops.jsonl      a concurrency sweep's closed loops (`sweep.loop_record`)
    summary.json     the header (machine, software, settings) and each method's numbers
    report.md        the tables, the greedy-identity check (sampled: acceptance and tokens per
                     round instead), the plots
    *.png            the plots (`plots`)

`--concurrency 1` (the default) is the single-request benchmark (`protocol`); any other list
of levels is the concurrency sweep (`sweep`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from transformers.utils import logging as hf_logging

from verispec import machine
from verispec.bench import plots, quick, sweep, sweep_report
from verispec.bench.methods import DEFAULT_METHODS, PLAIN, Method, parse_method, parse_methods, plain_in
from verispec.bench.protocol import Protocol, run_benchmark, run_count
from verispec.bench.report import render, summarize
from verispec.bench.runners import GreedyReference, OracleRunner, Runner, VerispecRunner
from verispec.bench.settings import Settings
from verispec.bench.workloads import Workload, read_workloads, select
from verispec.models.loading.format_costs import Workload as Expected
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.loading.load import LoadedModel, build, load_model
from verispec.models.loading.load_plan import LoadPlan, plan_load
from verispec.peers import llamacpp, vllm
from verispec.peers.hf import HFRunner
from verispec.proposers.controlled import ControlledAcceptance
from verispec.registry import build_policy
from verispec.request import Request
from verispec.runner import built, plain_alternatives, specs, workload
from verispec.sampling import GREEDY, SamplingParams

QUICK_DRAFT = "quick-draft"
RUNS, LOOPS, SUMMARY, REPORT = "runs.jsonl", "loops.jsonl", "summary.json", "report.md"
# Everything `run` may write into its output directory.
OUTPUTS = (RUNS, LOOPS, SUMMARY, REPORT, *plots.NAMES, *plots.SWEEP_NAMES, QUICK_DRAFT)


def quick_methods(out: Path) -> str:
    """Every kind of method, on the quick target and a tiny draft saved in `out`."""
    draft = out / QUICK_DRAFT
    return ",".join([
        "verispec-plain", "verispec-lookup-k2", "verispec-lookup-k4", "verispec-lookup-auto",
        "verispec-suffix-heuristic", "verispec-layerskip:2-k3", f"verispec-draft:{draft}-k3",
        "verispec-random-k2", "hf-generate", "hf-lookup", "hf-early-exit:2-k3", "hf-assisted",
    ])


def quick_target(out: Path) -> LoadedModel:
    """The tiny target of --quick, and its 2-layer draft saved under `out` for the draft
    methods (they load models by path)."""
    tokenizer = quick.tiny_tokenizer()
    model = quick.tiny_llama(len(tokenizer))
    draft_dir = out / QUICK_DRAFT
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        quick.tiny_llama(len(tokenizer), layers=2, seed=1).save_pretrained(draft_dir)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(draft_dir)
    return LoadedModel(
        name="quick: tiny random Llama (4 layers, hidden 64, byte-level vocabulary)",
        lm=HFCausalLM(model),
        model=model,
        tokenizer=tokenizer,
        eos_token_ids=(tokenizer.eos_token_id,),
        dtype=torch.float32,
        source=Path("(built in memory)"),
    )


ORACLE_PROFILE_TOKENS = 64  # the continuation an auto oracle method's profile drafts from


def oracle_runner(
    method: Method, target: LoadedModel, first_prompt: Sequence[int], sampling: SamplingParams, seed: int
) -> OracleRunner:
    """A `verispec-oracle:ALPHA` method's runner: `ControlledAcceptance` over the target's own
    greedy continuation (greedy only: it is what the oracle drafts)."""
    if not sampling.greedy:
        raise ValueError(f"{method.name} drafts the plain greedy continuation; benchmark it greedily (temperature 0)")
    reference = GreedyReference(target.lm, target.eos_token_ids)
    reference.prepare(first_prompt, ORACLE_PROFILE_TOKENS)
    proposer = ControlledAcceptance.alpha(reference, method.oracle, target.lm.vocab_size, seed)
    policy = build_policy(method.k_spec, target.lm, proposer, first_prompt, sampling)
    return OracleRunner(VerispecRunner(target.lm, proposer, policy, target.eos_token_ids, sampling, seed), reference)


def make_runner(
    method: Method,
    target: LoadedModel,
    first_prompt: Sequence[int],
    sampling: SamplingParams = GREEDY,
    seed: int = 0,
) -> Runner:
    """The runner for `method` on `target` under `sampling` and `seed` (the same for every
    method); `first_prompt` is the context an `auto` policy profiles its costs after."""
    eos = target.eos_token_ids
    if method.family == "llamacpp":
        return llamacpp.make_runner(method.name, target, method.k, method.cache_type_v)
    if method.family == "vllm":
        return vllm.VllmRunner(method, target)
    if method.family == "verispec":
        if method.proposer is None:
            peer = None if method.dtype is None else f"the same model in {method.dtype}, another target"
            return VerispecRunner(target.lm, None, 0, eos, sampling, seed, peer)
        if method.oracle is not None:
            return oracle_runner(method, target, first_prompt, sampling, seed)
        # built as `generate` builds its request's: the policy profiled after the first prompt
        template = Request(tuple(first_prompt), 0, sampling, eos, seed=seed, proposer=method.proposer_spec, k=method.k_spec)
        return VerispecRunner(target.lm, *built(target, template), eos, sampling, seed)
    hf = dict(sampling=sampling, seed=seed)
    if method.hf_mode == "generate":
        return HFRunner(target.transformers_model(), eos, **hf)
    if method.hf_mode == "lookup":
        return HFRunner(target.transformers_model(), eos, {"prompt_lookup_num_tokens": method.k}, **hf)
    if method.hf_mode == "early-exit":
        layers = target.config.num_hidden_layers
        if not 1 <= int(method.hf_arg) < layers:
            raise ValueError(f"{method.name}: the exit layer must lie in [1, {layers}) for this {layers}-layer model")
        return HFRunner(target.transformers_model(), eos, {"assistant_early_exit": int(method.hf_arg)}, method.k, **hf)
    assistant = load_model(method.hf_arg, dtype=target.dtype, device=target.device)
    if assistant.lm.vocab_size != target.lm.vocab_size:
        raise ValueError(
            f"{method.name}: the assistant's vocabulary ({assistant.lm.vocab_size}) differs from the target's "
            f"({target.lm.vocab_size}); HF would switch to its different-tokenizer path, which is not comparable"
        )
    return HFRunner(target.transformers_model(), eos, {"assistant_model": assistant.transformers_model()}, method.k, **hf)


def gather_workloads(settings: Settings) -> list[Workload]:
    if settings.quick and not settings.prompts:
        rows = quick.quick_workloads()
    elif not settings.prompts:
        raise ValueError("no prompts: give --prompts FILE.jsonl (Spec-Bench or HumanEval rows), or --quick")
    else:
        rows = [w for path in settings.prompts for w in read_workloads(path)]
    return select(rows, settings.categories or None, settings.limit_per_category)


def run(settings: Settings, console: Console | None = None) -> dict:
    """Run the benchmark `settings` describes and write its outputs; the summary.

    torch's thread count and transformers' log level are restored afterwards.
    """
    # The quick model's tensors are tiny: a second intra-op thread only adds synchronisation.
    threads = settings.threads if settings.threads is not None else (1 if settings.quick else None)
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    before = torch.get_num_threads(), hf_logging.get_verbosity()
    # HF's assisted generation calls its own `generate` with arguments it then warns about,
    # once per round: the warnings would only break up the progress bar.
    hf_logging.set_verbosity_error()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return measure(settings, console or Console(stderr=True))
    finally:
        torch.set_num_threads(before[0])
        hf_logging.set_verbosity(before[1])


def chosen_methods(settings: Settings) -> list[Method]:
    """The methods to run: --methods, else the defaults of the run's kind."""
    if settings.methods:
        names = settings.methods
    elif sweep.is_sweep(settings.concurrency):
        names = sweep.QUICK_SWEEP_METHODS if settings.quick else sweep.SWEEP_METHODS
    else:
        names = quick_methods(settings.out) if settings.quick else DEFAULT_METHODS
    methods = parse_methods(names)
    sweep.check_methods(methods, settings.concurrency)
    return methods


def expected(model: str, concurrency: Sequence[int]) -> Expected:
    """What the auto dtype and runtime are weighed by (one model serves every method and level):
    what `generate` weighs for `model` (its default proposer at k auto), at the highest
    concurrency level, so a bench of one request measures the target `generate` and `serve`
    load (`runner.load_plan`); `--dtype` pins another."""
    return workload(*specs(model, None, "auto"), max(concurrency))


def planned(settings: Settings, dtype: str, expects: Expected = Expected()) -> LoadPlan:
    """The bench's model in `dtype` as its runtime options load it, `expects` weighed by auto
    (by default plain decoding of one request, as `plan_load`'s)."""
    return plan_load(settings.model, dtype, settings.runtime, settings.deterministic, device=settings.device,
                     workload=expects, cache_type_v=settings.cache_type_v)


def with_plain_formats(methods: list[Method], settings: Settings, plan: LoadPlan) -> list[Method]:
    """`methods` and, where verispec-plain is among them and none was named in another format,
    plain decoding in each other format --dtype auto weighs for the model (`verispec-plain@FORMAT`,
    `runner.plain_alternatives`), so the report gives each method's speedup over the fastest
    plain format too; a sweep over concurrency levels, and a bench whose --dtype names its
    format (the user chose the target), keep their methods."""
    if (
        PLAIN not in [m.name for m in methods] or any(m.dtype is not None for m in methods)
        or sweep.is_sweep(settings.concurrency) or settings.dtype != "auto"
    ):
        return methods
    others = plain_alternatives(settings.model, settings.runtime, settings.deterministic, settings.device, plan)
    return methods + [parse_method(plain_in(str(p.weight_format))) for p in others]


def measure(settings: Settings, console: Console) -> dict:
    protocol = Protocol(settings.max_new_tokens, settings.repeats, settings.warmup)
    workloads = gather_workloads(settings)
    out = settings.out
    methods = chosen_methods(settings)
    llamacpp.require([m.name for m in methods if m.family == "llamacpp"], settings.sampling)
    vllm.require([m.name for m in methods if m.family == "vllm"], settings.sampling)
    out.mkdir(parents=True, exist_ok=True)
    with console.status("loading the model"):
        if settings.quick:
            target, formats = quick_target(out), {}
        else:
            plan = planned(settings, settings.dtype, expected(settings.model, settings.concurrency))
            target = build(plan)
            methods = with_plain_formats(methods, settings, plan)
            formats = {m.dtype: build(planned(settings, m.dtype)) for m in methods if m.dtype is not None}
    prompts = [(w, w.token_ids(target)) for w in workloads]
    if sweep.is_sweep(settings.concurrency):
        summary, records, loops = sweep.measure_sweep(
            settings, target, methods, prompts, protocol, header(settings, target, protocol, len(prompts)), console
        )
        write_lines(out / LOOPS, loops)
        summary["plots"] = plots.draw_sweep(summary, out)
        return write(summary, records, sweep_report.render_sweep(summary, summary["plots"]), out)
    with console.status("building the methods (an auto k profiles its costs first)"):
        runners = {m.name: make_runner(m, formats.get(m.dtype, target), prompts[0][1], settings.sampling, settings.seed)
                   for m in methods}
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), console=console, transient=True,
    )
    with progress:
        task = progress.add_task("bench", total=run_count(protocol, len(runners), len(prompts)))
        records = run_benchmark(
            runners, prompts, protocol, target.lm.score, target.dtype_name,
            lambda label: progress.update(task, advance=1, description=label[:60]),
            identity=settings.sampling.greedy,
        )
    summary = summarize(records, methods, header(settings, target, protocol, len(prompts)))
    summary["plots"] = plots.draw(summary, records, methods, out)
    return write(summary, records, render(summary, summary["plots"]), out)


def header(settings: Settings, target: LoadedModel, protocol: Protocol, prompts: int) -> dict:
    """What was measured, on what machine and software, with which settings."""
    return {
        **machine.describe(target.dtype_name),
        "model": target.name,
        "runtime": target.runtime + (" (deterministic)" if getattr(target.lm, "deterministic", False) else ""),
        "dtype_choice": target.auto_choice,  # why --dtype auto took this format, where it weighed q4 and bfloat16
        "max_new_tokens": protocol.max_new_tokens,
        "repeats": protocol.repeats,
        "warmup": protocol.warmup,
        "prompts": prompts,
        "prompt_files": [str(p) for p in settings.prompts],
        "eos_token_id": target.eos_token_id,
        "sampling": dataclasses.asdict(settings.sampling),
        "seed": settings.seed,
        "command": settings.command,
    }


def write_lines(path: Path, records: Sequence[dict]) -> None:
    with path.open("w", encoding="utf-8") as lines:
        for record in records:
            lines.write(json.dumps(record) + "\n")


def write(summary: dict, records: Sequence[dict], report: str, out: Path) -> dict:
    """runs.jsonl, summary.json and report.md into `out`; the summary."""
    write_lines(out / RUNS, records)
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (out / REPORT).write_text(report, encoding="utf-8")
    return summary
