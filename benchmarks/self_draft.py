"""The quantized self-draft against plain decoding, and q4 plainly, on the default model.

    PYTHONPATH=src .venv/bin/python benchmarks/self_draft.py [--per-category 1] [--max-new-tokens 64] [--threads 1]

Greedy decoding of Spec-Bench dev prompts (one per category by default) through the HF adapter:
- plain decoding of the float32 and the bfloat16 target;
- `selfdraft:q4` (k = 2, 3, 4) on each of those targets: the GGUF's own 4-bit codes as the
  draft, every token verified by the float target, so its output is the float target's;
- plain decoding of the q4 target (the same weights, exact; bfloat16 activations).
Methods are interleaved per prompt; the table gives tokens/s over all prompts, acceptance
(accepted / drafted) and tokens per round, and each method's speed relative to the plain
decoding of its own target. Outputs of the speculative methods are checked against plain.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from verispec import GREEDY, generate, load_model
from verispec.bench.workloads import read_workloads, select
from verispec.models.gguf_blocks import gguf_weights
from verispec.models.hf import HFCausalLM
from verispec.models.quantized import quantized_model
from verispec.proposers.self_draft import SelfDraft

SPECBENCH = Path(__file__).resolve().parents[1] / "../shared/data/specbench_dev.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fp32 = load_model(dtype="float32")
    bf16 = load_model(dtype="bfloat16")
    blocks = gguf_weights(fp32.source, fp32.model)
    start = time.perf_counter()
    q4 = HFCausalLM(quantized_model(fp32.model, "q4", blocks))
    print(f"q4 target built in {time.perf_counter() - start:.1f} s, exact weights: {q4.model.exact}")
    targets = {"fp32": fp32.lm, "bf16": bf16.lm}
    drafts = {name: SelfDraft(lm, "q4", gguf=fp32.source) for name, lm in targets.items()}
    methods = {}
    for name, lm in targets.items():
        methods[f"{name} plain"] = (lm, None, 0, f"{name} plain")
        for k in args.ks:
            methods[f"{name} selfdraft:q4 k={k}"] = (lm, drafts[name], k, f"{name} plain")
    methods["q4 plain"] = (q4, None, 0, "q4 plain")

    workloads = select(read_workloads(SPECBENCH), None, args.per_category)
    prompts = [w.token_ids(fp32) for w in workloads]
    print(f"{len(prompts)} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), "
          f"{args.max_new_tokens} new tokens, greedy, {args.threads} thread(s)")
    options = dict(max_new_tokens=args.max_new_tokens, sampling=GREEDY, eos_token_id=fp32.eos_token_id)
    for lm, proposer, k, _ in methods.values():  # warm-up
        generate(lm, proposer, prompts[0][:64], max_new_tokens=4, sampling=GREEDY, k=k)
    totals = {name: {"seconds": 0.0, "tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0, "same": 0}
              for name in methods}
    for ids in prompts:
        outputs = {}
        for name, (lm, proposer, k, _) in methods.items():
            start = time.perf_counter()
            result = generate(lm, proposer, ids, k=k, **options)
            total = totals[name]
            total["seconds"] += time.perf_counter() - start
            total["tokens"] += result.stats.new_tokens
            total["drafted"] += sum(result.stats.drafted)
            total["accepted"] += sum(result.stats.accepted)
            total["rounds"] += result.stats.rounds
            outputs[name] = result.tokens
        for name, (_, _, _, plain) in methods.items():
            totals[name]["same"] += outputs[name] == outputs[plain]
    print(f"\n{'method':<24} {'tok/s':>7} {'vs plain':>9} {'accept':>7} {'tok/round':>9} {'= plain':>8}")
    for name, method in methods.items():
        total = totals[name]
        rate = total["tokens"] / total["seconds"]
        plain = totals[method[3]]
        ratio = rate / (plain["tokens"] / plain["seconds"])
        accept = f"{total['accepted'] / total['drafted']:.3f}" if total["drafted"] else "-"
        print(f"{name:<24} {rate:7.2f} {ratio:8.2f}x {accept:>7} {total['tokens'] / total['rounds']:9.2f} "
              f"{total['same']:>4}/{len(prompts)}")
    fp32_rate = totals["fp32 plain"]["tokens"] / totals["fp32 plain"]["seconds"]
    q4_rate = totals["q4 plain"]["tokens"] / totals["q4 plain"]["seconds"]
    print(f"\nq4 plain / fp32 plain: {q4_rate / fp32_rate:.2f}x")


if __name__ == "__main__":
    main()
