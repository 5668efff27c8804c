"""`load_model`: a real causal LM, its tokenizer and its `CausalLM` adapter, from local files.

Loading is three steps, each in its own module: where the files are (`models.loading.sources`: the
accepted names, the GGUF file's cached float32 conversion, the tokenizer's files), what will be
built and why (`models.loading.load_plan`: runtime, weight format, exactness, from the config alone),
and the build itself, here, from a `LoadPlan`.

Nothing is ever fetched from a hub: every transformers read passes `local_files_only=True`
(`sources.from_directory`, `sources.from_gguf`). Importing this module changes no environment
variable; the command line sets `HF_HUB_OFFLINE=1` (`verispec.cli.main`), and a program that
wants the hub libraries offline as a whole sets it itself before importing them.

A GGUF file is read once by transformers' GGUF reader (which dequantises every weight) and
saved as a float32 checkpoint beside its tokenizer (`sources.converted_dir`); later loads read
that copy. Both paths give the same float32 weights, cast afterwards to the requested dtype.

Runtimes: Llama-architecture models run on the fast runtime (`LlamaRuntime`, built from the
transformers model's weights) unless `runtime="hf"`; other architectures run on `HFCausalLM`.
The transformers model is loaded either way. The HF runtime keeps it (`LoadedModel.model`);
the fast runtime consumes it while packing, one layer at a time, so the weights are never held
twice, and `LoadedModel.transformers_model()` loads it again from the same files for whatever
needs transformers itself (HF generate in the benchmark, a self-draft, training's features).
`runtime="llamacpp"` (a GGUF file only) loads no transformers model: llama.cpp reads the file
(`models.runtimes.llamacpp.LlamaCppLM`), the tokenizer and config come from the file or its cached copy.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from verispec.models import DEFAULT_MODEL
from verispec.models.base import CausalLM
from verispec.models.formats.gguf_blocks import GGUFWeight, gguf_weights
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.runtimes.llama import LlamaRuntime
from verispec.models.runtimes.static_llama import StaticLlama
from verispec.models.loading.format_costs import PLAIN, Workload
from verispec.models.loading.load_plan import LLAMACPP_Q8_0_VALUES, LLAMACPP_TARGET, LoadPlan, model_config, plan_load
from verispec.models.loading.memory import kv_bytes_per_token, peak_rss_bytes, weight_bytes
from verispec.models.formats.quant import Int4Linear
from verispec.models.formats.quantized import quantized_model
from verispec.models.runtime import Runtime
from verispec.models.loading.sources import (
    blocks_cache,
    check_tokenizer_files,
    converted_dir,
    from_directory,
    from_gguf,
    is_converted,
    locate,
    matrix_types,
    tokenizer_source,
)
from verispec.models.weight_format import WeightFormat


@dataclass
class LoadedModel:
    """A loaded model and what a request needs around it.

    name: what it was loaded as (the embedded name or the path given).
    lm: the `CausalLM` the engine drives: `LlamaRuntime` (runtime "fast"), `StaticLlama`
        ("static") or `HFCausalLM` ("hf"). model: the transformers model `lm` runs (runtime "hf"), or None where it was
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
    runtime: Runtime = Runtime.HF
    weight_format: WeightFormat = WeightFormat.FLOAT  # FLOAT (weights in `dtype`), Q4, or GGUF (llama.cpp's own blocks)
    exact_weights: bool = True  # every weight equals the source's float32 weight, bit for bit
    auto_choice: str | None = None  # why dtype "auto" chose what it did, where that is not the plain rule
    layout: str | None = None  # q4 on the fast runtime: which projections run on which kernel (`projection_layout`)
    config: PretrainedConfig | None = None  # None: `model`'s
    device: str = "cpu"  # where `lm` computes ("cpu", "cuda:0")
    reload: Callable[[], PreTrainedModel] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.runtime, self.weight_format = Runtime(self.runtime), WeightFormat(self.weight_format)  # a name is read once
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
    def context_limit(self) -> int | None:
        """The most positions a request may fill (prompt and new tokens): the config's trained
        context, or llama.cpp's cache where that holds fewer; None where neither says."""
        limits = [getattr(self.config, "max_position_embeddings", None), getattr(self.lm, "n_ctx", None)]
        return min((n for n in limits if n is not None), default=None)

    @property
    def dtype_name(self) -> str:
        """How reports name what this model computes in: "q4", else the dtype ("float32")."""
        return str(self.weight_format) if self.weight_format != WeightFormat.FLOAT else str(self.dtype).removeprefix("torch.")

    @property
    def target_note(self) -> str | None:
        """What a quantized format did to the model, for wherever it is chosen; None for float."""
        if self.weight_format == WeightFormat.GGUF:
            values = "" if self.lm.cache_type_v == "f16" else f"; {LLAMACPP_Q8_0_VALUES}"
            if not self.lm.deterministic:
                pieces = ("; --no-deterministic: a row's logits depend on how many rows are scored with it, so the output "
                          "follows no one fixed target and greedy speculative output may part from plain decoding")
            elif values:
                pieces = ("; on this cache a row's logits do not depend on how many rows one forward scores, so every "
                          "forward decodes as llama.cpp's own would, and greedy output equals llama.cpp's own on the same "
                          "settings")
            else:
                pieces = ("; every forward after the prompt decodes a number of rows that gives a row the same bits (a "
                          "lone token with a padding row where llama.cpp would score it otherwise), so a row's logits do "
                          "not depend on how many rows are scored with it")
            return f"llama.cpp: {LLAMACPP_TARGET}{values}{pieces}"
        if self.weight_format == WeightFormat.FLOAT:
            notes = []
            if self.dtype in (torch.bfloat16, torch.float16) and self.source.is_file():
                note = (
                    f"{self.dtype_name}: every weight rounded to {self.dtype_name} from the GGUF file's float32 values, so "
                    f"this is a different model from {self.name} in float32 or q4 (its outputs are not that model's)"
                )
                notes.append(f"{note} ({self.auto_choice})" if self.auto_choice else note)
            if self.runtime == Runtime.STATIC and not getattr(self.lm, "deterministic", True):
                notes.append(
                    "--no-deterministic: each step runs in the smallest shape that holds it and a row's logits depend "
                    "on that shape, so greedy speculative output may part from plain decoding at near ties"
                )
            return "; ".join(notes) or None
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
    device: str = "auto",
    workload: Workload = PLAIN,
    cache_type_v: str | None = None,
) -> LoadedModel:
    """Load a causal LM from local files (`models.loading.sources` says which names it accepts).

    dtype: "auto" (where the CPU computes bf16 natively: for a GGUF file whose every matrix is
    Q4_0/Q4_1/Q8_0 on the fast runtime on x86-64, q4, which holds those weights exactly, or
    bfloat16, whichever is expected to decode `workload` faster, else bfloat16; float32 elsewhere:
    `models.loading.load_plan`; `auto_choice` says why where q4 and bfloat16 were weighed), "float32",
    "bfloat16", "float16" or "q4". q4: projections on torch's int4 kernel (`models.formats.quant`);
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
    runtime "static" (`StaticLlama`): fixed-shape forwards over a static cache, CUDA graphs on
    CUDA; deterministic there runs every forward in one shape (`models.runtimes.static_llama`).
    device: "auto" (CUDA where torch sees a device, else the CPU), "cpu", "cuda" or "cuda:N";
    on CUDA, runtime "auto" takes the static runtime and dtype "auto" bfloat16 (float16 on a
    GPU without it). workload: what a step is expected to decode (the requests in flight and how
    each drafts, `models.loading.format_costs.Workload`; default plain decoding of one request),
    by which dtype and runtime "auto" weigh their candidates' expected tokens per second.
    cache_type_v: runtime "llamacpp" only: its value cache, "f16" (the default) or "q8_0" (another
    target, on which deterministic decoding costs nothing: `LlamaCppLM`).
    """
    return build(plan_load(name_or_path, dtype, runtime, deterministic, device=device, cache_type_v=cache_type_v,
                           trust_remote_code=trust_remote_code, workload=workload))


