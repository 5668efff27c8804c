"""Causal attention of M new query rows over a layer's cached keys and values.

Every kind takes q[B, Hq, M, D] of the rows in cache slots start..start+M-1 of B sequences
(B slots of equal length scored together, or one) and their layer's cached keys [B, Hkv, width,
D] and values (the first `width(start + M)` cache positions) (grouped-query: query head h reads
key/value head h // (Hq / Hkv)), and returns [B M, Hq * D] (sequence by sequence). One call
over B sequences gives each the bits it gets alone: every kind's kernels compute each
(sequence, head) on its own, with blockings that depend on the lengths only (the tests check it).

- `SdpaAttention`: torch's fused CPU kernel (`scaled_dot_product_attention`), the fastest.
  A row's result depends on how many rows come with it: the kernel blocks the key axis by
  the total length and routes one row to a different matrix kernel (measured on a 2-core
  AMD EPYC: 36 of 56 float32 and 10 of 56 bfloat16 row sets differ from the same rows
  scored alone, by a few units in the last place).
- `InvariantAttention`: a row's result is the same bits whatever rows are scored with it
  (see its docstring). Its cache keeps a column of ones beside the values. For bfloat16.
- `RowAttention`: the same promise by scoring each row alone through the fused kernel's
  one-row path, as plain decoding does: free for one row, M kernel calls for M rows. For
  float32 (and q4, whose activations are float32), where that path is fast.

`mask(start, m, dtype, visible)`: by default row i sees slots 0..start+i (a chain); a token
tree passes visible[M, M], which new rows each row sees (its ancestors and itself), and every
row still sees the whole cached prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


class SdpaAttention:
    value_ones = False
    keys_by_column = False

    def __init__(self, heads: int, kv_heads: int, head_dim: int) -> None:
        self.heads, self.head_dim = heads, head_dim

    def width(self, end: int) -> int:
        """How many cached positions a forward ending at `end` reads."""
        return end

    def mask(
        self, start: int, m: int, dtype: torch.dtype, visible: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """allowed[M, start+M] (row i sees slots 0..start+i, or the prefix and `visible[i]`);
        None for one row."""
        if m == 1:
            return None
        if visible is not None:
            return torch.cat((torch.ones(m, start, dtype=torch.bool), visible), dim=1)
        end = start + m
        return torch.arange(end) <= torch.arange(start, end)[:, None]

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, _, m, _ = q.shape
        out = nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)  # [B, Hq, M, D]
        return out.transpose(1, 2).reshape(b * m, self.heads * self.head_dim)  # [B M, Hq D]


class InvariantAttention:
    """Attention whose rows do not depend on M, built from parts that each are invariant:

    - scores and the weighted sum are batched matrix products over the key/value heads
      (`torch.bmm`: oneDNN's matmul in bfloat16), whose rows are independent of M, and of
      extra key columns or extra zero-weight key rows (checked for the shapes used here, up
      to 4,096 positions, and by the tests); the G query heads sharing a key/value head make
      G*M >= 2 rows, and the key axis is at least two wide, so no product takes a one-row
      (gemv) path. The cache keeps keys by column ([Hkv, D, width]) so the scores' product
      reads contiguous rows instead of copying a transposed view on every call;
    - masked positions get -inf, so exp gives exact zeros, which add nothing to any sum;
    - every row reads a multiple of WIDTH_STEP positions (the ones past the end masked), so
      elementwise kernels never leave a remainder to their scalar loop, whose exp and
      bfloat16 roundings differ from the vectorised ones (seen in bfloat16);
    - the row maximum is exact in any order; the softmax denominator comes out of the same
      product as the numerator, through the ones column of the cached values, instead of
      torch's softmax, whose vectorised sum changes order as the row length crosses its
      vector width (rows shorter than ~16 positions differed).

    Tree rows (a `visible` mask): the same holds, a row's bits do not depend on which other
    rows are scored with it, since other branches' slots are masked to exact zeros. A node
    whose ancestors fill the slots right after the prefix (the first-child chain of a
    depth-first tree) gets exactly the bits of the same path scored as a chain. Other nodes
    see their ancestors in later slots, with masked slots between them: the zeros add
    nothing, but the weighted sum may pair or block the key axis differently, so their rows
    are only promised to equal the chain's within rounding. Measured on a 2-core AMD EPYC
    (oneDNN, AVX-512 BF16): on the default model's random-token trees every row was bit-equal
    (trees of 3, 8 and 16 nodes, `benchmarks/tree_cost.py`; an 8-node tree after 5 to 2,600
    positions), and so were 589 rows of random trees of a tiny model; decoding real prompts,
    EAGLE trees met rows one bfloat16 step of the logits away from their chains (README,
    "bf16 trees and exact ties").
    """

    value_ones = True
    keys_by_column = True
    WIDTH_STEP = 64

    def __init__(self, heads: int, kv_heads: int, head_dim: int) -> None:
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.scale = head_dim**-0.5

    def width(self, end: int) -> int:
        """How many cached positions a forward ending at `end` reads: a multiple of WIDTH_STEP."""
        return -(-end // self.WIDTH_STEP) * self.WIDTH_STEP

    def mask(
        self, start: int, m: int, dtype: torch.dtype, visible: torch.Tensor | None = None
    ) -> torch.Tensor:
        """additive[M, width] in `dtype`: 0 where row i sees the slot (0..start+i, or the
        prefix and `visible[i]`), else -inf."""
        end = start + m
        width = self.width(end)
        if visible is None:
            blocked = torch.arange(width) > torch.arange(start, end)[:, None]
        else:
            blocked = torch.ones(m, width, dtype=torch.bool)
            blocked[:, :start] = False
            blocked[:, start:end] = ~visible
        return torch.zeros(blocked.shape, dtype=dtype).masked_fill_(blocked, float("-inf"))

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """keys [B, Hkv, D, width] (the cache keeps them by column), values [B, Hkv, width, D + 1]."""
        b, heads, m, d = q.shape
        group = heads // self.kv_heads
        width = mask.shape[1]
        pairs = b * self.kv_heads  # one product per (sequence, key/value head)
        grouped = (q * self.scale).reshape(pairs, group * m, d)  # [B Hkv, G M, D]
        scores = torch.bmm(grouped, keys.reshape(pairs, d, width)).view(pairs, group, m, width) + mask
        weights = (scores - scores.amax(-1, keepdim=True)).exp_().view(pairs, group * m, width)
        summed = torch.bmm(weights, values.reshape(pairs, width, d + 1))  # [B Hkv, G M, D + 1]
        out = summed[..., :d] / summed[..., d:]  # [B Hkv, G M, D]
        return out.view(b, heads, m, d).transpose(1, 2).reshape(b * m, heads * d)  # [B M, Hq D]


class RowAttention(SdpaAttention):
    """Attention whose rows do not depend on M: each row attends alone, through torch's fused
    kernel with one query row and no mask, over exactly the positions it sees, laid out as
    plain decoding of its path lays them out:

    - a chain row i reads the first start + i + 1 cached positions (a view);
    - a tree node reads the prefix followed by its ancestors and itself: their keys and
      values are written, in depth order, into the slots right after the prefix (a few
      small copies; the first-child chain of a depth-first tree is there already), and once
      every row has attended, the slots get back the nodes in slot order.

    So every row gets the bits plain decoding of its path gets, and a one-row forward is the
    fused kernel's own one-row call: plain decoding costs nothing more, and a forward of M
    rows makes M kernel calls per layer instead of one (a few rows cost about twice what they
    cost together: docs/results/implementation-choices.md). Chosen for deterministic scoring in float32 and for q4, whose
    activations are float32: torch's fused kernel is fast for one float32 row but slow for one
    bfloat16 row, so bfloat16 uses `InvariantAttention`. Its cache and widths are the fused
    attention's.
    """

    def mask(
        self, start: int, m: int, dtype: torch.dtype, visible: torch.Tensor | None = None
    ) -> RowPaths:
        """What each row reads: a chain row the first start + i + 1 positions; a tree row the
        prefix and the new rows it sees (`visible[i]`, ascending: its ancestors, then itself)."""
        if visible is None:
            return RowPaths(start, None)
        return RowPaths(start, [row.nonzero().flatten() for row in visible])

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rows: RowPaths) -> torch.Tensor:
        """Row i of every sequence in one call (a tree: B = 1, `keys` and `values` views of
        its cache, whose new slots are rewritten per row and restored)."""
        b, heads, m, d = q.shape
        start = rows.start
        out = q.new_empty(b, m, heads * d)
        if rows.paths is not None:
            new_keys, new_values = keys[:, :, start:].clone(), values[:, :, start:].clone()  # [1, Hkv, M, D], slot order
        for i in range(m):
            if rows.paths is None:
                end = start + i + 1
            else:
                path = rows.paths[i]  # [depth] row indices
                end = start + path.numel()
                keys[:, :, start:end], values[:, :, start:end] = new_keys[:, :, path], new_values[:, :, path]
            attended = nn.functional.scaled_dot_product_attention(
                q[:, :, i : i + 1], keys[:, :, :end], values[:, :, :end], enable_gqa=True
            )  # [B, Hq, 1, D]
            out[:, i] = attended.view(b, heads * d)
        if rows.paths is not None:
            keys[:, :, start:], values[:, :, start:] = new_keys, new_values
        return out.view(b * m, heads * d)


@dataclass(frozen=True)
class RowPaths:
    """`RowAttention`'s mask: the first new row's slot, and per tree row the new rows it sees
    in depth order (LongTensor [depth]; None for a chain)."""

    start: int
    paths: list[torch.Tensor] | None
