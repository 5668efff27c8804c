"""The engines `verispec check-runtime` can check, behind the protocol of `engines.base`.

    verispec              verispec itself (own): the self-check and the control
    hf                    transformers `generate`: assisted (a truncated copy of the target) and prompt lookup
    llamacpp              llama-cpp-python's `Llama.generate`: prompt lookup, on an F32 copy of the GGUF file
    openai:URL[,PLAIN]    any OpenAI-compatible server on this machine
    vllm                  vLLM's CPU build in its venv (`make vllm-env`): ngram, eagle3, draft_model
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from verispec.runtime_check.engines.base import Engine, Refused, Unavailable

ENGINES = "verispec, hf, openai:URL[,PLAIN_URL], llamacpp or vllm"
VERISPEC_METHODS = ("lookup", "layerskip:8")
VLLM_PYTHON = Path(__file__).resolve().parents[4] / ".venv-vllm" / "bin" / "python"

__all__ = ["ENGINES", "Engine", "Refused", "Unavailable", "check_spec", "open_engine"]


def check_spec(spec: str) -> None:
    """Refuse a spec that names no engine (before any model loads)."""
    name, _, argument = spec.partition(":")
    if name == "openai" and argument:
        from verispec.runtime_check.engines.openai import parse_urls

        parse_urls(argument)
    elif name not in ("verispec", "hf", "llamacpp", "vllm") or argument:
        raise ValueError(f"unknown engine {spec!r}; choose {ENGINES}")


def open_llamacpp(loaded, dtype: str) -> Engine:
    """llama-cpp-python on an F32 copy of the GGUF file `loaded` came from, after a probe
    decoded a few tokens of it (a build that crashes is one line, `models.runtimes.llamacpp.probe`)."""
    from verispec.models.runtimes import llamacpp

    if dtype != "float32":
        raise ValueError(f"llamacpp computes in float32 (an F32 copy of the GGUF file), so verispec's copy must too; "
                         f"give --dtype float32, not {dtype}")
    try:
        llamacpp.require("check-runtime llamacpp")
        if not (loaded.source.is_file() and loaded.source.suffix == ".gguf"):
            raise Unavailable(f"llamacpp decodes the GGUF file verispec loads, but {loaded.name} was not loaded from a "
                              f".gguf file ({loaded.source}); give --model a .gguf file or an embedded name")
        llamacpp.probe(loaded.source)
    except llamacpp.LlamaCppUnavailable as error:
        raise Unavailable(str(error)) from None
    from verispec.runtime_check.engines.llamacpp import LlamaCppEngine, float32_copy

    return LlamaCppEngine(float32_copy(loaded.source), loaded.eos_token_ids, loaded.lm.vocab_size)


def open_engine(spec: str, loaded, dtype: str, api_key: str | None = None) -> Engine:
    """The engine `spec` names, on the weights of `loaded` (a `LoadedModel`): ValueError for a
    name that is none, `Unavailable` for one that cannot run here (saying what to install)."""
    name, _, argument = spec.partition(":")
    if name == "verispec" and not argument:
        from verispec.registry import build_proposer
        from verispec.runtime_check.engines.own import VerispecEngine

        factories = {m: (lambda lm, m=m: build_proposer(m, replace(loaded, lm=lm))) for m in VERISPEC_METHODS}
        return VerispecEngine(loaded.lm, factories, loaded.eos_token_ids, dtype=dtype)
    if name == "hf" and not argument:
        from verispec.runtime_check.engines.hf import HFEngine

        model = loaded.model if loaded.model is not None else loaded.reload()
        return HFEngine(model, loaded.eos_token_ids, dtype)
    if name == "openai" and argument:
        from verispec.runtime_check.engines.openai import OpenAIEngine, parse_urls

        url, plain = parse_urls(argument)
        return OpenAIEngine(url, plain, loaded.name, dtype, api_key)
    if name == "llamacpp" and not argument:
        return open_llamacpp(loaded, dtype)
    if name == "vllm" and not argument:
        if not VLLM_PYTHON.exists():
            raise Unavailable("vllm needs vLLM's CPU build in .venv-vllm, which is missing; make it with `make vllm-env`")
        from verispec.runtime_check.engines.vllm import VllmEngine

        return VllmEngine(loaded, dtype, python=VLLM_PYTHON)
    raise ValueError(f"unknown engine {spec!r}; choose {ENGINES}")