def build(plan: LoadPlan) -> LoadedModel:
    """The model `plan` describes: its transformers model and tokenizer, then the runtime
    (llama.cpp reads the GGUF file itself: `_on_llamacpp`)."""
    if plan.runtime == Runtime.LLAMACPP:
        return _on_llamacpp(plan)
    source, torch_dtype = plan.source, plan.dtype
    if plan.gguf:
        # Its converted copy is float32: the fast runtime casts each weight as it packs it,
        # where transformers would read and cast all of them first (bfloat16's peak memory).
        model, tokenizer = _gguf_model(source, torch_dtype if plan.runtime == Runtime.HF else torch.float32)

        def reload() -> PreTrainedModel:
            return _gguf_model(source, torch_dtype)[0].to(plan.device)
    else:

        def reload() -> PreTrainedModel:
            return from_directory(
                AutoModelForCausalLM, source, dtype=torch_dtype, trust_remote_code=plan.trust_remote_code
            ).to(plan.device)

        model = from_directory(AutoModelForCausalLM, source, dtype=torch_dtype, trust_remote_code=plan.trust_remote_code)
        tokenizer = _directory_tokenizer(source, plan.trust_remote_code)
    config, eos_token_ids = model.config, eos_ids(model.config, model.generation_config, tokenizer)
    if plan.runtime == Runtime.HF:
        lm, model, exact = _on_transformers(plan, model)
    elif plan.runtime == Runtime.STATIC:
        lm, model, exact = _on_static_runtime(plan, model)
    else:
        lm, model, exact = _on_fast_runtime(plan, model)
    return LoadedModel(
        name=plan.name,
        lm=lm,
        model=model,
        tokenizer=tokenizer,
        eos_token_ids=eos_token_ids,
        dtype=torch_dtype,
        source=source,
        runtime=plan.runtime,
        weight_format=WeightFormat.Q4 if plan.weight_format == WeightFormat.Q4 else WeightFormat.FLOAT,
        exact_weights=exact,
        auto_choice=plan.auto_choice,
        layout=projection_layout(lm) if plan.weight_format == WeightFormat.Q4 else None,
        config=config,
        reload=reload,
        device=plan.device,
    )


