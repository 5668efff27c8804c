"""What batch-invariant projections cost: one `extend_slots` forward of n rows in all over 8
slots (each after a cached context), and one prompt's prefill, with the probed row blocks and
packing (`linear.row_blocks`, the default) and with every product in one call on weights packed
for 2 rows (before them: rows then depended on the batch past 32 on AMX), interleaved in random
order in one process.

    PYTHONPATH=src .venv/bin/python benchmarks/batch_invariance_cost.py [--dtype bfloat16]
        [--context 200] [--prompt 600] [--repeats 9] [--threads 2]

Prints, per n, the two medians and their ratio; then the prefill's. About two minutes on a
quiet 2-core machine.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from verispec.models.formats.linear import PackedLinear, RowBlocks
from verispec.models.loading.load import load_model

ROWS = (1, 8, 16, 24, 32, 40, 48, 64, 96, 128, 160)
SLOTS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--prompt", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(dtype=args.dtype, deterministic=True).lm
    layers = [lm.head, *(p for layer in lm.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down))]
    packed = [layer for layer in layers if isinstance(layer, PackedLinear)]
    modes = {"blocked": [(layer.packed, layer.blocks) for layer in packed], "one call": []}
    for layer in packed:  # the weight back from the packed product (exact: x = I), packed for 2 rows
        eye = torch.eye(layer.in_features, dtype=lm.dtype)
        weight = torch.cat([layer._linear(rows) for rows in eye.split(2)]).t().contiguous()  # [out, in]
        one_call = RowBlocks(2, 1 << 30, layer.blocks.pad_single)
        modes["one call"].append((torch.ops.mkldnn._reorder_linear_weight(weight, 2), one_call))
    print(f"{args.dtype}: {len(packed)} prepacked projections; blocks {sorted({str(layer.blocks) for layer in packed})}")

    def use(mode: str) -> None:
        for layer, (weights, blocks) in zip(packed, modes[mode]):
            layer.packed, layer.blocks = weights, blocks

    rng = random.Random(0)
    slots = [lm.new_slot() for _ in range(SLOTS)]
    for slot in slots:
        slot.prefill([rng.randrange(1000, 20000) for _ in range(args.context)])
    prompt = [rng.randrange(1000, 20000) for _ in range(args.prompt)]
    cases = [(mode, n) for mode in modes for n in (*ROWS, "prefill")]
    times: dict[tuple[str, int | str], list[float]] = {case: [] for case in cases}
    for repeat in range(args.repeats + 1):  # one warm-up pass
        rng.shuffle(cases)
        for mode, n in cases:
            use(mode)
            if n == "prefill":
                start = time.perf_counter()
                lm.prefill(prompt)
            else:
                count = min(n, SLOTS)
                rows = [[rng.randrange(1000, 20000) for _ in range(n // count + (i < n % count))] for i in range(count)]
                start = time.perf_counter()
                lm.extend_slots(slots[:count], rows)
            elapsed = time.perf_counter() - start
            for slot in slots:
                slot.rollback(args.context)
            if repeat:
                times[(mode, n)].append(elapsed)
    use("blocked")
    for n in (*ROWS, "prefill"):
        blocked, one = (statistics.median(times[(mode, n)]) for mode in modes)
        label = f"prefill {args.prompt}" if n == "prefill" else f"{n} rows"
        print(f"{label:>12}: blocked {blocked * 1e3:8.2f} ms  one call {one * 1e3:8.2f} ms  ratio {blocked / one:.3f}")


if __name__ == "__main__":
    main()
