"""What `verispec bench` was asked for, read by the suite and by its concurrency sweep."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from verispec.models.loading.load import DEFAULT_MODEL
from verispec.sampling import GREEDY, SamplingParams


@dataclass
class Settings:
    """What `verispec bench` was asked for (see `cli/bench.py` for each option)."""

    out: Path
    prompts: Sequence[Path] = ()
    categories: Sequence[str] = ()
    limit_per_category: int | None = None
    methods: str | None = None
    max_new_tokens: int = 128
    repeats: int = 3
    warmup: int = 1
    model: str = DEFAULT_MODEL
    dtype: str = "auto"
    runtime: str = "auto"
    deterministic: bool | None = None
    cache_type_v: str | None = None  # the llama.cpp runtime's value cache
    device: str = "auto"
    threads: int | None = None
    quick: bool = False
    command: str = ""
    sampling: SamplingParams = GREEDY
    seed: int = 0
    concurrency: tuple[int, ...] = (1,)
