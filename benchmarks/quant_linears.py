"""The default model's linear layers alone, per weight format, for M = 1..9 rows.

    PYTHONPATH=src .venv/bin/python benchmarks/quant_linears.py [--threads 1 2] [--repeats 15]

Builds the 30 layers' projections as a runtime fuses them (qkv, o, gate+up, down) and the
output head from the default GGUF file's blocks, in each format of `models.formats.quant`, and times
one pass over all of them (the head separately) for M = 1..9 rows. Methods are interleaved
within each repeat; medians and the spread between the 25th and 75th percentiles are reported.

Formats: float32 and bfloat16 `F.linear` (bfloat16 rounds the weights); packed-float32 and
packed-bfloat16, the fast runtime's oneDNN-prepacked float projections; q4, exact (the GGUF
blocks as bfloat16-exact planes: 2 for Q4_1, 4 for the Q8_0 head); q4-1plane, what a single
plane with bfloat16-rounded scales would cost (NOT exact, shown for the price of exactness);
q4-f32act, the exact planes through the kernel's float32 path (a scalar loop); int8 per channel.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec import load_model
from verispec.models.loading.load import gguf_blocks
from verispec.models.formats.linear import projection
from verispec.models.formats.quant import Int4Linear, exact_planes, linear_for


def one_plane(parts) -> Int4Linear:
    """The first plane of each part only: scales rounded to bfloat16 (not exact)."""
    planes = [exact_planes(part)[:1] for part in parts]
    codes = torch.cat([p[0][0] for p in planes])
    scales = torch.cat([p[0][1] for p in planes]).to(torch.bfloat16)
    zeros = torch.cat([p[0][2] for p in planes]).to(torch.bfloat16)
    return Int4Linear(codes, scales, zeros, 1, exact=False)


def build(blocks, layers: int, fmt: str) -> tuple[list, object]:
    groups = []
    for i in range(layers):
        prefix = f"model.layers.{i}."
        groups += [
            [blocks[prefix + f"self_attn.{p}_proj.weight"] for p in "qkv"],
            [blocks[prefix + "self_attn.o_proj.weight"]],
            [blocks[prefix + "mlp.gate_proj.weight"], blocks[prefix + "mlp.up_proj.weight"]],
            [blocks[prefix + "mlp.down_proj.weight"]],
        ]
    head = [blocks["model.embed_tokens.weight"]]
    if fmt == "q4-1plane":
        return [one_plane(g) for g in groups], one_plane(head)
    if fmt.startswith("packed-"):  # the fast runtime's float projections (oneDNN prepacked)
        dtype = torch.float32 if fmt == "packed-float32" else torch.bfloat16

        def packed(parts):
            return projection(torch.cat([part.dequantize() for part in parts]).to(dtype))

        return [packed(g) for g in groups], packed(head)
    base = {"q4-f32act": "q4"}.get(fmt, fmt)
    return [linear_for(g, base) for g in groups], linear_for(head, base)


def activation_dtype(fmt: str) -> torch.dtype:
    return torch.float32 if fmt in ("float32", "packed-float32", "q4-f32act") else torch.bfloat16


def timed(modules, x: torch.Tensor) -> float:
    start = time.perf_counter()
    for module in modules:
        # Inputs of the right width for each projection: hidden (576) or intermediate (1536).
        module(x[:, : module.in_features])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rows", type=int, nargs="+", default=list(range(1, 10)))
    parser.add_argument(
        "--formats", nargs="+",
        default=["float32", "packed-float32", "bfloat16", "packed-bfloat16", "q4", "q4-1plane", "int8"],
    )
    args = parser.parse_args()
    loaded = load_model(dtype="float32", runtime="hf")  # its transformers model: the weights to pack
    blocks = gguf_blocks(loaded.source, loaded.model)
    layers = loaded.config.num_hidden_layers
    built = {fmt: build(blocks, layers, fmt) for fmt in args.formats}
    for fmt, (groups, head) in built.items():
        exact = all(getattr(m, "exact", fmt == "packed-float32") for m in [*groups, head])
        planes = {getattr(m, "planes", None) for m in groups}
        print(f"{fmt}: exact={exact} layer planes={planes} head={type(head).__name__}"
              f"{' planes=' + str(head.planes) if isinstance(head, Int4Linear) else ''}")
    widest = max(m.in_features for m in built[args.formats[0]][0])
    with torch.inference_mode():
        for threads in args.threads:
            torch.set_num_threads(threads)
            print(f"\nthreads={threads}  ms per pass, median [p25, p75]")
            print(f"{'M':>2} " + " ".join(f"{fmt + ' ' + part:>30}" for fmt in args.formats for part in ("layers", "head")))
            base = {}
            for m in args.rows:
                x = torch.randn(m, widest)
                samples = {(fmt, part): [] for fmt in args.formats for part in ("layers", "head")}
                for repeat in range(args.repeats + 2):
                    for fmt in args.formats:
                        groups, head = built[fmt]
                        xs = x.to(activation_dtype(fmt))
                        layer_s, head_s = timed(groups, xs), timed([head], xs)
                        if repeat >= 2:  # two warm-up passes
                            samples[(fmt, "layers")].append(layer_s)
                            samples[(fmt, "head")].append(head_s)
                cells = []
                for fmt in args.formats:
                    for part in ("layers", "head"):
                        values = sorted(samples[(fmt, part)])
                        median = statistics.median(values) * 1e3
                        base.setdefault((fmt, part), median)
                        q1, q3 = values[len(values) // 4] * 1e3, values[(3 * len(values)) // 4] * 1e3
                        cells.append(f"{median:7.2f} [{q1:6.2f},{q3:6.2f}] v={median / base[(fmt, part)]:4.2f}")
                print(f"{m:>2} " + " ".join(f"{c:>30}" for c in cells))


if __name__ == "__main__":
    main()
