"""What `load_model` will build, decided before any weight is read: `plan_load` -> `LoadPlan`.

A plan names the file or directory, the architecture (from the config alone: a checkpoint's
`config.json`, a GGUF file's converted copy or its header), the runtime and why, the weight
format and why (`--dtype auto`'s choice), and whether the weights will be exactly the source's
float32 weights. `verispec load-plan` prints one; `load_model` builds from one
(`models.loading.load`).

`--dtype auto` is decided by what the machine is, what the file holds and what a step will
decode (`workload`: the requests in flight and how each drafts, `format_costs.Workload`):
- for a GGUF file whose every matrix is Q4_0, Q4_1 or Q8_0 (`coded_exactly`: q4 holds those
  blocks exactly) on the fast runtime, where torch's int4 kernel has its vectorised path
  (`MachineFacts.int4_faster`: an x86-64 CPU with native bf16), q4 or bfloat16, whichever the
  cost model expects to decode the workload faster, at the k each would choose
  (`format_costs.choose`: this machine's measured curves, else the documented ones);
- else bfloat16 where the CPU computes bf16 natively, float32 elsewhere (`resolve_dtype`).

`--runtime auto` never takes the fast runtime where transformers is expected, on this
machine's measured curves, to decode the workload faster in the same format
(`format_costs.hf_faster`).

The machine's facts are read from `verispec.machine` unless given (`MachineFacts`), so a plan
for another machine is one argument away.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, PretrainedConfig

from verispec.machine import cpu_model, native_bf16
from verispec.models import DEFAULT_MODEL
from verispec.models.loading import format_costs
from verispec.models.loading.format_costs import PLAIN, FormatChoice, FormatCost, Workload
from verispec.models.formats.gguf_blocks import CODED, READ
from verispec.models.runtimes.llama import config_refusal
from verispec.models.runtimes.llamacpp import CACHE_TYPES_V, require
from verispec.models.runtime import Runtime, parse_runtime
from verispec.models.runtimes.static_llama import static_refusal
from verispec.models.loading.sources import (
    converted_dir,
    from_directory,
    from_gguf,
    is_converted,
    locate,
    matrix_types,
    tokenizer_source,
)
from verispec.models.weight_format import AUTO, WeightFormat, parse_target

DEVICES = "auto, cpu, cuda or cuda:N"  # what `device=` accepts

LLAMACPP_TARGET = (
    "the GGUF file's own blocks as llama.cpp computes them (activations quantized to 8 bits per block, "
    "keys and values in float16, its own summation order): a different target from the file's float32 "
    "model, verified exactly as llama.cpp computes it"
)
LLAMACPP_Q8_0_VALUES = (
    "--cache-type-v q8_0: the cached values, though, rounded to 8-bit blocks of 32 (the keys stay float16), "
    "another target than llama.cpp's default float16 cache"
)


@dataclass(frozen=True)
class MachineFacts:
    """What `--dtype auto` reads about the machine.

    native_bf16: the CPU computes bfloat16 natively (`verispec.machine.native_bf16`).
    int4_faster: torch's int4 kernel beats bfloat16 here (`int4_faster`).
    cuda_devices: how many CUDA devices torch sees (0: none, or a torch built without CUDA).
    cuda_bf16: the first of them computes bfloat16 (compute capability 8.0 or later).
    """

    native_bf16: bool
    int4_faster: bool
    cuda_devices: int = 0
    cuda_bf16: bool = False


def this_machine() -> MachineFacts:
    cuda = torch.cuda.is_available()
    return MachineFacts(
        native_bf16=native_bf16(),
        int4_faster=int4_faster(),
        cuda_devices=torch.cuda.device_count() if cuda else 0,
        cuda_bf16=cuda and torch.cuda.is_bf16_supported(),
    )


def resolve_device(device: str, machine: MachineFacts) -> tuple[str, str]:
    """(the torch device a model runs on, why): `device` is auto (CUDA where torch sees a
    device, else the CPU), cpu, cuda or cuda:N; ValueError where it names a device that is
    not there."""
    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise ValueError(f"unknown device {device!r}; choose {DEVICES}")
    if device == AUTO:
        if machine.cuda_devices:
            return "cuda:0", "chosen by --device auto: torch sees a CUDA device"
        return "cpu", "chosen by --device auto: torch sees no CUDA device"
    if device == "cpu":
        return "cpu", "asked for"
    if not machine.cuda_devices:
        built = "this torch was built without CUDA" if torch.version.cuda is None else "torch sees no CUDA device"
        raise ValueError(f"--device {device}: {built}; use --device cpu (or auto)")
    index = int(device.partition(":")[2] or 0)
    if index >= machine.cuda_devices:
        raise ValueError(f"--device {device}: torch sees {machine.cuda_devices} CUDA device(s), numbered from 0")
    return f"cuda:{index}", "asked for"


def device_float_format(machine: MachineFacts, device: str) -> tuple[WeightFormat, str]:
    """`--dtype auto`'s float format on `device`, and why."""
    if device != "cpu":
        if machine.cuda_bf16:
            return WeightFormat.BFLOAT16, "chosen by --dtype auto: this GPU computes bfloat16"
        return WeightFormat.FLOAT16, "chosen by --dtype auto: this GPU has no bfloat16"
    fmt = float_format(machine)
    why = "this CPU computes bfloat16 natively" if machine.native_bf16 else "this CPU has no native bfloat16"
    return fmt, f"chosen by --dtype auto: {why}"


