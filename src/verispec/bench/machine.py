"""What a benchmark ran on: the machine and the software, for the report's header."""

from __future__ import annotations

import os
import platform
import resource
from pathlib import Path

import torch
import transformers

import verispec
from verispec.models.load import native_bf16


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def describe(dtype: str) -> dict:
    """The machine and software fields of the benchmark header."""
    return {
        "cpu": cpu_model(),
        "native_bf16": native_bf16(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "verispec": verispec.__version__,
        "dtype": dtype,
    }


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if platform.system() == "Darwin" else 2**10)
