"""Causal language models behind the `CausalLM` protocol."""

from verispec.models.base import CausalLM
from verispec.models.tables import TableLM, bigram, random_table, seed_pair

__all__ = ["CausalLM", "TableLM", "bigram", "random_table", "seed_pair"]
