"""Weight-only quantized linear layers for the CPU, and the factory that builds one per format.

`linear_for(weights, fmt)` is what a runtime calls for each projection: `weights` are one or
more weights [N_i, K] (GGUF blocks from `gguf_blocks.gguf_weights` or float tensors), fused
along the output dimension (q, k, v -> one qkv projection), and `fmt` the weight format. The
result is an `nn.Module` with `forward(x[..., K]) -> y[..., sum N_i]` (y in x's dtype) and an
`exact` flag: True when its weights equal, bit for bit, the float32 weights of the same
source (what transformers' GGUF loader, and so verispec's float32 path, holds).

Formats:
- "float32", "bfloat16": `F.linear` on the dequantised weight in that dtype (bfloat16 rounds
  the weights: not exact).
- "q4": torch's CPU int4 kernel (`aten._weight_int4pack_mm_for_cpu`, groups of 32 along K).
  For GGUF Q4_0, Q4_1, Q8_0, Q5_0 and Q4_K blocks the weights stay exact (below), with
  float32 products (`float32_route`) on gguf's float32 weights for any tensor that has no exact planes: Q6_K
  (groups of 16, finer than the kernel's), a Q4_K block whose D u + M rounds, and every
  projection fused with one of those (a Q6_K v beside Q4_K q and k: the whole qkv). Weights
  given as floats (a Hugging Face checkpoint, or F16/F32 matrices of a GGUF file) are
  quantized on load to 4 bits, which changes them: a different target (`exact` False).
- "int8": `aten._weight_int8pack_mm`, int8 per output channel, quantized on load from the
  float32 weights: always a different target, meant for drafts. A projection whose width K
  the kernel cannot take (not a multiple of 16) keeps its float32 weight: `linear.projection`
  decides every float and int8 format, for this factory and the fast runtime's alike.

How q4 stays exact. The kernel's only vectorised path takes bfloat16 activations and
bfloat16 scale/zero pairs; it dequantises each weight in float32 as
fma(u - 8, scale, zero) and accumulates in float32, then rounds each output to bfloat16 (its
float32 path is a scalar loop, far slower than float32 `F.linear`: docs/results/implementation-choices.md). A GGUF block scale d is
float16 (11 significant bits), which bfloat16 (8 bits) cannot hold, so each block is written as
a sum of P "planes" that share the block's codes:
    w = sum_p [(u - 8) * s_p + z_p],  s_p, z_p exact in bfloat16, each term exact in float32,
and the planes are laid side by side along K, with the activations repeated P times
(x' = [x, x, ...]): one kernel call computes sum_k x_k * sum_p w_pk. Q4_0 and Q4_1 take P = 2
(d = bf16(d) + remainder; z = m + 8 d likewise); Q8_0 is split into a high and a low nibble
(q = 16 h + l), each with two planes, P = 4. Construction checks, in float64, that the planes
sum to the float32 weight for every code and that no term rounds; a tensor that fails falls
back to the exact float32 route. So for a Q4 GGUF, q4 changes no weight: it is the same
target, with activations and each projection's output rounded to bfloat16 (accumulation in
float32), which is the numerics of the bfloat16 format without its rounding of the weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from verispec.models.formats.gguf_blocks import AFFINE, BLOCK, GGUFWeight
from verispec.models.formats.linear import RowProjection, projection
from verispec.models.weight_format import LINEAR, parse

Weight = GGUFWeight | torch.Tensor
FORMATS = LINEAR  # the weight formats `linear_for` builds (`models.weight_format`)
MAX_PIECES = 3  # bfloat16 pieces a scale or zero may be split into before falling back
CODES = torch.arange(16, dtype=torch.float64) - 8  # u - 8 for every 4-bit code u
PACK_CHUNK_ROWS = 4096  # a multiple of the kernel's 64-row blocks


class Int4Linear(RowProjection):
    """y = x W^T on torch's CPU int4 kernel, W held as P planes of 4-bit codes (see the module
    docstring); x and y in any float dtype, computed in bfloat16 with float32 accumulation.

    packed: the kernel's packing of codes[N, P K]; scales_and_zeros: bfloat16[P K / 32, N, 2].
    """

    def __init__(
        self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, planes: int, exact: bool,
        bias: torch.Tensor | None = None,
    ) -> None:
        """codes: uint8 or int[N, P K] in 0..15; scales, zeros: bfloat16[N, P K / 32]; bias:
        float[N] or None, added to the output in x's dtype."""
        super().__init__()
        self.register_buffer("bias", bias)
        rows, width = codes.shape
        if width % (BLOCK * planes):
            raise ValueError(f"int4 layers need K a multiple of {BLOCK}, got {width // planes}")
        pad = -rows % 16  # the kernel takes N in multiples of 16: extra rows of weight 0, cut off
        codes, scales, zeros = (F.pad(t, (0, 0, 0, pad)) for t in (codes, scales, zeros))
        # Packed in row chunks (the packing keeps each 64 rows apart), so the int32 copy of the
        # codes the packing op wants stays small even for a 49k-row head.
        chunks = codes.split(PACK_CHUNK_ROWS)
        packed = torch.cat([_pack_int4(chunk.to(torch.int32).contiguous()) for chunk in chunks])
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", torch.stack([scales.t(), zeros.t()], dim=2).contiguous())
        self.planes = planes
        self.exact = exact
        self.in_features, self.out_features = width // planes, rows
        self.kernel = "int4 aten._weight_int4pack_mm_for_cpu"  # `profile` names it

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """x[M, in] -> y[M, out]."""
        rows = x.to(torch.bfloat16)  # [M, K]
        # One concatenation, not `repeat` (which dispatches several ops: docs/results/implementation-choices.md).
        rows = torch.cat((rows,) * self.planes, dim=1) if self.planes > 1 else rows.contiguous()  # [M, P K]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, BLOCK, self.scales_and_zeros)  # [M, N + pad]
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def linear_for(
    weights: Weight | Sequence[Weight], fmt: str, exact: bool = True, bias: torch.Tensor | None = None
) -> nn.Module:
    """The projection for `weights` (fused along the output dimension) in format `fmt`, plus
    `bias` (float[sum N_i], the parts' biases side by side) where given.

    exact=False (q4 only) trades exactness for half the work: GGUF blocks keep one plane, their
    scales rounded to bfloat16, and a Q8_0 weight is requantized to 4 bits. For drafts, whose
    tokens are verified anyway.

    >>> qkv = linear_for([blocks["model.layers.0.self_attn.q_proj.weight"],
    ...                   blocks["model.layers.0.self_attn.k_proj.weight"],
    ...                   blocks["model.layers.0.self_attn.v_proj.weight"]], "q4")
    >>> qkv(hidden).shape, qkv.exact   # hidden[M, 576]
    (torch.Size([M, 960]), True)
    """
    parts = [weights] if isinstance(weights, (GGUFWeight, torch.Tensor)) else list(weights)
    fmt = parse(fmt, FORMATS)
    if fmt == "q4" and not exact:
        return _fused_int4([_draft_planes(part) for part in parts], exact=False, bias=bias)
    if fmt == "q4":
        planes = [exact_planes(part) for part in parts]
        if all(plane is not None for plane in planes):
            return _fused_int4(planes, bias=bias)
        if all(isinstance(part, torch.Tensor) or part.values is not None for part in parts):
            return _fused_int4([quantized_planes(_floats(part)) for part in parts], exact=False, bias=bias)
        # Mixed: some blocks cannot be held exactly; the whole projection takes the exact route.
        return float32_route(torch.cat([_floats(part) for part in parts]), bias)
    # float32, bfloat16 and int8 (with its rule for a width its kernel cannot take): `projection`
    return projection(torch.cat([_floats(part) for part in parts]), bias, fmt)  # weight [N, K] float32


