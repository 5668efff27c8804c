"""Causal attention of M new query rows over a layer's cached keys and values.

Both kinds take q[Hq, M, D] of the rows in cache slots start..start+M-1 and a layer's cached keys
[Hkv, width, D] and values (the first `width(start + M)` cache positions) (grouped-query: query head h reads key/value head
h // (Hq / Hkv)), and return [M, Hq * D].

- `SdpaAttention`: torch's fused CPU kernel (`scaled_dot_product_attention`), the fastest.
  A row's result depends on how many rows come with it: the kernel blocks the key axis by
  the total length and routes one row to a different matrix kernel (measured on a 2-core
  AMD EPYC: 36 of 56 float32 and 10 of 56 bfloat16 row sets differ from the same rows
  scored alone, by a few units in the last place).
- `InvariantAttention`: a row's result is the same bits whatever rows are scored with it
  (see its docstring). Its cache keeps a column of ones beside the values.

`mask(start, m, dtype, visible)`: by default row i sees slots 0..start+i (a chain); a token
tree passes visible[M, M], which new rows each row sees (its ancestors and itself), and every
row still sees the whole cached prefix.
"""

from __future__ import annotations

import torch
from torch import nn


class SdpaAttention:
    value_ones = False

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
        m = q.shape[1]
        out = nn.functional.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, enable_gqa=True)
        return out[0].transpose(0, 1).reshape(m, self.heads * self.head_dim)  # [M, Hq D]


class InvariantAttention:
    """Attention whose rows do not depend on M, built from parts that each are invariant:

    - scores and the weighted sum are oneDNN linear products (rows independent of M, and of
      extra key columns or extra zero-weight key rows; checked for the shapes used here);
      the G query heads sharing a key/value head make G*M >= 2 rows, and the key axis is
      at least two wide, so no product takes the one-row (gemv) path;
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
    (oneDNN, AVX-512 BF16): every row was bit-equal anyway, in float32 and bfloat16, on the
    default model (trees of 3, 8 and 16 nodes, `benchmarks/tree_cost.py`) and on 589 rows of
    random trees of a tiny model.
    """

    value_ones = True
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
        heads, m, d = q.shape
        group = heads // self.kv_heads
        width = mask.shape[1]
        grouped = (q * self.scale).reshape(self.kv_heads, group * m, d)  # [Hkv, G M, D]
        out = q.new_empty(self.kv_heads, group * m, d)
        for h in range(self.kv_heads):
            scores = torch.ops.mkldnn._linear_pointwise(grouped[h], keys[h], None, "none", [], "")  # [G M, width]
            scores = scores.view(group, m, width) + mask
            weights = (scores - scores.amax(-1, keepdim=True)).exp_().view(group * m, width)
            summed = torch.ops.mkldnn._linear_pointwise(weights, values[h].t(), None, "none", [], "")  # [G M, D + 1]
            torch.div(summed[:, :d], summed[:, d:], out=out[h])
        return out.view(heads, m, d).transpose(0, 1).reshape(m, heads * d)  # [M, Hq D]

