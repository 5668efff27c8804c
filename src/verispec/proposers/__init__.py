"""Proposers: where drafted tokens come from."""

from verispec.proposers.base import Proposer
from verispec.proposers.draft_model import DraftModel
from verispec.proposers.prompt_lookup import PromptLookup
from verispec.proposers.random_tokens import RandomTokens
from verispec.proposers.suffix_index import SuffixIndex

__all__ = ["DraftModel", "PromptLookup", "Proposer", "RandomTokens", "SuffixIndex"]
