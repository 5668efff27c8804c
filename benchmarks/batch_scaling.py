"""How plain decoding scales with requests in flight, per weight format, and what the batch's
row invariance costs: aggregate tokens/s of c requests at once against one at a time.

    .venv/bin/python benchmarks/batch_scaling.py [--dtypes bfloat16,float32,q4] [--levels 1,8]
        [--prompts 8] [--max-new-tokens 64] [--repeats 3] [--json OUT]

For each weight format, with deterministic scoring on and off (the fast runtime's row-invariant
attention, which makes every request's greedy output its own whatever shares the forward), it
serves the same prompts (the first of each Spec-Bench dev category) through the continuous-
batching scheduler at each concurrency level, plain greedy decoding, and for c = 1 also through
today's single-request `Decoding` (`generate`), so the scheduler's own overhead shows. Every
configuration runs once as a warm-up, then `--repeats` times interleaved; it reports the median
aggregate tokens/s with the lowest and highest, the ratios c = max / c = 1 and scheduler /
`generate` at c = 1, and checks that every batched output equals the single request's.
Run it alone: other processes on the cores change every number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from verispec import GREEDY, Request, Scheduler, generate, load_model
from verispec.bench.workloads import data_file, read_workloads, select
from verispec.machine import describe

SPECBENCH = data_file("specbench_dev.jsonl", Path(__file__).parents[1])


def scheduler_run(model, prompts: list[list[int]], c: int, max_new_tokens: int) -> tuple[float, list[list[int]]]:
    """A closed loop of `c` plain requests over `prompts`; (tokens/s, outputs)."""
    scheduler = Scheduler(model.lm, lambda request, slot: (None, 0), max_slots=c)
    start = time.perf_counter()
    jobs = [scheduler.submit(Request(tuple(p), max_new_tokens, eos_token_ids=model.eos_token_ids)) for p in prompts]
    scheduler.run()
    seconds = time.perf_counter() - start
    return sum(len(job.tokens) for job in jobs) / seconds, [job.tokens for job in jobs]


def single_run(model, prompts: list[list[int]], max_new_tokens: int) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    outs = [generate(model.lm, None, p, max_new_tokens=max_new_tokens, k=0, sampling=GREEDY,
                     eos_token_id=model.eos_token_ids).tokens for p in prompts]
    return sum(map(len, outs)) / (time.perf_counter() - start), outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="bfloat16,float32,q4")
    parser.add_argument("--levels", default="1,8")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    workloads = select(read_workloads(SPECBENCH), limit_per_category=1)[: args.prompts]
    rows = []
    for dtype in args.dtypes.split(","):
        for deterministic in (True, False):
            model = load_model(dtype=dtype, deterministic=deterministic)
            prompts = [w.token_ids(model) for w in workloads]
            runs = {("generate", 1): lambda: single_run(model, prompts, args.max_new_tokens)}
            for c in levels:
                runs["scheduler", c] = (lambda c=c: scheduler_run(model, prompts, c, args.max_new_tokens))
            rates: dict = {key: [] for key in runs}
            outputs: dict = {}
            keys = list(runs)
            for repeat in range(args.repeats + 1):
                for key in keys[repeat % len(keys):] + keys[: repeat % len(keys)]:
                    rate, outs = runs[key]()
                    outputs[key] = outs
                    if repeat:  # the first pass is the warm-up
                        rates[key].append(rate)
            reference = outputs["generate", 1]
            row = {"dtype": dtype, "weight_format": model.weight_format, "deterministic": deterministic}
            for (kind, c), values in rates.items():
                row[f"{kind}_c{c}"] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
                row[f"{kind}_c{c}_identical"] = sum(a == b for a, b in zip(outputs[kind, c], reference))
            base = row["scheduler_c1"]["median"] if "scheduler_c1" in row else None
            if base:
                row["scheduler_c1_over_generate"] = base / row["generate_c1"]["median"]
                top = max(levels)
                row[f"c{top}_over_c1"] = row[f"scheduler_c{top}"]["median"] / base
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"machine": describe(), "prompts": len(workloads), "max_new_tokens": args.max_new_tokens,
              "repeats": args.repeats, "levels": levels, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
