"""llama.cpp's features and slots (`LlamaCppLM` as a `FeatureChannel` and `SlotScoring`), on the
default model's GGUF file: the final norm's output (llama.cpp's embeddings output) is what its
output head multiplies, and agrees with the fast runtime's features, as do the layer outputs
the shipped EAGLE head reads; features follow the cache bit for bit and never change the
logits; greedy output with the shipped heads equals plain decoding on llama.cpp; requests run
as llama.cpp sequences of one cache, in one forward, each scored as on its own; `serve
--runtime llamacpp` answers."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from verispec.engine import generate
from verispec.models import DEFAULT_MODEL
from verispec.models.base import FINAL
from verispec.models.runtimes.llamacpp import INSTALL
from verispec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
TAPS = [FINAL, 2, 15, 27]  # Medusa's and the shipped EAGLE head's
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
    "Repeat this list exactly, twice: alpha, bravo, charlie, delta, echo, foxtrot, golf, hotel.",
]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason=f"needs llama-cpp-python: {INSTALL}"
)


@pytest.fixture(scope="module")
def loaded():
    from verispec.models.loading.load import load_model

    return load_model(DEFAULT_MODEL, runtime="llamacpp")


def chat_ids(loaded, text: str) -> list[int]:
    return loaded.encode(text, chat=True)


def new_lm(taps=()):
    from verispec.models.runtimes.llamacpp import LlamaCppLM
    from verispec.models.loading.sources import locate

    lm = LlamaCppLM(locate(DEFAULT_MODEL), n_ctx=1024, n_threads=torch.get_num_threads())
    if taps:
        lm.record_features(taps)
    return lm


def test_the_final_feature_is_what_the_output_head_multiplies_and_matches_the_fast_runtime(loaded):
    """llama.cpp's embeddings output times the output embedding gives its logits (up to its
    8-bit activations), and each tap agrees with the fast runtime's float32 features on the
    same tokens (cosine, measured >= 0.99 here)."""
    from verispec.models.loading.load import load_model

    ids = chat_ids(loaded, PROMPTS[0]) + chat_ids(loaded, PROMPTS[1])[5:]
    lm = new_lm(TAPS)
    lm.prefill(ids[:-6])
    logits = lm.extend(ids[-6:])  # [6, V]
    got = lm.features(TAPS, 0, len(ids))  # [T, 4 H]
    H = lm.hidden_size
    final = got[-6:, :H]
    product = final @ lm.output_embeddings().T  # [6, V]
    assert torch.equal(product.argmax(-1), logits.argmax(-1))
    assert (product - logits).abs().max() < 0.1 * logits.abs().max()
    fast = load_model(DEFAULT_MODEL, dtype="float32", runtime="fast").lm
    fast.record_features(TAPS)
    fast.prefill(ids)
    want = fast.features(TAPS, 0, len(ids))  # [T, 4 H]
    for i, tap in enumerate(TAPS):
        cosine = torch.nn.functional.cosine_similarity(got[:, i * H : (i + 1) * H], want[:, i * H : (i + 1) * H], dim=-1)
        assert cosine.min() > 0.99, (tap, cosine.min())


def test_features_follow_the_cache_bit_for_bit_and_never_change_the_logits():
    plain, lm = new_lm(), new_lm(TAPS)
    ids = torch.randint(0, lm.vocab_size, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    reference = lm.score_features(ids, TAPS)  # [40, 4 H]
    for model in (plain, lm):
        model.prefill(ids[:1])
    rows, position = [[], []], 1
    for n in [1, 3, 1, 2, 5, 1, 4, 9, 1]:
        for out, model in zip(rows, (plain, lm)):
            out.append(model.extend(ids[position : position + n + 2])[:n])  # two rows too many, forgotten
            model.rollback(position + n)
        position += n
    assert torch.equal(torch.cat(rows[0]), torch.cat(rows[1]))
    assert torch.equal(lm.features(TAPS, 0, position), reference[:position])
    assert torch.equal(lm.score(ids), plain.score(ids))
    with pytest.raises(ValueError, match="not recorded"):
        plain.score_features(ids, [FINAL])


@pytest.fixture(scope="module")
def plain(loaded):
    """Plain greedy decoding on llama.cpp of the first two prompts, 32 new tokens each."""
    return [generate(loaded.lm, None, chat_ids(loaded, text), max_new_tokens=32, k=0, sampling=GREEDY).tokens
            for text in PROMPTS[:2]]


@pytest.mark.parametrize("spec", ["eagle", "medusa", "lookup+eagle"])
def test_greedy_output_with_the_shipped_heads_equals_plain_decoding(loaded, plain, spec):
    from verispec.registry import build_proposer

    proposer = build_proposer(spec, loaded)
    accepted = 0
    for text, tokens in zip(PROMPTS, plain):
        run = generate(loaded.lm, proposer, chat_ids(loaded, text), max_new_tokens=32, k=4, sampling=GREEDY)
        assert run.tokens == tokens, text
        accepted += sum(run.stats.accepted)
    assert accepted > 0


def test_slots_are_sequences_of_one_cache_scored_in_one_forward():
    """Each slot's rows equal its own sequence decoded alone (bit for bit here: the default
    model's Q4_1 products take every row alone, and each row's attention skips the other
    sequences' cells), through rollbacks; a slot dropped gives its sequence back."""
    lm, alone = new_lm(TAPS), new_lm(TAPS)
    a, b, c = lm.new_slot(), lm.new_slot(), lm.new_slot()
    ids = [torch.randint(0, lm.vocab_size, (60,), generator=torch.Generator().manual_seed(s)).tolist() for s in range(3)]
    prompts = (20, 7, 33)
    for slot, seq, n in zip((a, b, c), ids, prompts):
        slot.record_features(TAPS)
        slot.prefill(seq[:n])
    positions = list(prompts)
    for step, counts in enumerate([(1, 3, 2), (4, 1, 1), (2, 2, 5), (1, 1, 1)]):
        rows = lm.extend_slots([a, b, c], [seq[p : p + n] for seq, p, n in zip(ids, positions, counts)])
        for slot, got, n in zip((a, b, c), rows, counts):
            assert got.shape == (n, lm.vocab_size)
        for i, (slot, n) in enumerate(zip((a, b, c), counts)):
            kept = max(1, n - 1 - step % 2)  # reject some rows, as verification does
            slot.rollback(positions[i] + kept)
            positions[i] += kept
    for slot, seq, p, n in zip((a, b, c), ids, prompts, positions):
        alone.prefill(seq[:p])
        alone.extend(seq[p:n])
        assert slot.length == alone.length == n
        assert torch.equal(slot.extend(seq[n : n + 2]), alone.extend(seq[n : n + 2]))
        assert torch.equal(slot.features(TAPS, p, n + 2), alone.features(TAPS, p, n + 2))
    held = len(lm._shared.members)
    del a, b, c, slot  # the loops' last slot too
    assert len(lm._shared.members) == held - 3


