"""What N a runtime check needs to see each named bug class, on the default model: the power
of `verispec check-runtime`'s tests against every class of `verispec.runtime_check.power`, per
parameter, at several N, from the exact law alone (no engine, no sampling, no timing).

    PYTHONPATH=src .venv/bin/python benchmarks/check_runtime_power.py [--n 1200 3366 13458] [--out FILE]

For each N: the check's prompts at N (`law.spread_prompts`, 3 of them), the exact law on its
24 cells a prompt at length 3, each class's law with a draft accepting half, and the power of
`spec vs exact` and of `spec vs plain` (noncentrality halved) at alpha 1e-3 and the degrees of
freedom those cells give. A markdown table per N on stdout (and in FILE).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from verispec.models import DEFAULT_MODEL
from verispec.models.loading.load import load_model
from verispec.runtime_check import law, power
from verispec.runtime_check.cases import default_cases
from verispec.statistics import degrees_of_freedom

ALPHA, CELLS, LENGTH, PROMPTS = 1e-3, 24, 3, 3


def table(score, encode, n: int) -> list[str]:
    per_prompt = n // PROMPTS
    prompts = [ids for _, ids, _ in law.spread_prompts(score, encode, PROMPTS, per_prompt)]
    bias = tuple(dict.fromkeys((law.likely_tokens(score, ids, 2)[1], 2.0) for ids in prompts))
    cases = default_cases(bias)
    names = list(power.CLASSES)
    lines = [f"### N = {n} per side ({per_prompt} a prompt): power of spec vs exact / spec vs plain (TV on the cells)", "",
             "| class | " + " | ".join(case.name for case in cases) + " |", "|---|" + "---|" * len(cases)]
    results = {}
    for case in cases:
        laws = [law.exact_cells(score, p, case, per_prompt, (), LENGTH, CELLS) for p in prompts]
        bugs = [power.bug_laws(score, p, case, list(cells), LENGTH) for p, cells in zip(prompts, laws)]
        df = sum(degrees_of_freedom(cells, per_prompt, CELLS) for cells in laws)
        for name in names:
            shares = [power.noncentrality(cells, bug[name], per_prompt, CELLS) for cells, bug in zip(laws, bugs)]
            lam = sum(share for _, share in shares)
            tv = sum(t for t, _ in shares) / len(shares)
            results[name, case.name] = (power.run_power([lam], df, ALPHA), power.run_power([lam / 2], df, ALPHA), tv)
        print(f"N {n}: {case.name} done", file=sys.stderr, flush=True)
    for name in names:
        cells = [f"{results[name, c.name][0]:.2f} / {results[name, c.name][1]:.2f} ({results[name, c.name][2]:.3f})"
                 for c in cases]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1200, 3366, 13458])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    loaded = load_model(args.model, dtype="float32")
    score = functools.lru_cache(maxsize=None)(lambda ids: loaded.lm.score(list(ids))[-1:])
    lines = [f"# Power of check-runtime against named bug classes: {loaded.name}, float32, length {LENGTH}, "
             f"{CELLS} cells a prompt, alpha {ALPHA:g}, a draft accepting half", ""]
    for n in args.n:
        lines += table(lambda ids: score(tuple(ids)), lambda text: loaded.encode(text, chat=False), n)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