def int4_faster() -> bool:
    """Whether torch's int4 kernel beats bfloat16 here, as measured: an x86-64 CPU with native
    bf16 (its vectorised path takes bfloat16 activations; other CPUs are unmeasured)."""
    return platform.machine().lower() in ("x86_64", "amd64") and native_bf16()


def float_format(machine: MachineFacts) -> WeightFormat:
    """`--dtype auto`'s float format: bfloat16 where the CPU computes it natively, else float32."""
    return WeightFormat.BFLOAT16 if machine.native_bf16 else WeightFormat.FLOAT32


def resolve_dtype(dtype: str | torch.dtype, machine: MachineFacts | None = None, device: str = "cpu") -> torch.dtype:
    """The dtype a target's transformers model is loaded in: the format's own (auto's float
    format on `machine`'s `device`, default this machine's CPU); float32 for q4, whose
    projections then hold codes."""
    fmt = parse_target(dtype)
    if fmt == AUTO:
        fmt = device_float_format(machine or this_machine(), device)[0]
    return fmt.dtype or torch.float32


def coded_exactly(gguf: Path) -> bool:
    """Whether every matrix of the GGUF file is stored in a block type q4 holds exactly on the
    int4 kernel alone (Q4_0, Q4_1, Q8_0): what `--dtype auto` takes q4 for."""
    matrices = matrix_types(gguf)
    return bool(matrices) and matrices <= set(CODED)


