"""Pinned outputs: the exact tokens (and each round's drafted count) of a few seeded runs, so
a change to the engine's structure that moves any random draw, any policy choice or any
proposer call shows here, even where the output law stays exact.

Sampled and greedy, chains and trees, a draft model, prompt lookup, a trained head beside
copying (one policy per source), the adaptive policies on a tick clock, and the batch
scheduler with and without per-batch k. The values were recorded with the engine as it was
before the round's stages became values (per-batch k: after BatchK pooled the batch's
acceptance counts with its prior counted once, which changes its plans, and so the draws of
the sampled auto request); a change that is meant to move a draw must say why and re-record
them. The sampled runs without a named verifier run the coupled rule (the default at
temperature > 0 since keyed sampling; recorded then); those that name token, block or
point-mass keep the values recorded before it, under the rule the default was then.
"""

from __future__ import annotations

import pytest

from verispec import SamplingParams, generate
from verispec.audit.trees import TopRankedDraft
from verispec.batching import Scheduler
from verispec.clocks import TickClock
from verispec.cost import BatchCosts, FixedCosts
from verispec.heads.untrained import tiny_head
from verispec.models.table_pair import Tables
from verispec.models.tables import random_table
from verispec.policies import AutoK, ConstantTree, HeuristicK
from verispec.proposers import DraftModel, PromptLookup
from verispec.proposers.copy_or_head import CopyOrHead
from verispec.proposers.eagle import EagleProposer
from verispec.registry import PROPOSERS
from verispec.request import Request
from verispec.sampling import GREEDY
from verispec.tree_policy import TreePolicy
from verispec.tree_shape import TreeShape

T1 = SamplingParams(temperature=1.0)
WARM = SamplingParams(temperature=0.7, top_k=5)
TARGET = random_table(6, 2, seed=11, eos_token_id=5)
DRAFT = random_table(6, 1, seed=12)
PROMPT = [0, 1, 2, 0, 1, 3, 0, 1]
SHAPE = TreeShape.of([(0,), (1,), (0, 0), (0, 1), (1, 0)])


def auto(k: int = 4) -> AutoK:
    return AutoK(FixedCosts(c=0.1, v=[1.0, 1.0, 1.1, 1.2, 1.4][: k + 1], step_seconds=0.001), probe_every=1)


def tree_auto() -> TreePolicy:
    return TreePolicy(FixedCosts(c=0.05, v=[1.0, 1.0, 1.05, 1.1, 1.2, 1.3], step_seconds=0.001), probe_every=1)


def head() -> EagleProposer:
    return EagleProposer(tiny_head("eagle", TARGET, seed=3), TARGET)


RUNS = {
    "draft-chain-sampled": lambda: generate(TARGET, DraftModel(DRAFT), PROMPT, max_new_tokens=16, k=3, sampling=T1, seed=7,
                                            verifier="block"),
    "draft-chain-coupled": lambda: generate(TARGET, DraftModel(DRAFT), PROMPT, max_new_tokens=16, k=3, sampling=T1, seed=7),
    "draft-chain-warm-block": lambda: generate(TARGET, DraftModel(DRAFT), PROMPT, max_new_tokens=16, k=4, sampling=WARM,
                                               seed=8, verifier="block"),
    "draft-chain-greedy": lambda: generate(TARGET, DraftModel(DRAFT), PROMPT, max_new_tokens=16, k=3, sampling=GREEDY),
    "lookup-chain-sampled": lambda: generate(TARGET, PromptLookup(), PROMPT, max_new_tokens=16, k=4, sampling=T1,
                                             seed=23, eos_token_id=5, verifier="point-mass"),
    "lookup-chain-coupled": lambda: generate(TARGET, PromptLookup(), PROMPT, max_new_tokens=16, k=4, sampling=T1,
                                             seed=23, eos_token_id=5),
    "lookup-heuristic-greedy": lambda: generate(TARGET, PromptLookup(), PROMPT, max_new_tokens=16, k=HeuristicK(2),
                                                sampling=GREEDY),
    "draft-auto-sampled": lambda: generate(TARGET, DraftModel(DRAFT), PROMPT, max_new_tokens=20, k=auto(), sampling=T1,
                                           seed=10, clock=TickClock()),
    "copy-or-head-auto-sampled": lambda: generate(TARGET, CopyOrHead(PromptLookup(), head()), PROMPT, max_new_tokens=20,
                                                  k=auto(), sampling=T1, seed=11, clock=TickClock()),
    "draft-tree-sampled": lambda: generate(TARGET, DraftModel(DRAFT), PROMPT, max_new_tokens=16, k=ConstantTree(SHAPE),
                                           sampling=T1, seed=12, verifier="token"),
    "draft-tree-coupled": lambda: generate(TARGET, DraftModel(DRAFT), PROMPT, max_new_tokens=16, k=ConstantTree(SHAPE),
                                           sampling=T1, seed=12),
    "ranked-tree-greedy": lambda: generate(TARGET, TopRankedDraft(DRAFT), PROMPT, max_new_tokens=16,
                                           k=ConstantTree(SHAPE), sampling=GREEDY),
    "lookup-tree-sampled": lambda: generate(TARGET, PromptLookup(), PROMPT, max_new_tokens=16, k=ConstantTree(SHAPE),
                                            sampling=T1, seed=13, verifier="token"),
    "draft-tree-auto-sampled": lambda: generate(TARGET, DraftModel(DRAFT), PROMPT, max_new_tokens=20, k=tree_auto(),
                                                sampling=T1, seed=14, clock=TickClock()),
}

