"""The fast runtime's float32 logits against transformers' forward on the same weights, and
both against a float64 copy of the model (the exact function, up to float64 rounding).

    .venv/bin/python benchmarks/logits_vs_hf.py [--per-category 1] [--long 4] [--min-long 300]
        [--prompts FILE] [--threads 1]

Prompts: the first `--per-category` of each category of a Spec-Bench file, then the first
`--long` with at least `--min-long` tokens (first turn, through the chat template). Each is
scored in one full forward by: transformers in float32 (its default attention) and in float64,
the fast runtime (prepacked oneDNN projections) and the fast runtime with `F.linear`
projections (weight format "dense", transformers' own products). Prints per prompt: tokens,
max |fast - HF|, max |dense - HF| (0 when every operation but the projections' summation order
matches transformers), and max and root-mean-square distance to float64 of fast and HF.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch

from verispec.bench.workloads import data_file, read_workloads, select
from verispec.models.runtimes.llama import LlamaRuntime
from verispec.models.loading.load import load_model

SPECBENCH = data_file("specbench_dev.jsonl", Path(__file__).parents[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--long", type=int, default=4)
    parser.add_argument("--min-long", type=int, default=300)
    parser.add_argument("--prompts", type=Path, default=SPECBENCH)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    loaded = load_model(dtype="float32", runtime="hf")
    model = loaded.model
    exact = copy.deepcopy(model).double()  # float64 ground truth, same weights
    fast, dense = LlamaRuntime.from_hf(model), LlamaRuntime.from_hf(model, "dense")
    workloads = read_workloads(args.prompts)
    prompts = [w.token_ids(loaded) for w in select(workloads, limit_per_category=args.per_category)]
    prompts += [ids for ids in (w.token_ids(loaded) for w in workloads) if len(ids) >= args.min_long][: args.long]

    columns = ("fast-HF", "dense-HF", "fast-f64", "HF-f64", "rms fast-f64", "rms HF-f64")
    print(f"{'tokens':>6}", *(f"{c:>12}" for c in columns))
    worst = dict.fromkeys(columns, 0.0)
    for ids in prompts:
        with torch.no_grad():
            truth = exact(torch.tensor([ids])).logits[0]  # float64 [T, V]
            hf = model(torch.tensor([ids])).logits[0].double()
        ours, reference = fast.score(ids).double(), dense.score(ids).double()
        row = {
            "fast-HF": (ours - hf).abs().max().item(),
            "dense-HF": (reference - hf).abs().max().item(),
            "fast-f64": (ours - truth).abs().max().item(),
            "HF-f64": (hf - truth).abs().max().item(),
            "rms fast-f64": (ours - truth).pow(2).mean().sqrt().item(),
            "rms HF-f64": (hf - truth).pow(2).mean().sqrt().item(),
        }
        print(f"{len(ids):>6}", *(f"{row[c]:>12.2e}" for c in columns), flush=True)
        worst = {c: max(worst[c], row[c]) for c in columns}
    print(f"{'worst':>6}", *(f"{worst[c]:>12.2e}" for c in columns))


if __name__ == "__main__":
    main()