@dataclass(frozen=True)
class LoadPlan:
    """What `load_model` builds: read by `models.loading.load.build`, printed by `verispec load-plan`.

    name: what the model is loaded as (the embedded name or the path given).
    source: the .gguf file or checkpoint directory. architecture: the config's model type.
    runtime, runtime_reason: what runs it and why. deterministic: the fast runtime's
        shape-invariant attention.
    weight_format, dtype_reason: what the weights are held in (float32, bfloat16, float16 or
        q4) and why (asked for, or `--dtype auto`'s reasons).
    exact_weights: every weight equals the source's float32 weight, bit for bit; None where the
        build decides it projection by projection (q4 on a GGUF file with matrices of types
        not read raw, such as F16: each is held exactly or quantized on load as its blocks allow).
    trust_remote_code: run modelling code shipped in a checkpoint directory.
    device, device_reason: the torch device the model runs on ("cpu", "cuda:0") and why.
    """

    name: str
    source: Path
    architecture: str
    runtime: Runtime
    runtime_reason: str
    deterministic: bool
    weight_format: WeightFormat
    dtype_reason: str
    exact_weights: bool | None
    auto: bool = False  # the weight format was chosen by --dtype auto
    trust_remote_code: bool = False
    device: str = "cpu"
    device_reason: str = "asked for"
    workload: Workload = PLAIN  # what a step is expected to decode, what --dtype auto weighed the formats by
    format_choice: FormatChoice | None = None  # --dtype auto's candidates and their expectations, where it weighed formats
    cache_type_v: str | None = None  # the llama.cpp runtime's value cache type ("f16", "q8_0"); None on the others

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the transformers model is loaded in (`resolve_dtype`); float32 for the
        llama.cpp runtime, whose logits are float32 and whose transformers model (for HF's own
        generate) is the file's float32 model."""
        return torch.float32 if self.weight_format == WeightFormat.GGUF else resolve_dtype(self.weight_format, device=self.device)

    @property
    def gguf(self) -> bool:
        return self.source.is_file()

    @property
    def converted(self) -> Path | None:
        """A GGUF file's converted float32 copy (None for a directory); written by the first load."""
        return converted_dir(self.source) if self.gguf else None

    @property
    def tokenizer(self) -> Path:
        return tokenizer_source(self.source)

    @property
    def auto_choice(self) -> str | None:
        """Why `--dtype auto` chose what it did where it weighed q4 against bfloat16
        (`LoadedModel.target_note` says it); None where the plain rule (bfloat16 where native,
        else float32) or an explicit dtype holds."""
        return self.dtype_reason if self.auto and self.format_choice is not None else None

    def as_dict(self) -> dict:
        """The plan as JSON values (`verispec load-plan --json`)."""
        converted = self.converted
        return {
            "model": self.name,
            "source": str(self.source),
            "converted": None if converted is None else str(converted),
            "converted_cached": self.gguf and is_converted(self.source),
            "tokenizer": str(self.tokenizer),
            "architecture": self.architecture,
            "runtime": str(self.runtime),
            "runtime_reason": self.runtime_reason,
            "deterministic": self.deterministic,
            "cache_type_v": self.cache_type_v,
            "dtype": str(self.weight_format),
            "dtype_reason": self.dtype_reason,
            "exact_weights": self.exact_weights,
            "device": self.device,
            "device_reason": self.device_reason,
            "workload": self.workload.to_dict(),
            "dtype_candidates": None if self.format_choice is None else self.format_choice.to_dict()["candidates"],
            "costs_measured": None if self.format_choice is None else self.format_choice.measured,
        }

    def describe(self) -> str:
        """A few lines for a person: what is loaded from where, on what, in what, and why."""
        if self.gguf:
            cached = "cached" if is_converted(self.source) else "written by the first load, ~20 s"
            source = f"{self.source} (GGUF; float32 copy {self.converted}, {cached})"
        else:
            source = f"{self.source} (checkpoint directory)"
        exact = {
            True: "yes: every weight is the source's float32 weight, bit for bit",
            False: "no: the weights are rounded or quantized, a different model from float32",
            None: "projection by projection, as the file's block types allow (the loaded model says)",
        }[self.exact_weights]
        if self.runtime == Runtime.LLAMACPP:
            exact = "no: llama.cpp's arithmetic on the file's blocks, a different model from float32"
        determinism = " (deterministic)" if self.deterministic else ""
        if self.cache_type_v == "q8_0":
            determinism += " (values q8_0)"
        choice = self.format_choice
        costs = [] if choice is None else [
            f"{'chosen:' if c is choice.chosen else 'weighed:':<10}{c.describe()}" for c in choice.candidates
        ]
        return "\n".join([
            f"model:    {self.name} ({self.architecture})",
            f"source:   {source}",
            f"device:   {self.device}: {self.device_reason}",
            f"expects:  {self.workload.describe()}",
            f"runtime:  {self.runtime}{determinism}: {self.runtime_reason}",
            f"dtype:    {self.weight_format}: {self.dtype_reason}",
            *costs,
            f"exact:    {exact}",
        ])


