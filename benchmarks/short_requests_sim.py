"""Auto k against every fixed k on short requests, on the long-context sweep's cost curves.

    .venv/bin/python benchmarks/short_requests_sim.py [--tokens 40] [--seeds 30]

The simulated machine of `verispec.simulation` (exact, no clock read): v(n) of the q4 forward
measured at 512 and 4,096 tokens of context (docs/results/long-context.json's profile), a
drafted token 0.01 of a step, k_max 4, and drafts whose acceptance at each position is set:
prompt lookup's on that document (about 0.53, 0.8, 0.5, 0.67 at 512 tokens; 0.75, 0.83, 0.7,
0.7 at 4,096) or flat. Each cell is the mean over `--seeds` requests of `--tokens` tokens; it
prints auto's throughput over the best fixed k's, the measure docs/results/long-context.md
quotes.
"""

from __future__ import annotations

import argparse
import statistics

from verispec.simulation import Curve, Simulation

K_MAX = 4  # the sweep's k_max: its profile measured v(n) to n = 5

CURVES = {
    "q4 at 512": Curve((1, 2, 3, 4, 5), (1.0, 1.17, 1.327, 1.562, 2.333), "long-context.json, 512 tokens"),
    "q4 at 4096": Curve((1, 2, 3, 4, 5), (1.0, 1.40, 1.71, 2.02, 2.60), "long-context.json, 4,096 tokens"),
}
ACCEPTANCE = {
    "lookup at 512": [[0.53], [0.8], [0.5], [0.67]],
    "lookup at 4096": [[0.75], [0.83], [0.7], [0.7]],
    "flat 0.5": [[0.5]] * 4,
    "flat 0.8": [[0.8]] * 4,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=30)
    args = parser.parse_args()
    if args.tokens < 1 or args.seeds < 1:
        parser.error("--tokens and --seeds must be >= 1")
    ratios = []
    for curve_name, curve in CURVES.items():
        for name, acceptance in ACCEPTANCE.items():
            mean = {
                plan: statistics.mean(Simulation(curve, acceptance, 0.01, args.tokens, seed, K_MAX).throughput(plan)
                                      for seed in range(args.seeds))
                for plan in ("auto", 1, 2, 3, 4)
            }
            best = max((k for k in mean if k != "auto"), key=mean.__getitem__)
            ratios.append(mean["auto"] / mean[best])
            print(f"{curve_name:11} {name:15} auto {mean['auto']:6.1f}  best k = {best} {mean[best]:6.1f}  "
                  f"auto / best {ratios[-1]:.3f}")
    print(f"auto / best fixed k: {min(ratios):.3f} to {max(ratios):.3f}, mean {statistics.mean(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
