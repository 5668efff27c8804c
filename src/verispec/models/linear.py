"""Projections of the fast runtime: one module per weight format, built by `projection`.

Every projection maps activations x[M, in] to y[M, out] in the runtime's activation dtype.
The runtime never looks inside one, so a new weight format (a quantized layout, say) is a new
module here and a new branch in `projection`, and nothing else changes.

Float weights go to oneDNN prepacked once (`PackedLinear`). Measured on a 2-core AMD EPYC
(torch 2.13, one thread, the 30 layers' projections of SmolLM2-135M, machine loaded): float32
61 ms at M = 1 against 85-96 ms for `F.linear` (MKL), bfloat16 36 against 58 ms (`F.linear`
reorders the weight on every call). Packed with a batch hint of 2, a row's output is also the
same bits whatever the number of rows M, except at M = 1 for some shapes (K = 1536, float32
and bfloat16: another kernel); `PackedLinear` probes that once per shape and then scores a
single row as two.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from verispec.models.weight_format import PROJECTION, WeightFormat, parse

# oneDNN picks its kernel by this expected row count; 2 keeps single rows on the gemm path.
PACK_ROWS = 2
INT8_K_MULTIPLE = 16  # `Int8Linear`'s kernel needs the input width K a multiple of this


class DenseLinear(nn.Module):
    """y = x W^T (+ b) through `F.linear`, W[out, in] kept as given (float32 or bfloat16); x is
    cast to W's dtype and y back to x's (no-ops when they match). `exact`: W holds the source
    weights bit for bit (False where a weight format rounded them, e.g. float32 to bfloat16)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, exact: bool = True) -> None:
        super().__init__()
        self.register_buffer("weight", weight.contiguous())  # [out, in]
        self.register_buffer("bias", bias)  # [out] or None
        self.exact = exact
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x[..., in] -> y[..., out]."""
        return nn.functional.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)


class RowProjection(nn.Module):
    """A projection of rows x[M, in] -> y[M, out] (`rows`); `forward` also takes x[..., in],
    whose leading dimensions it flattens into M rows and restores. The fast runtime's
    activations are 2-D already and skip the reshapes (a microsecond each, per projection)."""

    in_features: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x[..., in] -> y[..., out]."""
        if x.dim() == 2:
            return self.rows(x)
        return self.rows(x.reshape(-1, self.in_features)).view(*x.shape[:-1], -1)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class PackedLinear(RowProjection):
    """y = x W^T (+ b) through oneDNN with W[out, in] prepacked (float32 or bfloat16).

    Rows are shape-invariant: row i of the output depends only on row i of x, whatever M,
    bit for bit (checked at construction; a single row is padded to two where the kernel for
    one row rounds differently).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.in_features = weight.shape[1]
        self.exact = True  # the weight as given, packed: no rounding (`DenseLinear.exact`)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)  # opaque oneDNN layout
        self.bias = bias  # [out] or None
        self.pad_single_row = not single_row_matches(*weight.shape, weight.dtype)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """x[M, in] -> y[M, out]."""
        if self.pad_single_row and x.shape[0] == 1:
            return self._linear(x.expand(2, -1).contiguous())[:1]
        return self._linear(x)

    def _linear(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class Int8Linear(RowProjection):
    """y = x W^T (+ b) with W = scale[n] * q[n, k], q int8 per output channel (quantized on
    load: not the source weights), on torch's weight-only kernel (`aten._weight_int8pack_mm`):
    bfloat16 activations, float32 accumulation, y rounded to bfloat16 and returned in x's
    dtype. Half the bytes of a bfloat16 weight, for drafts (whose tokens are verified) and
    `selfdraft:int8`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if not int8_fits(weight):
            raise ValueError(f"the int8 kernel needs K a multiple of {INT8_K_MULTIPLE}, got a weight of shape {tuple(weight.shape)}")
        weight = weight.float()  # [out, in]
        scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127  # [out]
        self.register_buffer("codes", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(torch.bfloat16))
        self.bias = bias  # [out] or None
        self.exact = False
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """x[M, in] -> y[M, out]."""
        y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), self.codes, self.scales).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def int8_fits(weight: torch.Tensor) -> bool:
    """Whether torch's int8 kernel takes weight [out, in]: it reads the activations in blocks
    and crashed (a segmentation fault, torch 2.13 CPU) for K = in of 8 and 24."""
    return weight.shape[1] % INT8_K_MULTIPLE == 0


