"""Weight formats: how a projection holds its weight, named once for every part of verispec.

One type, `WeightFormat`, names what `--dtype` loads a target in, what a trained head drafts in
(`eagle:DIR:weights=F`), what a self-draft quantizes to (`selfdraft:FORMAT`) and what the
projection factories build (`models.formats.linear.projection` for a float weight, `models.formats.quant.
linear_for` for GGUF blocks, which hands every float format to `projection`). Each part accepts
a subset, named here; `parse` reads a name once and refuses one outside the subset.

- float32, bfloat16, float16: float weights in that dtype (bfloat16 and float16 round a float32
  weight: not the same target).
- q4: 4-bit codes on torch's CPU int4 kernel (exact for a Q4 GGUF's own blocks, `models.formats.quant`).
- int8: int8 codes per output channel on torch's weight-only kernel, quantized on load (for
  drafts). The kernel takes an input width K that is a multiple of 16 only: a projection of any
  other width keeps its float weight (`projection` decides this, for every caller, and
  `models.formats.linear.Int8Linear` itself refuses such a weight).
- auto (`--dtype` only): chosen per model and machine when it is loaded (`models.loading.load_plan`).
- gguf: the GGUF file's own blocks as llama.cpp computes them (runtime "llamacpp" only; no
  `--dtype` names it, `models.loading.load_plan` sets it).
- float, dense: the fast runtime's routes for a weight kept in its own float dtype: prepacked
  for oneDNN ("float"), or through `F.linear` as transformers computes it ("dense": a reference
  for tests).

A `WeightFormat` is a `str`, so the name and the member are interchangeable:

    >>> parse("int8", HEAD) is WeightFormat.INT8, WeightFormat.INT8 == "int8"
    (True, True)
    >>> parse("int4", HEAD)
    Traceback (most recent call last):
    ...
    ValueError: unknown weight format 'int4'; choose float32, bfloat16, int8
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Literal

import torch


class WeightFormat(StrEnum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    Q4 = "q4"
    INT8 = "int8"
    FLOAT = "float"
    DENSE = "dense"
    GGUF = "gguf"

    @property
    def quantized(self) -> bool:
        """Held as integer codes (q4, int8), built by `models.formats.quant`."""
        return self in QUANTIZED

    @property
    def dtype(self) -> torch.dtype | None:
        """The float dtype the weight is cast to (None: it keeps its own, or it is quantized)."""
        return _DTYPES.get(self)


_DTYPES = {
    WeightFormat.FLOAT32: torch.float32,
    WeightFormat.BFLOAT16: torch.bfloat16,
    WeightFormat.FLOAT16: torch.float16,
}

# The subsets each part of verispec accepts.
QUANTIZED = (WeightFormat.Q4, WeightFormat.INT8)
TARGET = (WeightFormat.FLOAT32, WeightFormat.BFLOAT16, WeightFormat.FLOAT16, WeightFormat.Q4)  # --dtype, besides auto
HEAD = (WeightFormat.FLOAT32, WeightFormat.BFLOAT16, WeightFormat.INT8)  # eagle:...:weights=F, besides auto
AUTO = "auto"  # --dtype auto: chosen per model and machine (`models.loading.load_plan`)
TARGET_ALIASES = {"fp32": WeightFormat.FLOAT32, "bf16": WeightFormat.BFLOAT16, "fp16": WeightFormat.FLOAT16}
SELF_DRAFT = QUANTIZED  # selfdraft:FORMAT
LINEAR = (WeightFormat.FLOAT32, WeightFormat.BFLOAT16, WeightFormat.Q4, WeightFormat.INT8)  # quant.linear_for
PROJECTION = (  # linear.projection: a float weight
    WeightFormat.FLOAT, WeightFormat.DENSE, WeightFormat.FLOAT32, WeightFormat.BFLOAT16, WeightFormat.FLOAT16,
    WeightFormat.INT8,
)


def parse(name: str, choices: Sequence[WeightFormat]) -> WeightFormat:
    """The format `name` names, one of `choices`, or ValueError naming them."""
    if name not in choices:
        raise ValueError(f"unknown weight format {name!r}; choose {', '.join(choices)}")
    return WeightFormat(name)


def parse_target(dtype: str | torch.dtype) -> WeightFormat | Literal["auto"]:
    """What `--dtype` (`load_model`'s dtype) names: `AUTO`, or a format of `TARGET` by its
    name, its alias (`TARGET_ALIASES`) or its torch dtype; ValueError naming the choices.

    >>> parse_target("bf16"), parse_target(torch.float32), parse_target("auto")
    (<WeightFormat.BFLOAT16: 'bfloat16'>, <WeightFormat.FLOAT32: 'float32'>, 'auto')
    """
    if dtype == AUTO:
        return AUTO
    named = next((fmt for fmt, torch_dtype in _DTYPES.items() if torch_dtype == dtype), None)
    if isinstance(dtype, torch.dtype) and named is not None:
        return named
    if isinstance(dtype, str) and (dtype in TARGET or dtype in TARGET_ALIASES):
        return TARGET_ALIASES.get(dtype) or WeightFormat(dtype)
    raise ValueError(f"unknown dtype {dtype!r}; choose {AUTO}, {', '.join(TARGET[:-1])} or {TARGET[-1]}")


def head_packing(fmt: WeightFormat) -> tuple[torch.dtype, WeightFormat]:
    """How a head drafts in `fmt` (one of `HEAD`): the dtype it computes in and its projections'
    route. int8 computes in bfloat16 (the int8 kernel's activations); its projections whose
    width the kernel cannot take stay bfloat16 (`projection`).

    >>> head_packing(WeightFormat.INT8)
    (torch.bfloat16, <WeightFormat.INT8: 'int8'>)
    """
    if fmt == WeightFormat.INT8:
        return torch.bfloat16, WeightFormat.INT8
    return WeightFormat(fmt).dtype, WeightFormat.FLOAT
