"""llama.cpp's v(n) on the default GGUF file: what scoring n tokens in one forward costs.

    .venv/bin/python benchmarks/llamacpp_costs.py [--threads 1] [--context 220] [--repeats 7]

After a context of `--context` tokens, times `Llama.eval` of n = 1..11 new tokens (median of
`--repeats`, each from the same cached context) and prints t(1) and v(n) = t(n) / t(1), for
logits of the last row only (plain decoding) and of every row (what `Llama.generate` keeps when
it verifies drafts, and what a `CausalLM` on llama.cpp would need), with flash attention on as
`--runtime llamacpp` and the llamacpp peer decode. v(2) past 255 positions of context (e.g.
`--threads 2 --context 600`) is what deterministic plain decoding on `--runtime llamacpp` pays
for a one-token step (a padding row) against llama.cpp's own. Needs the llamacpp extra.
"""

from __future__ import annotations

import argparse
import statistics
import time

from verispec.models import DEFAULT_MODEL
from verispec.models.loading.sources import locate
from verispec.models.runtimes.llamacpp import FLASH_ATTENTION
from verispec.peers.llamacpp import require
from verispec.sampling import GREEDY

SIZES = (1, 2, 3, 4, 5, 6, 9, 11)


def costs(threads: int, context: int, repeats: int, logits_all: bool) -> dict[int, float]:
    import llama_cpp

    llama = llama_cpp.Llama(
        model_path=str(locate(DEFAULT_MODEL)), n_ctx=context + max(SIZES) + 1, n_threads=threads,
        n_threads_batch=threads, logits_all=logits_all, flash_attn=FLASH_ATTENTION, verbose=False,
    )
    prefix = [1 + (i * 37) % 40_000 for i in range(context)]  # arbitrary ids: only shapes matter
    llama.eval(prefix)
    seconds = {}
    for n in SIZES:
        runs = []
        for _ in range(repeats):
            llama.n_tokens = context  # drop the last timed tokens: eval removes cache cells past here
            start = time.perf_counter()
            llama.eval([5 + j for j in range(n)])
            runs.append(time.perf_counter() - start)
        seconds[n] = statistics.median(runs)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--context", type=int, default=220)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    require(["benchmarks/llamacpp_costs.py"], GREEDY)
    for logits_all, label in ((False, "last row's logits"), (True, "every row's logits")):
        seconds = costs(args.threads, args.context, args.repeats, logits_all)
        print(f"{label:>20}: t(1) {seconds[1] * 1e3:.1f} ms; "
              + " ".join(f"v({n}) {seconds[n] / seconds[1]:.2f}" for n in SIZES[1:]))


if __name__ == "__main__":
    main()
