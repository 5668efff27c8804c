"""The measurement protocol (the seed lesson's): warm up, interleave, rotate, repeat, check.

- Warm-up: every method runs `warmup` times on the first prompt first; those runs are dropped
  (first calls pay for allocations and lazy initialisation).
- For each repeat and each prompt, every method runs once, one after another, so all methods
  see the same machine state within a few seconds of each other (interleaved, not one method's
  whole sweep after another's). The order rotates by one position per prompt and per repeat,
  so no method always runs first (right after a switch of prompt) or last.
- Each run is checked against verispec-plain's output for the same prompt and repeat; a
  mismatch carries its diagnosis (`identity.diagnose`). A peer runtime's run (`Outcome.peer`,
  e.g. llama.cpp on the GGUF's quantized blocks) is checked too, but its differences are its
  own arithmetic, not exactness failures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from verispec.identity import diagnose
from verispec.machine import peak_rss_mb
from verispec.peers.outcome import Outcome
from verispec.bench.methods import PLAIN
from verispec.bench.runners import Runner
from verispec.bench.workloads import Workload
from verispec.stats import Stats


@dataclass(frozen=True)
class Protocol:
    max_new_tokens: int
    repeats: int = 1
    warmup: int = 1

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {self.repeats}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")


def rotated(names: Sequence[str], shift: int) -> list[str]:
    """names rotated left by `shift`: rotated([a, b, c], 1) == [b, c, a]."""
    shift %= len(names)
    return [*names[shift:], *names[:shift]]


def run_count(protocol: Protocol, n_methods: int, n_prompts: int) -> int:
    """Requests the benchmark makes, warm-up included (for the progress bar)."""
    return n_methods * (protocol.warmup + protocol.repeats * n_prompts)


def run_benchmark(
    runners: dict[str, Runner],
    prompts: Sequence[tuple[Workload, list[int]]],
    protocol: Protocol,
    score: Callable[[list[int]], torch.Tensor],
    dtype: str,
    progress: Callable[[str], None] = lambda _: None,
    identity: bool = True,
) -> list[dict]:
    """Run every method on every prompt `repeats` times; one record per measured run.

    runners: method name -> runner, verispec-plain among them. prompts: (workload, token ids).
    score(ids) -> logits[len(ids), V]: the target's full forward, for mismatch diagnoses.
    progress(label) is called after each request. identity: compare every output with
    verispec-plain's (greedy decoding); sampled outputs differ by design and are not compared.
    """
    if PLAIN not in runners:
        raise ValueError(f"{PLAIN} is the baseline of every comparison; include it in the methods")
    if not prompts:
        raise ValueError("no prompts to run; check --prompts, --categories and --limit-per-category")
    names = list(runners)
    first_ids = prompts[0][1]
    for _ in range(protocol.warmup):
        for name in names:
            runners[name](first_ids, protocol.max_new_tokens)
            progress(f"warm-up {name}")
    records = []
    for repeat in range(protocol.repeats):
        for index, (workload, ids) in enumerate(prompts):
            outcomes: dict[str, tuple[int, Outcome, float]] = {}
            for position, name in enumerate(rotated(names, repeat + index)):
                outcome = runners[name](ids, protocol.max_new_tokens)
                outcomes[name] = (position, outcome, peak_rss_mb())
                progress(f"{name} on {workload.category}/{workload.id}")
            reference = outcomes[PLAIN][1].tokens
            for name in names:
                position, outcome, rss = outcomes[name]
                mismatch = diagnose(ids, reference, outcome.tokens, score, dtype, peer=outcome.peer) if identity else None
                records.append(
                    record(name, workload, ids, repeat, position, outcome, rss, mismatch, identity)
                )
    return records


def record(
    method: str,
    workload: Workload,
    prompt_ids: Sequence[int],
    repeat: int,
    position: int,
    outcome: Outcome,
    peak_rss: float,
    mismatch: dict | None,
    compared: bool = True,
) -> dict:
    """One line of runs.jsonl.

    Times are seconds. tokens_per_second: new tokens / wall time (the primary number).
    first_token_seconds: until the first new token(s) arrived (prefill + first round);
    decode_tokens_per_second: the tokens after those / the time after them. tokens_per_round:
    new tokens per target forward after the prompt's (accepted + 1). The verispec engine's own
    counters and time split are in `engine` (None for HF methods). matches_plain: None when
    the output was not compared (sampled decoding). peer: `Outcome.peer` (None: the run must
    equal plain decoding).
    """
    new = len(outcome.tokens)
    decode_seconds = outcome.wall_seconds - outcome.first_token_seconds
    decode_tokens = new - outcome.first_tokens
    return {
        "method": method,
        "prompt_id": workload.id,
        "category": workload.category,
        "repeat": repeat,
        "order": position,
        "prompt_tokens": len(prompt_ids),
        "new_tokens": new,
        "wall_seconds": outcome.wall_seconds,
        "tokens_per_second": new / outcome.wall_seconds if outcome.wall_seconds > 0 else 0.0,
        "first_token_seconds": outcome.first_token_seconds,
        "decode_seconds": decode_seconds,
        "decode_tokens_per_second": decode_tokens / decode_seconds if decode_seconds > 0 else None,
        "rounds": len(outcome.tokens_per_round),
        "tokens_per_round": outcome.tokens_per_round,
        "mean_tokens_per_round": new / len(outcome.tokens_per_round) if outcome.tokens_per_round else 0.0,
        "engine": engine_fields(outcome.stats),
        "peak_rss_mb": peak_rss,
        "matches_plain": mismatch is None if compared else None,
        "mismatch": mismatch,
        "peer": outcome.peer,
        "tokens": outcome.tokens,
    }


def engine_fields(stats: Stats | None) -> dict | None:
    """The engine's counters: per-round drafted/accepted and target seconds, per-position
    acceptance, time split.

    prefill_seconds covers the prompt but its last token (the pending token goes into round
    1); target_seconds is the verification forwards; overhead_seconds the rule and rollback.
    """
    if stats is None:
        return None
    return {
        **stats.as_dict(),
        "drafted_per_round": stats.drafted,
        "accepted_per_round": stats.accepted,
        "target_seconds_per_round": stats.round_target_seconds,
        "position_acceptance": [
            accepts / attempts if attempts else None
            for accepts, attempts in zip(stats.position_accepts, stats.position_attempts)
        ],
    }
