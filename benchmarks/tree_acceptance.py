"""Whether token trees can pay, measured offline: how often the target's greedy token is each
proposer's rank-r candidate at depth d, by teacher forcing on the target's greedy output.

    PYTHONPATH=src .venv/bin/python benchmarks/tree_acceptance.py [--proposers lookup,suffix,eagle,medusa]
        [--per-category 1] [--max-new-tokens 96] [--width 4] [--depth 4] [--dtype bfloat16] [--json OUT]

Prompts: the first N of each Spec-Bench dev category (first turn, chat template), read where
they lie (../shared/data, or $VERISPEC_DATA); nothing trains on them.

For each prompt the target first decodes greedily (plain decoding). Then the walk feeds that
output to the target one token at a time, as rounds that each emit one token would, and at
every position t asks each proposer (`propose_tree`, temperature 0) for the full tree of width
W and depth D (every rank path with ranks < W). Along the target's own continuation
y_t, y_t+1, ...: depth d is *reached* when y_t..y_t+d-2 all lie in the tree; then the table
counts which rank r (< W, or none) y_t+d-1 has among the candidates after them. So
hit[d][r] / reached[d] is the per-depth, per-rank acceptance a greedy tree verifier sees
(`Stats.rank_accepts` / `rank_attempts` at T = 0, given the earlier depths accepted at any rank).

Then, from the same trees (a sub-shape's tree is the full tree cut to its rank paths), the
tokens per round (accepted + 1) of greedy tree verification for a few fixed shapes beside the
chains, and for each proposer its chain (`propose`, which for lookup copies the most recent
match rather than the most frequent continuation).

With --sampled (EAGLE and Medusa): at temperature 1 the depth-1 acceptance of w chosen
siblings (the head's top w by q, point masses without replacement: P = p's mass on them)
against w siblings sampled from q with replacement (SpecInfer's recursive rule, whose
acceptance is computed exactly: the residual after a rejection does not depend on the
rejected token), averaged over the positions.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from verispec import GREEDY, SamplingParams, TorchRandom, generate
from verispec.bench.workloads import data_file, read_workloads, select
from verispec.drafts import ROOT, TreeDraft
from verispec.models.loading.load import DEFAULT_MODEL, load_model
from verispec.proposers.eagle import EagleProposer
from verispec.registry import build_proposer
from verispec.sampling import probabilities
from verispec.tree_shape import TreeShape

REPOSITORY = Path(__file__).resolve().parents[1]
SHAPES = {
    "chain 1": TreeShape.chain(1),
    "chain 2": TreeShape.chain(2),
    "chain 3": TreeShape.chain(3),
    "chain 4": TreeShape.chain(4),
    "2-1-1-1 (5)": TreeShape.of([(0,), (1,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]),
    "2-2-1-1 (6)": TreeShape.of([(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 0, 0)]),
    "4-2-1-1 (8)": TreeShape.of([(0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 0, 0)]),
    "3-3-2-1 (9)": TreeShape.of([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)]),
    "binary 2-4-8 (14)": TreeShape.of([p for d in (1, 2, 3) for p in itertools.product((0, 1), repeat=d)]),
}


def full_shape(width: int, depth: int) -> TreeShape:
    return TreeShape.of([p for d in range(1, depth + 1) for p in itertools.product(range(width), repeat=d)])


def rank_paths(tree: TreeDraft) -> dict[int, tuple[int, ...]]:
    """node -> its rank path (its sibling index at each depth)."""
    paths: dict[int, tuple[int, ...]] = {ROOT: ()}
    for node, parent in enumerate(tree.parents):
        paths[node] = (*paths[parent], tree.children(parent).index(node))
    return paths


def walk(tree: TreeDraft, truth: Sequence[int], allowed: set[tuple[int, ...]] | None = None) -> list[int | None]:
    """The rank of truth[d] among the candidates after truth[:d] (inside `allowed` rank paths),
    for each depth until it is missing (None ends the list)."""
    paths = rank_paths(tree)
    node, ranks = ROOT, []
    for token in truth:
        children = [c for c in tree.children(node) if allowed is None or paths[c] in allowed]
        match = next((c for c in children if tree.tokens[c] == token), None)
        ranks.append(None if match is None else children.index(match))
        if match is None:
            break
        node = match
    return ranks


def sampled_acceptance(p: torch.Tensor, q: torch.Tensor, width: int) -> float:
    """P(some of `width` children drawn from q with replacement is accepted) under SpecInfer's
    recursive rule, exactly: the residual after a rejection is norm(max(r - q, 0)) whatever
    the rejected token was."""
    r, rejected = p, 1.0
    for _ in range(width):
        accept = float(torch.minimum(r, q).sum())
        rejected *= 1 - accept
        residual = (r - q).clamp_min(0)
        if float(residual.sum()) <= 0:
            return 1.0 - rejected
        r = residual / residual.sum()
    return 1.0 - rejected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--runtime", default="fast")
    parser.add_argument("--proposers", default="lookup,suffix,eagle,medusa")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--sampled", action="store_true", help="also compare chosen and sampled siblings at T = 1")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    loaded = load_model(args.model, dtype=args.dtype, runtime=args.runtime)
    lm = loaded.lm
    workloads = select(read_workloads(data_file("specbench_dev.jsonl", REPOSITORY)), limit_per_category=args.per_category)
    specs = args.proposers.split(",")
    proposers = {spec: build_proposer(spec, loaded) for spec in specs}
    # EAGLE-2's own node choice within each tree shape's size, depth and width
    dynamic = EagleProposer(proposers["eagle"].head, lm, dynamic=True) if "eagle" in proposers else None
    dynamic_shapes = {f"dynamic {name}": shape for name, shape in SHAPES.items() if dynamic and not shape.is_chain}
    shape = full_shape(args.width, args.depth)
    W, D = args.width, args.depth
    reached = {spec: [0] * D for spec in specs}
    hits = {spec: [[0] * W for _ in range(D)] for spec in specs}
    tokens = {spec: {name: 0 for name in [*SHAPES, "propose chain 4", *(dynamic_shapes if spec == "eagle" else ())]}
              for spec in specs}
    sampled = {spec: {"chosen": [0.0] * W, "sampled": [0.0] * W} for spec in specs if args.sampled and spec in ("eagle", "medusa")}
    positions, seconds = 0, {spec: 0.0 for spec in specs}
    allowed = {name: set(s.paths) for name, s in SHAPES.items()}
    T1 = SamplingParams(temperature=1.0)
    print(f"{args.model} ({loaded.dtype}, {loaded.runtime}), {len(workloads)} prompts, {args.max_new_tokens} "
          f"greedy tokens each, full trees of width {W} and depth {D} ({len(shape)} nodes)")
    for workload in workloads:
        prompt = workload.token_ids(loaded)
        output = generate(lm, None, prompt, max_new_tokens=args.max_new_tokens, sampling=GREEDY, k=0,
                          eos_token_id=loaded.eos_token_ids).tokens
        lm.reset()
        lm.prefill(prompt[:-1])
        for proposer in [*proposers.values(), *([dynamic] if dynamic else [])]:
            proposer.begin(prompt, GREEDY)
        for t in range(len(output) - D + 1):
            context = prompt + output[:t]  # the target has processed all but its last token
            truth = output[t : t + D]
            positions += 1
            heads_q = {}
            for spec in specs:
                proposer = proposers[spec]
                start = time.perf_counter()
                proposer.commit(context)
                tree = proposer.propose_tree(context, shape, TorchRandom(0))
                seconds[spec] += time.perf_counter() - start
                for d, rank in enumerate(walk(tree, truth)):
                    reached[spec][d] += 1
                    if rank is not None:
                        hits[spec][d][rank] += 1
                for name in SHAPES:
                    tokens[spec][name] += 1 + sum(r is not None for r in walk(tree, truth, allowed[name]))
                chain = proposer.propose(context, D, TorchRandom(0)).tokens
                matched = next((i for i, (a, b) in enumerate(zip(chain, truth)) if a != b), min(len(chain), D))
                tokens[spec]["propose chain 4"] += 1 + matched
                if spec == "eagle":
                    for name, dynamic_shape in dynamic_shapes.items():
                        dynamic_tree = dynamic.propose_tree(context, dynamic_shape, TorchRandom(0))
                        tokens[spec][name] += 1 + sum(r is not None for r in walk(dynamic_tree, truth))
                if spec in sampled:
                    logits = proposer._follow(context)[0] if spec == "eagle" else proposer.head(proposer._feature(context))[0, 0]
                    heads_q[spec] = proposer.vocab.q(logits.float(), T1)
            row = lm.extend([context[-1]])[0]  # the target after the pending token: y_t's row
            if int(row.argmax()) != truth[0]:
                raise RuntimeError(f"position {t}: the walk's argmax {int(row.argmax())} is not the greedy output's {truth[0]}")
            p = probabilities(row[None].float(), T1)[0]
            for spec, q in heads_q.items():
                top = q.argsort(descending=True, stable=True)
                for w in range(1, W + 1):
                    sampled[spec]["chosen"][w - 1] += float(p[top[:w]].sum())
                    sampled[spec]["sampled"][w - 1] += sampled_acceptance(p, q, w)
        print(f"  {workload.category}: {len(output)} tokens", flush=True)
    results = {}
    for spec in specs:
        table = [[hits[spec][d][r] / reached[spec][d] if reached[spec][d] else None for r in range(W)] for d in range(D)]
        results[spec] = {
            "reached": reached[spec],
            "rank_acceptance": table,
            "tokens_per_round": {name: tokens[spec][name] / positions for name in tokens[spec]},
            "tree_ms": 1000 * seconds[spec] / positions,
        }
        if spec in sampled:
            results[spec]["depth1_T1"] = {kind: [x / positions for x in sampled[spec][kind]] for kind in ("chosen", "sampled")}
        print(f"\n{spec}: P(target's token is the rank-r candidate | depth d reached), {positions} positions, "
              f"full tree {results[spec]['tree_ms']:.1f} ms")
        print("  depth  reached  " + "  ".join(f"rank {r}" for r in range(W)) + "  top-W")
        for d in range(D):
            cells = "  ".join(f"{x:6.3f}" if x is not None else "     -" for x in table[d])
            total = sum(x for x in table[d] if x is not None)
            print(f"  {d + 1:5d}  {reached[spec][d]:7d}  {cells}  {total:5.3f}")
        print("  tokens per round (greedy):  " + ", ".join(f"{n} {v:.3f}" for n, v in results[spec]["tokens_per_round"].items()))
        if spec in sampled:
            for kind in ("chosen", "sampled"):
                row = results[spec]["depth1_T1"][kind]
                print(f"  T=1 depth-1 acceptance, {kind} siblings, w = 1..{W}: " + " ".join(f"{x:.3f}" for x in row))
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "dtype": str(loaded.dtype), "positions": positions,
                                         "width": W, "depth": D, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
