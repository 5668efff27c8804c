"""Shared fixtures: exact target distributions of table models, for tests that compare an
enumerated or sampled output distribution with the target's; one torch thread for the fast
tests."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import pytest
import torch

from verispec.models.tables import TableLM


def target_joint(
    target: TableLM, prompt: Sequence[int], n: int, eos_token_id: int | None = None
) -> dict[tuple[int, ...], Fraction]:
    """The exact probability of every output of plain sampling from `target`: n tokens, or
    fewer when one of them is EOS (the output ends there)."""
    joint: dict[tuple[int, ...], Fraction] = {}
    stack = [((), Fraction(1))]
    while stack:
        tokens, prob = stack.pop()
        if len(tokens) == n or (tokens and tokens[-1] == eos_token_id):
            joint[tokens] = prob
            continue
        for token, p in enumerate(target.distribution([*prompt, *tokens])):
            if p:
                stack.append(((*tokens, token), prob * p))
    return joint


@pytest.fixture
def exact_joint():
    return target_joint


@pytest.fixture(autouse=True)
def one_torch_thread(request):
    """Fast tests work on tensors of a few dozen entries, where intra-op threads only add
    synchronisation: on a loaded 2-core machine a softmax over [4, 4] took 13 ms with two
    threads and 3 us with one. Tests of the real model keep the configured threads."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
