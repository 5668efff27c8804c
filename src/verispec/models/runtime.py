"""What runs a model, named once: `Runtime`. A leaf, like `weight_format`, so that the loader,
the cost curves, the proposers and the commands compare members, never names.

A `Runtime` is a `str` whose value is what users type (`--runtime fast`) and what JSON holds
(`"runtime": "fast"`); `parse_runtime` reads a name once, where it comes in, and refuses one
outside the subset that part accepts.

    >>> parse_runtime("fast") is Runtime.FAST, parse_runtime("auto"), Runtime.STATIC == "static"
    (True, 'auto', True)
    >>> Runtime.FAST.named
    'the fast runtime'
    >>> parse_runtime("vllm", (AUTO, Runtime.FAST))
    Traceback (most recent call last):
    ...
    ValueError: unknown runtime 'vllm'; choose auto, fast
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Literal

from verispec.models.weight_format import AUTO


class Runtime(StrEnum):
    """What runs the model: a runtime is one value here and one build in `models.loading.load`."""

    FAST = "fast"  # verispec's Llama runtime for the CPU (`models.runtimes.llama.LlamaRuntime`)
    HF = "hf"  # transformers' own model (`models.runtimes.hf.HFCausalLM`)
    LLAMACPP = "llamacpp"  # llama.cpp itself on a GGUF file (`models.runtimes.llamacpp.LlamaCppLM`): its arithmetic
    STATIC = "static"  # fixed shapes over a static cache, CUDA graphs on CUDA (`models.runtimes.static_llama.StaticLlama`)

    @property
    def named(self) -> str:
        """How a message names it: "the fast runtime"."""
        return f"the {self.value} runtime"


RUNTIMES = (AUTO, *Runtime)  # what `runtime=` accepts: auto takes the fast runtime on a CPU, static on CUDA


def parse_runtime(name: str, choices: Sequence[str] = RUNTIMES) -> Runtime | Literal["auto"]:
    """The runtime `name` names, one of `choices` (`AUTO` among them where auto is accepted),
    or ValueError naming them."""
    if name not in choices:
        raise ValueError(f"unknown runtime {name!r}; choose {', '.join(choices)}")
    return AUTO if name == AUTO else Runtime(name)
