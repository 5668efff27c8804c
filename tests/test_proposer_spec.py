"""parse_proposer: every command-line spec builds its proposer, malformed specs say what to
write instead, and a draft model with another tokenizer is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from verispec.models.hf import HFCausalLM
from verispec.models.load import LoadedModel, load_tokenizer
from verispec.proposers import DraftModel, PromptLookup, RandomTokens, SuffixIndex
from verispec.proposers.layer_skip import LayerSkip
from verispec.proposers.spec import parse_proposer

VOCAB = 64


def tiny_llama(vocab: int, layers: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
    )
    return LlamaForCausalLM(config)


def loaded(model: LlamaForCausalLM, tokenizer=None) -> LoadedModel:
    return LoadedModel(
        name="tiny", lm=HFCausalLM(model), model=model, tokenizer=tokenizer, eos_token_ids=(),
        dtype=torch.float32, source=Path("tiny"),
    )


@pytest.fixture(scope="module")
def target() -> LoadedModel:
    return loaded(tiny_llama(VOCAB, 3))


def test_each_spec_builds_its_proposer(target):
    assert isinstance(parse_proposer("lookup", target), PromptLookup)
    assert isinstance(parse_proposer(" random ", target), RandomTokens)
    assert parse_proposer("random", target).vocab_size == VOCAB
    suffix = parse_proposer("suffix", target, corpus=[[1, 2, 3]])
    assert isinstance(suffix, SuffixIndex) and suffix.corpus == [(1, 2, 3)]
    skip = parse_proposer("layerskip:2", target)
    assert isinstance(skip, LayerSkip) and skip.layers == 2 and skip.head_tokens is None
    pruned = parse_proposer("layerskip:1:5", target, corpus=[[9, 9, 7]])
    assert pruned.layers == 1 and pruned.head_tokens.tolist() == [0, 1, 2, 7, 9]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "unknown proposer ''; choose lookup, suffix, draft:PATH, layerskip:L"),
        ("hydra", "unknown proposer 'hydra'"),
        ("lookup:3", "lookup takes no argument"),
        ("random:7", "random takes no argument"),
        ("draft", "draft:PATH needs the draft model's path"),
        ("draft:", "draft:PATH needs the draft model's path"),
        ("layerskip", r"layerskip needs layerskip:L or layerskip:L:N"),
        ("layerskip:1:2:3", r"layerskip needs layerskip:L or layerskip:L:N, got 'layerskip:1:2:3'"),
        ("layerskip:two", "layerskip:L needs an integer number of layers L, got 'two'"),
        ("layerskip:0", r"layerskip:L needs 1 <= L < 3 \(the target has 3 layers\), got 0"),
        ("layerskip:3", r"1 <= L < 3 \(the target has 3 layers\), got 3"),
        ("layerskip:1:", "layerskip:L:N needs an integer number of head tokens N, got ''"),
        ("layerskip:1:0", r"layerskip:L:N needs 1 <= N <= 64 \(the vocabulary size\), got 0"),
        ("layerskip:1:65", r"1 <= N <= 64"),
    ],
)
def test_malformed_specs_are_refused(target, spec, message):
    with pytest.raises(ValueError, match=message):
        parse_proposer(spec, target)


def test_a_missing_draft_model_is_a_missing_file(target, tmp_path):
    with pytest.raises(FileNotFoundError, match="verispec never downloads models"):
        parse_proposer(f"draft:{tmp_path / 'absent'}", target)


@pytest.mark.slow
def test_a_draft_must_share_the_targets_tokenizer(tmp_path):
    """A tiny random model saved with the default model's tokenizer is accepted as a draft;
    the same model with one token added to its tokenizer is refused."""
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    vocab = len(tokenizer)
    target = loaded(tiny_llama(vocab, 2), tokenizer)
    same = tmp_path / "same"
    tiny_llama(vocab, 1).save_pretrained(same)
    tokenizer.save_pretrained(same)
    draft = parse_proposer(f"draft:{same}", target)
    assert isinstance(draft, DraftModel) and draft.vocab_size == vocab
    other = tmp_path / "other"
    tiny_llama(vocab, 1).save_pretrained(other)
    changed = load_tokenizer("smollm2-135m-instruct")
    changed.add_tokens(["<verispec-extra>"])
    changed.save_pretrained(other)
    with pytest.raises(ValueError, match="tokenizers do not match"):
        parse_proposer(f"draft:{other}", target)
