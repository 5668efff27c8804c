"""Where the verification rules should run when the model is on an accelerator: on the host
after one copy of the rows, or on the device.

    .venv/bin/python benchmarks/rule_rows_device.py [--vocab 49152] [--k 4] [--repeats 200]

On rows shaped like a round of the default model ([k + 1, V] float32 logits, random), it times
on this CPU, interleaved, medians of `--repeats`: the sampling transforms (logits -> float64 p),
each rule on host rows, and the rows' sizes. Then it counts the single numbers each rule reads
(`float`, `int`, `bool`, `.tolist()`): on a device each read is a synchronisation, which is
what running the rules there would cost, against one copy of the rows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec import SamplingParams, verify
from verispec.drafts import Draft
from verispec.randomness import TorchRandom
from verispec.sampling import probabilities

READS = {torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__bool__, torch.Tensor.__index__,
         torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy}


class CountsReads(torch.Tensor):
    """Counts the reads of single numbers, each a synchronisation if the tensor lived on a GPU."""

    reads = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in READS:
            CountsReads.reads += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    k, sampling = args.k, SamplingParams()
    logits = 4 * torch.randn(k + 1, args.vocab)  # float32 [k + 1, V]
    draft_logits = logits[:k] + 0.5 * torch.randn(k, args.vocab)
    p = probabilities(logits, sampling)  # float64 [k + 1, V]
    q = probabilities(draft_logits, sampling)  # float64 [k, V]
    sampled = Draft(tuple(int(t) for t in q.argmax(-1)), q)
    chosen = Draft(sampled.tokens)
    steps = {
        "transforms: float32 logits -> float64 p": lambda: probabilities(logits, sampling),
        "greedy rule on logits": lambda: verify.greedy(logits, chosen, TorchRandom(0)),
        "point-mass rule on p": lambda: verify.point_mass(p, chosen, TorchRandom(0)),
        "token-level rule on p, q": lambda: verify.token_level(p, sampled, TorchRandom(0)),
        "block rule on p, q": lambda: verify.block(p, sampled, TorchRandom(0)),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(5):
        for step in steps.values():
            step()
    for _ in range(args.repeats):
        for name, step in steps.items():  # interleaved, so drift spreads over all of them
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)

    on_device = {"logits": logits.as_subclass(CountsReads), "p": p.as_subclass(CountsReads),
                 "q": q.as_subclass(CountsReads)}
    reads = {}
    for name, rule, rows, draft in [
        ("greedy rule on logits", verify.greedy, on_device["logits"], chosen),
        ("point-mass rule on p", verify.point_mass, on_device["p"], chosen),
        ("token-level rule on p, q", verify.token_level, on_device["p"], Draft(sampled.tokens, on_device["q"])),
        ("block rule on p, q", verify.block, on_device["p"], Draft(sampled.tokens, on_device["q"])),
    ]:
        CountsReads.reads = 0
        rule(rows, draft, TorchRandom(0))
        reads[name] = CountsReads.reads
    CountsReads.reads = 0
    probabilities(on_device["logits"], sampling)
    reads["transforms: float32 logits -> float64 p"] = CountsReads.reads

    print(f"rows [{k + 1}, {args.vocab}]: logits float32 {logits.numel() * 4 / 2**20:.2f} MiB, "
          f"p float64 {p.numel() * 8 / 2**20:.2f} MiB; {torch.get_num_threads()} torch thread(s)")
    print(f"{'step':<42} {'median ms':>10} {'q1-q3 ms':>15} {'number reads':>13}")
    for name, seconds in times.items():
        q1, _, q3 = statistics.quantiles(seconds, n=4)
        print(f"{name:<42} {1000 * statistics.median(seconds):>10.3f} "
              f"{1000 * q1:>7.3f}-{1000 * q3:<7.3f} {reads[name]:>13}")


if __name__ == "__main__":
    main()
