"""The eval callback that copies llama.cpp's layer taps, in C (`llamacpp_taps.c`).

llama.cpp asks a context's eval callback about every node of a forward's graph before it
computes it; `LlamaCppLM` needs the few nodes `l_out-i` that a head reads. Asked in Python, the
936 questions of a forward of the default model cost about 0.9 ms a token, every request on
the target paying it once a head's proposer was made there. The C callback compares names in C
and copies a wanted node, once it is computed, into a buffer the context gave it, without a
call into Python.

`make llamacpp` compiles it beside its source with the system's C compiler (`build`, `CC` or
`cc`), named by the source's hash, so a library built from another version of the source is
never loaded. Where it is missing, `LlamaCppLM` answers in Python, the same features, slower.

    python -m verispec.models.runtimes.llamacpp_taps     # build it; prints its path
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("llamacpp_taps.c")
MAX_TAPS = 64  # VERISPEC_MAX_TAPS
NAME_BYTES = 64  # VERISPEC_NAME_BYTES, ggml's GGML_MAX_NAME


class Taps(ctypes.Structure):
    """`struct verispec_taps`: what the callback compares, the ggml functions it calls and
    where it copies each wanted node."""

    _fields_ = [
        ("name", ctypes.c_void_p),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_void_p),
        ("count", ctypes.c_int),
        ("names", (ctypes.c_char * NAME_BYTES) * MAX_TAPS),
        ("dest", ctypes.c_void_p * MAX_TAPS),
        ("capacity", ctypes.c_size_t * MAX_TAPS),
        ("copied", ctypes.c_size_t * MAX_TAPS),
        ("overflow", ctypes.c_int),
    ]


def library_path() -> Path:
    """Where the library built from this source lives: beside it, named by the source's hash."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return SOURCE.with_name(f"_llamacpp_taps-{digest}.so")


def build(compiler: str | None = None, target: Path | None = None) -> Path:
    """Compile the callback with `compiler` (default: $CC, else cc) into `target` (default:
    `library_path()`, where `library` loads it from); the library's path. Raise RuntimeError
    with the compiler's last line where it fails."""
    compiler = compiler or os.environ.get("CC") or "cc"
    target = target or library_path()
    try:
        done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", str(SOURCE), "-o", str(target)],
                              capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError(f"no C compiler {compiler!r}: set CC to one") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"{compiler} could not compile {SOURCE.name}: {last}")
    library.cache_clear()
    return target


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built callback for this source, or None where it was not built (or the source is
    not installed)."""
    if not SOURCE.is_file():
        return None
    path = library_path()
    return ctypes.CDLL(str(path)) if path.is_file() else None


class NativeCallback:
    """The C callback for one context: `pointer` and `user_data` go in llama.cpp's context
    parameters (`cb_eval`, `cb_eval_user_data`). `ggml` gives the callback ggml_get_name,
    ggml_get_data and ggml_nbytes; wanted node `names[i]` is copied into `buffers[i]` (float32
    [rows, H], each at least as large as the node in a forward). Keep the object alive as long
    as the context: llama.cpp and the callback hold pointers into it."""

    def __init__(self, lib: ctypes.CDLL, ggml, names: Sequence[bytes], buffers: Sequence[np.ndarray],
                 callback_type: type) -> None:
        if len(names) > MAX_TAPS or any(len(name) >= NAME_BYTES for name in names):
            raise ValueError(f"at most {MAX_TAPS} taps of names under {NAME_BYTES} bytes")
        if len(buffers) != len(names) or any(b.dtype != np.float32 or not b.flags.c_contiguous for b in buffers):
            raise ValueError("one contiguous float32 buffer for each wanted name")
        self.buffers = list(buffers)
        self.taps = Taps(*(ctypes.cast(f, ctypes.c_void_p) for f in (ggml.ggml_get_name, ggml.ggml_get_data, ggml.ggml_nbytes)),
                         len(names))
        for i, (name, buffer) in enumerate(zip(names, self.buffers)):
            self.taps.names[i].value = name
            self.taps.dest[i], self.taps.capacity[i] = buffer.ctypes.data, buffer.nbytes
        self.wanted = len(names)
        self.pointer = ctypes.cast(lib.verispec_observe, callback_type)
        self.user_data = ctypes.cast(ctypes.pointer(self.taps), ctypes.c_void_p)

    def listen(self, on: bool) -> None:
        """Answer yes for the wanted nodes (on), or for none: the callback then compares nothing
        and llama.cpp computes the forward's graph whole."""
        self.taps.count = self.wanted if on else 0

    def start(self) -> None:
        """Before a forward: nothing copied yet."""
        ctypes.memset(ctypes.addressof(self.taps.copied), 0, ctypes.sizeof(self.taps.copied))
        self.taps.overflow = 0

    def copied(self) -> list[np.ndarray]:
        """After a forward: per wanted name, its rows [n, H] as copied (views of the buffers,
        which the next forward overwrites). RuntimeError where a node outgrew its buffer:
        llama.cpp then stopped computing the forward."""
        if self.taps.overflow:
            raise RuntimeError("a layer tap outgrew its buffer; the forward was not computed")
        return [buffer.reshape(-1)[: self.taps.copied[i] // buffer.itemsize].reshape(-1, buffer.shape[-1])
                for i, buffer in enumerate(self.buffers)]


if __name__ == "__main__":
    try:
        print(build())
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