def float32_route(weight: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Module:
    """q4's projection for weights it cannot hold as planes: float32 products on the float32
    weight[N, K] (exact), prepacked for oneDNN (`linear.projection`). Not `F.linear`: MKL sums
    a lone row in another order than the same row among others (measured: M = 1, 2, 3, 5, 6, 7
    differ from M = 9 for K = 1536 and 8960), and the deterministic mode's greedy identity
    needs a row's output to be the same bits whatever rows are computed with it."""
    layer = projection(weight.float(), None if bias is None else bias.float())
    layer.exact = True
    return layer


# A plane: (codes uint8[N, K] in 0..15, scale float64[N, K / 32], zero float64[N, K / 32]),
# value (u - 8) * scale + zero.
Plane = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def exact_planes(weight: Weight) -> list[Plane] | None:
    """bfloat16-exact planes that sum to the GGUF weight bit for bit, or None when it has no
    such form (float weights, other GGUF types, or blocks whose scales need too many pieces).

    Checked per block for all 16 codes (so whatever codes a block holds), in float64, which
    holds these sums exactly: every plane's (u - 8) s_p + z_p is exact in float32, and each
    affine form (u - 8) S + Z (S = sum s_p, Z = sum z_p exactly) is exact in float32. For
    Q4_0/Q4_1 that form is d u (+ m) itself, so its float32 value is gguf's float32 result.
    For Q8_0 and Q5_0 the two forms are 16 d h and d l, and their sum d q is exact in float32
    for any float16 d and int8 q (11 + 8 significant bits). Q4_K's D = d sc has up to 17
    significant bits, so its scale takes up to 3 bfloat16 pieces (3 planes), and D u + M may
    round in float32 (then None).
    """
    if isinstance(weight, torch.Tensor) or weight.values is not None or weight.group != BLOCK:
        return None  # Q6_K's groups of 16 are finer than the kernel's smallest, 32
    d = weight.d.double()  # [N, G]
    if weight.kind == "Q4_0":
        affine = [(weight.codes, d, torch.zeros_like(d))]
    elif weight.kind in AFFINE:  # Q4_1, Q4_K
        affine = [(weight.codes, d, weight.m.double() + 8 * d)]
    else:  # Q8_0, Q5_0: q = 16 h + l with h in -8..7 (stored h + 8) and l in 0..15
        q = weight.codes.to(torch.int16)
        affine = [((q >> 4) + 8, 16 * d, torch.zeros_like(d)), (q & 15, d, 8 * d)]
    planes = []
    for codes, scale, zero in affine:
        scales, zeros = _bf16_pieces(scale), _bf16_pieces(zero)
        if scales is None or zeros is None or not _exact_in_float32(scale, zero):
            return None
        count = max(len(scales), len(zeros))
        scales += [torch.zeros_like(scale)] * (count - len(scales))
        zeros += [torch.zeros_like(zero)] * (count - len(zeros))
        if not all(_exact_in_float32(s, z) for s, z in zip(scales, zeros)):
            return None
        planes += [(codes.to(torch.uint8), s, z) for s, z in zip(scales, zeros)]
    return planes


def _draft_planes(weight: Weight) -> list[Plane]:
    """One plane: a Q4 weight's first exact plane (its codes; d and m + 8 d rounded to
    bfloat16), else 4-bit quantization of the float weight."""
    planes = exact_planes(weight) if isinstance(weight, GGUFWeight) and weight.kind in ("Q4_0", "Q4_1", "Q4_K") else None
    return planes[:1] if planes else quantized_planes(_floats(weight))


def quantized_planes(weight: torch.Tensor) -> list[Plane]:
    """4-bit asymmetric quantization of a float weight[N, K] in groups of 32 (min/max, as
    torchao's int4 weight-only): one plane, scale and zero rounded to bfloat16. Changes the
    weight: a different target."""
    rows, width = weight.shape
    if width % BLOCK:
        raise ValueError(f"int4 layers need K a multiple of {BLOCK}, got {width}")
    groups = weight.float().reshape(rows, width // BLOCK, BLOCK)
    low, high = groups.amin(-1), groups.amax(-1)  # [N, G]
    scale = ((high - low) / 15).clamp(min=1e-20).to(torch.bfloat16).float()
    zero = (low + 8 * scale).to(torch.bfloat16).float()  # value of code 8
    codes = torch.round((groups - (zero - 8 * scale)[..., None]) / scale[..., None]).clamp(0, 15)
    return [(codes.reshape(rows, width).to(torch.uint8), scale.double(), zero.double())]


def planes_weight(planes: Sequence[Plane]) -> torch.Tensor:
    """float64[N, K]: what the planes sum to, computed exactly."""
    total = 0
    for codes, scale, zero in planes:
        s, z = scale.repeat_interleave(BLOCK, 1), zero.repeat_interleave(BLOCK, 1)
        total = total + (codes.double() - 8) * s + z
    return total


def _fused_int4(parts: list[list[Plane]], exact: bool = True, bias: torch.Tensor | None = None) -> Int4Linear:
    """One Int4Linear holding every part's planes, parts stacked along N; a part with fewer
    planes is padded with zero planes (scale 0, zero 0: weight 0, exactly)."""
    count = max(len(planes) for planes in parts)
    codes, scales, zeros = [], [], []
    for planes in parts:
        codes_0, scale_0, _ = planes[0]
        blank = (torch.zeros_like(codes_0), torch.zeros_like(scale_0), torch.zeros_like(scale_0))
        planes = list(planes) + [blank] * (count - len(planes))
        codes.append(torch.cat([c for c, _, _ in planes], dim=1))  # [N_i, P K]
        scales.append(torch.cat([s for _, s, _ in planes], dim=1))  # [N_i, P G]
        zeros.append(torch.cat([z for _, _, z in planes], dim=1))
    return Int4Linear(
        torch.cat(codes), torch.cat(scales).to(torch.bfloat16), torch.cat(zeros).to(torch.bfloat16), count, exact, bias
    )


def _bf16_pieces(value: torch.Tensor) -> list[torch.Tensor] | None:
    """float64 tensors, each exact in bfloat16, that sum to `value` exactly (greedy: round,
    subtract, repeat); None when MAX_PIECES do not suffice."""
    pieces, rest = [], value
    for _ in range(MAX_PIECES):
        piece = rest.to(torch.bfloat16).double()
        pieces.append(piece)
        rest = rest - piece  # exact: both are close float64 values of few bits
        if not rest.any():
            return pieces
    return None


def _exact_in_float32(scale: torch.Tensor, zero: torch.Tensor) -> bool:
    """Whether (u - 8) * scale + zero (float64[N, G] each) is exact in float32 for u = 0..15."""
    values = CODES * scale[..., None] + zero[..., None]  # [N, G, 16]
    return torch.equal(values.float().double(), values)


def _pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """The CPU int4 kernel's layout of codes int32[N, K] in 0..15."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2)


def _floats(weight: Weight) -> torch.Tensor:
    return weight.float() if isinstance(weight, torch.Tensor) else weight.dequantize()
