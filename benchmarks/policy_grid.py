"""The k policies on simulated cost curves: each curve x acceptance x concurrency, the auto
policy's throughput over the best fixed k (chosen after the fact) and over plain decoding,
through the real engine (one request) and scheduler (several, with `BatchK`), on a clock that
charges what the curve says (`verispec.simulation`; no model runs, so the numbers are exact
for a seed and the machine's load does not touch them).

    PYTHONPATH=src .venv/bin/python benchmarks/policy_grid.py \\
        [--curves gpu-flat,cpu-q4] [--alphas 0.2,0.4,0.6,0.8,0.9] [--concurrency 1,8,32] \\
        [--c 0.05] [--tokens 2048] [--policy auto|tree] [--seeds 0] [--json OUT]

Each cell: `--tokens` tokens in all (split evenly over the requests decoded at once), every
draft of acceptance alpha per position (`simulation.chain_acceptance`), drafting at c of a
one-row forward per token; auto starts from a correct profile of the curve. With several
`--seeds` a cell's ratios are the mean over them. The targets (docs/cost-model.md): auto at or
above 0.95x the best fixed k and 0.97x plain in every cell. Exits 1 when a cell misses them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from verispec.simulation import CURVES, grid_cell

BEST, PLAIN = 0.95, 0.97


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--curves", default=",".join(CURVES))
    parser.add_argument("--alphas", default="0.2,0.4,0.6,0.8,0.9")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--c", type=float, default=0.05, help="one drafted token / one one-row forward")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--policy", choices=("auto", "tree"), default="auto")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--json", help="write every cell here")
    args = parser.parse_args()
    curves = args.curves.split(",")
    unknown = [c for c in curves if c not in CURVES]
    if unknown:
        print(f"error: unknown curve {unknown[0]!r}; choose from {', '.join(CURVES)}", file=sys.stderr)
        return 2
    alphas = [float(a) for a in args.alphas.split(",")]
    levels = [int(c) for c in args.concurrency.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"policy {args.policy}, c = {args.c}, {args.tokens} tokens a cell, seeds {seeds}")
    print(f"{'curve':<16} {'alpha':>5} {'conc':>4} {'/best k':>8} {'/plain':>7} {'best k':>6}")
    cells, worst = [], None
    for curve in curves:
        for alpha in alphas:
            for level in levels:
                runs = [grid_cell(curve, alpha, level, policy=args.policy, c=args.c, tokens=args.tokens, seed=s)
                        for s in seeds]
                best = statistics.fmean(r.over_best for r in runs)
                plain = statistics.fmean(r.over_plain for r in runs)
                flag = "" if best >= BEST and plain >= PLAIN else "  <- below target"
                print(f"{curve:<16} {alpha:>5} {level:>4} {best:>8.3f} {plain:>7.3f} {runs[0].best_k:>6}{flag}")
                cells.append({"curve": curve, "alpha": alpha, "concurrency": level, "over_best": best,
                              "over_plain": plain, "runs": [r.as_dict() for r in runs]})
                score = min(best / BEST, plain / PLAIN)
                if worst is None or score < worst[0]:
                    worst = (score, curve, alpha, level, best, plain)
    _, curve, alpha, level, best, plain = worst
    print(f"worst cell: {curve}, alpha {alpha}, concurrency {level}: {best:.3f}x best fixed k, {plain:.3f}x plain")
    print(f"lowest over best fixed k: {min(c['over_best'] for c in cells):.3f}; "
          f"lowest over plain: {min(c['over_plain'] for c in cells):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"policy": args.policy, "c": args.c, "tokens": args.tokens, "seeds": seeds, "cells": cells}, f, indent=1)
    return 0 if all(c["over_best"] >= BEST and c["over_plain"] >= PLAIN for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
