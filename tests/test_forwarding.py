"""`ForwardingLM`: every `CausalLM` member reaches the wrapped model, and a wrapper claims an
optional protocol only where it defines that protocol's methods itself."""

from __future__ import annotations

import pytest
import torch

from verispec.bench.identity_suite import Recorder, recorder
from verispec.models.base import BatchedPrefill, CausalLM, FeatureChannel, ForwardingLM, SlotScoring, TreeScoring
from verispec.runtime_check.controls import LogitsTap
from verispec.simulation import CURVES, SimulatedClock, SimulatedTarget, cycle_table

PROTOCOLS = (FeatureChannel, TreeScoring, SlotScoring, BatchedPrefill)


class CallLog:
    """A `CausalLM` that logs each call and answers with values no default could produce."""

    vocab_size = 11
    length = 7

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.logits = torch.full((1, 11), 3.0)  # [1, V]

    def reset(self) -> None:
        self.calls.append(("reset",))

    def prefill(self, ids) -> None:
        self.calls.append(("prefill", list(ids)))

    def extend(self, tokens, keep=None) -> torch.Tensor:
        self.calls.append(("extend", list(tokens), keep))
        return self.logits

    def rollback(self, length: int) -> None:
        self.calls.append(("rollback", length))

    def score(self, ids) -> torch.Tensor:
        self.calls.append(("score", list(ids)))
        return self.logits


def test_every_causal_lm_member_is_forwarded():
    members = {name for name in vars(CausalLM) if not name.startswith("_")} | set(CausalLM.__annotations__)
    assert members == {"vocab_size", "length", "reset", "prefill", "extend", "rollback", "score"}, (
        "CausalLM changed: forward the new member in ForwardingLM and add it here"
    )
    inner = CallLog()
    lm = ForwardingLM(inner)
    assert (lm.vocab_size, lm.length) == (11, 7)
    lm.reset()
    lm.prefill([1, 2])
    assert lm.extend([3, 4], keep=1) is inner.logits
    lm.rollback(5)
    assert lm.score([6]) is inner.logits
    assert inner.calls == [("reset",), ("prefill", [1, 2]), ("extend", [3, 4], 1), ("rollback", 5), ("score", [6])]


def test_the_wrappers_follow_the_model_they_wrap():
    table = cycle_table()
    inner = table.new_slot()
    for lm in (SimulatedTarget(inner, CURVES["gpu-flat"], SimulatedClock()), LogitsTap(inner), recorder(inner)):
        lm.prefill([1, 2, 3])
        rows = lm.extend([4, 5])  # [2, V]
        lm.rollback(4)
        assert lm.length == inner.length == 4 and lm.vocab_size == inner.vocab_size
        assert torch.equal(rows, table.score([1, 2, 3, 4, 5])[-2:])
        assert torch.equal(lm.score([1, 2]), table.score([1, 2]))
        lm.reset()
        assert inner.length == 0


@pytest.mark.parametrize(
    ("wrap", "claims"),
    [
        (ForwardingLM, set()),
        (lambda lm: SimulatedTarget(lm, CURVES["gpu-flat"], SimulatedClock()), {TreeScoring, SlotScoring}),
        (LogitsTap, set()),
        (Recorder, set()),
        (recorder, {TreeScoring}),
    ],
    ids=["ForwardingLM", "SimulatedTarget", "LogitsTap", "Recorder", "TreeRecorder"],
)
def test_a_wrapper_claims_only_the_protocols_it_defines(wrap, claims):
    """Over a table that has FeatureChannel, TreeScoring and SlotScoring, a wrapper claims only
    what it forwards faithfully: the engine, scheduler and heads pick their paths by isinstance."""
    table = cycle_table()
    assert {FeatureChannel, TreeScoring, SlotScoring} <= {p for p in PROTOCOLS if isinstance(table, p)}
    assert {p for p in PROTOCOLS if isinstance(wrap(table), p)} == claims