def plan_load(
    name_or_path: str | os.PathLike = DEFAULT_MODEL,
    dtype: str | torch.dtype = AUTO,
    runtime: str = AUTO,
    deterministic: bool | None = None,
    *,
    device: str = AUTO,
    trust_remote_code: bool = False,
    machine: MachineFacts | None = None,
    workload: Workload = PLAIN,
    costs: Sequence[FormatCost] | None = None,
    cache_type_v: str | None = None,
) -> LoadPlan:
    """What `load_model` with these arguments builds (its docstring says what each means),
    reading only the config and, for auto or q4 on a GGUF file, its tensor table.
    machine: the facts `--dtype auto` and `--device auto` read (default: this machine's,
    `this_machine`). workload: what a step is expected to decode (default: plain decoding of
    one request), by which `--dtype auto` weighs q4 against bfloat16 and `--runtime auto` the
    fast runtime against transformers. costs: the measured curves those read (default: what
    `verispec profile` recorded for this file on this CPU at this thread count,
    `format_costs.measured`). cache_type_v: the llama.cpp runtime's value cache, "f16" (None:
    llama.cpp's default) or "q8_0" (another target); refused with any other runtime."""
    runtime = parse_runtime(runtime)
    if cache_type_v is not None and runtime != Runtime.LLAMACPP:
        raise ValueError(
            f"--cache-type-v {cache_type_v} is a setting of the llama.cpp runtime's cache; drop it or give --runtime llamacpp"
        )
    if deterministic and runtime == Runtime.HF:
        raise ValueError(
            "deterministic scoring is a mode of the fast, static and llama.cpp runtimes; drop it or choose runtime "
            "'fast', 'static', 'llamacpp' or 'auto'"
        )
    asked = parse_target(dtype)
    machine = machine or this_machine()
    where, device_reason = resolve_device(device, machine)
    source = locate(name_or_path)
    config = model_config(source, trust_remote_code)
    if runtime == Runtime.LLAMACPP:
        if where != "cpu":
            raise ValueError(f"the llama.cpp runtime runs on the CPU here, not {where}; drop --device (or give cpu)")
        return llamacpp_plan(str(name_or_path), source, config, asked, deterministic, cache_type_v or "f16")
    if where != "cpu" and asked == WeightFormat.Q4:
        raise ValueError(f"--dtype q4 runs on torch's CPU int4 kernel, not on {where}; give bfloat16, float16 or float32")
    chosen, runtime_reason = runtime_choice(runtime, config, resolve_dtype(asked, machine, where), where, source)
    if deterministic and chosen == Runtime.HF:
        raise ValueError(f"{source}: deterministic scoring needs the fast or static runtime, but {runtime_reason}")
    if costs is None:
        costs = format_costs.measured(source, cpu_model(), torch.get_num_threads()) if where == "cpu" else ()
    weighs_hf = runtime == AUTO and deterministic is not True
    fmt, dtype_reason, exact, choice = weight_choice(asked, source, chosen, machine, where, workload, costs, weighs_hf)
    if weighs_hf and chosen == Runtime.FAST and (slower := format_costs.hf_faster(fmt, costs, workload)):
        hf, fast = slower
        chosen, runtime_reason = Runtime.HF, (
            f"chosen by --runtime auto: measured on this machine, transformers' {fmt} forward is expected to decode "
            f"{hf.tokens_per_s:.1f} tok/s at {hf.k} against the fast runtime's {fast.tokens_per_s:.1f} at {fast.k} "
            f"(for {workload.describe()}; auto never takes a runtime measured slower than transformers in the same "
            "format); --runtime fast overrides"
        )
    return LoadPlan(
        name=str(name_or_path),
        source=source,
        architecture=config.model_type,
        runtime=chosen,
        runtime_reason=runtime_reason,
        deterministic=chosen in (Runtime.FAST, Runtime.STATIC) if deterministic is None else deterministic,
        weight_format=fmt,
        dtype_reason=dtype_reason,
        exact_weights=exact,
        auto=asked == AUTO,
        trust_remote_code=trust_remote_code,
        device=where,
        device_reason=device_reason,
        workload=workload,
        format_choice=choice,
    )


def runtime_choice(
    runtime: Runtime | str, config: PretrainedConfig, dtype: torch.dtype, device: str, source: Path
) -> tuple[Runtime, str]:
    """The runtime for `runtime` (auto, fast, static or hf) on `device`, and why: auto takes
    the fast runtime on the CPU and the static one on CUDA where it runs the model, else
    transformers; a runtime asked for that cannot run the model is refused with the reason."""
    on_cpu = device == "cpu"
    if runtime == Runtime.FAST and not on_cpu:
        raise ValueError(f"the fast runtime runs on the CPU; on {device} choose runtime static (or auto) or hf")
    refusal = config_refusal(config, dtype) if on_cpu else static_refusal(config, dtype)
    if runtime == Runtime.STATIC:
        refusal = static_refusal(config, dtype)
    if runtime in (Runtime.FAST, Runtime.STATIC) and refusal:
        raise ValueError(f"{source}: {refusal}")
    if runtime != AUTO:
        return runtime, "asked for"
    if refusal:
        return Runtime.HF, f"chosen by --runtime auto: {refusal}"
    if on_cpu:
        return Runtime.FAST, f"chosen by --runtime auto: the fast runtime runs {config.model_type!r} models on the CPU"
    return Runtime.STATIC, (
        f"chosen by --runtime auto: on {device} the static runtime runs {config.model_type!r} models "
        "(fixed shapes, CUDA graphs)"
    )


