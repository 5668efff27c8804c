"""The cost c of a head's draft step against one target step, on the default model.

    .venv/bin/python benchmarks/head_cost.py [--dtype auto] [--head-dtypes float32,bfloat16] [--vocab 8192,49152]
        [--forms as-loaded,for-drafting,int8] [--repeats 15] [--context 200] [--threads 1]
        [--kinds eagle-1,eagle-3,medusa]

Builds heads of the shipped shapes with untrained weights (time does not depend on the
weights): EAGLE on the FINAL feature (EAGLE-1), EAGLE on three fused layers (EAGLE-3), and
Medusa with K = 4 heads, each with a head vocabulary of N = 8192 and of the full 49152, in
float32 and bfloat16, as loaded (`nn.Linear` layers, as trained) and packed for drafting
(`heads.for_drafting`, as `--proposer eagle|medusa:weights=bfloat16|float32` runs them), and
packed with int8 projections (the form `int8`, `:weights=int8`); the form `packed-hf-layer` is
for_drafting with the EAGLE head's decoder layer left as transformers' (its projections
packed), to measure the `DraftingLayer` against it. At one
context length it interleaves, per repeat: one target step (extend 1 token + rollback), and
each proposer's `propose(context, k = 4)` after its state has caught up with the context (the
drafting alone), then one round's catch-up (the new true pairs EAGLE reads after 2 accepted
tokens). c = median seconds per drafted token / median target step; spread is the IQR.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec import GREEDY, SamplingParams, load_model
from verispec.heads import HeadConfig, for_drafting, new_head, target_info
from verispec.heads.config import FINAL, default_layer, eagle3_layers
from verispec.heads.eagle import FrozenRows
from verispec.models.formats.linear import packed_linears, projection
from verispec.proposers.eagle import EagleProposer
from verispec.proposers.medusa import MedusaProposer
from verispec.randomness import TorchRandom

K = 4
TEXT = ("Explain, step by step, how a lighthouse keeper in the nineteenth century kept the lamp burning "
        "through a winter night, what could go wrong, and how the keeper's logbook recorded it. ")


def build(loaded, kind: str, taps, n: int, dtype: torch.dtype, form: str):
    lm = loaded.lm
    config = HeadConfig(kind, target_info(lm, loaded.name), taps, vocab_size=n,
                        layer=default_layer(loaded.config) if kind == "eagle" else {},
                        heads=K if kind == "medusa" else 0)
    torch.manual_seed(0)
    head = new_head(config, torch.arange(n), lm).to(dtype).eval().requires_grad_(False)
    if form in ("for-drafting", "int8"):
        head = for_drafting(head, "int8" if form == "int8" else "float")
    elif form == "packed-hf-layer":
        packed_linears(head)
        if isinstance(head.output, FrozenRows):
            head.output = projection(head.output.rows)
    return (EagleProposer if kind == "eagle" else MedusaProposer)(head, lm)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--head-dtypes", default="float32,bfloat16", help="comma-separated, interleaved")
    parser.add_argument("--vocab", default="8192,49152", help="head vocabulary sizes N, comma-separated")
    parser.add_argument("--forms", default="as-loaded,for-drafting",
                        help="comma-separated, interleaved: as-loaded, for-drafting, int8, packed-hf-layer")
    parser.add_argument("--kinds", default="eagle-1,eagle-3,medusa", help="comma-separated")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model("smollm2-135m-instruct", dtype=args.dtype)
    head_dtypes = [getattr(torch, name) for name in args.head_dtypes.split(",")]
    lm = loaded.lm
    ids = loaded.encode(TEXT * 20)[: args.context]
    L = loaded.config.num_hidden_layers
    proposers = {}
    for n in map(int, args.vocab.split(",")):
        for dtype in head_dtypes:
            for form in args.forms.split(","):
                label = f"{str(dtype).removeprefix('torch.')} {form}"
                kinds = args.kinds.split(",")
                if "eagle-1" in kinds:
                    proposers[f"eagle-1 N={n} {label}"] = build(loaded, "eagle", (FINAL,), n, dtype, form)
                if "eagle-3" in kinds:
                    proposers[f"eagle-3 N={n} {label}"] = build(loaded, "eagle", eagle3_layers(L), n, dtype, form)
                if "medusa" in kinds:
                    proposers[f"medusa K={K} N={n} {label}"] = build(loaded, "medusa", (FINAL,), n, dtype, form)
    times: dict[str, list[float]] = {"target step": [], **{f"{name} {mode}": [] for name in proposers
                                                          for mode in ("greedy", "T=1")}}
    catchup: dict[str, list[float]] = {name: [] for name in proposers if name.startswith("eagle")}
    rng = TorchRandom(0)
    with torch.inference_mode():
        lm.prefill(ids[:-3])
        for repeat in range(args.repeats + 2):
            start = time.perf_counter()
            lm.extend([ids[-3]])
            lm.rollback(len(ids) - 3)
            times["target step"].append(time.perf_counter() - start)
            lm.rollback(len(ids) - 3)
            for name, proposer in proposers.items():
                for mode, sampling in (("greedy", GREEDY), ("T=1", SamplingParams())):
                    lm.rollback(len(ids) - 3)  # the target holds all of `short` but its pending token
                    proposer.begin(ids, sampling)
                    short = ids[:-2]
                    proposer.propose(short, K, rng)  # catches up with the whole context
                    proposer.commit(short)
                    start = time.perf_counter()
                    draft = proposer.propose(short, K, rng)
                    times[f"{name} {mode}"].append((time.perf_counter() - start) / len(draft))
                    proposer.commit(short)
                    if name in catchup and mode == "greedy":
                        lm.extend(ids[-3:-1])  # a round emitted 2 more tokens
                        start = time.perf_counter()
                        proposer.propose(ids, K, rng)  # 2 new true pairs, then 4 drafts
                        catchup[name].append(time.perf_counter() - start)
                        proposer.commit(ids)
    step = statistics.median(times["target step"][2:])
    print(f"default model {loaded.dtype}, heads {args.head_dtypes}, context {len(ids)} tokens, "
          f"{torch.get_num_threads()} threads, {args.repeats} repeats (2 warm-ups dropped)")
    print(f"{'what':52s} {'median ms':>10s} {'IQR ms':>14s} {'c':>7s}")
    for name, values in times.items():
        v = values[2:]
        q = statistics.quantiles(v, n=4)
        print(f"{name:52s} {statistics.median(v) * 1e3:10.3f} {q[0] * 1e3:6.3f}-{q[2] * 1e3:6.3f} "
              f"{statistics.median(v) / step:7.3f}")
    for name, values in catchup.items():
        v = values[2:]
        print(f"{name + ' round (2 pairs + 4 drafts)':52s} {statistics.median(v) * 1e3:10.3f} "
              f"{'':14s} {statistics.median(v) / step:7.3f}")


if __name__ == "__main__":
    main()
