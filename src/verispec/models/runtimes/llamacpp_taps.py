"""The eval callback that copies llama.cpp's layer taps, in C (`llamacpp_taps.c`).

llama.cpp asks a context's eval callback about every node of a forward's graph before it
computes it; `LlamaCppLM` needs the few nodes `l_out-i` that a head reads. Asked in Python, the
936 questions of a forward of the default model cost about 0.9 ms a token, every request on
the target paying it once a head's proposer was made there. The C callback compares names in C
and calls Python only to copy a wanted node once it is computed.

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
from collections.abc import Callable, Sequence
from pathlib import Path

SOURCE = Path(__file__).with_name("llamacpp_taps.c")
MAX_TAPS = 64  # VERISPEC_MAX_TAPS
NAME_BYTES = 64  # VERISPEC_NAME_BYTES, ggml's GGML_MAX_NAME

COPY = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p)  # bool (*)(struct ggml_tensor *)


class Taps(ctypes.Structure):
    """`struct verispec_taps`: what the callback compares and whom it calls."""

    _fields_ = [
        ("name", ctypes.c_void_p),
        ("copy", ctypes.c_void_p),
        ("count", ctypes.c_int),
        ("names", (ctypes.c_char * NAME_BYTES) * MAX_TAPS),
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
    parameters (`cb_eval`, `cb_eval_user_data`); `copy(tensor) -> bool` is called for each
    wanted node once computed. Keep the object alive as long as the context."""

    def __init__(self, lib: ctypes.CDLL, get_name: Callable, names: Sequence[bytes], copy: Callable[[int], bool],
                 callback_type: type) -> None:
        if len(names) > MAX_TAPS or any(len(name) >= NAME_BYTES for name in names):
            raise ValueError(f"at most {MAX_TAPS} taps of names under {NAME_BYTES} bytes")
        self.copy = COPY(copy)
        self.taps = Taps(ctypes.cast(get_name, ctypes.c_void_p), ctypes.cast(self.copy, ctypes.c_void_p), len(names))
        for i, name in enumerate(names):
            self.taps.names[i].value = name
        self.pointer = ctypes.cast(lib.verispec_observe, callback_type)
        self.user_data = ctypes.cast(ctypes.pointer(self.taps), ctypes.c_void_p)
        self.wanted = len(names)

    def listen(self, on: bool) -> None:
        """Answer yes for the wanted nodes (on), or for none: the callback then compares nothing
        and llama.cpp computes the forward's graph whole."""
        self.taps.count = self.wanted if on else 0


if __name__ == "__main__":
    try:
        print(build())
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
