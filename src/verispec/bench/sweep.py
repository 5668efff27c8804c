"""`verispec bench --concurrency 1,2,4,8`: throughput, latency and memory as requests share
the target.

At each concurrency level c (ascending) every method serves the workload in a closed loop of
c (`closed_loop`: c requests in flight, each finished one replaced by the next prompt; every
prompt once per repeat):

- Warm-up: every method first serves the first c prompts `warmup` times, dropped (the first
  batch at a level pays for slots, contexts and lazy initialisation).
- Repeats: for each repeat every method serves the whole workload, one method after another,
  the order rotated by one per repeat and per level, so all methods see the same machine state
  within minutes of each other and none always runs first.
- Greedy identity: every request's output is compared token by token with verispec-plain's
  for the same prompt at c = 1 (its first repeat), so batched output must equal the output of
  the request decoded alone. Peers (llama.cpp; HF on a padded batch of more than one) are
  compared too, but their differences are their arithmetic's (`identity.diagnose`).

Servers: verispec methods run `verispec.batching.Scheduler` (continuous batching; an auto k is
planned per batch from v(n), `profile.measure_batch_costs`, measured once per run);
`llamacpp-plain` runs `llamacpp.LlamaCppBatchServer` (llama.cpp's batch API, continuous);
`hf-generate` runs `peers.hf.HFBatchServer` (left-padded whole batches); `vllm-*` methods
run `vllm.VllmBatchServer` (vLLM's engine in its own venv, continuous; one engine per method
for every level, batching up to the highest). Other HF and llama.cpp methods cannot batch and
are refused at c > 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from verispec.batching import RegistryBuilder
from verispec.bench.closed_loop import Loop, Server, VerispecServer, closed_loop
from verispec.identity import diagnose
from verispec.bench.methods import PLAIN, Method, parse_methods
from verispec.bench.protocol import Protocol, rotated
from verispec.bench.sweep_report import summarize_sweep
from verispec.bench.workloads import Workload
from verispec.machine import peak_rss_mb
from verispec.models.base import SlotScoring
from verispec.models.loading.load import LoadedModel
from verispec.peers import llamacpp, vllm
from verispec.peers.hf import HFBatchServer
from verispec.peers.outcome import Served
from verispec.sampling import SamplingParams

if TYPE_CHECKING:
    from verispec.bench.settings import Settings
    from verispec.cost import BatchCosts

# The single-request defaults less HF's assisted generation, which refuses batches.
SWEEP_METHODS = "verispec-plain,verispec-lookup-k4,verispec-lookup-auto,hf-generate"
QUICK_SWEEP_METHODS = "verispec-plain,verispec-lookup-k2,verispec-lookup-auto,hf-generate"


def parse_concurrency(text: str) -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8): distinct integers >= 1, sorted."""
    levels = []
    for part in text.split(","):
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or int(part) < 1:
            raise ValueError(
                f"--concurrency takes integers >= 1 separated by commas, e.g. 1,2,4,8; {part!r} in {text!r} is not one"
            )
        levels.append(int(part))
    if len(set(levels)) != len(levels):
        raise ValueError(f"--concurrency lists a level twice: {text!r}")
    return tuple(sorted(levels))


def is_sweep(levels: Sequence[int]) -> bool:
    """Any level but a lone 1 is a sweep; `--concurrency 1` is the single-request benchmark."""
    return tuple(levels) != (1,)


def batchable(method: Method) -> bool:
    """Whether the sweep can serve `method` with several requests in flight: verispec's
    scheduler, HF `generate` on a padded batch, llama.cpp's batch API (plain), vLLM's engine."""
    return (method.family in ("verispec", "vllm") or (method.family == "hf" and method.hf_mode == "generate")
            or (method.family == "llamacpp" and method.proposer is None))


