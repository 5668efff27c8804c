"""vLLM as a benchmark peer: its CPU build decoding the same target, in its own venv.

    vllm-plain                  vLLM's greedy decoding
    vllm-ngram[-kN]             vLLM's ngram speculation (prompt lookup, n-grams of 2 to 4), N drafts (4)
    vllm-eagle3:DIR[-kN]        an EAGLE-3 head in speculators' format (`verispec export-head
                                --format speculators`), N drafts (3)
    vllm-medusa:DIR             a Medusa head in vLLM's format (`--format vllm-medusa`), its K drafts

vLLM pins its own torch and transformers, so it runs in the venv `make vllm-env` makes, as a
long-lived subprocess (`verispec.bench.vllm_worker`) holding one engine per method, fed the
same prompt token ids, budget and EOS ids as every other method, one request at a time. The
runner's clock is the same `Clock`, end to end around the request (the pipe adds well under a
millisecond); tokens per round come from the drafts vLLM's proposer returned. Greedy only, as
for llama.cpp, and the target must be a checkpoint directory vLLM can read (for a GGUF target,
verispec's float32 conversion of it).

A peer, not a verispec method: vLLM computes with its own kernels, so its greedy output may
part from verispec-plain's where the two round a close choice differently (`Outcome.peer`).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from verispec.bench.methods import Method, split_k
from verispec.bench.runners import Clock, Outcome
from verispec.models.load import LoadedModel
from verispec.sampling import SamplingParams

VENV_PYTHON = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
WORKER = Path(__file__).resolve().with_name("vllm_worker.py")
NGRAM_TOKENS = 4
EAGLE3_TOKENS = 3
METHODS_GRAMMAR = "vllm-plain, vllm-ngram[-kN], vllm-eagle3:DIR[-kN] or vllm-medusa:DIR"


def parse(name: str) -> Method:
    """A `vllm-*` method name -> Method(family "vllm", proposer None, "ngram", "eagle3:DIR" or
    "medusa:DIR", k).

    >>> parse("vllm-ngram-k3").proposer, parse("vllm-ngram-k3").k
    ('ngram', 3)
    >>> parse("vllm-eagle3:heads/e3").k
    3
    """
    if name == "vllm-plain":
        return Method(name, "vllm")
    head, k = split_k(name)
    if head == "vllm-ngram":
        return Method(name, "vllm", proposer="ngram", k=k or NGRAM_TOKENS)
    kind, _, directory = head.removeprefix("vllm-").partition(":")
    if kind in ("eagle3", "medusa") and directory:
        if kind == "medusa" and k is not None:
            raise ValueError(f"method {name!r}: a Medusa head drafts its own K tokens; write vllm-medusa:DIR")
        return Method(name, "vllm", proposer=f"{kind}:{directory}", k=k or (EAGLE3_TOKENS if kind == "eagle3" else None))
    raise ValueError(f"method {name!r}: write {METHODS_GRAMMAR}")


def speculative_config(method: Method) -> dict | None:
    """vLLM's `speculative_config` for `method`; None for plain decoding."""
    if method.proposer is None:
        return None
    if method.proposer == "ngram":
        return {"method": "ngram", "num_speculative_tokens": method.k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    kind, _, directory = method.proposer.partition(":")
    config = Path(directory) / "config.json"
    if not config.is_file():
        raise ValueError(f"method {method.name!r}: {directory} has no config.json; export a head there with `verispec export-head`")
    if kind == "medusa":
        return {"method": "medusa", "model": str(Path(directory).resolve()), "num_speculative_tokens": json.loads(config.read_text())["num_heads"]}
    return {"method": "eagle3", "model": str(Path(directory).resolve()), "num_speculative_tokens": method.k}


def require(names: Sequence[str], sampling: SamplingParams, python: Path = VENV_PYTHON) -> None:
    """Refuse vllm methods up front when vLLM's venv is missing or the benchmark samples."""
    if not names:
        return
    if not python.is_file():
        raise ValueError(f"{', '.join(names)} need vLLM's CPU build in its own venv; run `make vllm-env` (about 3.5 GB)")
    if not sampling.greedy:
        raise ValueError(f"{', '.join(names)} decode greedily only here; drop --temperature or these methods")


def checkpoint_directory(target: LoadedModel) -> Path:
    """The target as a checkpoint directory vLLM reads: its own, or verispec's conversion of its GGUF file."""
    from verispec.models.sources import converted_dir

    source = Path(target.source)
    directory = converted_dir(source) if source.suffix == ".gguf" else source
    if not (directory / "config.json").is_file():
        raise ValueError(f"vLLM needs the target as a checkpoint directory; {source} gives none (no {directory / 'config.json'})")
    return directory


class VllmRunner:
    """One vLLM engine for `method` on `target`, in a worker process of vLLM's venv; call it as
    any runner. `close` ends the worker (it also ends when the runner is collected)."""

    def __init__(self, method: Method, target: LoadedModel, python: Path = VENV_PYTHON, eager: bool = True,
                 max_model_len: int = 2048, spawn: Callable[..., subprocess.Popen] = subprocess.Popen) -> None:
        self.method = method
        self.eos_token_ids = list(target.eos_token_ids)
        dtype = str(target.dtype).removeprefix("torch.")
        # -P: the worker's own directory (which holds this module, vllm.py) must not shadow vLLM
        self.process = spawn([str(python), "-P", str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._send({"target": str(checkpoint_directory(target)), "dtype": dtype, "eager": eager, "seed": 0,
                    "max_model_len": max_model_len, "speculative_config": speculative_config(method)})
        ready = self._receive()
        self.engine = {"vllm": ready.get("vllm"), "patches": ready.get("patches", [])}

    def __call__(
        self, prompt_ids: Sequence[int], max_new_tokens: int, on_token: Callable[[int], None] | None = None
    ) -> Outcome:
        from verispec.bench.vllm_worker import rounds

        clock = Clock()
        self._send({"prompt": list(prompt_ids), "max_tokens": max_new_tokens, "stop": self.eos_token_ids})
        answer = self._receive()
        tokens = answer["tokens"]
        clock.per_round = rounds(tokens, answer["drafts"]) if self.method.proposer else [1] * len(tokens)
        if on_token is not None:
            for token in tokens:
                on_token(token)
        # Not streamed: every token arrives with the last, so the first-token time is the wall
        # time and there is no decode rate to report apart from it.
        outcome = clock.outcome(tokens)
        outcome.first_tokens = len(tokens)
        outcome.peer = f"vLLM {self.engine['vllm']} (its own kernels)"
        return outcome

    def close(self) -> None:
        process = getattr(self, "process", None)
        if process is not None and process.poll() is None:
            process.stdin.close()
            process.wait(timeout=60)

    def __del__(self) -> None:
        self.close()

    def _send(self, message: dict) -> None:
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def _receive(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"vLLM's worker for {self.method.name} ended (exit status {self.process.wait()}); its errors are above")
        return json.loads(line)


def make_runner(method: Method, target: LoadedModel) -> VllmRunner:
    return VllmRunner(method, target)
