"""What scoring a token tree costs on the default model: the tree mask and the cache compaction.

    PYTHONPATH=src .venv/bin/python benchmarks/tree_cost.py [--sizes 4,8,16] [--repeats 15] [--context 200] [--threads 1]

For each target (float32 and bfloat16; the fast runtime, its deterministic mode, and
transformers through the HF adapter) and each n, interleaved and rotated within every repeat
after two warm-ups:
- chain: `extend(n tokens)` then `rollback` (a round of k = n - 1 drafts);
- tree: `extend_tree` of the pending token and a representative tree of n - 1 nodes
  (`profile.representative_tree`), then `rollback` (the forward alone);
- keep_path: after an untimed `extend_tree`, `keep_path` of the tree's deepest path alone (the
  compaction: it copies the path's nodes not yet in their slots, `rows moved`).
tree / chain is the price of the mask within one run. It also checks each tree row against its
path extended as a chain (max |difference| and how many rows are equal bit for bit).
Prints medians (IQR) in ms and the machine (`verispec.machine.describe`); the machine may be
shared, so compare ratios within one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec import load_model
from verispec.drafts import TreeDraft
from verispec.engine import scored_parents
from verispec.machine import describe
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.runtimes.llama import LlamaRuntime
from verispec.models.scored_tree import ScoredTree
from verispec.profile import deepest_path, representative_tree

TEXT = ("Explain, step by step, how a lighthouse keeper in the nineteenth century kept the lamp burning "
        "through a winter night, what could go wrong, and how the keeper's logbook recorded it. ")


def tree_parents(n: int) -> list[int]:
    """Parents of [pending, a representative tree of n - 1 nodes], as the engine scores them."""
    shape = representative_tree(n - 1)
    return scored_parents(TreeDraft(tuple(range(n - 1)), shape.parents))


def exactness(lm, ids: list[int], n: int) -> tuple[float, int]:
    """Largest |tree row - its path's chain row| and the number of rows equal bit for bit."""
    parents, tokens = tree_parents(n), ids[-n:]
    paths = TreeDraft(tuple(tokens), tuple(parents))
    prefix = ids[:-n]
    lm.prefill(prefix)
    tree = lm.extend_tree(tokens, parents)
    worst, equal = 0.0, 0
    for node in range(n):
        lm.rollback(len(prefix))
        chain = lm.extend(list(paths.path_tokens(paths.path_to(node))))[-1]
        worst = max(worst, (tree[node] - chain).abs().max().item())
        equal += torch.equal(tree[node], chain)
    return worst, equal


def measure(lm, ids: list[int], sizes: list[int], repeats: int) -> dict[tuple[str, int], list[float]]:
    start_length = len(ids) - max(sizes)
    prefix, block = ids[:start_length], ids[start_length:]
    jobs = [(kind, n) for n in sizes for kind in ("chain", "tree", "keep_path")]
    times: dict[tuple[str, int], list[float]] = {job: [] for job in jobs}
    lm.prefill(prefix)
    for repeat in range(repeats + 2):
        shift = repeat % len(jobs)
        for kind, n in jobs[shift:] + jobs[:shift]:
            parents = tree_parents(n)
            if kind == "keep_path":
                lm.extend_tree(block[:n], parents)
            start = time.perf_counter()
            if kind == "chain":
                lm.extend(block[:n])
            elif kind == "tree":
                lm.extend_tree(block[:n], parents)
            else:
                lm.keep_path(deepest_path(parents))
            seconds = time.perf_counter() - start
            lm.rollback(start_length)
            if repeat >= 2:
                times[kind, n].append(seconds)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4,8,16", help="positions n scored per round, comma-separated")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(n) for n in args.sizes.split(",")]
    loaded = load_model("smollm2-135m-instruct", dtype="float32", runtime="hf")
    ids = loaded.encode(TEXT * 20)[: args.context]
    print(", ".join(f"{key} {value}" for key, value in describe().items()))
    print(f"default model, context {len(ids) - max(sizes)} tokens before the round, {torch.get_num_threads()} threads, "
          f"{args.repeats} repeats after 2 warm-ups, interleaved; medians (IQR) in ms")
    for n in sizes:
        parents = tree_parents(n)
        moved = len(ScoredTree(0, tuple(parents)).moves(deepest_path(parents))[0])
        print(f"n = {n}: tree {representative_tree(n - 1).describe()}, deepest path of {len(deepest_path(parents))} "
              f"positions, {moved} rows moved by keep_path")
    print(f"{'target':34s} {'n':>3s} {'chain':>24s} {'tree':>24s} {'tree/chain':>10s} {'keep_path':>24s} "
          f"{'exact rows':>10s} {'max |diff|':>10s}")
    for dtype_name in args.dtypes.split(","):
        model = loaded.model.to(getattr(torch, dtype_name))
        targets = {
            "fast": LlamaRuntime.from_hf(model),
            "fast deterministic": LlamaRuntime.from_hf(model, deterministic=True),
            "hf": HFCausalLM(model),
        }
        for name, lm in targets.items():
            times = measure(lm, ids, sizes, args.repeats)
            for n in sizes:
                cells = {}
                for kind in ("chain", "tree", "keep_path"):
                    values = times[kind, n]
                    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
                    cells[kind] = (statistics.median(values) * 1e3, q[0] * 1e3, q[2] * 1e3)
                worst, equal = exactness(lm, ids, n)
                fmt = lambda c: f"{c[0]:6.3f} ({c[1]:.3f}-{c[2]:.3f})"  # noqa: E731
                print(f"{dtype_name + ' ' + name:34s} {n:3d} {fmt(cells['chain']):>24s} {fmt(cells['tree']):>24s} "
                      f"{cells['tree'][0] / cells['chain'][0]:10.3f} {fmt(cells['keep_path']):>24s} "
                      f"{equal:>5d}/{n:<4d} {worst:10.2e}")
    loaded.model.to(torch.float32)


if __name__ == "__main__":
    main()
