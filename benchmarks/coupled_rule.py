"""The coupled rule against today's rules at temperature > 0: tokens per round (tau) and tok/s
on the Spec-Bench dev prompts (first turn, chat template), per proposer and sampling.

    PYTHONPATH=src .venv/bin/python benchmarks/coupled_rule.py [--per-category 1] \\
        [--max-new-tokens 64] [--proposers lookup,lookup+eagle,eagle,eagle@tree:4x2x1,layerskip:8] \\
        [--rules coupled,block,token,point-mass] [--seeds 3] [--dtype float32] [--threads 1]

A proposer may carry its own k after '@' (default --k, 4). Rules that are not exact for a
proposer's drafts (point-mass for sampled drafts, block for trees) are left out of its rows.
tau = new tokens / rounds over every prompt and seed; it depends on the seeds and the model's
numerics only, not on timing, so it may be measured on a busy machine. tok/s is wall time and
needs a quiet one. Each row also reports the ratio of its tok/s to the best rule's in its group.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from verispec import SamplingParams
from verispec.bench.workloads import read_workloads, select
from verispec.engine import generate
from verispec.models.loading.load import DEFAULT_MODEL, load_model
from verispec.registry import build_policy, build_proposer
from verispec.request import Request

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
SAMPLINGS = {"T0.7": SamplingParams(0.7), "T1.0": SamplingParams(1.0), "T0.7 top-p 0.9": SamplingParams(0.7, top_p=0.9)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--proposers", default="lookup,lookup+eagle,eagle,eagle@tree:4x2x1,layerskip:8")
    parser.add_argument("--rules", default="coupled,block,token,point-mass")
    parser.add_argument("--samplings", default=",".join(SAMPLINGS), help=f"comma-separated, of {list(SAMPLINGS)}")
    parser.add_argument("--k", default="4")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype=args.dtype)
    workloads = select(read_workloads(args.data / "specbench_dev.jsonl"), limit_per_category=args.per_category)
    prompts = [workload.token_ids(loaded) for workload in workloads]
    print(f"{len(prompts)} prompts, {args.seeds} seeds, {args.max_new_tokens} new tokens, {args.dtype}")
    print("sampling | proposer | k | rule | tau | tok/s | tok/s vs best rule | new tokens | rounds")
    for sampling_name in args.samplings.split(","):
        sampling = SAMPLINGS[sampling_name]
        for entry in args.proposers.split(","):
            spec, _, k = entry.partition("@")
            k = k or args.k
            rows = []
            for rule in args.rules.split(","):
                row = measure(loaded, prompts, spec, k, rule, sampling, args)
                if row is not None:
                    rows.append((rule, *row))
            best = max(speed for _, _, speed, _, _ in rows)
            for rule, tau, speed, tokens, rounds in rows:
                print(f"{sampling_name} | {spec} | {k} | {rule} | {tau:.3f} | {speed:.1f} | {speed / best:.3f} | "
                      f"{tokens} | {rounds}", flush=True)
    return 0


def measure(loaded, prompts, spec: str, k: str, rule: str, sampling: SamplingParams, args) -> tuple | None:
    """(tau, tok/s, new tokens, rounds) of one rule over every prompt and seed; None where the
    rule is not exact for the proposer's drafts."""
    tokens = rounds = 0
    seconds = 0.0
    for ids in prompts:
        for seed in range(args.seeds):
            proposer = build_proposer(spec, loaded)
            policy = build_policy(k, loaded.lm, proposer, ids, sampling)
            request = Request(tuple(ids), args.max_new_tokens, sampling=sampling, seed=seed,
                              eos_token_ids=loaded.eos_token_ids, verifier=rule)
            start = time.perf_counter()
            try:
                generation = generate(loaded.lm, proposer, request, policy=policy)
            except ValueError:  # e.g. point-mass for sampled drafts, block for a tree
                return None
            seconds += time.perf_counter() - start
            tokens += len(generation.tokens)
            rounds += generation.stats.rounds
    return tokens / rounds, tokens / seconds, tokens, rounds


if __name__ == "__main__":
    raise SystemExit(main())
