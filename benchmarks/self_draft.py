"""The quantized self-draft against plain decoding, and q4 plainly, on the default model.

    PYTHONPATH=src .venv/bin/python benchmarks/self_draft.py [--prompts 6] [--max-new-tokens 64] [--threads 1] [--runtime fast]

Greedy decoding of Spec-Bench dev prompts (the first of each category, up to --prompts):
- plain decoding of the float32 and the bfloat16 target;
- `selfdraft:q4` (k = 2, 3, 4) on each of those targets: the GGUF's own 4-bit codes as the
  draft, every token verified by the float target, so its output is the float target's;
- plain decoding with `--dtype q4` (the same weights, held exactly; bfloat16 activations);
- HF generate on the float32 transformers model, the baseline of the speed targets.
Methods are interleaved per prompt; the table gives tokens/s over all prompts, acceptance
(accepted / drafted), tokens per round, each method's speed relative to the plain decoding of
its own target, and how many outputs equal that plain decoding's.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from verispec import load_model
from verispec.bench.runners import VerispecRunner
from verispec.peers.hf import HFRunner
from verispec.bench.workloads import read_workloads, select
from verispec.registry import build_proposer

SPECBENCH = Path(__file__).resolve().parents[1] / "../shared/data/specbench_dev.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--runtime", default="fast")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loads = {}
    for name, dtype in (("fp32", "float32"), ("bf16", "bfloat16"), ("q4", "q4")):
        start = time.perf_counter()
        loads[name] = load_model(dtype=dtype, runtime=args.runtime)
        print(f"{name}: loaded in {time.perf_counter() - start:.1f} s, runtime {loads[name].runtime}, "
              f"exact weights {loads[name].exact_weights}")
    fp32 = loads["fp32"]
    eos = fp32.eos_token_ids
    methods = {"HF generate fp32": (HFRunner(fp32.transformers_model(), eos), "fp32 plain")}
    for name in ("fp32", "bf16"):
        lm = loads[name].lm
        methods[f"{name} plain"] = (VerispecRunner(lm, None, 0, eos), f"{name} plain")
        draft = build_proposer("selfdraft:q4", loads[name])
        for k in args.ks:
            methods[f"{name} selfdraft:q4 k={k}"] = (VerispecRunner(lm, draft, k, eos), f"{name} plain")
    methods["q4 plain"] = (VerispecRunner(loads["q4"].lm, None, 0, eos), "fp32 plain")

    workloads = select(read_workloads(SPECBENCH), None, 1)[: args.prompts]
    prompts = [w.token_ids(fp32) for w in workloads]
    print(f"{len(prompts)} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), "
          f"{args.max_new_tokens} new tokens, greedy, {args.threads} thread(s)")
    for run, _ in methods.values():  # warm-up
        run(prompts[0][:64], 4)
    totals = {name: {"seconds": 0.0, "tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0, "same": 0}
              for name in methods}
    for ids in prompts:
        outputs = {}
        for name, (run, _) in methods.items():
            outcome = run(ids, args.max_new_tokens)
            total = totals[name]
            total["seconds"] += outcome.wall_seconds
            total["tokens"] += len(outcome.tokens)
            total["rounds"] += len(outcome.tokens_per_round) or len(outcome.tokens)
            if outcome.stats is not None:
                total["drafted"] += sum(outcome.stats.drafted)
                total["accepted"] += sum(outcome.stats.accepted)
            outputs[name] = outcome.tokens
        for name, (_, plain) in methods.items():
            totals[name]["same"] += outputs[name] == outputs[plain]
    print(f"\n{'method':<24} {'tok/s':>7} {'vs plain':>9} {'accept':>7} {'tok/round':>9} {'= plain':>8}")
    for name, method in methods.items():
        total = totals[name]
        rate = total["tokens"] / total["seconds"]
        plain = totals[method[1]]
        ratio = rate / (plain["tokens"] / plain["seconds"])
        accept = f"{total['accepted'] / total['drafted']:.3f}" if total["drafted"] else "-"
        print(f"{name:<24} {rate:7.2f} {ratio:8.2f}x {accept:>7} {total['tokens'] / total['rounds']:9.2f} "
              f"{total['same']:>4}/{len(prompts)}")
    print("(HF generate and q4 plain are compared with fp32 plain: the same weights)")


if __name__ == "__main__":
    main()
