"""Causal language models behind the `CausalLM` protocol."""

from verispec.models.base import CausalLM
from verispec.models.tables import TableLM, bigram, random_table, seed_pair

DEFAULT_MODEL = "smollm2-135m-instruct"

__all__ = ["DEFAULT_MODEL", "CausalLM", "HFCausalLM", "LoadedModel", "TableLM", "bigram", "load_model", "random_table", "seed_pair"]

# Loaded on first use: they import transformers, which takes seconds.
_LAZY = {"HFCausalLM": "verispec.models.runtimes.hf", "LoadedModel": "verispec.models.loading.load", "load_model": "verispec.models.loading.load"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'verispec.models' has no attribute {name!r}")
