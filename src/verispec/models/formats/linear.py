"""Projections of the fast runtime: one module per weight format, built by `projection`.

Every projection maps activations x[M, in] to y[M, out] in the runtime's activation dtype.
The runtime never looks inside one, so a new weight format (a quantized layout, say) is a new
module here and a new branch in `projection`, and nothing else changes.

Float weights go to oneDNN prepacked once (`PackedLinear`): faster than `F.linear` (MKL) in
float32 and in bfloat16, where `F.linear` reorders the weight on every call (docs/results/implementation-choices.md).

Row invariance: a row's output must be the same bits whatever other rows are computed with it
(the fast runtime's batch-invariant scoring). oneDNN chooses its kernel, and with it the order
in which a row's sum is taken, by the number of rows M: on some shapes a single row takes
another kernel (K = 1536, float32 and bfloat16), and on a CPU with AMX bfloat16 products of
more than 32 rows take the AMX tiles, whose sums come out in other orders (several, by M, for
K = 1536 and 8,960), unless the weight is packed for one row. `row_blocks` probes each shape
once for the packing and the largest block of rows over which every row keeps its bits, and
`PackedLinear` computes a product in such blocks (a lone row padded to two where it must be).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from verispec.models.weight_format import PROJECTION, WeightFormat, parse

# oneDNN packs a weight for the kernel it would choose at an expected row count: these are
# tried, in order of preference (`row_blocks`); 2 keeps single rows on the gemm path.
PACK_ROWS = (2, 1)
# Row counts `row_blocks` compares, ascending (thresholds sit at and around powers of two), and
# the block sizes it may choose: the largest power of two up to which every probed count agrees.
PROBE_ROWS = (2, 3, 5, 8, 9, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128)
PROBE_OUT = 2048  # output columns the probe computes at most
MAX_BLOCK = PROBE_ROWS[-1]
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
        self.kernel = f"F.linear {dtype_name(weight.dtype)}" + (" (MKL)" if mkl_sgemm(weight) else "")  # `profile` names it

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

    Rows are batch-invariant: row i of the output depends only on row i of x, whatever M and
    whatever the other rows, bit for bit. The product runs in blocks of at most
    `blocks.size` rows, each through the kernel that every block size up to it shares, and a
    lone row is padded to two where the one-row kernel sums differently (`row_blocks`,
    probed at construction, at the torch thread count then set: the blocks of a shape whose
    kernel oneDNN splits by threads hold for that count).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.in_features = weight.shape[1]
        self.exact = True  # the weight as given, packed: no rounding (`DenseLinear.exact`)
        self.blocks = row_blocks(*weight.shape, weight.dtype)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, self.blocks.pack_rows)  # opaque oneDNN layout
        self.bias = bias  # [out] or None
        self.kernel = f"oneDNN prepacked {dtype_name(weight.dtype)}"  # `profile` names it

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """x[M, in] -> y[M, out]."""
        size = self.blocks.size
        if x.shape[0] <= size:
            return self._block(x)
        return torch.cat([self._block(block) for block in x.split(size)])

    def _block(self, x: torch.Tensor) -> torch.Tensor:
        """x[m, in] -> y[m, out] for m <= blocks.size: one kernel call."""
        if self.blocks.pad_single and x.shape[0] == 1:
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
        self.kernel = "int8 aten._weight_int8pack_mm"  # `profile` names it

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """x[M, in] -> y[M, out]."""
        y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), self.codes, self.scales).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def int8_fits(weight: torch.Tensor) -> bool:
    """Whether torch's int8 kernel takes weight [out, in]: it reads the activations in blocks
    and crashed (a segmentation fault, torch 2.13 CPU) for K = in of 8 and 24."""
    return weight.shape[1] % INT8_K_MULTIPLE == 0


def dtype_name(dtype: torch.dtype) -> str:
    """"float32" for torch.float32, and so on."""
    return str(dtype).removeprefix("torch.")


def mkl_sgemm(weight: torch.Tensor) -> bool:
    """Whether `F.linear` computes with this weight on MKL's sgemm (a float32 weight on the
    CPU where torch has MKL; a single row goes to its gemv)."""
    return weight.dtype == torch.float32 and weight.device.type == "cpu" and torch.backends.mkl.is_available()


@functools.cache
def prepacks(dtype: torch.dtype) -> bool:
    """Whether oneDNN prepacks a weight of this dtype on this CPU: float32 wherever torch has
    oneDNN; bfloat16 only where the CPU has the instructions oneDNN's bfloat16 path needs
    (AVX-512 BW, VL and DQ, or AVX-NE-CONVERT), not on a CPU with AVX2 alone."""
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@dataclass(frozen=True)
class RowBlocks:
    """How a prepacked product of one shape keeps each row's bits whatever rows come with it:
    the weight packed for `pack_rows` rows, at most `size` rows per kernel call, and a lone
    row padded to two (`pad_single`) where the one-row kernel sums in another order."""

    pack_rows: int
    size: int
    pad_single: bool


def row_blocks(out_features: int, in_features: int, dtype: torch.dtype) -> RowBlocks:
    """The row blocks of a prepacked linear of this shape: for each packing in `PACK_ROWS`,
    the largest power of two up to which every probed row count sums a row alike
    (`probe_blocks`); the packing with the larger blocks, the first on a tie. Probed once
    per shape, dtype and torch thread count (oneDNN splits the work by threads).

    Measured on a 2-core Intel Xeon with AMX (torch 2.13): bfloat16 weights packed for 2 rows
    take one kernel up to 32 rows and the AMX tiles past them, which sum each row in another
    order; packed for 1 row, every product from 1 to 128 rows sums a row alike for K = 576 and
    1,536 at the same speed (the default model's shapes), but K = 8,960 switches at 16 rows
    (8 on two threads), where packing for 2 keeps 32. On an AMD EPYC without AMX, packing for
    2 rows kept one kernel for every row count but a single row at K = 1536."""
    return _row_blocks(out_features, in_features, dtype, torch.get_num_threads())


@functools.cache
def _row_blocks(out_features: int, in_features: int, dtype: torch.dtype, threads: int) -> RowBlocks:
    del threads  # part of the cache key
    best = None
    for pack in PACK_ROWS:
        blocks = probe_blocks(out_features, in_features, dtype, pack)
        if best is None or blocks.size > best.size:
            best = blocks
        if best.size == MAX_BLOCK:
            break
    return best


def probe_blocks(out_features: int, in_features: int, dtype: torch.dtype, pack: int) -> RowBlocks:
    """The row blocks of a weight of this shape packed for `pack` rows (the kernel depends
    on the shape, not the values): products of the first m of 128 rows, m in `PROBE_ROWS`,
    each compared with the previous one on the rows they share, over at most `PROBE_OUT`
    output columns; the block size is the largest power of two up to which all agree (at
    least 2: two rows, or one padded to two, are always the same call). The rows are chosen
    so that their exact products cancel to zero (x = (a, a permuted), w = (b, -b permuted)):
    the output is then pure rounding residue, which differs under any other summation order,
    even after a bfloat16 output rounding that hides the differences of random data.
    """
    generator = torch.Generator().manual_seed(0)
    half = in_features // 2
    a = torch.randn(MAX_BLOCK, half, generator=generator)
    columns = min(out_features, PROBE_OUT)
    b = torch.randn(columns, half, generator=generator)
    order = torch.randperm(half, generator=generator)
    tail = in_features - 2 * half  # an odd width: one zero column
    x = torch.cat((a, a[:, order], a.new_zeros(MAX_BLOCK, tail)), 1).to(dtype)  # [128, in]
    weight = torch.cat((b, -b[:, order], b.new_zeros(columns, tail)), 1).to(dtype)  # [columns, in]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, pack)

    def product(m: int) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x[:m], packed, None, "none", [], "")  # [m, columns]

    previous, agreed = product(PROBE_ROWS[0]), PROBE_ROWS[0]
    pad_single = not torch.equal(product(1), previous[:1])
    for m in PROBE_ROWS[1:]:
        rows = product(m)
        if not torch.equal(rows[:agreed], previous):
            break
        previous, agreed = rows, m
    return RowBlocks(pack, 1 << (agreed.bit_length() - 1), pad_single)


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
