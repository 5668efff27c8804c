"""Head directories: `config.json` (a `HeadConfig`) and `model.safetensors` (the head's saved
state, d2t included). `--proposer eagle:DIR` and `medusa:DIR` load them with `load_head`.

The target's frozen parts (its embedding, its output rows for the head vocabulary) are not
saved: the head is built around the target it runs with, and refuses a target whose shape
differs from the one it was trained for.

    >>> head = new_head(config, d2t, target)           # fresh weights, for training
    >>> save_head(head, "out/eagle")
    >>> head = load_head("out/eagle", target)          # EagleHead or MedusaHead, eval mode
    >>> proposer = EagleProposer(for_drafting(head), target)   # its projections prepacked
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from verispec.head_kind import HeadKind
from verispec.heads.config import HeadConfig, TargetInfo
from verispec.heads.drafting_layer import DraftingLayer
from verispec.heads.eagle import EagleHead, FrozenRows
from verispec.heads.eagle3 import Eagle3Head
from verispec.heads.medusa import MedusaHead
from verispec.models.base import FeatureChannel
from verispec.models.formats.linear import DenseLinear, Int8Linear, PackedLinear, packed_linears, projection

CONFIG = "config.json"
WEIGHTS = "model.safetensors"

Head = EagleHead | Eagle3Head | MedusaHead


def target_info(target: FeatureChannel, name: str) -> TargetInfo:
    """What a head records about the target it is trained for."""
    vocab_size = int(target.input_embeddings().shape[0])
    return TargetInfo(name=name, vocab_size=vocab_size, hidden_size=target.hidden_size, num_layers=target.num_layers)


def check_target(config: HeadConfig, target: object) -> None:
    """Refuse a target without a feature channel, or of another shape than the head's."""
    if not isinstance(target, FeatureChannel):
        raise ValueError(
            f"{type(target).__name__} has no feature channel (FeatureChannel), which a {config.kind} head "
            "reads; use the fast Llama runtime (LlamaRuntime), a Hugging Face model (HFCausalLM) or a table model"
        )
    trained = config.target
    vocab_size = int(target.input_embeddings().shape[0])
    actual = {"vocab_size": vocab_size, "hidden_size": target.hidden_size, "num_layers": target.num_layers}
    wrong = [f"{key} {value} (the head's target has {getattr(trained, key)})"
             for key, value in actual.items() if value != getattr(trained, key)]
    if wrong:
        raise ValueError(
            f"this {config.kind} head was trained for {trained.name!r}, a different target: this one has "
            f"{', '.join(wrong)}; train a head for this model with `verispec train`"
        )


def new_head(config: HeadConfig, d2t: torch.Tensor, target: FeatureChannel) -> Head:
    """A head with fresh weights around `target`'s frozen embedding and output rows, on the
    target's device (where its features are: a GPU target's head drafts on that GPU)."""
    check_target(config, target)
    embedding = target.input_embeddings()
    output = None if config.trained_output else target.output_embeddings()
    if config.kind == HeadKind.EAGLE:
        head = EagleHead(config, d2t, embedding, output)
    elif config.kind == HeadKind.EAGLE3:  # its own output layer, started from the target's rows
        head = Eagle3Head(config, d2t, embedding, target.output_embeddings())
    else:
        head = MedusaHead(config, d2t, output)
    return head.to(embedding.device)