@functools.cache
def prepacks(dtype: torch.dtype) -> bool:
    """Whether oneDNN prepacks a weight of this dtype on this CPU: float32 wherever torch has
    oneDNN; bfloat16 only where the CPU has the instructions oneDNN's bfloat16 path needs
    (AVX-512 BW, VL and DQ, or AVX-NE-CONVERT), not on a CPU with AVX2 alone."""
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def single_row_matches(out_features: int, in_features: int, dtype: torch.dtype) -> bool:
    """Whether a prepacked linear of this shape gives one row the same bits alone as among
    seven others. Probed once per shape (the kernel depends on the shape, not the values)
    on rows whose exact products cancel to zero (x = (a, a permuted), w = (b, -b permuted)):
    the output is then pure rounding residue, which differs under any other summation
    order, even after a bfloat16 output rounding that hides the differences of random data.
    """
    generator = torch.Generator().manual_seed(0)
    half = in_features // 2
    a = torch.randn(8, half, generator=generator)
    b = torch.randn(out_features, half, generator=generator)
    order = torch.randperm(half, generator=generator)
    tail = in_features - 2 * half  # an odd width: one zero column
    x = torch.cat((a, a[:, order], a.new_zeros(8, tail)), 1).to(dtype)  # [8, in]
    weight = torch.cat((b, -b[:, order], b.new_zeros(out_features, tail)), 1).to(dtype)  # [out, in]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
    rows = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    return torch.equal(torch.ops.mkldnn._linear_pointwise(x[:1], packed, None, "none", [], ""), rows[:1])


def projection(
    weight: torch.Tensor, bias: torch.Tensor | None = None, weight_format: str = WeightFormat.FLOAT
) -> nn.Module:
    """The projection module for a float `weight` [out, in] (and `bias` [out]) in
    `weight_format` (one of `weight_format.PROJECTION`): the one place a float weight's format
    is decided, for the fast runtime, the heads and `quant.linear_for` alike.

    "float": the weight's own dtype (float32 or bfloat16), prepacked for oneDNN where it
    takes that dtype on this CPU (`prepacks`), else (or on a GPU) through `F.linear`.
    "dense": the weight's own dtype through `F.linear`, as transformers computes it: MKL in
    float32, whose sums come out the same bits for a fused weight as for its parts, so a
    runtime of dense projections gives transformers' float32 logits bit for bit (a reference
    for tests: oneDNN's prepacked products are the runtime's speed, and its only difference).
    "float32", "bfloat16", "float16": the weight cast to that dtype, through `F.linear`
    (`exact` unless the cast rounds it).
    "int8": `Int8Linear`, the weight quantized per output channel (changes it: for drafts);
    a CPU kernel, refused for a weight on another device.
    The rule for a width the int8 kernel cannot take (K not a multiple of `INT8_K_MULTIPLE`,
    `int8_fits`): that projection keeps its float weight, as "float" builds it (the rest of a
    head or a self-draft stays int8); `Int8Linear` itself refuses such a weight.
    """
    fmt = parse(weight_format, PROJECTION)
    bias = None if bias is None else bias.contiguous()
    if fmt is WeightFormat.INT8:
        if weight.device.type != "cpu":
            raise ValueError(f"int8 projections run on torch's CPU kernel; this weight is on {weight.device}")
        if int8_fits(weight):
            return Int8Linear(weight, bias)
        fmt = WeightFormat.FLOAT  # a width the int8 kernel cannot take
    if fmt is WeightFormat.FLOAT:
        if weight.device.type == "cpu" and prepacks(weight.dtype):
            return PackedLinear(weight.contiguous(), bias)
        return DenseLinear(weight.contiguous(), bias)
    if fmt is WeightFormat.DENSE:
        return DenseLinear(weight.contiguous(), bias)
    dtype = fmt.dtype
    exact = dtype == weight.dtype or dtype == torch.float32  # widening to float32 rounds nothing
    return DenseLinear(weight.to(dtype), None if bias is None else bias.to(dtype), exact=exact)


def fused_projection(
    weights: list[torch.Tensor], biases: list[torch.Tensor | None], weight_format: str = WeightFormat.FLOAT
) -> nn.Module:
    """One projection computing every weight's [out, in] output side by side ([M, sum of outs]);
    a weight without a bias gets zeros where another has one."""
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, weights)])
    return projection(torch.cat(weights) if len(weights) > 1 else weights[0], bias, weight_format)


def packed_linears(module: nn.Module, weight_format: str = WeightFormat.FLOAT) -> nn.Module:
    """`module` with every `nn.Linear` inside it replaced, in place, by `projection` of its
    weight and bias in `weight_format` (default: prepacked for oneDNN where it can, `prepacks`). For
    inference only: the projections hold no parameters, so nothing trains or saves through
    them afterwards."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                bias = None if child.bias is None else child.bias.detach()
                setattr(parent, name, projection(child.weight.detach(), bias, weight_format))
    return module
