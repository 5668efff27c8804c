"""What a head is: the target it was trained for, the features it reads, its architecture.

A `HeadConfig` is the `config.json` of a head directory (see `verispec.heads.checkpoint`):

    {"format": "verispec-head", "version": 1, "kind": "eagle",
     "target": {"name": "smollm2-135m-instruct", "vocab_size": 49152, "hidden_size": 576,
                "num_layers": 30},
     "feature_layers": ["final"],            # EAGLE-3 style: e.g. [2, 15, 27]
     "vocab_size": 8192,                     # N, the pruned head vocabulary (d2t)
     "trained_output": false,                # false: the target's output rows, frozen
     "layer": {"num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
               "rms_norm_eps": 1e-05, "rope_theta": 100000.0, "hidden_act": "silu"},
     "depth": 1,                             # EAGLE only: how many such decoder layers
     "heads": 4,                             # Medusa only: the number of heads K
     "training": {...}}                      # free-form record: command, data, minutes, seed
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from verispec.checks import is_int
from verispec.head_kind import HeadKind, head_kind
from verispec.models.base import FINAL, Tap, check_taps

FORMAT = "verispec-head"
VERSION = 1


@dataclass(frozen=True)
class TargetInfo:
    """The target a head was trained for; a head refuses any target that differs in shape."""

    name: str
    vocab_size: int  # V
    hidden_size: int  # H
    num_layers: int  # L


@dataclass(frozen=True)
class HeadConfig:
    """kind: "eagle" (one decoder layer, autoregressive in feature space), "eagle3" (the
    standard EAGLE-3 layer, `verispec.heads.eagle3`; its `layer` may hold norm_before_residual) or "medusa" (K
    residual heads on one feature). feature_layers: the taps it reads (`FeatureChannel`), so
    its feature size is F = len(feature_layers) * H. vocab_size: N, the pruned head vocabulary.
    trained_output: whether the output layer [N, H] is trained (saved) or the target's rows
    for the N tokens (frozen, not saved). layer: the EAGLE decoder layer's LlamaConfig fields;
    depth: how many such layers the EAGLE head stacks (a config without it has one). heads:
    Medusa's K."""

    kind: HeadKind
    target: TargetInfo
    feature_layers: tuple[Tap, ...]
    vocab_size: int
    trained_output: bool = False
    layer: dict[str, Any] = field(default_factory=dict)
    depth: int = 1
    heads: int = 0
    training: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", head_kind(self.kind))
        object.__setattr__(self, "feature_layers", check_taps(self.feature_layers, self.target.num_layers))
        if not 1 <= self.vocab_size <= self.target.vocab_size:
            raise ValueError(f"head vocabulary N must lie in [1, {self.target.vocab_size}], got {self.vocab_size}")
        if self.kind == HeadKind.MEDUSA and (self.heads < 1 or self.layer):
            raise ValueError(f"a Medusa head needs heads K >= 1 and no decoder layer, got K = {self.heads}, layer {self.layer}")
        if self.kind in (HeadKind.EAGLE, HeadKind.EAGLE3) and (self.heads or not self.layer):
            raise ValueError(f"an EAGLE head needs a decoder layer and no Medusa heads, got layer {self.layer}, K = {self.heads}")
        if self.kind == HeadKind.EAGLE3 and (self.depth != 1 or not self.trained_output):
            raise ValueError(f"an EAGLE-3 head has one decoder layer and its own output layer, got depth {self.depth}, trained_output {self.trained_output}")
        if not is_int(self.depth, least=1) or (self.kind == HeadKind.MEDUSA and self.depth != 1):
            raise ValueError(f"depth is an EAGLE head's number of decoder layers, at least 1 (1 for Medusa), got {self.depth!r}")

    @property
    def hidden_size(self) -> int:
        return self.target.hidden_size

    @property
    def feature_size(self) -> int:
        """F: the width of the concatenated features the head reads."""
        return len(self.feature_layers) * self.target.hidden_size

    def to_json(self) -> dict[str, Any]:
        data = {"format": FORMAT, "version": VERSION, **asdict(self)}
        data["feature_layers"] = list(self.feature_layers)
        if self.kind != HeadKind.MEDUSA:
            del data["heads"]
        else:
            del data["layer"], data["depth"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeadConfig:
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ValueError(
                f"not a {FORMAT} config of version {VERSION} (format {data.get('format')!r}, "
                f"version {data.get('version')!r}); save heads with verispec.heads.save_head"
            )
        fields = {k: v for k, v in data.items() if k not in ("format", "version")}
        fields["target"] = TargetInfo(**fields["target"])
        fields["feature_layers"] = tuple(fields["feature_layers"])
        return cls(**fields)


def default_layer(target_config: Any) -> dict[str, Any]:
    """EAGLE's decoder layer shaped like one of the target's (a transformers config)."""
    return {
        "num_attention_heads": target_config.num_attention_heads,
        "num_key_value_heads": getattr(target_config, "num_key_value_heads", target_config.num_attention_heads),
        "intermediate_size": target_config.intermediate_size,
        "rms_norm_eps": getattr(target_config, "rms_norm_eps", 1e-6),
        "rope_theta": (getattr(target_config, "rope_parameters", None) or {}).get("rope_theta", 10000.0),
        "hidden_act": getattr(target_config, "hidden_act", "silu"),
    }


def eagle3_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high taps for an L-layer target: its code keeps the residual
    stream entering 0-based layers 2, L // 2 and L - 3, i.e. the outputs of layer numbers 2,
    L // 2 and L - 3 counted from 1. A shallow target gets its distinct clamped values.

    >>> eagle3_layers(30), eagle3_layers(2)
    ((2, 15, 27), (1, 2))
    """
    return tuple(sorted({max(1, min(num_layers, n)) for n in (2, num_layers // 2, num_layers - 3)}))


__all__ = ["FINAL", "FORMAT", "HeadConfig", "TargetInfo", "default_layer", "eagle3_layers"]
