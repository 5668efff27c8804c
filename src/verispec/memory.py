"""What a request costs in memory: weights, KV cache, peak resident set.

Bytes are counted from the tensors themselves, each storage once (a head that reads the
target's embedding adds nothing for it), so the numbers follow whatever format a load chose
(fp32, bf16, the GGUF's 4-bit blocks, an int8 head).

    >>> report = memory_report(model.lm, proposer, slots=8, context=1024)
    >>> report["target_weight_bytes"], report["kv_bytes_per_token"], report["peak_rss_bytes"]
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable

import torch
from torch import nn

_SCALARS = (str, bytes, int, float, bool, type(None))


def tensor_bytes(*roots: object, exclude: Iterable[object] = ()) -> int:
    """Bytes of every tensor storage reachable from `roots` through attributes, containers
    and modules, each storage once, leaving out those reachable from `exclude`."""
    seen = _storages(exclude)
    return sum(size for key, size in _storages(roots).items() if key not in seen)


def _storages(roots: Iterable[object]) -> dict[int, int]:
    """{storage address (an opaque tensor: minus its id): bytes} of every tensor reachable."""
    found: dict[int, int] = {}
    visited: set[int] = set()
    todo = list(roots)
    while todo:
        obj = todo.pop()
        if isinstance(obj, _SCALARS) or id(obj) in visited:
            continue
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            try:
                storage = obj.untyped_storage()
                found[storage.data_ptr()] = storage.nbytes()
            except NotImplementedError:  # a packed (opaque) weight: no storage to share
                found[-id(obj)] = obj.numel() * obj.element_size()
        elif isinstance(obj, nn.Module):
            todo.extend(obj.parameters(recurse=False))
            todo.extend(obj.buffers(recurse=False))
            todo.extend(obj.children())
            todo.extend(vars(obj).values())
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            todo.extend(vars(obj).values())
        elif hasattr(obj, "__slots__"):
            todo.extend(getattr(obj, name) for name in obj.__slots__ if hasattr(obj, name))
    return found


def kv_bytes_per_token(lm: object) -> int | None:
    """KV-cache bytes one position takes in every layer of `lm` (None where unknown)."""
    measure = getattr(lm, "kv_bytes_per_token", None)
    if callable(measure):
        return int(measure())
    config = getattr(getattr(lm, "model", None), "config", None)
    if config is None:
        return None
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    itemsize = lm.model.get_input_embeddings().weight.element_size()
    return int(config.num_hidden_layers * 2 * kv_heads * head_dim * itemsize)


def peak_rss_bytes() -> int:
    """The process's peak resident set so far (kilobytes on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def memory_report(target: object, proposer: object | None = None, *, slots: int = 1, context: int = 0) -> dict:
    """target_weight_bytes; proposer_bytes (its weights and caches beyond the target's);
    kv_bytes_per_token; kv_bytes_per_slot at `context` positions and for `slots` slots;
    peak_rss_bytes."""
    per_token = kv_bytes_per_token(target)
    weights_of = getattr(target, "model", target)
    report = {
        "target_weight_bytes": tensor_bytes(weights_of, exclude=[getattr(target, "cache", None)]),
        "proposer_bytes": tensor_bytes(proposer, exclude=[target, weights_of]) if proposer is not None else 0,
        "kv_bytes_per_token": per_token,
        "kv_bytes_per_slot": None if per_token is None else per_token * context,
        "kv_bytes_all_slots": None if per_token is None else per_token * context * slots,
        "context_tokens": context,
        "slots": slots,
        "peak_rss_bytes": peak_rss_bytes(),
    }
    return report
