"""The engine's own cost per round, beside the target's forward, on the default model.

    .venv/bin/python benchmarks/engine_overhead.py [--prompts 4] [--max-new-tokens 96] [--threads 1]

Runs prompt lookup (k = 4) on the first Spec-Bench summarization prompts, greedy and at
temperature 1, and reports per round: the target forward, the proposer, and verify + commit
(the engine's overhead). Then times the pieces of that overhead alone on rows shaped like a
round's ([k + 1, 49152] float32 logits), to show which of them cost what.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from verispec import GREEDY, SamplingParams, generate, load_model, verify
from verispec.bench.workloads import data_file, read_workloads, select
from verispec.drafts import Draft
from verispec.proposers import PromptLookup
from verispec.randomness import TorchRandom
from verispec.sampling import check_logits, probabilities

SPECBENCH = data_file("specbench_dev.jsonl", Path(__file__).parents[1])


def per_round(prompts: list[list[int]], loaded, sampling: SamplingParams, max_new_tokens: int) -> dict:
    totals = {"rounds": 0, "tokens": 0, "target": 0.0, "draft": 0.0, "verify": 0.0, "commit": 0.0}
    for ids in prompts:
        stats = generate(
            loaded.lm, PromptLookup(), ids, max_new_tokens=max_new_tokens, sampling=sampling,
            eos_token_id=loaded.eos_token_id, k=4, seed=0,
        ).stats
        totals["rounds"] += stats.rounds
        totals["tokens"] += stats.new_tokens
        totals["target"] += stats.target_seconds
        totals["draft"] += stats.draft_seconds
        totals["verify"] += stats.verify_seconds
        totals["commit"] += stats.commit_seconds
    rounds = totals["rounds"]
    return {
        "rounds": rounds,
        "tokens per round": totals["tokens"] / rounds,
        **{f"{key} ms/round": 1000 * totals[key] / rounds for key in ("target", "draft", "verify", "commit")},
        "overhead % of target": 100 * (totals["verify"] + totals["commit"]) / totals["target"],
    }


def median_ms(fn, repeats: int = 50) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def pieces(loaded, context: list[int]) -> dict[str, float]:
    """Each step of verify and commit, alone, on one round's worth of rows."""
    k = 4
    logits = loaded.lm.score(context[-64:])[-(k + 1) :]  # float32 [k + 1, V]
    draft = Draft(tuple(int(t) for t in logits[:k].argmax(-1)))
    rng = TorchRandom(0)
    p = probabilities(logits, SamplingParams())
    lm = loaded.lm
    lm.prefill(context)

    def extend_and_rollback() -> None:
        lm.extend(context[-1:] + list(draft.tokens))
        lm.rollback(len(context))

    crop_times = []
    for _ in range(20):
        lm.extend(list(draft.tokens), keep=1)
        start = time.perf_counter()
        lm.rollback(len(context))
        crop_times.append(time.perf_counter() - start)
    return {
        "greedy rule (argmax [5, V] + tolist)": median_ms(lambda: verify.greedy(logits, draft, rng)),
        "probabilities float64 [5, V] (T = 1)": median_ms(lambda: probabilities(logits, SamplingParams())),
        "  of which the float64 copy + softmax": median_ms(lambda: torch.softmax(logits.double(), -1)),
        "  of which check_logits (isnan/isposinf/isneginf)": median_ms(lambda: check_logits(logits)),
        "  float32 softmax, for comparison": median_ms(lambda: torch.softmax(logits, -1)),
        "point-mass rule on p [5, V]": median_ms(lambda: verify.point_mass(p, draft, rng)),
        "rollback (DynamicCache crop, 30 layers)": 1000 * statistics.median(crop_times),
        "extend 5 + rollback (the target's forward)": median_ms(extend_and_rollback, repeats=10),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(dtype="float32")
    workloads = select(read_workloads(SPECBENCH), ["summarization"], args.prompts)
    prompts = [w.token_ids(loaded) for w in workloads]
    print(f"default model, float32, {args.threads} thread(s), {len(prompts)} summarization prompts "
          f"({min(map(len, prompts))}-{max(map(len, prompts))} tokens), {args.max_new_tokens} new tokens each")
    generate(loaded.lm, PromptLookup(), prompts[0], max_new_tokens=8, sampling=GREEDY, k=4)  # warm-up
    for label, sampling in [("greedy", GREEDY), ("temperature 1", SamplingParams())]:
        print(f"\nprompt lookup k=4, {label}")
        for key, value in per_round(prompts, loaded, sampling, args.max_new_tokens).items():
            print(f"  {key:<24} {value:9.2f}")
    print("\npieces, median ms")
    for key, value in pieces(loaded, prompts[0]).items():
        print(f"  {key:<50} {value:8.3f}")


if __name__ == "__main__":
    main()