PINNED: dict[str, tuple[list[int], list[int]]] = {  # name -> (tokens, drafted per round)
    "copy-or-head-auto-sampled": ([4, 4, 2, 5, 1, 3, 0, 3, 1, 5, 4, 1, 0, 5, 2, 0, 3, 5, 5, 0], [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    "draft-auto-sampled": ([5, 5, 5, 3, 5, 5, 3, 4, 2, 3, 3, 4, 1, 5, 4, 5, 4, 1, 5, 2], [1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]),
    "draft-chain-coupled": ([5, 2, 1, 3, 3, 4, 5, 2, 1, 5, 1, 4, 2, 3, 5, 2], [3, 3, 3, 3, 3, 3, 3, 3, 1, 0]),
    "draft-chain-greedy": ([4, 4, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 1, 0]),
    "draft-chain-sampled": ([4, 2, 3, 4, 0, 3, 5, 5, 5, 0, 3, 1, 0, 3, 0, 1], [3, 3, 3, 3, 3, 3, 2, 0]),
    "draft-chain-warm-block": ([5, 4, 0, 4, 0, 1, 4, 4, 2, 4, 3, 3, 5, 4, 3, 0], [4, 4, 4, 4, 4, 3, 2, 0]),
    "draft-tree-auto-sampled": ([4, 4, 5, 5, 0, 4, 0, 1, 4, 4, 5, 2, 2, 2, 2, 5, 5, 5, 1, 4], [3, 3, 0, 3, 3, 0, 3, 3, 0, 3, 0, 3, 0, 0, 3, 0]),
    "draft-tree-coupled": ([4, 4, 0, 2, 4, 4, 5, 5, 1, 2, 5, 2, 1, 0, 5, 2], [5, 5, 5, 5, 5, 5, 5, 5, 2]),
    "draft-tree-sampled": ([5, 1, 2, 3, 3, 3, 3, 1, 2, 4, 4, 2, 1, 2, 5, 0], [5, 5, 5, 5, 5, 5, 5, 0]),
    "lookup-chain-coupled": ([4, 2, 3, 3, 3, 5], [3, 0, 4, 4, 1]),
    "lookup-chain-sampled": ([4, 4, 3, 0, 3, 4, 1, 3, 5], [3, 0, 1, 4, 2, 4, 4, 4]),
    "lookup-heuristic-greedy": ([4, 4, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [2, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0]),
    "lookup-tree-sampled": ([4, 5, 5, 0, 0, 3, 2, 2, 4, 4, 5, 2, 1, 2, 3, 5], [4, 0, 0, 1, 3, 3, 2, 2, 3, 2, 3, 4, 4, 1, 0]),
    "ranked-tree-greedy": ([4, 4, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 2, 0]),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_seeded_run_emits_its_pinned_tokens(name):
    run = RUNS[name]()
    assert (run.tokens, run.stats.drafted) == PINNED[name]


def builder(policies):
    def build(request: Request, slot):
        proposer = PROPOSERS[request.proposer].audit(Tables(slot, DRAFT.new_slot())) if request.proposer else None
        return proposer, (policies[request.k]() if isinstance(request.k, str) else request.k)

    return build


def scheduled(batch_costs: BatchCosts | None) -> list[tuple[list[int], list[int]]]:
    """Five requests on three slots (joins as others finish): lookup and a draft model, fixed,
    adaptive and tree k, sampled and greedy."""
    policies = {"auto": auto, "tree": lambda: ConstantTree(SHAPE)}
    scheduler = Scheduler(TARGET, builder(policies), max_slots=3, batch_costs=batch_costs, clock=TickClock())
    requests = [
        Request(tuple(PROMPT), 12, sampling=T1, proposer="lookup", k="auto", seed=1),
        Request(tuple(PROMPT[:3]), 10, sampling=T1, proposer="draft", k=3, seed=2),
        Request(tuple(PROMPT[2:]), 12, sampling=GREEDY, proposer="draft", k="auto", seed=3),
        Request((2, 3), 8, sampling=T1, proposer="draft", k="tree", seed=6, eos_token_ids=frozenset({5})),
        Request((1,), 6, sampling=T1, seed=5),
    ]
    jobs = [scheduler.submit(request) for request in requests]
    scheduler.run()
    return [(job.tokens, job.stats.drafted) for job in jobs]


PINNED_SCHEDULER: dict[str, list[tuple[list[int], list[int]]]] = {
    "own-k": [
        ([4, 5, 4, 2, 3, 2, 5, 3, 4, 4, 3, 0], [1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0]),
        ([4, 3, 5, 4, 3, 5, 5, 4, 2, 3], [3, 3, 3, 2]),
        ([4, 4, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]),
        ([2, 3, 5], [5, 3]),
        ([4, 3, 5, 4, 0, 3], [0, 0, 0, 0, 0, 0]),
    ],
    "batch-k": [
        ([4, 5, 4, 2, 3, 2, 5, 3, 4, 4, 3, 0], [1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0]),
        ([4, 3, 5, 4, 3, 5, 5, 4, 2, 3], [3, 3, 3, 2]),
        ([4, 4, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3], [1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0]),
        ([2, 3, 5], [5, 3]),
        ([4, 3, 5, 4, 0, 3], [0, 0, 0, 0, 0, 0]),
    ],
}


@pytest.mark.parametrize("name", ["own-k", "batch-k"])
def test_a_seeded_batch_emits_its_pinned_tokens(name):
    costs = None if name == "own-k" else BatchCosts((1, 4, 8, 64), (1.0, 1.1, 1.6, 12.0))
    assert scheduled(costs) == PINNED_SCHEDULER[name]
