"""The eval callback in C that copies llama.cpp's layer taps (`llamacpp_taps`): its logic on
made-up nodes wherever a C compiler is (no llama.cpp needed), and on llama.cpp the same
features bit for bit as the Python callback it replaces."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest
import torch

from verispec.models.runtimes import llamacpp as runtime
from verispec.models.runtimes import llamacpp_taps

COMPILER = shutil.which("cc") or shutil.which("gcc")
needs_compiler = pytest.mark.skipif(COMPILER is None, reason="no C compiler (cc) to build the callback")
POINTER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)  # ggml_get_name's and ggml_get_data's shape
SIZE = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p)  # ggml_nbytes's


class FakeGgml:
    """ggml_get_name, ggml_get_data and ggml_nbytes over made-up nodes: node -> (name, float32 rows)."""

    def __init__(self, nodes: dict[int, tuple[bytes, np.ndarray]]) -> None:
        self.names = {node: ctypes.create_string_buffer(name) for node, (name, _) in nodes.items()}
        self.data = {node: rows for node, (_, rows) in nodes.items()}
        self.ggml_get_name = POINTER(lambda tensor: ctypes.addressof(self.names[tensor]))
        self.ggml_get_data = POINTER(lambda tensor: self.data[tensor].ctypes.data)
        self.ggml_nbytes = SIZE(lambda tensor: self.data[tensor].nbytes)


@needs_compiler
def test_the_callback_wants_the_named_nodes_only_and_copies_each_once_computed(tmp_path):
    lib = ctypes.CDLL(str(llamacpp_taps.build(COMPILER, tmp_path / "taps.so")))
    lib.verispec_observe.restype = ctypes.c_bool
    lib.verispec_observe.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p]
    rows = {node: np.arange(3 * n, dtype=np.float32).reshape(n, 3) + node for node, n in {1: 2, 2: 1, 3: 6, 4: 1, 5: 3}.items()}
    ggml = FakeGgml({1: (b"l_out-1", rows[1]), 2: (b"attn_norm-3", rows[2]), 3: (b"l_out-14", rows[3]),
                     4: (b"l_out-140", rows[4]), 5: (b"l_out-1", rows[5])})
    buffers = [np.zeros((8, 3), dtype=np.float32), np.zeros((6, 3), dtype=np.float32)]
    callback = llamacpp_taps.NativeCallback(lib, ggml, [b"l_out-1", b"l_out-14"], buffers, ctypes.c_void_p)
    callback.start()
    asked = [lib.verispec_observe(node, True, callback.user_data) for node in ggml.names]
    assert asked == [True, False, True, False, True]
    assert all(len(copied) == 0 for copied in callback.copied())
    # node 1 and node 5 are l_out-1 in two ubatches of one forward: the second after the first
    assert all(lib.verispec_observe(node, False, callback.user_data) for node in (1, 3, 5))
    first, second = callback.copied()
    assert np.array_equal(first, np.concatenate([rows[1], rows[5]])) and np.array_equal(second, rows[3])
    callback.start()  # the next forward: copied from the start again
    assert all(len(copied) == 0 for copied in callback.copied())
    assert lib.verispec_observe(3, False, callback.user_data)  # fills the second buffer exactly
    assert not lib.verispec_observe(3, False, callback.user_data)  # one more would overflow: the forward stops
    with pytest.raises(RuntimeError, match="outgrew its buffer"):
        callback.copied()
    callback.listen(False)
    assert not lib.verispec_observe(1, True, callback.user_data)


def test_too_many_or_too_long_names_or_unfit_buffers_are_refused():
    with pytest.raises(ValueError, match="at most 64 taps"):
        llamacpp_taps.NativeCallback(None, None, [b"x" * 64], [np.zeros((1, 1), dtype=np.float32)], ctypes.c_void_p)
    with pytest.raises(ValueError, match="one contiguous float32 buffer"):
        llamacpp_taps.NativeCallback(None, None, [b"l_out-1"], [np.zeros((1, 1))], ctypes.c_void_p)


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
