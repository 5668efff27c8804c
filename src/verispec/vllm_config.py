"""The `speculative_config` vLLM should serve a model and proposer with, from verispec's own
measurements on this machine (`verispec profile --vllm-config OUT.json`).

    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                            "prompt_lookup_min": 1, "prompt_lookup_max": 3,
                            "num_speculative_tokens_per_batch_size": [[1, 3, 3], [4, 7, 2], [8, 64, 0]]},
     "verispec": {"k_per_batch_size": {"1": 3, "2": 3, ...}, "measured": {...}}}

`speculative_config` holds only fields of vLLM 0.32's `SpeculativeConfig`: the method the
profiled proposer is in vLLM (`drafter`), `num_speculative_tokens` (the cost model's best k
for one request, from v(n), c and the survival measured here) and
`num_speculative_tokens_per_batch_size`, vLLM's batch-size schedule: inclusive ranges
(first, last, k), from the k `BatchK` gives each of b identical requests on the measured
batched forward, for every b from 2 up to the rows measured, never above the best k (vLLM
clamps the schedule to `num_speculative_tokens`); at batch size 1, the best k itself. vLLM
carries the last range's k to every larger batch, and a k of 0 turns speculation off there:
the batch size where verispec stops drafting is where vLLM stops too. Where no k beats plain decoding for one request,
`speculative_config` is null: serve without speculation.

`verispec` keeps what the schedule came from: k per batch size and the measurement (model,
dtype, CPU and its relevant flags, v(n), c, survival, batched v(n), date, verispec version).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from verispec.cost import BatchCosts, optimal_k
from verispec.machine import cpu_flags as machine_cpu_flags, cpuinfo
from verispec.profile import Profile, k_per_batch_size
from verispec.registry import ProposerSpec

# The CPU flags vLLM's CPU kernels (and verispec's) choose paths by.
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "asimd", "sve", "bf16")
MAPPED = "lookup (vLLM ngram), eagle3 (a speculators export), medusa (a vllm-medusa export) or draft:DIR"


def drafter(spec: ProposerSpec, vllm_head: Path | None = None) -> dict:
    """vLLM's method (and model) for a verispec proposer spec, checked before any measurement:
    lookup -> ngram with its n-gram sizes (1 to 3); eagle3:DIR -> eagle3 with DIR when it is a
    speculators export (else `vllm_head`, the export of the profiled head); medusa[:DIR] ->
    medusa with `vllm_head`, its `--format vllm-medusa` export; draft:DIR -> draft_model."""
    from verispec.heads.export import is_speculators

    kind = spec.kind.name
    if vllm_head is not None and kind not in ("eagle3", "medusa"):
        raise ValueError(f"--vllm-head names an exported head; proposer {kind} has none: drop it")
    if kind == "lookup":
        return {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    if kind == "draft":
        if not (Path(spec.options) / "config.json").is_file():
            raise ValueError(f"vLLM's draft_model reads a checkpoint directory; {spec.options} is none (no config.json)")
        return {"method": "draft_model", "model": str(Path(spec.options).resolve())}
    if kind == "eagle3":
        head = vllm_head or (Path(spec.options.directory) if spec.options.directory else None)
        if head is None or not is_speculators(head):
            raise ValueError(
                f"vLLM's eagle3 reads a speculators export: export the head (`verispec export-head DIR --format "
                f"speculators --out E`), then profile --proposer eagle3:E, or give --vllm-head E; "
                f"{head or 'eagle3 without DIR'} is no such export"
            )
        return {"method": "eagle3", "model": str(head.resolve())}
    if kind == "medusa":
        config = vllm_head / "config.json" if vllm_head is not None else None
        if config is None or not config.is_file() or "num_heads" not in json.loads(config.read_text()):
            raise ValueError(
                "vLLM's medusa reads a vllm-medusa export of the profiled head: give --vllm-head E after "
                f"`verispec export-head DIR --format vllm-medusa --out E`{f'; {vllm_head} is none' if vllm_head else ''}"
            )
        return {"method": "medusa", "model": str(vllm_head.resolve())}
    raise ValueError(f"vLLM has no method for proposer {kind}; --vllm-config takes {MAPPED}")


def batch_schedule(k_by_size: dict[int, int]) -> list[list[int]]:
    """vLLM's `num_speculative_tokens_per_batch_size` from k at batch sizes 1, 2, .. (each k
    holding up to the next size given): inclusive [first, last, k] ranges, equal neighbours
    merged.

    >>> batch_schedule({1: 3, 2: 3, 3: 2, 4: 0, 5: 0})
    [[1, 2, 3], [3, 3, 2], [4, 5, 0]]
    """
    sizes = sorted(k_by_size)
    if not sizes or sizes[0] != 1:
        raise ValueError(f"a batch schedule starts at batch size 1, got sizes {sizes}")
    ends = [*(b - 1 for b in sizes[1:]), sizes[-1]]
    ranges: list[list[int]] = []
    for first, last in zip(sizes, ends):
        if ranges and ranges[-1][2] == k_by_size[first]:
            ranges[-1][1] = last
        else:
            ranges.append([first, last, k_by_size[first]])
    return ranges


def cpu_flags() -> list[str]:
    """The `KERNEL_FLAGS` this CPU has, from /proc/cpuinfo."""
    present = machine_cpu_flags(cpuinfo())
    return [flag for flag in KERNEL_FLAGS if flag in present]


def vllm_config(profile: Profile, method: dict, today: datetime.date | None = None) -> dict:
    """The file's content for a profile with survival and batch costs (`verispec profile
    --batch-rows N`) and vLLM's `method` fields (`drafter`)."""
    if not profile.survival or not profile.batch:
        raise ValueError("a vLLM config needs the profile's survival and batch costs; measure both")
    rows, batch_v = profile.batch["rows"], profile.batch["v"]
    best = optimal_k(profile.c, profile.v, survival=profile.survival)
    planned = k_per_batch_size(BatchCosts(tuple(rows), tuple(batch_v)), profile.c, profile.survival, profile.k_max,
                               range(1, max(rows) + 1))
    dense = {int(b): best if b == "1" else min(k, best) for b, k in planned.items()}
    speculative = None
    if best:
        speculative = {**method, "num_speculative_tokens": best,
                       "num_speculative_tokens_per_batch_size": batch_schedule(dense)}
    return {
        "speculative_config": speculative,
        "verispec": {
            "k_per_batch_size": {str(b): k for b, k in dense.items()},
            "measured": {
                "model": profile.target,
                "proposer": profile.proposer,
                "dtype": profile.machine.get("dtype"),
                "runtime": profile.machine.get("runtime"),
                "cpu": profile.machine.get("cpu"),
                "cpu_flags": cpu_flags(),
                "logical_cpus": profile.machine.get("logical_cpus"),
                "torch_threads": profile.machine.get("torch_threads"),
                "context_tokens": profile.context_tokens,
                "v": profile.v,
                "c": profile.c,
                "survival": profile.survival,
                "batch_rows": rows,
                "batch_v": batch_v,
                "date": (today or datetime.date.today()).isoformat(),
                "verispec": profile.machine.get("verispec"),
            },
        },
    }


def write(path: str | Path, config: dict) -> None:
    Path(path).write_text(json.dumps(config, indent=2) + "\n")
