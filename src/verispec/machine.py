"""What a measurement ran on: the machine, how busy it was, and the software. One description
for the benchmark's header, `verispec profile` and the demo; /proc/cpuinfo is read once.

    >>> describe()["logical_cpus"] == os.cpu_count()
    True
"""

from __future__ import annotations

import functools
import os
import platform
import resource
from importlib import metadata
from pathlib import Path

import torch


@functools.cache
def cpuinfo() -> str:
    """/proc/cpuinfo ("" where there is none)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    for line in cpuinfo().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively; elsewhere bf16 is emulated and slower
    than float32 (docs/results/implementation-choices.md)."""
    return cpu_has_bf16(cpuinfo(), platform.machine())


def cpu_has_bf16(cpuinfo: str, machine: str) -> bool:
    """From /proc/cpuinfo: AVX512-BF16 or AMX-BF16 on x86, the BF16 extension on Arm."""
    wanted = {"avx512_bf16", "amx_bf16"} if machine in ("x86_64", "AMD64", "i686") else {"bf16"}
    return bool(wanted & cpu_flags(cpuinfo))


def cpu_flags(cpuinfo: str) -> set[str]:
    """Every flag a "flags" (x86) or "Features" (Arm) line of /proc/cpuinfo names."""
    return {
        flag
        for line in cpuinfo.splitlines()
        if line.partition(":")[0].strip().lower() in ("flags", "features")
        for flag in line.partition(":")[2].split()
    }


def version() -> str:
    """verispec's installed version (read from its distribution, not from the package root:
    models import this module, and the root imports the engine, which imports models)."""
    try:
        return metadata.version("verispec")
    except metadata.PackageNotFoundError:
        return "unknown"


def describe(dtype: str | None = None) -> dict:
    """The machine and software a timing depends on besides the models."""
    import transformers  # imported here: the CLI reads this module before any model is loaded

    return {
        "cpu": cpu_model(),
        "native_bf16": native_bf16(),
        "amx": "amx_tile" in cpu_flags(cpuinfo()),  # oneDNN may take AMX tiles for bfloat16 products
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # ATen's vector ISA
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # Other processes competing for the cores change every timing, by far more than any
        # choice measured (docs/results/implementation-choices.md); say how busy it was.
        "load_average_1min": round(os.getloadavg()[0], 2),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "verispec": version(),
        "dtype": dtype,
    }


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if platform.system() == "Darwin" else 2**10)