def _on_llamacpp(plan: LoadPlan) -> LoadedModel:
    """Runtime "llamacpp": llama.cpp decodes the GGUF file with torch's thread count; no
    transformers model is loaded (`transformers_model()` loads the file's float32 one where
    something runs transformers itself, HF's generate in the benchmark). A build that crashes
    on this CPU is found by a probe in a child process first (`llamacpp.probe`)."""
    from verispec.models.runtimes.llamacpp import LlamaCppLM, probe

    probe(plan.source)
    config = model_config(plan.source)
    tokenizer = load_tokenizer(plan.source)
    converted = converted_dir(plan.source)
    generation = (
        from_directory(GenerationConfig, converted) if (converted / "generation_config.json").is_file()
        else GenerationConfig.from_model_config(config)
    )
    lm = LlamaCppLM(plan.source, n_threads=torch.get_num_threads(), deterministic=plan.deterministic,
                    matrices=matrix_types(plan.source), cache_type_v=plan.cache_type_v)
    return LoadedModel(
        name=plan.name,
        lm=lm,
        model=None,
        tokenizer=tokenizer,
        eos_token_ids=eos_ids(config, generation, tokenizer),
        dtype=plan.dtype,
        source=plan.source,
        runtime=plan.runtime,
        weight_format=plan.weight_format,
        exact_weights=False,
        config=config,
        reload=lambda: _gguf_model(plan.source, plan.dtype)[0],
    )


def _on_transformers(plan: LoadPlan, model: PreTrainedModel) -> tuple[CausalLM, PreTrainedModel, bool]:
    """Runtime "hf": transformers runs `model` (its linears on the int4 kernel for q4)."""
    if plan.weight_format != WeightFormat.Q4:
        model = model.to(plan.device)
        return HFCausalLM(model), model, plan.exact_weights
    quantized = quantized_model(model, plan.weight_format, gguf_blocks(plan.source, model) if plan.gguf else None)
    return HFCausalLM(quantized), model, quantized.exact


def _on_fast_runtime(plan: LoadPlan, model: PreTrainedModel) -> tuple[CausalLM, None, bool]:
    """Runtime "fast": `LlamaRuntime` packs `model`'s weights, consuming them layer by layer."""
    checkpoint = checkpoint_tensors(plan.source)
    if plan.weight_format != WeightFormat.Q4:
        lm = LlamaRuntime.from_hf(model, deterministic=plan.deterministic, consume=True, checkpoint=checkpoint, dtype=plan.dtype)
        return lm, None, plan.exact_weights
    blocks = gguf_blocks(plan.source, model) if plan.gguf else None
    lm = LlamaRuntime.from_hf(model, plan.weight_format, deterministic=plan.deterministic, blocks=blocks, consume=True, checkpoint=checkpoint)
    return lm, None, lm.exact_weights


