"""Weight averaging of heads: one head whose every weight is the weighted mean of the same
weight in several heads of one architecture and one vocabulary.

For heads that descend from one another, a head and the head fitting continued from it
(`verispec train --init`), this is weight-space ensembling (WiSE-FT, Wortsman et al.
2109.01903; model soups, 2203.05482), which can generalise past both heads: on the dev prompts
the mean of a shipped EAGLE head (tau 1.76) and its 500-step continuation (1.78) reached 1.80,
while a 1,000-step continuation (1.84) gained nothing from it (1.83); the README has the
table. Heads trained apart from fresh weights share no basin, and their mean need not draft
at all; the result is a head like any other, so acceptance, never exactness, is what
averaging can change.

    >>> config, state = average_heads(["heads/a", "heads/b"], [0.5, 0.5])
    >>> write_head(config, state, "heads/ab")    # what `verispec average-heads` does
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from verispec.heads.checkpoint import read_config, read_weights
from verispec.heads.config import HeadConfig


def check_weights(weights: Sequence[float], count: int) -> list[float]:
    """One positive weight per head, summing to 1 (to 1e-6), or a clear error: a mean is
    never renormalised for you."""
    weights = [float(w) for w in weights]
    if len(weights) != count:
        raise ValueError(f"give one weight per head: {count} heads, {len(weights)} weights")
    if any(not w > 0 for w in weights):
        raise ValueError(f"every weight must be positive, got {weights}")
    if abs(sum(weights) - 1) > 1e-6:
        raise ValueError(f"the weights must sum to 1, got {weights} (sum {sum(weights):.6g}); scale them yourself")
    return weights


def average_heads(
    directories: Sequence[str | Path], weights: Sequence[float] | None = None
) -> tuple[HeadConfig, dict[str, torch.Tensor]]:
    """The config and saved state (d2t included) of the weighted mean of the heads in
    `directories` (at least two; equal weights when None). Every head must have the first
    one's config (but its `training` record) and vocabulary d2t; each floating weight is
    averaged in float64 and stored in the first head's dtype. The config's `training` records
    each head's directory, weight and own training record under `averaged`."""
    if len(directories) < 2:
        raise ValueError(f"averaging needs at least two head directories, got {len(directories)}")
    weights = check_weights(weights if weights is not None else [1 / len(directories)] * len(directories), len(directories))
    configs = [read_config(directory) for directory in directories]
    states = [read_weights(directory) for directory in directories]
    first, first_state = configs[0], states[0]
    for directory, config, state in zip(directories[1:], configs[1:], states[1:]):
        mine, theirs = _architecture(config), _architecture(first)
        differs = [name for name in dict.fromkeys([*theirs, *mine]) if mine.get(name) != theirs.get(name)]
        if differs:
            raise ValueError(
                f"{directory} holds another kind of head than {directories[0]} ({', '.join(differs)} differ); "
                "average heads of one architecture, such as a head and the head `verispec train --init` continued from it"
            )
        if not torch.equal(state["d2t"], first_state["d2t"]):
            raise ValueError(
                f"{directory} has another head vocabulary (d2t) than {directories[0]}; average heads that share "
                "one, such as a head and the head `verispec train --init` continued from it (--init keeps d2t)"
            )
        if set(state) != set(first_state) or any(state[n].shape != first_state[n].shape for n in first_state):
            raise ValueError(f"{directory} holds other weights than {directories[0]} under the same config; re-save both")
    averaged = {}
    for name, tensor in first_state.items():
        if not tensor.is_floating_point():
            averaged[name] = tensor
            continue
        mean = sum(w * state[name].double() for w, state in zip(weights, states))
        averaged[name] = mean.to(tensor.dtype).contiguous()
    record = {"averaged": [
        {"directory": str(directory), "weight": weight, "training": config.training}
        for directory, weight, config in zip(directories, weights, configs)
    ]}
    return replace(first, training=record), averaged


def _architecture(config: HeadConfig) -> dict[str, object]:
    """Everything a config says but how the head was trained."""
    data = config.to_json()
    del data["training"]
    return data


__all__ = ["average_heads", "check_weights"]