def save_head(head: Head, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write `config.json` and `model.safetensors` into `directory` (created if missing).
    dtype: store the floating weights in it (e.g. bfloat16 halves a float32 head's file;
    `load_head` casts them to the dtype it runs in); None keeps the head's."""
    if any(isinstance(module, (PackedLinear, DenseLinear, Int8Linear)) for module in head.modules()):
        raise ValueError("this head is packed for drafting (for_drafting) and holds no weights to save; save it as loaded or trained")
    state = {
        name: (tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor).detach().contiguous()
        for name, tensor in head.state_dict().items()
    }
    return write_head(head.config, state, directory)


def write_head(config: HeadConfig, state: dict[str, torch.Tensor], directory: str | Path) -> Path:
    """Write `config` and a saved `state` (d2t included, as `read_weights` returns it) into
    `directory` (created if missing)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG).write_text(json.dumps(config.to_json(), indent=2) + "\n")
    save_file(state, directory / WEIGHTS, metadata={"format": "pt"})
    return directory


def read_config(directory: str | Path) -> HeadConfig:
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise ValueError(f"{directory} is not a head directory: it has no {CONFIG}; pass the --out DIR of `verispec train`")
    try:
        return HeadConfig.from_json(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, KeyError) as error:
        raise ValueError(f"{path} is not a valid head config: {error}") from None


def read_weights(directory: str | Path) -> dict[str, torch.Tensor]:
    """The state saved in `directory`'s `model.safetensors`, d2t (the head vocabulary) included."""
    path = Path(directory) / WEIGHTS
    if not path.is_file():
        raise ValueError(f"{directory} has a head config but no {WEIGHTS}")
    try:
        state = load_file(path)
    except SafetensorError as error:
        raise ValueError(
            f"{path} is not a readable safetensors file ({error}); write the head again with `verispec train --out`"
        ) from None
    if "d2t" not in state:
        raise ValueError(f"{path} has no d2t (the head vocabulary)")
    # An EAGLE head saved before heads could stack layers named its one decoder layer `layer`.
    return {(f"layers.0.{name[6:]}" if name.startswith("layer.") else name): tensor for name, tensor in state.items()}


def load_weights(head: Head, state: dict[str, torch.Tensor], source: str | Path, depth: int | None = None) -> Head:
    """Copy `state` (from `read_weights`) into `head`, cast to its dtype; every tensor must match.
    depth: `state` is that of an EAGLE head of that many decoder layers (at most the head's),
    copied into the first ones; the rest become the identity (`EagleHead.deepened_from`), so
    the head computes what the saved one did."""
    missing, unexpected = head.load_state_dict(state, strict=False)
    if depth is not None:  # the new layers' weights are not in `state`
        missing = [name for name in missing if not (name.startswith("layers.") and int(name.split(".")[1]) >= depth)]
    if missing or unexpected:
        raise ValueError(
            f"{source} does not match its config: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )
    if depth is not None:
        head.deepened_from(depth)
    return head


def load_head(directory: str | Path, target: FeatureChannel, dtype: torch.dtype = torch.float32) -> Head:
    """The head saved in `directory`, built around `target`, in `dtype`, in eval mode."""
    config = read_config(directory)
    state = read_weights(directory)
    head = new_head(config, state["d2t"], target).to(dtype)
    return _frozen(load_weights(head, state, Path(directory) / WEIGHTS))


def for_drafting(head: Head, weight_format: str = "float") -> Head:
    """`head` (loaded, frozen) with its projections packed for drafting, in place: every
    linear layer and the target's output rows for the head vocabulary, in `weight_format`
    (`models.formats.linear.projection`), and an EAGLE head's decoder layers rebuilt as
    `DraftingLayer`s (fused projections, precomputed rotary tables).

    "float" prepacks the head's own weights: the same function, up to the order in which the
    products sum. Unpacked, most of a step is `F.linear` reordering bfloat16 weights (and the
    fusion layer's 3-D input copying its weight) on every call (docs/results/implementation-choices.md).
    "int8" quantizes every projection per output channel (`Int8Linear`): another q, half the
    bytes to read (`proposers.trained.auto_head_format` says what it gains). Drafting only: the
    packed head cannot train, and `save_head` refuses it."""
    if isinstance(head, Eagle3Head):
        return head.for_drafting(weight_format)
    if isinstance(head, EagleHead):
        head.layers = nn.ModuleList(DraftingLayer(layer, head.layer_config, weight_format) for layer in head.layers)
    packed_linears(head, weight_format)
    if isinstance(head.output, FrozenRows):
        head.output = projection(head.output.rows, None, weight_format)
    return head


def _frozen(head: nn.Module) -> Head:
    head.requires_grad_(False)
    return head.eval()
