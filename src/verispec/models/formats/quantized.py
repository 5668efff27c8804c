"""A transformers causal LM whose linear layers run in a quantized format (`quant.linear_for`).

`quantized_model(model, fmt, blocks)` returns a copy of `model`'s module tree that shares
every tensor with it (embedding, norms, rotary tables) except the linear layers, which are
rebuilt in `fmt`: from `blocks` (a GGUF file's own codes, `gguf_blocks.gguf_weights`) where
the file has them, else quantized on load from the float weights. transformers' own forward,
masks and caches then run unchanged, so the copy works behind `HFCausalLM` with its own cache.

`exact` on the result says whether every linear holds its float32 weight bit for bit (q4 on a
Q4_0/Q4_1/Q8_0 GGUF); when False the copy is a different model from the float one.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping

import torch
from torch import nn
from transformers import PreTrainedModel

from verispec.models.formats.gguf_blocks import GGUFWeight
from verispec.models.formats.quant import linear_for


def quantized_model(
    model: PreTrainedModel, fmt: str, blocks: Mapping[str, GGUFWeight] | None = None, exact: bool = True
) -> PreTrainedModel:
    """A copy of `model` with its linear layers in `fmt` ("q4", "int8", "bfloat16",
    "float32"), sharing all other tensors; `.exact` tells whether its weights are unchanged.
    exact=False: q4's cheaper single plane (`quant.linear_for`), for drafts.

    >>> model = loaded.transformers_model()
    >>> draft = quantized_model(model, "q4", gguf_weights(loaded.source, model))
    >>> draft.exact   # True for the default model's Q4_1/Q8_0 file
    True
    """
    stored = stored_weights(model, blocks)
    shared = {id(tensor): tensor for tensor in itertools.chain(model.parameters(), model.buffers())}
    view = copy.deepcopy(model, memo=shared)  # new modules, the same tensors
    exact = True
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if module.bias is not None:
            raise ValueError(
                f"{name} has a bias; quantized formats support bias-free linear layers (Llama-style models)"
            )
        layer = linear_for(stored(module.weight), fmt, exact=exact)
        view.set_submodule(name, layer)
        exact = exact and layer.exact
    view.exact = exact
    return view.eval()


def stored_weights(
    model: PreTrainedModel,
    blocks: Mapping[str, GGUFWeight] | None,
    checkpoint: Callable[[str], torch.Tensor | None] | None = None,
) -> Callable[[torch.Tensor], GGUFWeight | torch.Tensor]:
    """A lookup: a parameter of `model` -> that weight as the GGUF file stores it (in `blocks`,
    by parameter name; a tied head finds the embedding's blocks), else as the checkpoint file
    holds it (`checkpoint(name)`, used only in the parameter's dtype and shape), else the
    parameter's own tensor."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)

    def stored(weight: torch.Tensor) -> GGUFWeight | torch.Tensor:
        for name in names.get(id(weight), []):
            if blocks is not None and name in blocks:
                return blocks[name]
        for name in names.get(id(weight), []) if checkpoint is not None else ():
            read = checkpoint(name)
            if read is not None and read.dtype == weight.dtype and read.shape == weight.shape:
                return read
        return weight.detach()

    return stored
