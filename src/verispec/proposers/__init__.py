"""Proposers: where drafted tokens come from."""

from verispec.proposers.base import EMPTY_DRAFT, Draft, Proposer
from verispec.proposers.draft_model import DraftModel
from verispec.proposers.prompt_lookup import PromptLookup

__all__ = ["EMPTY_DRAFT", "Draft", "DraftModel", "PromptLookup", "Proposer"]
