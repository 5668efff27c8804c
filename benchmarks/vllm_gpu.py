"""vLLM on a CUDA machine with verispec's exported heads: plain decoding, ngram, EAGLE-3 and
Medusa, each at several concurrencies: tokens a second, vLLM's own acceptance counters, and
greedy identity with vLLM's plain decoding, token by token.

It needs only the `vllm` package (a CUDA build) and local files: the target as a Hugging Face
checkpoint directory and the heads as `verispec export-head` wrote them. Nothing is fetched.

    pip install vllm
    verispec export-head HEAD --format speculators --out e3     # on the machine that trained it
    verispec export-head src/verispec/heads/default/medusa --format vllm-medusa --out medusa
    python benchmarks/vllm_gpu.py --target SMOLLM2_DIR --eagle3 e3 --medusa medusa \\
        --k 3 --concurrency 1,4,8 --out vllm-gpu.json

Stock vLLM refuses a Medusa checkpoint with a truncated vocabulary (its `Medusa.load_weights`
never reports `token_map` loaded; seen in 0.32); --patch-medusa adds that one name to what the
loader reports, in this process (the engine runs in it), and the report says so.

Each method gets its own engine; a measured pass follows a warm-up pass over the same prompts.
tok/s is generated tokens over the wall time of one `generate` call holding `concurrency`
prompts (vLLM schedules them together, at most `concurrency` at once). Acceptance is read from
vLLM's counters (spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens) as the
difference over the measured pass: mean acceptance length = 1 + accepted / drafts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring and a test.",
    "Explain why the sky is blue to a ten-year-old.",
    "Summarize the plot of Romeo and Juliet in five sentences.",
    "List ten uses of a paperclip, one line each.",
    "Translate into French: 'The meeting is moved to Thursday at ten; please bring the report.'",
    "What is the difference between a list and a tuple in Python? Give examples.",
    "Write a haiku about autumn, then explain its imagery.",
    "Give me a three-day itinerary for Rome.",
]


def parse_methods(args) -> list[tuple[str, dict | None]]:
    """(name, speculative_config) per method; plain first, as the reference for greedy identity."""
    methods: list[tuple[str, dict | None]] = [("vllm-plain", None)]
    methods.append((f"vllm-ngram-k{args.k}", {"method": "ngram", "num_speculative_tokens": args.k,
                                               "prompt_lookup_min": 2, "prompt_lookup_max": 4}))
    if args.eagle3:
        methods.append((f"vllm-eagle3-k{args.k}", {"method": "eagle3", "model": str(args.eagle3), "num_speculative_tokens": args.k}))
    if args.medusa:
        heads = json.loads((Path(args.medusa) / "config.json").read_text())["num_heads"]
        methods.append((f"vllm-medusa-k{heads}", {"method": "medusa", "model": str(args.medusa), "num_speculative_tokens": heads}))
    return methods


def patch_medusa() -> str:
    from vllm.model_executor.models import medusa

    load_weights = medusa.Medusa.load_weights

    def load_with_token_map(self, weights):
        return load_weights(self, weights) | ({"token_map"} if self.token_map is not None else set())

    medusa.Medusa.load_weights = load_with_token_map
    return "Medusa.load_weights reports token_map as loaded"


def counters(llm) -> dict[str, float]:
    """vLLM's speculative-decoding counters now (cumulative over the engine's life)."""
    values = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_num") and hasattr(metric, "value"):
            values[metric.name.removeprefix("vllm:spec_decode_")] = float(metric.value)
    return values


def run_method(name: str, speculative: dict | None, args, prompts: list[list[int]]) -> list[dict]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(args.target), dtype=args.dtype, max_model_len=args.max_model_len, seed=0,
              max_num_seqs=max(args.concurrency), speculative_config=speculative, disable_log_stats=False,
              gpu_memory_utilization=args.gpu_memory_utilization)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    rows = []
    for concurrency in args.concurrency:
        batch = [{"prompt_token_ids": p} for p in (prompts * concurrency)[:concurrency]]
        llm.generate(batch, greedy, use_tqdm=False)  # warm-up
        before = counters(llm)
        start = time.perf_counter()
        results = llm.generate(batch, greedy, use_tqdm=False)
        seconds = time.perf_counter() - start
        after = counters(llm)
        delta = {key: after[key] - before.get(key, 0.0) for key in after}
        generated = sum(len(r.outputs[0].token_ids) for r in results)
        drafts = delta.get("num_drafts", 0.0)
        rows.append({
            "method": name, "concurrency": concurrency, "tokens": generated, "seconds": round(seconds, 4),
            "tok_s": round(generated / seconds, 2),
            "mean_acceptance_length": round(1 + delta.get("num_accepted_tokens", 0.0) / drafts, 4) if drafts else None,
            "draft_acceptance_rate": round(delta["num_accepted_tokens"] / delta["num_draft_tokens"], 4)
            if delta.get("num_draft_tokens") else None,
            "outputs": [list(r.outputs[0].token_ids) for r in results],
        })
    del llm
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True, help="the target, a Hugging Face checkpoint directory")
    parser.add_argument("--eagle3", type=Path, help="an EAGLE-3 head exported with --format speculators")
    parser.add_argument("--medusa", type=Path, help="a Medusa head exported with --format vllm-medusa")
    parser.add_argument("--k", type=int, default=3, help="draft length for ngram and eagle3")
    parser.add_argument("--concurrency", default="1,4,8", help="comma-separated numbers of requests at once")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--patch-medusa", action="store_true", help="let stock vLLM load a truncated-vocabulary Medusa head")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.out.exists():
        print(f"error: {args.out} already exists; give a new --out", file=sys.stderr)
        return 2
    for path in (args.target, args.eagle3, args.medusa):
        if path is not None and not (path / "config.json").is_file():
            print(f"error: {path} has no config.json; give a local checkpoint or export directory", file=sys.stderr)
            return 2
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: --patch-medusa reaches it

    import torch
    import vllm
    from transformers import AutoTokenizer

    patches = [patch_medusa()] if args.patch_medusa and args.medusa else []
    tokenizer = AutoTokenizer.from_pretrained(args.target, local_files_only=True)
    prompts = [list(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=True)["input_ids"]) for p in PROMPTS]
    rows = []
    for name, speculative in parse_methods(args):
        rows += run_method(name, speculative, args, prompts)
    plain = {row["concurrency"]: row for row in rows if row["method"] == "vllm-plain"}
    for row in rows:
        reference = plain[row["concurrency"]]
        row["greedy_identical"] = row["outputs"] == reference["outputs"]
        row["speedup_vs_plain"] = round(row["tok_s"] / reference["tok_s"], 3)
    report = {
        "machine": {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                    "platform": platform.platform(), "vllm": vllm.__version__, "torch": torch.__version__},
        "target": str(args.target), "dtype": args.dtype, "max_tokens": args.max_tokens, "patches": patches,
        "results": [{k: v for k, v in row.items() if k != "outputs"} for row in rows],
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for row in report["results"]:
        print(f"{row['method']:>20} c={row['concurrency']:<3} {row['tok_s']:>9.1f} tok/s  x{row['speedup_vs_plain']:<6} "
              f"accept len {row['mean_acceptance_length']}  identical {row['greedy_identical']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
