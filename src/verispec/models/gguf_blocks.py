"""A GGUF file's weights as stored: 4- and 8-bit codes with their block scales, not floats.

transformers' GGUF reader dequantises every tensor to float32 (`gguf.quants.dequantize`);
verispec's float32 path uses those floats. Here the same tensors are read raw with
`gguf.GGUFReader` and kept as codes, in Hugging Face names and row order, so a quantized
linear layer can run on them while `GGUFWeight.dequantize()` still returns, bit for bit, the
float32 weight the float32 path holds.

Block formats (ggml, 32 weights a block; d and m are float16):
- Q4_0: w = d * (u - 8), u in 0..15;
- Q4_1: w = d * u + m, u in 0..15;
- Q8_0: w = d * q, q in -128..127.
Every other type (F32 norms, F16, k-quants, ...) is kept as gguf's float32 dequantisation,
the exact route for anything the 4-bit kernels cannot hold.

Rows: llama.cpp stores the q and k projections with their rotary halves interleaved;
transformers un-permutes those rows on load. A row permutation moves whole blocks, so it is
applied to codes and scales alike (the permutation is transformers' own, taken by running its
tensor processor on row indices).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, GGUFReader, dequantize, get_tensor_name_map
from transformers import PreTrainedModel
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

BLOCK = 32  # weights per block in Q4_0, Q4_1 and Q8_0
CODED = ("Q4_0", "Q4_1", "Q8_0")


@dataclass(frozen=True)
class GGUFWeight:
    """One weight [N, K] of a GGUF file in Hugging Face orientation (rows = output features).

    kind: the GGML type name ("Q4_0", "Q4_1", "Q8_0", "F32", ...).
    For Q4_0 and Q4_1: codes uint8[N, K] in 0..15; for Q8_0: codes int8[N, K].
    d: float32[N, K / 32], the block scales (float16 values); m: float32[N, K / 32], the
        Q4_1 block minimums (None otherwise).
    values: float32[...] for every other kind (gguf's dequantisation), else None.
    """

    kind: str
    codes: torch.Tensor | None = None
    d: torch.Tensor | None = None
    m: torch.Tensor | None = None
    values: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple((self.values if self.values is not None else self.codes).shape)

    def dequantize(self) -> torch.Tensor:
        """float32[N, K], with gguf's arithmetic: d * u (exact: 11 x 4 bits) and then + m
        (one float32 rounding), the same as transformers' loader gives."""
        if self.values is not None:
            return self.values
        d = self.d.repeat_interleave(BLOCK, dim=1)  # [N, K]
        if self.kind == "Q4_0":
            return d * (self.codes.to(torch.float32) - 8)
        if self.kind == "Q4_1":
            return d * self.codes.to(torch.float32) + self.m.repeat_interleave(BLOCK, dim=1)
        return self.codes.to(torch.float32) * d


def gguf_weights(path: str | os.PathLike, model: PreTrainedModel) -> dict[str, GGUFWeight]:
    """Every tensor of the GGUF file at `path`, keyed by the parameter name it has in `model`
    (the transformers model of the same architecture; its weights are not read, so a model
    built on the meta device will do). Tensors the model has no parameter for are left out."""
    reader = GGUFReader(Path(path))
    processor = _processor(model)
    names = _hf_names(model)
    weights = {}
    for tensor in reader.tensors:
        if tensor.name not in names:
            continue
        weight = _weight(tensor)
        if weight.values is None:
            weight = _permute_rows(weight, _row_order(processor, tensor.name, weight.codes.shape[0]))
        else:
            weight = GGUFWeight(weight.kind, values=torch.from_numpy(
                np.ascontiguousarray(processor.process(weights=weight.values.numpy(), name=tensor.name).weights)
            ))
        weights[names[tensor.name]] = weight
    return weights


def decode_blocks(kind: str, blocks: np.ndarray) -> GGUFWeight:
    """Codes and scales from raw ggml blocks uint8[N, bytes per row]; each row holds K / 32
    blocks of (d, [m,] packed codes). Q4 codes: byte j of a block holds weight j in its low
    nibble and weight j + 16 in its high nibble."""
    rows = blocks.shape[0]
    header = {"Q4_0": 2, "Q4_1": 4, "Q8_0": 2}[kind]
    per_block = header + (BLOCK if kind == "Q8_0" else BLOCK // 2)
    grouped = np.ascontiguousarray(blocks).reshape(rows, -1, per_block)  # [N, G, bytes]
    d = torch.from_numpy(grouped[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32))  # [N, G]
    m = None
    if kind == "Q4_1":
        m = torch.from_numpy(grouped[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
    payload = grouped[..., header:]
    if kind == "Q8_0":
        codes = torch.from_numpy(payload.copy().view(np.int8).reshape(rows, -1))
    else:
        low, high = payload & 0x0F, payload >> 4
        codes = torch.from_numpy(np.concatenate([low, high], axis=-1).reshape(rows, -1))
    return GGUFWeight(kind, codes=codes, d=d, m=m)


def _weight(tensor) -> GGUFWeight:
    kind = GGMLQuantizationType(tensor.tensor_type).name
    data = np.asarray(tensor.data)
    if kind in CODED:
        return decode_blocks(kind, data)
    return GGUFWeight(kind, values=torch.from_numpy(np.array(dequantize(data, tensor.tensor_type))))


def _hf_names(model: PreTrainedModel) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, by gguf's own name table (what
    transformers' `get_gguf_hf_weights_map` does, without rebuilding the table for every
    submodule: that took ~10 s for the default model)."""
    arches = [arch for arch, name in MODEL_ARCH_NAMES.items() if name == model.config.model_type]
    if not arches:
        raise ValueError(f"gguf has no tensor names for model type {model.config.model_type!r}")
    table = get_tensor_name_map(arches[0], model.config.num_hidden_layers)
    names = {}
    for hf_name in model.state_dict():
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = table.get_name(base) if suffix in ("weight", "bias") else None
        if gguf_name is not None:
            names.setdefault(f"{gguf_name}.{suffix}", hf_name)
    return names


def _processor(model: PreTrainedModel) -> TensorProcessor:
    config = model.config.to_dict()
    return TENSOR_PROCESSORS.get(model.config.model_type, TensorProcessor)(config=config)


def _row_order(processor: TensorProcessor, name: str, rows: int) -> np.ndarray:
    """The row order transformers' loader gives tensor `name`: its processor run on indices."""
    order = processor.process(weights=np.arange(rows)[:, None], name=name).weights
    return np.asarray(order).reshape(rows)


def _permute_rows(weight: GGUFWeight, order: np.ndarray) -> GGUFWeight:
    if (order == np.arange(len(order))).all():
        return weight
    index = torch.from_numpy(order.astype(np.int64))
    return GGUFWeight(
        weight.kind,
        codes=weight.codes[index].contiguous(),
        d=weight.d[index].contiguous(),
        m=None if weight.m is None else weight.m[index].contiguous(),
    )
