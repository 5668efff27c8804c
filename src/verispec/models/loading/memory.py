"""What a request costs in memory: weights, KV cache, peak resident set.

Bytes are counted from the tensors themselves, each storage once (a head that reads the
target's embedding adds nothing for it), so the numbers follow whatever format a load chose
(fp32, bf16, the GGUF's 4-bit blocks, an int8 head).

    >>> report = memory_report(model.lm, proposer, slots=8, context=1024)   # verispec.models.loading.memory
    >>> report["target_weight_bytes"], report["kv_bytes_per_token"], report["peak_rss_bytes"]
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable
from types import ModuleType

import torch
from torch import nn

_SCALARS = (str, bytes, int, float, bool, type(None))


def tensor_bytes(*roots: object, exclude: Iterable[object] = ()) -> int:
    """Bytes of every tensor storage reachable from `roots` through attributes, containers
    and modules, each storage once, leaving out those reachable from `exclude`; a model held
    outside torch that counts its own weights (`weight_bytes()`) counts as those bytes. Python
    modules an object refers to are not walked."""
    seen = _storages(exclude)
    return sum(size for key, size in _storages(roots).items() if key not in seen)


def _storages(roots: Iterable[object]) -> dict[int, int]:
    """{storage key (`storage_of`): bytes} of every tensor reachable."""
    found: dict[int, int] = {}
    visited: set[int] = set()
    todo = list(roots)
    while todo:
        obj = todo.pop()
        if isinstance(obj, _SCALARS) or isinstance(obj, ModuleType) or id(obj) in visited:
            continue
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            key, size = storage_of(obj)
            found[key] = size
        elif callable(getattr(obj, "weight_bytes", None)):  # a model that counts its own (`LlamaCppLM`)
            found[-id(obj)] = int(obj.weight_bytes())
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


def weight_bytes(lm: object) -> int | None:
    """Bytes of the weights `lm` holds in memory, each tensor counted once (a tied head is the
    embedding), whatever their layout (prepacked, int4-packed, float): a transformers adapter's
    (`HFCausalLM`) parameters and buffers, the fast runtime's (`LlamaRuntime`) embedding, norms,
    projections and head; what a model that counts its own says (`LlamaCppLM.weight_bytes`);
    None for a model of another kind."""
    measure = getattr(lm, "weight_bytes", None)
    if callable(measure):
        return int(measure())
    model = getattr(lm, "model", None)
    if isinstance(model, nn.Module):
        tensors = [*model.parameters(), *model.buffers()]
    elif all(hasattr(lm, name) for name in ("embed", "layers", "head", "head_linear")):
        modules = [lm.head, *(p for layer in lm.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down))]
        tensors = [lm.embed, lm.norm, lm.head_linear.weight, *(t for layer in lm.layers for t in (layer.attn_norm, layer.mlp_norm))]
        for module in modules:
            tensors += [*module.buffers(), *(v for v in vars(module).values() if isinstance(v, torch.Tensor))]
    else:
        return None
    return sum(dict(storage_of(tensor) for tensor in tensors).values())


def storage_of(tensor: torch.Tensor) -> tuple[int, int]:
    """(a key shared by every view of the same memory, its bytes); a prepacked (mkldnn) weight
    has no storage to share and counts as itself."""
    if tensor.is_mkldnn:
        return -id(tensor), tensor.nbytes
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


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
    """target_weight_bytes (`weight_bytes`); proposer_bytes (its weights and caches beyond the
    target's, whatever it holds);
    kv_bytes_per_token; kv_bytes_per_slot at `context` positions and for `slots` slots;
    peak_rss_bytes."""
    per_token = kv_bytes_per_token(target)
    report = {
        "target_weight_bytes": weight_bytes(target),
        "proposer_bytes": tensor_bytes(proposer, exclude=[target, getattr(target, "model", None)]) if proposer else 0,
        "kv_bytes_per_token": per_token,
        "kv_bytes_per_slot": None if per_token is None else per_token * context,
        "kv_bytes_all_slots": None if per_token is None else per_token * context * slots,
        "context_tokens": context,
        "slots": slots,
        "peak_rss_bytes": peak_rss_bytes(),
    }
    return report
