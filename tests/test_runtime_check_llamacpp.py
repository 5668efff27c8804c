"""check-runtime's `llamacpp` engine: llama-cpp-python's prompt lookup (`Llama.generate` with a
draft model) against its plain sampling, on an F32 copy of the default model's GGUF file. What
it refuses and why, without llama-cpp-python; with it, a small check that passes and one that
must fail (the engine's own path with the logit bias dropped under speculation).

False failure: the passing check below runs 3 G-tests at alpha = 1e-3 (at most 3e-3 for a
fresh seed list, union bound); the seeds are fixed, so the outcome is deterministic.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from verispec.peers.llamacpp import GREEDY
from verispec.models.runtimes import llamacpp as runtime
from verispec.models.loading.load import LoadedModel
from verispec.runtime_check import Reference, Settings, check_runtime
from verispec.runtime_check.cases import SamplingCase, neutral
from verispec.runtime_check.engines import Unavailable, open_engine
from verispec.runtime_check.report import FAIL, PASS, REFUSED

NEEDS_LLAMACPP = pytest.mark.skipif(not runtime.installed(), reason=f"needs llama-cpp-python: {runtime.INSTALL}")
PROMPT = "Coffee or tea? I prefer coffee. Tea or coffee? I prefer"


def stub(source: Path) -> LoadedModel:
    return LoadedModel("stub", None, None, None, (0,), torch.float32, source)


def test_without_llama_cpp_python_the_engine_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime, "installed", lambda: False)
    with pytest.raises(Unavailable, match=f"is not installed; install it with `{runtime.INSTALL}`"):
        open_engine("llamacpp", stub(tmp_path / "model.gguf"), "float32")


def test_llamacpp_decodes_a_gguf_file_in_float32(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime, "installed", lambda: True)
    with pytest.raises(Unavailable, match="was not loaded from a .gguf file"):
        open_engine("llamacpp", stub(tmp_path), "float32")
    with pytest.raises(ValueError, match="give --dtype float32, not bfloat16"):
        open_engine("llamacpp", stub(tmp_path / "model.gguf"), "bfloat16")


@pytest.fixture(scope="module")
def engine(default_float32):
    if not runtime.installed():
        pytest.skip(f"needs llama-cpp-python: {runtime.INSTALL}")
    return open_engine("llamacpp", default_float32, "float32")


@NEEDS_LLAMACPP
def test_llama_cpp_python_is_checked_with_prompt_lookup(engine, default_float32):
    loaded = default_float32
    prompt = loaded.encode(PROMPT, chat=False)
    reference = Reference(loaded.lm.score, encode=None, eos_ids=loaded.eos_token_ids)
    cases = [SamplingCase("default"), SamplingCase("repetition_penalty", repetition_penalty=1.5)]
    settings = Settings(n=80, prompts=1, length=2, sample_prompts=[prompt], cases=cases,
                        greedy_prompts=[prompt], greedy_tokens=8, concurrency=(2,))
    report = check_runtime(engine, reference, ["lookup"], settings)
    rows = {(row.parameter, row.test): row for row in report.law_rows}
    tests = ("plain vs exact", "spec vs plain", "spec vs exact")
    assert all(rows[("default", test)].status == PASS for test in tests), report.markdown()
    assert rows[("repetition_penalty", "plain vs exact")].status == REFUSED
    assert "never fed the prompt" in rows[("repetition_penalty", "plain vs exact")].reason
    greedy = {(row.method, row.concurrency): row.status for row in report.greedy_rows}
    assert greedy == {("lookup", 1): PASS, ("plain", 2): PASS, ("lookup", 2): REFUSED}, report.markdown()


class DropsBiasWhenSpeculating:
    """The engine with the logit bias dropped under speculation (a parameter lost on verified
    tokens, as vLLM #18902 loses the frequency penalty)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.name, self.methods, self.dtype = engine.name, engine.methods, engine.dtype

    def versions(self):
        return self.engine.versions()

    def sample(self, prompt, case, n, length, method, seed):
        return self.engine.sample(prompt, case if method is None else replace(neutral(case), name=case.name),
                                  n, length, method, seed)


@NEEDS_LLAMACPP
def test_a_bias_dropped_under_speculation_is_caught(engine, default_float32):
    loaded = default_float32
    prompt = loaded.encode(PROMPT, chat=False)
    second = int(loaded.lm.score(prompt)[-1].topk(2).indices[1])
    case = SamplingCase("logit_bias", logit_bias=((second, 3.0),))
    assert {s[0] for s in engine.sample(prompt, replace(case, logit_bias=((second, 40.0),)), 4, 2, "lookup", 0)} == {second}
    reference = Reference(loaded.lm.score, encode=None, eos_ids=loaded.eos_token_ids)
    settings = Settings(n=30, prompts=1, length=2, sample_prompts=[prompt], cases=[case])
    report = check_runtime(DropsBiasWhenSpeculating(engine), reference, ["lookup"], settings)
    status = {row.test: row.status for row in report.law_rows}
    assert status == {"plain vs exact": PASS, "spec vs plain": FAIL, "spec vs exact": FAIL}, report.markdown()


@NEEDS_LLAMACPP
def test_the_refused_repeat_penalty_never_counts_the_prompt(engine, default_float32):
    """Why `repetition_penalty` is refused: llama-cpp-python's repeat_penalty of 100 leaves the
    greedy choice at a token the prompt holds, which a penalty over prompt and output (CTRL,
    HF, vLLM) would divide by 100. If this fails, llama-cpp-python now counts the prompt and the
    refusal should go."""
    prompt = default_float32.encode(PROMPT, chat=False)
    llama = engine._llama(None, len(prompt) + 2)
    (top,) = engine._generate(llama, prompt, 1, GREEDY)
    assert top in prompt
    assert engine._generate(llama, prompt, 1, GREEDY | {"repeat_penalty": 100.0}) == [top]
