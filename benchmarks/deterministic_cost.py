"""What deterministic scoring costs: one forward of n rows after a cached context, with the fast
runtime's deterministic attention and with torch's fused one, interleaved in random order.

    PYTHONPATH=src .venv/bin/python benchmarks/deterministic_cost.py --dtype q4 [--context 300]
        [--repeats 15] [--threads 2]

Prints, per attention, the one-row forward's median and v(n) = t(n) / t(1) for n = 2..9.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from verispec.models.loading.load import load_model

ROWS = (1, 2, 3, 4, 5, 6, 8, 9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="q4")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runtimes = {det: load_model(dtype=args.dtype, deterministic=det).lm for det in (False, True)}
    for lm in runtimes.values():
        lm.prefill(list(range(1000, 1000 + args.context)))
    times: dict[tuple[bool, int], list[float]] = {(det, n): [] for det in runtimes for n in ROWS}
    rng = random.Random(0)
    for repeat in range(args.repeats + 2):  # two warm-up passes
        order = list(times)
        rng.shuffle(order)
        for det, n in order:
            lm = runtimes[det]
            start = time.perf_counter()
            lm.extend([5] * n)
            elapsed = time.perf_counter() - start
            lm.rollback(args.context)
            if repeat >= 2:
                times[(det, n)].append(elapsed)
    for det in runtimes:
        one = statistics.median(times[(det, 1)])
        ratios = " ".join(f"v({n})={statistics.median(times[(det, n)]) / one:.2f}" for n in ROWS[1:])
        print(f"{args.dtype} {'deterministic' if det else 'fused'}: 1 row {one * 1e3:.2f} ms  {ratios}")


if __name__ == "__main__":
    main()
