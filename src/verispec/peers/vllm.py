"""vLLM as a peer: its CPU build decoding the same target, in its own venv, for the benchmark
(`verispec bench`: the `vllm-*` methods, `verispec.bench.methods`) and the runtime check
(`verispec check-runtime`). An engine is made for a `VllmMethod`: plain decoding, vLLM's ngram
speculation, an EAGLE-3 or Medusa head exported by `verispec export-head`, or the
`speculative_config` of a `verispec profile --vllm-config` file.

vLLM pins its own torch and transformers, so it runs in the venv `make vllm-env` makes, as a
long-lived subprocess (`verispec.peers.vllm_worker`) holding one engine per method, fed the
same prompt token ids, budget and EOS ids as every other method. `VllmRunner` serves one
request at a time; its clock is the same `Clock`, end to end around the request (the pipe
adds well under a millisecond); tokens per round come from the drafts vLLM's proposer
returned. `VllmBatchServer` serves the concurrency sweep's closed loop (`verispec.bench.closed_loop.Server`)
with vLLM's own continuous batching: requests join between engine steps, each step is one
pipe round trip, timed on the sweep's clock. Greedy only, as
for llama.cpp, and the target must be a checkpoint directory vLLM can read (for a GGUF target,
verispec's float32 conversion of it).

A peer, not a verispec method: vLLM computes with its own kernels, so its greedy output may
part from verispec-plain's where the two round a close choice differently (`Outcome.peer`).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from verispec.peers.outcome import Clock, Outcome, Served
from verispec.sampling import SamplingParams
from verispec.stats import Stats
from verispec.tree_shape import describe_plan

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel

VENV_PYTHON = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
WORKER = Path(__file__).resolve().with_name("vllm_worker.py")


@dataclass(frozen=True)
class VllmMethod:
    """What a vLLM engine is made for (a bench `Method` of family vllm has the same fields).
    name: for messages. proposer: None (plain decoding), "ngram", "eagle3:DIR", "medusa:DIR" or
    "config:FILE". k: the draft length (None: the Medusa head's own, or the file's schedule)."""

    name: str
    proposer: str | None = None
    k: int | None = None


def speculative_config(method: VllmMethod) -> dict | None:
    """vLLM's `speculative_config` for `method`; None for plain decoding."""
    if method.proposer is None:
        return None
    if method.proposer == "ngram":
        return {"method": "ngram", "num_speculative_tokens": method.k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    kind, _, directory = method.proposer.partition(":")
    if kind == "config":
        return profiled_config(method, Path(directory))
    config = Path(directory) / "config.json"
    if not config.is_file():
        raise ValueError(f"method {method.name!r}: {directory} has no config.json; export a head there with `verispec export-head`")
    if kind == "medusa":
        return {"method": "medusa", "model": str(Path(directory).resolve()), "num_speculative_tokens": json.loads(config.read_text())["num_heads"]}
    return {"method": "eagle3", "model": str(Path(directory).resolve()), "num_speculative_tokens": method.k}


def profiled_config(method: VllmMethod, path: Path) -> dict:
    """The `speculative_config` of a `verispec profile --vllm-config` file, as written (its k per
    batch size), or at the method's fixed k with the schedule dropped."""
    try:
        written = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"method {method.name!r}: cannot read {path} as JSON ({error}); write it with `verispec profile --vllm-config`") from None
    if not isinstance(written, dict) or "speculative_config" not in written:
        raise ValueError(f"method {method.name!r}: {path} has no speculative_config; write it with `verispec profile --vllm-config`")
    config = written["speculative_config"]
    if config is None:
        raise ValueError(f"method {method.name!r}: {path} says to serve without speculation (no k beat plain decoding there); use vllm-plain")
    if method.k is None:
        return config
    fixed = {key: value for key, value in config.items() if key != "num_speculative_tokens_per_batch_size"}
    return fixed | {"num_speculative_tokens": method.k}


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
    from verispec.models.loading.sources import converted_dir

    source = Path(target.source)
    directory = converted_dir(source) if source.suffix == ".gguf" else source
    if not (directory / "config.json").is_file():
        raise ValueError(f"vLLM needs the target as a checkpoint directory; {source} gives none (no {directory / 'config.json'})")
    return directory