def test_lone_tokens_of_several_slots_share_one_forward_unpadded(monkeypatch):
    """On two threads a slot's lone token is padded to two rows when it is its forward's only
    row (the one-query attention would split the cache), and not beside another slot's rows,
    where the forward takes the many-row attention already: its row equals the padded one."""
    from verispec.models.runtimes.llamacpp import LlamaCppLM
    from verispec.models.loading.sources import locate

    lm = LlamaCppLM(locate(DEFAULT_MODEL), n_ctx=1024, n_threads=2)
    a, b = lm.new_slot(), lm.new_slot()
    a.prefill([5, 6, 7])
    b.prefill([8, 9])
    context, sizes = lm._shared.live(), []
    decode = context.decode
    monkeypatch.setattr(context, "decode", lambda parts: sizes.append([part.size for part in parts]) or decode(parts))
    together = lm.extend_slots([a, b], [[1], [2]])
    a.rollback(3)
    alone = a.extend([1])
    assert sizes == [[1, 1], [2]] and torch.equal(together[0], alone)


def test_a_context_remade_for_new_taps_decodes_what_its_sequences_hold_again():
    """A head's proposer made after the model decoded (a benchmark's plain run first): the
    context is remade with the layer outputs, and the cached tokens are decoded into it again
    as a prompt is; under 64 rows a prompt's forward computes every row as the history did."""
    late, early = new_lm(), new_lm([15])
    ids = torch.randint(0, late.vocab_size, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    for model in (late, early):
        model.prefill(ids[:12])
        model.extend(ids[12:20])
        model.rollback(17)
    late.record_features([15])
    assert torch.equal(late.extend(ids[17:25]), early.extend(ids[17:25]))
    assert torch.equal(late.features([15], 17, 25), early.features([15], 17, 25))
    with pytest.raises(ValueError, match="recorded from position 17"):
        late.features([15], 0, 25)


def test_serve_runs_requests_as_llama_cpp_sequences(loaded, plain):
    """The server on llama.cpp with the EAGLE head: requests in flight together are slots of
    one cache; one alone answers plain decoding's greedy tokens."""
    import sys
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from serving import running

    with running(loaded, proposer="eagle", k=3, max_slots=3) as server:
        body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 32, "temperature": 0, "return_token_ids": True}
        status, alone = server.request("POST", "/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 32, "temperature": 0,
            "return_token_ids": True})
        assert status == 200 and alone["choices"][0]["token_ids"] == plain[0]
        with ThreadPoolExecutor(max_workers=3) as pool:
            replies = list(pool.map(lambda _: server.request("POST", "/v1/completions", body), range(3)))
        assert [status for status, _ in replies] == [200] * 3
        assert all(reply["usage"]["completion_tokens"] == 32 for _, reply in replies)
        assert max(server.app.engine.scheduler.step_rows) > 4  # several requests' rows in one forward