def check_methods(methods: Sequence[Method], levels: Sequence[int]) -> None:
    """Refuse methods that cannot serve more than one request at a time at a level above 1,
    and the oracle methods, which need each prompt's continuation decoded before its run."""
    oracles = [m.name for m in methods if m.oracle is not None]
    if oracles and is_sweep(levels):
        raise ValueError(
            f"{', '.join(oracles)} measure one request at a time (each prompt's greedy continuation is decoded "
            "before its run); leave out --concurrency, or drop them"
        )
    if max(levels) == 1:
        return
    unbatched = [m.name for m in methods if not batchable(m)]
    if unbatched:
        raise ValueError(
            f"{', '.join(unbatched)} decode one request at a time here (HF's assisted generation refuses batches; "
            "llama-cpp-python's prompt lookup drives one sequence; the sweep batches verispec methods, "
            "hf-generate, llamacpp-plain and vllm-*), so they cannot run at --concurrency above 1; drop them or run "
            "them with --concurrency 1"
        )


@dataclass
class Servers:
    """Makes each method's server at each level, once (reused across repeats).

    builders: one `RegistryBuilder` per verispec method, shared by its levels (an auto policy
    is profiled once). batch_costs: v(n) for every verispec scheduler (None: not measured).
    context: positions a llama.cpp sequence or a vLLM request needs (the longest prompt and the
    budget). most_in_flight: the highest level, the requests each vLLM engine batches."""

    target: LoadedModel
    sampling: SamplingParams
    seed: int
    context: int
    batch_costs: BatchCosts | None = None
    most_in_flight: int = 1
    made: dict[tuple[str, int], Server] = field(default_factory=dict)
    builders: dict[str, RegistryBuilder] = field(default_factory=dict)
    llama: dict[str, object] = field(default_factory=dict)  # value cache type -> the llama_cpp.Llama its servers decode with
    engines: dict[str, vllm.VllmRunner] = field(default_factory=dict)  # one vLLM worker per method

    def get(self, method: Method, concurrency: int) -> Server:
        key = (method.name, concurrency)
        if key not in self.made:
            self.made[key] = self.make(method, concurrency)
        return self.made[key]

    def make(self, method: Method, concurrency: int) -> Server:
        eos = self.target.eos_token_ids
        if method.family == "verispec":
            builder = self.builders.setdefault(method.name, RegistryBuilder(self.target))
            return VerispecServer(builder, method, eos, concurrency, self.sampling, self.seed, self.batch_costs)
        if method.family == "llamacpp":
            if method.cache_type_v not in self.llama:
                self.llama[method.cache_type_v] = llamacpp.load_batch_model(method.name, self.target, method.cache_type_v)
            return llamacpp.LlamaCppBatchServer(self.llama[method.cache_type_v], eos, concurrency, self.context, torch.get_num_threads())
        if method.family == "vllm":
            if method.name not in self.engines:
                self.engines[method.name] = vllm.VllmRunner(
                    method, self.target, max_model_len=max(2048, self.context), max_num_seqs=self.most_in_flight)
            return vllm.VllmBatchServer(self.engines[method.name], concurrency)
        if method.family == "hf" and method.hf_mode == "generate":
            return HFBatchServer(self.target.transformers_model(), eos, self.sampling, self.seed)
        raise ValueError(f"{method.name} cannot serve a closed loop; run it with --concurrency 1")

    def close(self) -> None:
        for server in self.made.values():
            close = getattr(server, "close", None)
            if close is not None:
                close()
        for engine in self.engines.values():
            engine.close()


def continuous(method: Method) -> bool:
    """Whether a method's server replaces a finished request at once (else: whole batches)."""
    return method.family != "hf"


def sweep_count(protocol: Protocol, n_methods: int, n_prompts: int, levels: Sequence[int]) -> int:
    """Requests the sweep serves, warm-ups included (for the progress bar)."""
    return sum(n_methods * (protocol.warmup * min(c, n_prompts) + protocol.repeats * n_prompts) for c in levels)