class VllmRunner:
    """One vLLM engine for `method` on `target`, in a worker process of vLLM's venv; call it as
    any runner. max_num_seqs: the most requests its engine batches (`VllmBatchServer`).
    `close` ends the worker (it also ends when the runner is collected)."""

    def __init__(self, method: VllmMethod, target: LoadedModel, python: Path = VENV_PYTHON, eager: bool = True,
                 max_model_len: int = 2048, max_num_seqs: int = 1,
                 spawn: Callable[..., subprocess.Popen] = subprocess.Popen) -> None:
        self.method = method
        self.eos_token_ids = list(target.eos_token_ids)
        # read (and refused) before a worker starts, which would otherwise report the refusal's
        # closed pipe with a traceback of its own
        setup = {"target": str(checkpoint_directory(target)), "dtype": str(target.dtype).removeprefix("torch."),
                 "eager": eager, "seed": 0, "max_model_len": max_model_len, "max_num_seqs": max_num_seqs,
                 "speculative_config": speculative_config(method)}
        # -P: the worker's own directory (which holds this module, vllm.py) must not shadow vLLM
        self.process = spawn([str(python), "-P", str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._send(setup)
        self.max_num_seqs = max_num_seqs
        ready = self._receive()
        self.engine = {"vllm": ready.get("vllm"), "patches": ready.get("patches", [])}

    def __call__(
        self, prompt_ids: Sequence[int], max_new_tokens: int, on_token: Callable[[int], None] | None = None
    ) -> Outcome:
        from verispec.peers.vllm_worker import rounds

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


class VllmBatchServer:
    """The closed loop's server (`verispec.bench.closed_loop.Server`) on a runner's engine: vLLM's continuous
    batching, up to `slots` requests in flight (at most the engine's max_num_seqs). `submit`
    adds a request to the engine; `step` runs one engine step (one target forward over every
    request in flight, its drafts verified in it) and reads each request's new tokens, timed on
    `clock` when the step's answer arrives. A request's stats: one round per step that emitted
    its tokens (the prefill's first), its drafts and accepted tokens as vLLM's scheduler counted
    them (its plans: the k vLLM drafted each round). Several servers may share one runner (one per concurrency level); its owner closes it."""

    def __init__(self, runner: VllmRunner, slots: int, clock: Callable[[], float] = time.perf_counter) -> None:
        if not 1 <= slots <= runner.max_num_seqs:
            raise ValueError(f"{runner.method.name}: {slots} requests in flight, but its engine batches at most {runner.max_num_seqs}")
        self.runner, self.slots, self.clock = runner, slots, clock
        self.eos_token_ids = runner.eos_token_ids
        self.peer = f"vLLM {runner.engine['vllm']}, its continuous batching (its own kernels)"
        self.requests: dict[int, dict] = {}  # key -> tokens, stats, times

    @property
    def in_flight(self) -> int:
        return len(self.requests)

    def submit(self, key: int, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
        if len(self.requests) >= self.slots:
            raise ValueError(f"{self.slots} requests are in flight already; wait for one to finish")
        self.requests[key] = {"tokens": [], "stats": Stats(), "submitted": self.clock(), "first": None}
        self.runner._send({"add": key, "prompt": [int(t) for t in prompt_ids], "max_tokens": max_new_tokens,
                           "stop": self.eos_token_ids})

    def step(self) -> list[Served]:
        self.runner._send({"step": True})
        answer = self.runner._receive()
        now = self.clock()
        verified = {key: (drafted, accepted) for key, drafted, accepted in answer["verified"]}
        served = []
        for output in answer["outputs"]:
            request = self.requests[output["key"]]
            tokens = output["tokens"]
            if tokens:
                drafted, accepted = verified.get(output["key"], (0, 0))
                request["stats"].record(drafted, accepted, len(tokens), plan=describe_plan(drafted))
                request["tokens"] += tokens
                request["first"] = request["first"] if request["first"] is not None else now
            if output["finished"]:
                del self.requests[output["key"]]
                served.append(Served(output["key"], request["tokens"], request["submitted"], request["first"], now,
                                     request["stats"], self.peer))
        return served
