"""Where the fast runtime's float32 forward stands against transformers', by projection kernel:
one forward of 1 and of `--rows` new tokens after a cached context, interleaved in random
order, for transformers' `LlamaForCausalLM` (its own cache, as `generate` steps it), the fast
runtime on oneDNN's prepacked weights (its default), on `F.linear` (MKL, transformers' own
products: weight format "dense", whose single row is MKL's gemv and sums apart from two or
more) and on MKL with a lone row padded to two (`PaddedMKL`: what a row-invariant MKL route
would cost at most rows in one call; probed row blocks would add calls past their size).

    PYTHONPATH=src .venv/bin/python benchmarks/float32_kernels.py [--contexts 50,300,1000]
        [--rows 5] [--repeats 21] [--threads 2]

Prints, per context, each forward's median and the one-token forward's speed against
transformers'. `verispec profile --dtype float32` names the kernel path the projections took.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from transformers import DynamicCache

from verispec.models.loading.load import load_model
from verispec.models.runtimes.llama import LlamaRuntime

FAST = {"fast (oneDNN prepacked)": "float", "fast (F.linear, MKL)": "dense"}
PADDED = "fast (MKL, 1 row padded)"
TOKEN = 5  # the token every timed forward appends


class PaddedMKL(torch.nn.Module):
    """y = x W^T through `F.linear` (MKL), a single row computed as two (MKL's gemm, not its gemv)."""

    def __init__(self, dense: torch.nn.Module) -> None:
        super().__init__()
        self.weight, self.bias = dense.weight, dense.bias  # [out, in], [out] or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return torch.nn.functional.linear(x.expand(2, -1), self.weight, self.bias)[:1]
        return torch.nn.functional.linear(x, self.weight, self.bias)


def padded(lm: LlamaRuntime) -> LlamaRuntime:
    """`lm` (built on weight format "dense") with every projection padded (`PaddedMKL`)."""
    lm.head = PaddedMKL(lm.head)
    for layer in lm.layers:
        layer.qkv, layer.o = PaddedMKL(layer.qkv), PaddedMKL(layer.o)
        layer.gate_up, layer.down = PaddedMKL(layer.gate_up), PaddedMKL(layer.down)
    return lm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="50,300,1000")
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(dtype="float32", runtime="hf").model
    fast = {name: LlamaRuntime.from_hf(model, fmt, deterministic=True) for name, fmt in FAST.items()}
    fast[PADDED] = padded(LlamaRuntime.from_hf(model, "dense", deterministic=True))
    for context in (int(c) for c in args.contexts.split(",")):
        prompt = list(range(1000, 1000 + context))
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
        for lm in fast.values():
            lm.prefill(prompt)
        steps = {}
        for n in (1, args.rows):
            steps["transformers", n] = hf_step(model, cache, n)
            for name, lm in fast.items():
                steps[name, n] = fast_step(lm, context, n)
        medians = timed(steps, args.repeats)
        hf = medians["transformers", 1]
        print(f"context {context}:")
        for name in ("transformers", *fast):
            one, many = medians[name, 1], medians[name, args.rows]
            print(f"  {name:26s} 1 row {one * 1e3:7.2f} ms ({hf / one:.2f}x transformers)  "
                  f"{args.rows} rows {many * 1e3:7.2f} ms (v({args.rows}) {many / one:.2f})")


def hf_step(model, cache: DynamicCache, n: int):
    def step() -> None:
        with torch.inference_mode():
            model(input_ids=torch.tensor([[TOKEN] * n]), past_key_values=cache, use_cache=True, logits_to_keep=n)
        cache.crop(-n)
    return step


def fast_step(lm: LlamaRuntime, context: int, n: int):
    def step() -> None:
        lm.extend([TOKEN] * n)
        lm.rollback(context)
    return step


def timed(steps: dict, repeats: int) -> dict:
    """Median seconds of each step over `repeats` rounds, in a shuffled order each round,
    after two untimed rounds."""
    times = {key: [] for key in steps}
    rng = random.Random(0)
    for repeat in range(repeats + 2):
        order = list(steps)
        rng.shuffle(order)
        for key in order:
            start = time.perf_counter()
            steps[key]()
            if repeat >= 2:
                times[key].append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in times.items()}


if __name__ == "__main__":
    main()