def run_sweep(
    servers: Callable[[Method, int], Server],
    methods: Sequence[Method],
    prompts: Sequence[tuple[Workload, list[int]]],
    levels: Sequence[int],
    protocol: Protocol,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[list[dict], list[dict]]:
    """Every method at every level (module docstring); (request records, loop records)."""
    if not prompts:
        raise ValueError("no prompts to run; check --prompts, --categories and --limit-per-category")
    by_name = {m.name: m for m in methods}
    ids = [p for _, p in prompts]
    requests, loops = [], []
    for level_index, c in enumerate(levels):
        for _ in range(protocol.warmup):
            for name in by_name:
                closed_loop(servers(by_name[name], c), ids[:c], c, protocol.max_new_tokens,
                            lambda _s, n=name: progress(f"warm-up {n} at c = {c}"))
        for repeat in range(protocol.repeats):
            for order, name in enumerate(rotated(list(by_name), repeat + level_index)):
                method = by_name[name]
                label = f"{name} at c = {c}"
                loop = closed_loop(servers(method, c), ids, c, protocol.max_new_tokens, lambda _s: progress(label))
                loops.append(loop_record(method, c, repeat, order, loop))
                requests += [request_record(method, c, repeat, order, prompts[s.key][0], ids[s.key], s)
                             for s in sorted(loop.served, key=lambda s: s.key)]
    return requests, loops


def loop_record(method: Method, concurrency: int, repeat: int, order: int, loop: Loop) -> dict:
    """One line of loops.jsonl: one method's closed loop over the workload at one level.
    tokens_per_second: all new tokens / the loop's wall time (aggregate throughput).
    peak_rss_mb: the process's peak resident memory so far (all methods share the process)."""
    return {
        "method": method.name,
        "concurrency": concurrency,
        "repeat": repeat,
        "order": order,
        "mode": "closed loop" if continuous(method) else "whole batches",
        "requests": len(loop.served),
        "new_tokens": loop.new_tokens,
        "wall_seconds": loop.wall_seconds,
        "tokens_per_second": loop.tokens_per_second,
        "most_in_flight": loop.most_in_flight,
        "peak_rss_mb": peak_rss_mb(),
    }


def request_record(
    method: Method, concurrency: int, repeat: int, order: int, workload: Workload, prompt_ids: Sequence[int], s: Served
) -> dict:
    """One line of runs.jsonl: one request. ttft_seconds: submission to the first token;
    tpot_seconds: per output token after it. rounds, drafted, accepted: the engine's (a peer
    decodes one token per forward: rounds = new tokens). matches_plain and mismatch are set by
    `check_identity`."""
    stats = s.stats
    return {
        "method": method.name,
        "concurrency": concurrency,
        "repeat": repeat,
        "order": order,
        "prompt_id": workload.id,
        "category": workload.category,
        "prompt_tokens": len(prompt_ids),
        "new_tokens": len(s.tokens),
        "ttft_seconds": s.ttft,
        "tpot_seconds": s.tpot,
        "rounds": len(stats.accepted) if stats is not None else len(s.tokens),
        "drafted": sum(stats.drafted) if stats is not None else 0,
        "accepted": sum(stats.accepted) if stats is not None else 0,
        "plans": dict(stats.plans) if stats is not None else {},
        "matches_plain": None,
        "mismatch": None,
        "peer": s.peer,
        "tokens": s.tokens,
    }


def check_identity(
    requests: Sequence[dict],
    prompts: Sequence[tuple[Workload, list[int]]],
    reference: dict[str, list[int]],
    score: Callable[[list[int]], torch.Tensor],
    dtype: str,
) -> None:
    """Set every request's matches_plain and mismatch against `reference` (prompt id ->
    verispec-plain's tokens at c = 1)."""
    ids = {w.id: p for w, p in prompts}
    for r in requests:
        r["mismatch"] = diagnose(ids[r["prompt_id"]], reference[r["prompt_id"]], r["tokens"], score, dtype,
                                 peer=r["peer"])
        r["matches_plain"] = r["mismatch"] is None


def reference_outputs(
    requests: Sequence[dict], servers: Callable[[Method, int], Server], prompts: Sequence[tuple[Workload, list[int]]],
    max_new_tokens: int,
) -> dict[str, list[int]]:
    """verispec-plain's output for each prompt at c = 1: from the sweep's first repeat at that
    level, else from one unmeasured closed loop of 1."""
    plain = {r["prompt_id"]: r["tokens"] for r in requests
             if r["method"] == PLAIN and r["concurrency"] == 1 and r["repeat"] == 0}
    if plain:
        return plain
    loop = closed_loop(servers(parse_methods(PLAIN)[0], 1), [p for _, p in prompts], 1, max_new_tokens)
    return {prompts[s.key][0].id: s.tokens for s in loop.served}


def measure_batch_costs(target: LoadedModel, methods: Sequence[Method], prompt_ids: Sequence[int], quick: bool):
    """v(n) of the target's batched forward for the auto methods' `BatchK`, or None (no auto
    method, a target without slots, or a verispec without the batch profiler)."""
    if not any(m.family == "verispec" and m.policy == "auto" for m in methods):
        return None
    if not isinstance(target.lm, SlotScoring):
        return None
    try:
        from verispec.profile import measure_batch_costs as measure
    except ImportError:
        return None
    options = dict(rows=(1, 2, 4, 8), contexts=(), repeats=2) if quick else {}
    return measure(target.lm, prompt_ids, **options)


def kv_bytes_per_token(target: LoadedModel, servers: Servers, method: Method) -> int | None:
    """Cache bytes one position of one request takes for `method`: the fast runtime's own
    count, llama.cpp's float16 cache, or HF's cache in the model's dtype."""
    if method.family == "llamacpp":
        made = next((s for (name, _), s in servers.made.items() if name == method.name), None)
        return made.kv_bytes_per_token() if made is not None else None
    per_token = getattr(target.lm, "kv_bytes_per_token", None) if method.family == "verispec" else None
    if per_token is not None:
        return per_token()
    config = target.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers * 2 * kv_heads * head_dim * target.dtype.itemsize


def measure_sweep(
    settings: Settings,
    target: LoadedModel,
    methods: Sequence[Method],
    prompts: Sequence[tuple[Workload, list[int]]],
    protocol: Protocol,
    header: dict,
    console: Console,
) -> tuple[dict, list[dict], list[dict]]:
    """The sweep over `settings.concurrency` on `target`; (summary, request records, loop
    records). `header`: the machine, software and settings, to which the sweep adds its own."""
    levels = settings.concurrency
    longest = max(len(p) for _, p in prompts)
    with console.status("measuring the batched forward's cost v(n) (auto k per batch)"):
        profile = measure_batch_costs(target, methods, prompts[0][1], settings.quick)
    servers = Servers(target, settings.sampling, settings.seed, longest + protocol.max_new_tokens + 1,
                      profile.costs if profile is not None else None, max(levels))
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), console=console, transient=True,
    )
    try:
        with progress:
            task = progress.add_task("sweep", total=sweep_count(protocol, len(methods), len(prompts), levels))
            requests, loops = run_sweep(
                servers.get, methods, prompts, levels, protocol,
                lambda label: progress.update(task, advance=1, description=label[:60]),
            )
        if settings.sampling.greedy:
            with console.status("checking every output against verispec-plain's at c = 1"):
                reference = reference_outputs(requests, servers.get, prompts, protocol.max_new_tokens)
                check_identity(requests, prompts, reference, target.lm.score, target.dtype_name)
        memory = {m.name: kv_bytes_per_token(target, servers, m) for m in methods}
    finally:
        servers.close()
    weights = getattr(target, "memory", None)
    header = {
        **header,
        "concurrency": list(levels),
        "weights_bytes": weights()["weights_bytes"] if weights is not None else None,
        "longest_request_tokens": longest + protocol.max_new_tokens,
        "batch_costs": profile.to_dict() if profile is not None else None,
    }
    return summarize_sweep(requests, loops, methods, levels, header, memory), requests, loops