def llamacpp_plan(
    name: str, source: Path, config: PretrainedConfig, asked: WeightFormat | str, deterministic: bool | None,
    cache_type_v: str = "f16",
) -> LoadPlan:
    """Runtime "llamacpp": llama.cpp decodes the GGUF file's own blocks, so there is no weight
    format to choose; deterministic (the default) pads a lone token to llama.cpp's many-row
    kernels on a float16 value cache, and needs nothing on a Q8_0 one (`LlamaCppLM`). Refused
    where llama-cpp-python is not installed."""
    if cache_type_v not in CACHE_TYPES_V:
        raise ValueError(f"--cache-type-v {cache_type_v} is not a value cache type llama.cpp is run with here; give "
                         f"{' or '.join(CACHE_TYPES_V)}")
    if not source.is_file():
        raise ValueError(
            f"{source}: the llama.cpp runtime reads a GGUF file, not a checkpoint directory; give a .gguf file "
            "or an embedded GGUF model's name, or choose runtime fast or hf"
        )
    if asked != AUTO:
        raise ValueError(
            f"--dtype {asked} does not apply to the llama.cpp runtime, which computes the GGUF file's own "
            "blocks; drop --dtype (or give auto)"
        )
    require("--runtime llamacpp")
    return LoadPlan(
        name=name,
        source=source,
        architecture=config.model_type,
        runtime=Runtime.LLAMACPP,
        runtime_reason="asked for",
        deterministic=True if deterministic is None else deterministic,
        weight_format=WeightFormat.GGUF,
        dtype_reason=LLAMACPP_TARGET if cache_type_v == "f16" else f"{LLAMACPP_TARGET}; {LLAMACPP_Q8_0_VALUES}",
        exact_weights=False,
        cache_type_v=cache_type_v,
    )


def weight_choice(
    asked: WeightFormat | str,
    source: Path,
    runtime: Runtime,
    machine: MachineFacts,
    device: str = "cpu",
    workload: Workload = PLAIN,
    costs: Sequence[FormatCost] = (),
    weighs_hf: bool = False,
) -> tuple[WeightFormat, str, bool | None, FormatChoice | None]:
    """The weight format for `asked` (a `TARGET` format or auto) on `device`, why, whether
    the weights will be the source's float32 weights bit for bit (`LoadPlan.exact_weights`),
    and, where auto weighed q4 against bfloat16 for `workload`, the expectations it weighed
    (`costs`: measured curves; `weighs_hf`: a format may run on transformers where it was
    measured faster there)."""
    if asked == AUTO:
        if runtime == Runtime.FAST and source.is_file() and machine.int4_faster and coded_exactly(source):
            runtimes = (Runtime.FAST, Runtime.HF) if weighs_hf else (Runtime.FAST,)
            choice = format_costs.choose((WeightFormat.Q4, WeightFormat.BFLOAT16), costs, runtimes, workload)
            if choice.chosen.cost.weight_format == WeightFormat.Q4:
                return WeightFormat.Q4, (
                    "chosen by --dtype auto: every matrix of this GGUF file is Q4_0/Q4_1/Q8_0, which q4 holds "
                    f"exactly (the same weights as float32, activations rounded to bfloat16), and {choice.why()}; "
                    "--dtype bfloat16 or float32 overrides"
                ), True, choice
            return WeightFormat.BFLOAT16, (
                f"chosen by --dtype auto: {choice.why()}; bfloat16 rounds every weight, a different target from "
                "float32 and from q4 (which holds this file's weights exactly); --dtype q4 or float32 overrides"
            ), False, choice
        fmt, why = device_float_format(machine, device)
        return fmt, why, fmt == WeightFormat.FLOAT32, None
    if asked != WeightFormat.Q4:
        return asked, "asked for", asked == WeightFormat.FLOAT32, None
    if not source.is_file():
        return asked, "asked for; a checkpoint's float weights are quantized on load", False, None
    # Blocks read raw stay exact (on the int4 kernel, or float32 where they have no exact int4
    # form); a matrix of any other type is quantized on load unless a fused partner is read raw.
    matrices = matrix_types(source)
    return asked, "asked for", True if matrices and matrices <= set(READ) else None, None


def model_config(source: Path, trust_remote_code: bool = False) -> PretrainedConfig:
    """The transformers config of a checkpoint directory or GGUF file, no weight read: a GGUF
    file's converted copy's where it is cached, else its header's."""
    if source.is_file():
        return from_directory(AutoConfig, converted_dir(source)) if is_converted(source) else from_gguf(AutoConfig, source)
    if not (source / "config.json").is_file():
        raise ValueError(
            f"{source} has no config.json, so it is not a Hugging Face model directory; "
            "give a checkpoint directory, a .gguf file or an embedded name"
        )
    return from_directory(AutoConfig, source, trust_remote_code=trust_remote_code)
