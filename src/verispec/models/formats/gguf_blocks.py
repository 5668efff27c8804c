"""A GGUF file's weights as stored: 4- and 8-bit codes with their block scales, not floats.

transformers' GGUF reader dequantises every tensor to float32 (`gguf.quants.dequantize`);
verispec's float32 path uses those floats. Here the same tensors are read raw with
`gguf.GGUFReader` and kept as codes, in Hugging Face names and row order, so a quantized
linear layer can run on them while `GGUFWeight.dequantize()` still returns, bit for bit, the
float32 weight the float32 path holds.

Block formats (ggml; d, dmin and m are float16, sc and mn small integers). Every format reads
as one of two forms over groups of weights, with float32 group constants that are exact
products, so `GGUFWeight.dequantize` repeats gguf's float32 arithmetic bit for bit:
- "affine" w = D * u + M, u in 0..15, one float32 rounding (of the sum):
  Q4_1 (groups of 32): D = d, M = m;
  Q4_K (super-blocks of 256 in 8 groups of 32): D = d * sc, M = -(dmin * mn), sc and mn 6-bit
  (gguf computes d * sc * u - dmin * mn: the products are exact, so negating the minimum
  before the sum changes no bit);
- "scaled" w = D * q, exact: Q4_0 (q = u - 8), Q8_0 (q in -128..127) and Q5_0 (q in -16..15),
  groups of 32, D = d; Q6_K (q in -32..31), super-blocks of 256 in 16 groups of 16, D = d * sc
  with sc int8 (float16 x int8 x 6 bits: 24 significant bits at most, so exact).
Every other type (F32 norms and biases, F16, other k-quants) is kept as gguf's float32
dequantisation.

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
from safetensors import safe_open
from transformers import PreTrainedModel
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

BLOCK = 32  # weights per group in every coded format but Q6_K
SUPER = 256  # weights per k-quant super-block
CODED = ("Q4_0", "Q4_1", "Q8_0")  # the formats `--dtype auto` takes as all-4-bit (`load_plan.coded_exactly`)
AFFINE = ("Q4_1", "Q4_K")  # w = D u + M
READ = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_0", "Q6_K")  # kept as codes and group constants
GROUP = {"Q6_K": 16}  # weights per group where not BLOCK


@dataclass(frozen=True)
class GGUFWeight:
    """One weight [N, K] of a GGUF file in Hugging Face orientation (rows = output features).

    kind: the GGML type name ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_0", "Q6_K", "F32", ...).
    codes: for Q4_0, Q4_1 and Q4_K uint8[N, K] in 0..15; for Q8_0, Q5_0 and Q6_K int8[N, K],
        the signed q (Q5_0: -16..15, Q6_K: -32..31).
    d: float32[N, K / g], each group's scale D (g = `group`: 16 for Q6_K, else 32);
    m: float32[N, K / 32], each group's M for the affine kinds (Q4_1, Q4_K), else None.
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

    @property
    def group(self) -> int:
        return GROUP.get(self.kind, BLOCK)

    def dequantize(self) -> torch.Tensor:
        """float32[N, K], with gguf's arithmetic: D * u (exact) and then + M (one float32
        rounding) for the affine kinds, D * q (exact) for the others, the same as
        transformers' loader gives."""
        if self.values is not None:
            return self.values
        d = self.d.repeat_interleave(self.group, dim=1)  # [N, K]
        if self.kind == "Q4_0":
            return d * (self.codes.to(torch.float32) - 8)
        if self.kind in AFFINE:
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
    """Codes and group constants from raw ggml blocks uint8[N, bytes per row] of one of the
    `READ` kinds, unpacked as gguf's own dequantisation unpacks them."""
    if kind in ("Q4_K", "Q5_0", "Q6_K"):
        return {"Q4_K": _q4_k, "Q5_0": _q5_0, "Q6_K": _q6_k}[kind](np.ascontiguousarray(blocks))
    rows = blocks.shape[0]
    # Each row holds K / 32 blocks of (d, [m,] packed codes). Q4 codes: byte j of a block holds
    # weight j in its low nibble and weight j + 16 in its high nibble.
    header = {"Q4_0": 2, "Q4_1": 4, "Q8_0": 2}[kind]
    per_block = header + (BLOCK if kind == "Q8_0" else BLOCK // 2)
    grouped = np.ascontiguousarray(blocks).reshape(rows, -1, per_block)  # [N, G, bytes]
    d = torch.from_numpy(_half(grouped[..., 0:2]))  # [N, G]
    m = None
    if kind == "Q4_1":
        m = torch.from_numpy(_half(grouped[..., 2:4]))
    payload = grouped[..., header:]
    if kind == "Q8_0":
        codes = torch.from_numpy(payload.copy().view(np.int8).reshape(rows, -1))
    else:
        codes = torch.from_numpy(_nibbles(payload).reshape(rows, -1))
    return GGUFWeight(kind, codes=codes, d=d, m=m)


def _half(raw: np.ndarray) -> np.ndarray:
    """float32[...] from float16 values stored as byte pairs uint8[..., 2]."""
    return raw.copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """uint8[..., 2 B] from bytes uint8[..., B]: every low nibble, then every high nibble."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def _q4_k(blocks: np.ndarray) -> GGUFWeight:
    """Q4_K, 144 bytes per 256 weights: d, dmin (float16), 12 bytes of 6-bit (sc, mn) for 8
    groups, then 128 bytes of codes: 4 runs of 32 bytes, run j holding group 2j in its low
    nibbles and group 2j + 1 in its high nibbles."""
    rows = blocks.shape[0]
    grouped = blocks.reshape(rows, -1, 144)  # [N, S, 144]
    d, dmin = _half(grouped[..., 0:2]), _half(grouped[..., 2:4])  # [N, S]
    scales = grouped[..., 4:16].reshape(rows, -1, 3, 4)
    low, high, mixed = scales[..., 0, :], scales[..., 1, :], scales[..., 2, :]  # [N, S, 4] each
    sc = np.concatenate([low & 0x3F, (mixed & 0x0F) | ((low >> 2) & 0x30)], axis=-1)  # [N, S, 8]
    mn = np.concatenate([high & 0x3F, (mixed >> 4) | ((high >> 2) & 0x30)], axis=-1)
    runs = grouped[..., 16:].reshape(rows, -1, 4, 32)  # [N, S, 4, 32]
    codes = np.stack([runs & 0x0F, runs >> 4], axis=3)  # [N, S, 4, 2, 32]: group 2j + nibble
    scale = d[..., None] * sc.astype(np.float32)  # [N, S, 8], exact: 11 x 6 bits
    minimum = -(dmin[..., None] * mn.astype(np.float32))
    return GGUFWeight(
        "Q4_K",
        codes=torch.from_numpy(codes.reshape(rows, -1)),
        d=torch.from_numpy(scale.reshape(rows, -1)),
        m=torch.from_numpy(minimum.reshape(rows, -1)),
    )


def _q5_0(blocks: np.ndarray) -> GGUFWeight:
    """Q5_0, 22 bytes per 32 weights: d (float16), the 32 high bits (a little-endian uint32,
    bit j for weight j), then 16 bytes of low nibbles as Q4_0 lays them out; q = u - 16."""
    rows = blocks.shape[0]
    grouped = blocks.reshape(rows, -1, 22)  # [N, G, 22]
    d = _half(grouped[..., 0:2])  # [N, G]
    high = grouped[..., 2:6].copy().view("<u4")  # [N, G, 1]
    high = ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [N, G, 32]
    q = (_nibbles(grouped[..., 6:]) | (high << 4)).astype(np.int8) - np.int8(16)  # [N, G, 32]
    return GGUFWeight("Q5_0", codes=torch.from_numpy(q.reshape(rows, -1)), d=torch.from_numpy(d))


def _q6_k(blocks: np.ndarray) -> GGUFWeight:
    """Q6_K, 210 bytes per 256 weights: 128 bytes of low nibbles (2 halves of 64 bytes, each
    holding 64 weights in its low nibbles, then 64 in its high), 64 bytes of 2-bit highs (2
    halves of 32 bytes, each shifted 0, 2, 4, 6 for 4 runs of 32), 16 int8 scales, d (float16);
    q = u - 32."""
    rows = blocks.shape[0]
    grouped = blocks.reshape(rows, -1, 210)  # [N, S, 210]
    low = grouped[..., :128].reshape(rows, -1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)
    low = (low & 0x0F).reshape(rows, -1, 8, 32)  # [N, S, 8, 32]
    high = grouped[..., 128:192].reshape(rows, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    high = (high & 0x03).reshape(rows, -1, 8, 32)
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)  # [N, S, 8, 32]
    sc = grouped[..., 192:208].copy().view(np.int8).astype(np.float32)  # [N, S, 16]
    scale = _half(grouped[..., 208:210])[..., None] * sc  # exact: 11 x 8 bits
    return GGUFWeight("Q6_K", codes=torch.from_numpy(q.reshape(rows, -1)), d=torch.from_numpy(scale.reshape(rows, -1)))


def _weight(tensor) -> GGUFWeight:
    kind = GGMLQuantizationType(tensor.tensor_type).name
    data = np.asarray(tensor.data)
    if kind in READ:
        return decode_blocks(kind, data)
    return GGUFWeight(kind, values=torch.from_numpy(np.array(dequantize(data, tensor.tensor_type))))


def _hf_names(model: PreTrainedModel) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, by gguf's own name table (what
    transformers' `get_gguf_hf_weights_map` does, without rebuilding the table for every
    submodule: that took seconds for the default model, docs/results/implementation-choices.md)."""
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


def stored_matrix_types(gguf: Path) -> set[str]:
    """The block types of the GGUF file's matrices ("Q4_1", "Q6_K", "F16", ...; the
    one-dimensional tensors, the norms, stay float32 anyway), read from the file's tensor table
    (about 2 s for the default model: `sources.matrix_types` reads a cached copy's metadata)."""
    return {tensor.tensor_type.name for tensor in GGUFReader(gguf).tensors if len(tensor.shape) == 2}
