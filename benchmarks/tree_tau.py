"""Tokens per target forward (tau) of proposers at constant k policies and token trees, greedy,
on the first Spec-Bench dev prompt of each category (first turn, chat template).

    PYTHONPATH=src .venv/bin/python benchmarks/tree_tau.py --proposers lookup,lookahead \\
        --ks 4,tree:2x2x1,tree:4x2x1 [--per-category 1] [--max-new-tokens 64] [--dtype bfloat16]

tau = new tokens / rounds over all prompts; a constant policy (an integer k or tree:W1xW2x...)
makes the proposers comparable shape for shape, whatever a cost model would choose.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from verispec import GREEDY, generate
from verispec.bench.workloads import read_workloads, select
from verispec.models.loading.load import DEFAULT_MODEL, load_model
from verispec.registry import build_policy, build_proposer

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--proposers", default="lookup,lookahead", help="comma-separated proposer specs")
    parser.add_argument("--ks", default="4,tree:2x2x1", help="comma-separated constant k policies")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_model(args.model, dtype=args.dtype)
    workloads = select(read_workloads(args.data / "specbench_dev.jsonl"), limit_per_category=args.per_category)
    prompts = [workload.token_ids(loaded) for workload in workloads]
    print("proposer | k | tau | new tokens | rounds | seconds")
    for spec in args.proposers.split(","):
        for k in args.ks.split(","):
            tokens = rounds = 0
            start = time.perf_counter()
            for ids in prompts:
                proposer = build_proposer(spec, loaded)
                policy = build_policy(k, loaded.lm, proposer, ids)
                generation = generate(loaded.lm, proposer, ids, max_new_tokens=args.max_new_tokens, sampling=GREEDY,
                                      k=policy, eos_token_id=loaded.eos_token_ids)
                tokens += len(generation.tokens)
                rounds += generation.stats.rounds
            print(f"{spec} | {k} | {tokens / rounds:.3f} | {tokens} | {rounds} | {time.perf_counter() - start:.0f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
