"""What logprobs cost under speculation: the same speculative decoding with and without each
token's logprobs (and its top alternatives), greedy, on the dev prompts of each category, the
two interleaved per prompt (the order alternating), every pair checked token for token.

    .venv/bin/python benchmarks/logprobs_cost.py [--proposer lookup+eagle] [--k auto] [--top 5]
        [--per-category 1] [--repeats 2] [--max-new-tokens 128] [--dtype auto]

Prints tokens/s with logprobs off and on per prompt and the median ratio on/off (the target:
>= 0.95). The logprobs are the target's rows the round scored anyway (`verispec.logprobs`), so
what they add is a log-softmax and a top-k per emitted token.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

from verispec import GREEDY, generate, load_model
from verispec.bench.workloads import data_file, read_workloads, select
from verispec.proposers.trained import default_proposer
from verispec.registry import build_policy, build_proposer, parse_k
from verispec.request import Request

SPECBENCH = data_file("specbench_dev.jsonl", Path(__file__).parents[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--proposer", default=None)
    parser.add_argument("--k", default="auto")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    loaded = load_model(args.model, dtype=args.dtype)
    proposer = build_proposer(args.proposer or default_proposer(args.model), loaded)
    prompts = [w.token_ids(loaded) for w in select(read_workloads(SPECBENCH), limit_per_category=args.per_category)]
    policy = build_policy(parse_k(args.k), loaded.lm, proposer, prompts[0], GREEDY)
    eos = loaded.eos_token_ids

    def run(ids: list[int], logprobs: int | None) -> tuple[list[int], float]:
        request = Request(tuple(ids), args.max_new_tokens, eos_token_ids=eos, logprobs=logprobs)
        start = time.perf_counter()
        out = generate(loaded.lm, proposer, request, policy=copy.deepcopy(policy))
        return out.tokens, len(out.tokens) / (time.perf_counter() - start)

    run(prompts[0], args.top)  # warm-up
    ratios = []
    print(f"{'prompt':>6} {'off tok/s':>10} {'on tok/s':>10} {'on/off':>7}")
    for repeat in range(args.repeats):
        for i, ids in enumerate(prompts):
            order = [None, args.top] if (i + repeat) % 2 == 0 else [args.top, None]
            results = {setting: run(ids, setting) for setting in order}
            (off_tokens, off), (on_tokens, on) = results[None], results[args.top]
            if off_tokens != on_tokens:
                raise SystemExit(f"prompt {i}: logprobs changed the tokens")
            ratios.append(on / off)
            print(f"{i:>6} {off:>10.1f} {on:>10.1f} {on / off:>7.3f}")
    print(f"median on/off: {statistics.median(ratios):.3f} over {len(ratios)} pairs (target >= 0.95)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
