"""The eval callback in C that copies llama.cpp's layer taps (`llamacpp_taps`): its logic on
made-up nodes wherever a C compiler is (no llama.cpp needed), and on llama.cpp the same
features bit for bit as the Python callback it replaces."""

from __future__ import annotations

import ctypes
import shutil

import pytest
import torch

from verispec.models.runtimes import llamacpp as runtime
from verispec.models.runtimes import llamacpp_taps

COMPILER = shutil.which("cc") or shutil.which("gcc")
needs_compiler = pytest.mark.skipif(COMPILER is None, reason="no C compiler (cc) to build the callback")
NAME = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)  # const char * (*)(const struct ggml_tensor *)


@needs_compiler
def test_the_callback_wants_the_named_nodes_only_and_copies_each_once_computed(tmp_path):
    lib = ctypes.CDLL(str(llamacpp_taps.build(COMPILER, tmp_path / "taps.so")))
    lib.verispec_observe.restype = ctypes.c_bool
    lib.verispec_observe.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p]
    names = {node: ctypes.create_string_buffer(name) for node, name in
             {1: b"l_out-1", 2: b"attn_norm-3", 3: b"l_out-14", 4: b"l_out-140"}.items()}
    get_name = NAME(lambda tensor: ctypes.addressof(names[tensor]))
    copied = []
    callback = llamacpp_taps.NativeCallback(lib, get_name, [b"l_out-1", b"l_out-14"],
                                            lambda tensor: copied.append(tensor) or True, ctypes.c_void_p)
    asked = [lib.verispec_observe(node, True, callback.user_data) for node in names]
    assert asked == [True, False, True, False] and copied == []
    assert lib.verispec_observe(3, False, callback.user_data) and copied == [3]


def test_too_many_or_too_long_names_are_refused():
    with pytest.raises(ValueError, match="at most 64 taps"):
        llamacpp_taps.NativeCallback(None, None, [b"x" * 64], lambda tensor: True, ctypes.c_void_p)


@needs_compiler
def test_a_failed_compile_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(llamacpp_taps, "SOURCE", tmp_path / "broken.c")
    (tmp_path / "broken.c").write_text("this is not C\n")
    with pytest.raises(RuntimeError, match="could not compile broken.c") as refused:
        llamacpp_taps.build(COMPILER, tmp_path / "broken.so")
    assert "\n" not in str(refused.value)
    with pytest.raises(RuntimeError, match="no C compiler 'no-such-cc'"):
        llamacpp_taps.build("no-such-cc", tmp_path / "x.so")


@pytest.mark.skipif(not runtime.installed(), reason=f"llama-cpp-python is not installed: `{runtime.INSTALL}`")
@needs_compiler
def test_on_llamacpp_the_c_callback_gives_the_python_callbacks_features_bit_for_bit(monkeypatch):
    from verispec.models import DEFAULT_MODEL
    from verispec.models.loading import sources

    if llamacpp_taps.library() is None:
        llamacpp_taps.build()
    path = sources.locate(DEFAULT_MODEL)
    prompt, taps = list(range(1000, 1040)), [2, 15, 30]

    def decode(native: bool) -> tuple[torch.Tensor, torch.Tensor]:
        with monkeypatch.context() as patch:
            if not native:
                patch.setattr(llamacpp_taps, "library", lambda: None)
            lm = runtime.LlamaCppLM(path, n_ctx=512, n_threads=2)
            lm.record_features(taps)
            lm.prefill(prompt)
            made = lm._shared.live().callback
        assert isinstance(made, llamacpp_taps.NativeCallback) == native
        rows = torch.cat([lm.extend([5, 6, 7]), lm.extend([8])])
        return rows, lm.features(taps, 0, lm.length)

    python_rows, python_features = decode(native=False)
    c_rows, c_features = decode(native=True)
    assert c_features.shape == (44, 3 * 576)
    assert torch.equal(c_features, python_features) and torch.equal(c_rows, python_rows)


def test_without_the_source_or_the_library_the_python_callback_is_used(tmp_path, monkeypatch):
    monkeypatch.setattr(llamacpp_taps, "SOURCE", tmp_path / "llamacpp_taps.c")
    llamacpp_taps.library.cache_clear()
    try:
        assert llamacpp_taps.library() is None
        (tmp_path / "llamacpp_taps.c").write_text("/* not built */\n")
        llamacpp_taps.library.cache_clear()
        assert llamacpp_taps.library() is None
    finally:
        monkeypatch.undo()
        llamacpp_taps.library.cache_clear()


@pytest.mark.skipif(not runtime.installed(), reason=f"llama-cpp-python is not installed: `{runtime.INSTALL}`")
@pytest.mark.parametrize("native", [True, False], ids=["C", "Python"])
def test_a_forward_of_slots_without_a_head_copies_no_taps_and_the_head_slot_keeps_its_features(native, monkeypatch):
    """The callback answers no to every node in a forward where no slot records the layer taps
    (`_Context._tap`): nothing is copied, and both slots' logits and the head slot's features
    are those of each decoded alone."""
    from verispec.models import DEFAULT_MODEL
    from verispec.models.loading import sources

    if native and COMPILER is None:
        pytest.skip("no C compiler (cc) to build the callback")
    if native and llamacpp_taps.library() is None:
        llamacpp_taps.build()
    if not native:
        monkeypatch.setattr(llamacpp_taps, "library", lambda: None)
    path, taps = sources.locate(DEFAULT_MODEL), [2, 15, 30]
    head_ids, plain_ids = list(range(1000, 1030)), list(range(2000, 2025))
    lm = runtime.LlamaCppLM(path, n_ctx=512, n_threads=2)
    plain = lm.new_slot()
    lm.record_features(taps)
    lm.prefill(head_ids[:20])
    plain.prefill(plain_ids[:20])
    context = lm._shared.live()
    assert isinstance(context.callback, llamacpp_taps.NativeCallback) == native
    plain_rows = torch.cat([plain.extend(plain_ids[20:23]), plain.extend(plain_ids[23:24])])
    assert not context.tapping and not any(context.captured.values())
    if native:
        assert context.callback.taps.count == 0
    head_rows = lm.extend(head_ids[20:30])
    assert context.tapping and all(context.captured.values())

    alone_plain = runtime.LlamaCppLM(path, n_ctx=512, n_threads=2)
    alone_plain.prefill(plain_ids[:20])
    assert torch.equal(plain_rows, torch.cat([alone_plain.extend(plain_ids[20:23]), alone_plain.extend(plain_ids[23:24])]))
    alone_head = runtime.LlamaCppLM(path, n_ctx=512, n_threads=2)
    alone_head.record_features(taps)
    alone_head.prefill(head_ids[:20])
    assert torch.equal(head_rows, alone_head.extend(head_ids[20:30]))
    assert torch.equal(lm.features(taps, 0, 30), alone_head.features(taps, 0, 30))
