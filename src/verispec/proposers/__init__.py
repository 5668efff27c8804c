"""Proposers: where drafted tokens come from."""

from verispec.proposers.base import EMPTY_DRAFT, Draft, Proposer
from verispec.proposers.draft_model import DraftModel
from verispec.proposers.prompt_lookup import PromptLookup
from verispec.proposers.random_tokens import RandomTokens
from verispec.proposers.suffix_index import SuffixIndex

__all__ = ["EMPTY_DRAFT", "Draft", "DraftModel", "PromptLookup", "Proposer", "RandomTokens", "SuffixIndex"]
