"""Plain decoding on llama.cpp, verispec's and llama-cpp-python's: where a token's time goes.

    .venv/bin/python benchmarks/llamacpp_host_time.py [--categories 7] [--max-new-tokens 128] [--repeats 3]

Decodes the first Spec-Bench dev prompt of each of the first `--categories` categories greedily,
with `--runtime llamacpp`'s plain decoding (`verispec-plain`) and with llama-cpp-python's
`Llama.generate` on the same GGUF file (`llamacpp-plain`), the two interleaved per prompt and
repeat. Both call llama.cpp through `llama_cpp._internals.LlamaContext.decode`, which this
script times, so each token's time splits into llama.cpp's forward and the host's work between
forwards (the Python of a round: the batch, the logits' copy, the rule, the bookkeeping).
Prints per method the medians across prompts and repeats of tokens/s, forward ms a token and
host us a token. Prompts under 256 tokens keep deterministic plain decoding on one-row forwards
(no padding row), so the forwards are the same work. Needs the llamacpp extra (`make llamacpp`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from verispec.bench.workloads import data_file, read_workloads, select
from verispec.engine import Decoding
from verispec.models.loading.load import load_model
from verispec.models.runtimes.llamacpp import LONE_ROW_CELLS
from verispec.peers.llamacpp import make_runner, require
from verispec.request import Request
from verispec.runner import timed
from verispec.sampling import GREEDY

SPECBENCH = data_file("specbench_dev.jsonl", Path(__file__).parents[1])


class ForwardClock:
    """Seconds spent in llama.cpp's forwards (`LlamaContext.decode`) since `reset`."""

    def __init__(self) -> None:
        from llama_cpp import _internals

        self.seconds = 0.0
        decode = _internals.LlamaContext.decode

        def timed_decode(context, batch):
            start = time.perf_counter()
            try:
                return decode(context, batch)
            finally:
                self.seconds += time.perf_counter() - start

        _internals.LlamaContext.decode = timed_decode

    def reset(self) -> None:
        self.seconds = 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--categories", type=int, default=7)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    require(["benchmarks/llamacpp_host_time.py"], GREEDY)
    forwards = ForwardClock()
    loaded = load_model(runtime="llamacpp")
    peer = make_runner("llamacpp-plain", loaded)
    workloads = select(read_workloads(SPECBENCH), limit_per_category=1)
    prompts = [ids for ids in (w.token_ids(loaded) for w in workloads) if len(ids) + args.max_new_tokens < LONE_ROW_CELLS]
    prompts = prompts[: args.categories]

    def verispec_plain(ids: list[int]):
        return timed(Decoding(loaded.lm, None, Request(tuple(ids), args.max_new_tokens, eos_token_ids=loaded.eos_token_ids)))

    methods = {"verispec-plain": verispec_plain, "llamacpp-plain": lambda ids: peer(ids, args.max_new_tokens)}
    for run in methods.values():  # warm-up
        run(prompts[0])
    rows: dict[str, dict[str, list[float]]] = {name: {"tok/s": [], "forward": [], "host": []} for name in methods}
    for _ in range(args.repeats):
        for ids in prompts:
            for name, run in methods.items():
                forwards.reset()
                outcome = run(ids)
                n = len(outcome.tokens)
                rows[name]["tok/s"].append(n / outcome.wall_seconds)
                rows[name]["forward"].append(1e3 * forwards.seconds / n)
                rows[name]["host"].append(1e6 * (outcome.wall_seconds - forwards.seconds) / n)
    print(f"{len(prompts)} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), "
          f"{args.max_new_tokens} new tokens, {args.repeats} repeats, {torch.get_num_threads()} threads")
    print("| method | tok/s | forward ms a token | host us a token |")
    print("|---|---|---|---|")
    for name, values in rows.items():
        median = {key: statistics.median(v) for key, v in values.items()}
        print(f"| {name} | {median['tok/s']:.1f} | {median['forward']:.2f} | {median['host']:.0f} |")


if __name__ == "__main__":
    main()
