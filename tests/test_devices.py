"""Models on any torch device: no `.numpy()` of a device tensor, no product of a host tensor
with a device tensor, and the same tokens as on the CPU.

No accelerator is needed: `OnAccelerator` is a CPU tensor that obeys an accelerator's rules
(CUDA's messages). Operations among such tensors stay "on the device"; a device tensor combined
with a host tensor of one or more dimensions raises, as CUDA does (a 0-dim host tensor is a
scalar, which CUDA accepts); `.numpy()` raises; `.cpu()` / `.to("cpu")` is the copy to the host.
Reading one number (`float`, `int`, `.tolist()`) works, as on CUDA, where it synchronises.
A model whose logits come back `OnAccelerator` then exercises every line a real GPU would, and
the copies to the host are counted.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from torch.utils._pytree import tree_flatten

from verispec import GREEDY, SamplingParams, TorchRandom, generate
from verispec.models.tables import TableLM, random_table
from verispec.proposers import DraftModel, PromptLookup
from verispec.sampling import rule_rows


class OnAccelerator(torch.Tensor):
    """CPU data with an accelerator's device rules (see the module docstring). `copies`
    counts the copies to the host since it was last reset."""

    copies = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.numpy:
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to "
                            "copy the tensor to host memory first.")
        if func is torch.Tensor.cpu or (func is torch.Tensor.to and _to_host(args[1:], kwargs)):
            OnAccelerator.copies += 1
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs).as_subclass(torch.Tensor)
        tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        if any(type(x) is torch.Tensor and x.ndim > 0 for x in tensors):
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two "
                               f"devices, cuda:0 and cpu! ({getattr(func, '__name__', func)})")
        return super().__torch_function__(func, types, args, kwargs)


def _to_host(args: tuple, kwargs: dict) -> bool:
    """Whether Tensor.to's arguments name the CPU."""
    targets = [*args, kwargs.get("device")]
    return any(str(x) == "cpu" or (isinstance(x, torch.Tensor) and type(x) is torch.Tensor) for x in targets)


class AcceleratedTable(TableLM):
    """A table model whose logits come back on the (simulated) accelerator."""

    def __init__(self, table: TableLM) -> None:
        super().__init__(table.rows, table.order)

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        return super().extend(tokens, keep).as_subclass(OnAccelerator)

    def score(self, ids: Sequence[int]) -> torch.Tensor:
        return super().score(ids).as_subclass(OnAccelerator)


def test_the_simulated_device_refuses_what_cuda_refuses():
    on_device = torch.ones(3).as_subclass(OnAccelerator)
    with pytest.raises(RuntimeError, match="same device"):
        on_device * torch.ones(3)
    with pytest.raises(TypeError, match="numpy"):
        on_device.numpy()
    assert type(on_device * 2) is OnAccelerator and type(on_device + torch.tensor(1.0)) is OnAccelerator
    assert type(on_device.cpu()) is torch.Tensor and type(on_device.to("cpu")) is torch.Tensor
    assert float(on_device.sum()) == 3.0


CASES = [
    ("draft", GREEDY, "auto"),
    ("draft", SamplingParams(temperature=0.8, top_p=0.9), "token"),
    ("draft", SamplingParams(temperature=0.8, top_k=3, min_p=0.05), "block"),
    ("lookup", SamplingParams(), "point-mass"),
    ("lookup", GREEDY, "greedy"),
]


@pytest.mark.parametrize(("proposer", "sampling", "verifier"), CASES,
                         ids=[f"{p}-{v}" for p, _, v in CASES])
def test_a_target_and_draft_on_an_accelerator_give_the_cpu_tokens(proposer, sampling, verifier):
    target, draft = random_table(6, 2, seed=3, eos_token_id=5), random_table(6, 2, seed=4)

    def run(wrap) -> list[int]:
        drafter = DraftModel(wrap(draft)) if proposer == "draft" else PromptLookup(2)
        return generate(wrap(target), drafter, [0, 1, 2, 0, 1], max_new_tokens=24, k=3, sampling=sampling,
                        verifier=verifier, eos_token_id=5, rng=TorchRandom(7)).tokens

    assert run(AcceleratedTable) == run(lambda table: table)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.7)], ids=["greedy", "sampled"])
def test_rule_rows_are_host_tensors_after_one_copy(sampling):
    """Greedy brings back each row's argmax (its check rides along), never the rows."""
    OnAccelerator.copies = 0
    logits = torch.randn(4, 6)
    rows = rule_rows(logits.as_subclass(OnAccelerator), sampling)
    assert type(rows) is torch.Tensor and OnAccelerator.copies == 1
    if sampling.greedy:
        assert rows.tolist() == logits.argmax(dim=-1).tolist()
    else:
        assert rows.shape == (4, 6)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.9)], ids=["greedy", "sampled"])
def test_one_copy_to_the_host_per_round_and_per_sampled_draft_row(sampling):
    """The target's rows cross once a round; a sampled draft's q crosses once per drafted
    token (its token is drawn on the host); a greedy draft's argmax never copies a row."""
    target, draft = random_table(6, 2, seed=3), random_table(6, 2, seed=4)
    OnAccelerator.copies = 0
    out = generate(AcceleratedTable(target), DraftModel(AcceleratedTable(draft)), [0, 1, 2], max_new_tokens=20,
                   k=3, sampling=sampling, rng=TorchRandom(2))
    q_rows = 0 if sampling.greedy else sum(out.stats.drafted)
    assert OnAccelerator.copies == out.stats.rounds + q_rows


def test_a_transformers_model_without_data_fails_first_where_the_rows_cross_to_the_host():
    """A tiny Llama on the meta device (shapes, no data): HFCausalLM's prefill and forwards run,
    and the first number anything reads is in `arrive`, the round's one crossing to the host; no
    read of device data happens earlier, in the adapter or the engine."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from verispec.models.runtimes.hf import HFCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    lm = HFCausalLM(LlamaForCausalLM(config))
    lm.model.to("meta")  # moved after wrapping: the adapter follows the model
    assert lm.device.type == "meta"
    with pytest.raises(RuntimeError, match="meta tensor") as failure:
        generate(lm, PromptLookup(2), [1, 2, 3, 1, 2], max_new_tokens=4, k=2, sampling=GREEDY)
    ours = [frame.name for frame in failure.traceback if "/verispec/" in str(frame.path)]
    assert ours[-2:] == ["arrive", "to_host_all"] and "score" in ours
