"""Acceptance of a trained head on held-out benchmark prompts: tau (tokens per target forward)
at a fixed k and the conditional acceptance at each draft position, greedy by default or
sampled at `--temperature T` (drafts sampled from q, verified by the engine's `auto` rule; each
prompt decoded with seed `--seed` + its index).

    .venv/bin/python benchmarks/head_tau.py [--proposers eagle,medusa,lookup] [--k 4]
        [--per-category 1] [--humaneval 3] [--max-new-tokens 128] [--dtype auto]
        [--temperature 0] [--seed 0] [--json OUT] [--heldout DIR [--heldout-count 16]]

Prompts: the first N of each Spec-Bench dev category (first turn, chat template) and the
first M HumanEval dev prompts, read where they lie. A head never trains on them.
With `--heldout DIR` (a `verispec train` work or data directory) the prompts are instead the
instructions of DIR's held-back conversations (the trainer's 5 % split, drawn with the seed
that made DIR's data; greedy ones only, at most `--heldout-count`), decoded afresh: the head's
own distribution, which the trainer scores it on, so the two scores compare drafting with
training.
Position i's acceptance is accepted / attempted over the rounds whose draft reached position
i with the positions before it accepted (`Stats.position_attempts`); tau = new tokens / rounds.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

from verispec import GREEDY, generate
from verispec.sampling import SamplingParams
from verispec.bench.workloads import Workload, read_workloads, select
from verispec.models.loading.load import DEFAULT_MODEL, load_model
from verispec.registry import build_proposer
from verispec.train.data import DataCache
from verispec.train.loop import TrainSettings, heldout_split

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--proposers", default="eagle", help="comma-separated proposer specs")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--humaneval", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--heldout", type=Path, default=None, help="a training work or data directory")
    parser.add_argument("--heldout-count", type=int, default=16)
    args = parser.parse_args()
    sampling = SamplingParams(temperature=args.temperature) if args.temperature > 0 else GREEDY
    decoding = f"temperature {args.temperature}, seed {args.seed}" if args.temperature > 0 else "greedy"

    if args.heldout:
        workloads = heldout_workloads(args.heldout, args.heldout_count)
    else:
        workloads = select(read_workloads(args.data / "specbench_dev.jsonl"), limit_per_category=args.per_category)
        if args.humaneval:
            workloads += read_workloads(args.data / "humaneval_dev.jsonl")[: args.humaneval]
    loaded = load_model(args.model, dtype=args.dtype)
    print(f"{args.model} ({loaded.dtype}), {len(workloads)} prompts, k = {args.k}, {decoding}, {args.max_new_tokens} new tokens")
    results = {}
    for spec in args.proposers.split(","):
        proposer = build_proposer(spec, loaded)
        attempts, accepts = [0] * args.k, [0] * args.k
        per_category: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        started = time.perf_counter()
        for index, workload in enumerate(workloads):
            run = generate(loaded.lm, proposer, workload.token_ids(loaded), max_new_tokens=args.max_new_tokens,
                           sampling=sampling, seed=args.seed + index, eos_token_id=loaded.eos_token_id, k=args.k)
            for i, (a, b) in enumerate(zip(run.stats.position_attempts, run.stats.position_accepts)):
                attempts[i] += a
                accepts[i] += b
            per_category[workload.category][0] += run.stats.new_tokens
            per_category[workload.category][1] += len(run.stats.accepted)
        tokens = sum(v[0] for v in per_category.values())
        rounds = sum(v[1] for v in per_category.values())
        results[spec] = {
            "tau": tokens / rounds,
            "acceptance_by_position": [b / a if a else None for a, b in zip(attempts, accepts)],
            "attempts_by_position": attempts,
            "tau_by_category": {c: round(t / r, 3) for c, (t, r) in sorted(per_category.items())},
            "seconds": round(time.perf_counter() - started, 1),
        }
        by_position = " ".join(f"{x:.2f}" if x is not None else "-" for x in results[spec]["acceptance_by_position"])
        print(f"{spec:>10}  tau {tokens / rounds:.2f}  acceptance by position {by_position}  ({results[spec]['seconds']} s)")
        print("            " + "  ".join(f"{c} {t}" for c, t in results[spec]["tau_by_category"].items()))
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "k": args.k, "temperature": args.temperature, "seed": args.seed, "prompts": len(workloads), "results": results}, indent=2))
    return 0


def heldout_workloads(directory: Path, count: int) -> list[Workload]:
    """The instructions of the greedy conversations that every training run on `directory`
    holds back (`heldout_split_by_part`: the split follows the data's own seed)."""
    if count < 1:
        raise SystemExit(f"error: --heldout-count must be at least 1, got {count}")
    data = directory / "data" if (directory / "data").is_dir() else directory
    cache = DataCache(data)
    conversations = cache.conversations()
    if not conversations:
        raise SystemExit(f"error: {data} holds no conversations; give a work or data directory of verispec train")
    if not cache.recipe_path.is_file():
        raise SystemExit(f"error: {data} holds no recipe.json, so its held-back split is unknown; give a work or data directory of verispec train")
    seed = cache.recipe()["seed"]
    held, _ = heldout_split(len(conversations), seed, TrainSettings(kind="eagle").holdout)
    greedy = [i for i in held if not conversations[i].sampled][:count]
    return [Workload(str(i), "held-back", conversations[i].instruction, True) for i in greedy]


if __name__ == "__main__":
    raise SystemExit(main())
