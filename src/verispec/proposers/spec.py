"""Proposers named on the command line: `parse_proposer("layerskip:4:8192", target)`.

Specs:
- `lookup`: prompt lookup (`PromptLookup`);
- `suffix`: the suffix index (`SuffixIndex`) over the request and `corpus`;
- `draft:PATH`: a smaller model loaded by `load_model(PATH)` (a `.gguf` file, a checkpoint
  directory or an embedded name); refused unless its tokenizer is the target's;
- `layerskip:L[:N]`: the target's first L layers, with a head pruned to N tokens when N is
  given (`LayerSkip`; the N tokens: those of `corpus` by count, then the smallest ids);
- `random`: uniform random drafts (`RandomTokens`), the baseline an adaptive k must turn off;
- `eagle[:DIR]`, `medusa[:DIR]`: a trained head (`EagleProposer`, `MedusaProposer`) loaded from
  DIR (a `verispec train --out` directory), or without DIR the head shipped for the default
  model; refused when trained for a target of another shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from verispec.models.load import LoadedModel, load_model
from verispec.proposers.base import Proposer
from verispec.proposers.draft_model import DraftModel
from verispec.proposers.layer_skip import LayerSkip
from verispec.proposers.prompt_lookup import PromptLookup
from verispec.proposers.random_tokens import RandomTokens
from verispec.proposers.suffix_index import SuffixIndex
from verispec.proposers.trained import HEAD_KINDS, head_proposer

SPECS = "lookup, suffix, draft:PATH, layerskip:L[:N], eagle[:DIR], medusa[:DIR] or random"


def parse_proposer(spec: str, target: LoadedModel, corpus: Iterable[Sequence[int]] = ()) -> Proposer:
    """The proposer `spec` names, for the loaded `target`.

    corpus: token-id sequences (e.g. encoded prompts) that `suffix` indexes and from which
    `layerskip:L:N` picks its N most frequent tokens.
    """
    kind, _, argument = spec.strip().partition(":")
    if kind in ("lookup", "suffix", "random"):
        if argument:
            raise ValueError(f"{kind} takes no argument, got {spec!r}; write just {kind!r}")
        if kind == "lookup":
            return PromptLookup()
        if kind == "suffix":
            return SuffixIndex(corpus)
        return RandomTokens(target.lm.vocab_size)
    if kind == "draft":
        if not argument:
            raise ValueError("draft:PATH needs the draft model's path (a .gguf file or a model directory)")
        return _draft_model(argument, target)
    if kind == "layerskip":
        return _layer_skip(argument, target, corpus)
    if kind in HEAD_KINDS:
        return head_proposer(kind, argument or None, target.lm, target.dtype)
    raise ValueError(f"unknown proposer {spec!r}; choose {SPECS}")


def _draft_model(path: str, target: LoadedModel) -> DraftModel:
    draft = load_model(path, dtype=target.dtype)
    return DraftModel(draft.lm, tokenizers=(target.tokenizer, draft.tokenizer))


def _layer_skip(argument: str, target: LoadedModel, corpus: Iterable[Sequence[int]]) -> LayerSkip:
    total = target.model.config.num_hidden_layers
    vocab_size = target.lm.vocab_size
    parts = argument.split(":")
    if not argument or len(parts) > 2:
        raise ValueError(f"layerskip needs layerskip:L or layerskip:L:N, got 'layerskip:{argument}'")
    layers = _integer(parts[0], "layerskip:L needs an integer number of layers L")
    if not 1 <= layers < total:
        raise ValueError(f"layerskip:L needs 1 <= L < {total} (the target has {total} layers), got {layers}")
    head_tokens = None
    if len(parts) == 2:
        head_tokens = _integer(parts[1], "layerskip:L:N needs an integer number of head tokens N")
        if not 1 <= head_tokens <= vocab_size:
            raise ValueError(
                f"layerskip:L:N needs 1 <= N <= {vocab_size} (the vocabulary size), got {head_tokens}"
            )
    return LayerSkip(target.lm, layers, head_tokens, corpus)


def _integer(text: str, message: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{message}, got {text!r}") from None
