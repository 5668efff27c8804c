"""The cost of keyed sampling: plain decoding per token with the keyed race (the coupled rule)
against the stream's categorical draw (the token rule), on the default model's 49k vocabulary,
and the two samplers alone on the same rows.

    PYTHONPATH=src .venv/bin/python benchmarks/keyed_sampling.py [--tokens 64] [--repeats 3] \\
        [--dtype float32] [--threads 1]

Decoding: k = 0, the same prompt and seed, the rule alternated run by run (so drift in the
machine's speed falls on both), the best of `--repeats` per rule; the ratio is keyed / stream
seconds per token. Samplers: `probabilities` then `categorical` or `race` on 64 rows of the
model's logits at T 0.7, T 1.0 and T 0.7 with top-p 0.9, microseconds per row.
"""

from __future__ import annotations

import argparse
import time

import torch

from verispec import SamplingParams, generate
from verispec.models.loading.load import DEFAULT_MODEL, load_model
from verispec.randomness import TorchRandom
from verispec.sampling import probabilities

PROMPT = "Write a short story about a robot who learns to paint."
SAMPLINGS = {"T0.7": SamplingParams(0.7), "T1.0": SamplingParams(1.0), "T0.7 top-p 0.9": SamplingParams(0.7, top_p=0.9)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype=args.dtype)
    ids = loaded.encode(PROMPT, chat=True)
    print(f"{loaded.name}, {args.dtype}, vocabulary {loaded.lm.vocab_size}, {args.threads} thread(s)")
    print("sampling | stream s/token | keyed s/token | keyed / stream")
    for name, sampling in SAMPLINGS.items():
        best = {"token": float("inf"), "coupled": float("inf")}
        for _ in range(args.repeats):
            for rule in best:
                start = time.perf_counter()
                out = generate(loaded.lm, None, ids, max_new_tokens=args.tokens, sampling=sampling, seed=0, k=0,
                               verifier=rule)
                best[rule] = min(best[rule], (time.perf_counter() - start) / len(out.tokens))
        print(f"{name} | {best['token']:.5f} | {best['coupled']:.5f} | {best['coupled'] / best['token']:.3f}", flush=True)
    logits = loaded.lm.score(ids + generate(loaded.lm, None, ids, max_new_tokens=64, sampling=SAMPLINGS["T1.0"],
                                            seed=1, k=0).tokens)[-64:]  # [64, V]
    print("sampling | probabilities + categorical us | probabilities + race us | ratio")
    rng = TorchRandom(0)
    for name, sampling in SAMPLINGS.items():
        stream = timed(lambda i, row: rng.categorical(probabilities(row, sampling)[0]), logits)
        keyed = timed(lambda i, row: rng.race(i, probabilities(row, sampling)[0]), logits)
        print(f"{name} | {stream:.0f} | {keyed:.0f} | {keyed / stream:.3f}", flush=True)
    return 0


def timed(sample, logits: torch.Tensor, repeats: int = 5) -> float:
    """The best over `repeats` passes of the mean microseconds per row of `sample(i, row)`."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(logits.shape[0]):
            sample(i, logits[i : i + 1])
        best = min(best, (time.perf_counter() - start) / logits.shape[0] * 1e6)
    return best


if __name__ == "__main__":
    raise SystemExit(main())