def _on_static_runtime(plan: LoadPlan, model: PreTrainedModel) -> tuple[CausalLM, None, bool]:
    """Runtime "static": `StaticLlama` copies `model`'s weights to the device in the plan's
    dtype, consuming them layer by layer (the host holds one layer's copy at a time)."""
    lm = StaticLlama.from_hf(model, dtype=plan.dtype, device=plan.device, deterministic=plan.deterministic, consume=True)
    return lm, None, plan.exact_weights


def load_tokenizer(name_or_path: str | os.PathLike, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Only the tokenizer of what `load_model` accepts, or of a tokenizer directory."""
    source = locate(name_or_path)
    if source.is_dir():
        return _directory_tokenizer(source, trust_remote_code)
    return gguf_tokenizer(source)


def gguf_tokenizer(gguf: Path, read: PreTrainedTokenizerBase | None = None) -> PreTrainedTokenizerBase:
    """A GGUF file's tokenizer, always as loaded from a saved directory: the converted copy, else
    a tokenizer-only copy saved on first use (`read`: the file's tokenizer already read).
    transformers builds a tokenizer read from the file without the normalizer its saved form
    loads with (Qwen2's NFC), so a first load and every later one would otherwise differ, and
    the tokenizer contract would refuse a pair loaded one each way."""
    saved, marker = tokenizer_source(gguf), "tokenizer_config.json"
    if not (saved / marker).is_file():
        read = read or from_gguf(AutoTokenizer, gguf)
        _save_directory(saved, marker, read.save_pretrained, "the tokenizer", f"using it as read from {gguf}")
        if not (saved / marker).is_file():
            return read
    return from_directory(AutoTokenizer, saved)


def _directory_tokenizer(directory: Path, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    """The tokenizer saved in `directory`; an error that says so when it holds none."""
    check_tokenizer_files(directory)
    return from_directory(AutoTokenizer, directory, trust_remote_code=trust_remote_code)


# Ends of a reply that a GGUF file does not name, by architecture: Qwen's own generation config
# ends at <|im_end|> (the file's eos id) and at <|endoftext|> (a document's end).
EXTRA_EOS = {"qwen2": ("<|endoftext|>",)}


def eos_ids(
    config: PretrainedConfig, generation: GenerationConfig | None, tokenizer: PreTrainedTokenizerBase
) -> tuple[int, ...]:
    """Every id that ends a reply: the generation config's, the tokenizer's, then `EXTRA_EOS`."""
    configured = getattr(generation, "eos_token_id", None)
    if configured is None:
        configured = []
    elif isinstance(configured, int):
        configured = [configured]
    ids = [*configured, tokenizer.eos_token_id]
    for text in EXTRA_EOS.get(getattr(config, "model_type", None), ()):
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


def gguf_blocks(gguf: Path, model: PreTrainedModel) -> dict[str, GGUFWeight]:
    """The GGUF file's weights as stored (`gguf_blocks.gguf_weights`), cached beside its
    converted checkpoint as one safetensors file: reading the file's metadata and decoding
    its blocks takes ~10-20 s for the default model, reading the cached copy well under 1 s."""
    cached = blocks_cache(gguf)
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
    if is_converted(gguf):
        return from_directory(AutoModelForCausalLM, converted, dtype=dtype), from_directory(AutoTokenizer, converted)
    model = from_gguf(AutoModelForCausalLM, gguf, dtype=torch.float32)
    tokenizer = from_gguf(AutoTokenizer, gguf)
    _save_converted(model, tokenizer, converted)
    return model.to(dtype), gguf_tokenizer(gguf, tokenizer)


def _save_converted(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path) -> None:
    """Save the dequantised model and its tokenizer; written to a temporary directory and
    renamed, so a concurrent or interrupted load never sees half a checkpoint."""
    # The weights are plain float32 tensors by now; what remains of the GGUF quantizer only
    # stops transformers from saving them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def write(partial: Path) -> None:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)

    _save_directory(target, "config.json", write, "the converted model", "every load will convert again")


def _save_directory(target: Path, marker: str, write: Callable[[Path], None], what: str, instead: str) -> None:
    """Save a directory: `write` fills a temporary sibling, renamed to `target` when complete,
    so a concurrent or interrupted load never sees half of it. A failure warns that `what` was
    not saved and what happens `instead`, unless `target / marker` exists by then (another load
    saved it)."""
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write(partial)
        partial.rename(target)
    except OSError as error:
        if not (target / marker).is_file():
            warnings.warn(f"could not save {what} to {target} ({error}); {instead}")
    finally:
        shutil.rmtree(partial, ignore_errors=True)
