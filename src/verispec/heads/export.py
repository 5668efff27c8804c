"""Heads in the formats other engines load, and EAGLE-3 checkpoints made elsewhere read back.

- `write_speculators(head_dir, out)`: an EAGLE-3 head (`verispec train --head eagle3`) as
  speculators writes one (`speculators_model_type: "eagle3"`), which vLLM serves with
  `speculative_config={"method": "eagle3", "model": out}`. The weights keep their names; d2t
  becomes offsets, as EAGLE-3's reference code and vLLM store it (head index i drafts target
  token i + d2t[i]), and t2d marks the draft vocabulary over the target's (bool [V]).
- `read_speculators(dir, target)`: the reverse, for a Llama-family target with the same
  vocabulary: the `HeadConfig` and state that `Eagle3Head` loads (`load_eagle3`).
- `write_vllm_medusa(head_dir, out)`: a Medusa head in vLLM's Medusa format: the residual
  blocks renamed, one output layer shared by the heads (`original_lm_head`: verispec's heads
  share the target's frozen rows for the head vocabulary), and `token_map` = d2t.

A round trip is exact: `read_speculators(write_speculators(d))` gives `d`'s weights bit for
bit, so the head drafts the same tokens.

    >>> write_speculators("heads/e3", "out/e3-speculators")   # then vLLM: {"method": "eagle3", "model": ...}
    >>> head = load_eagle3("out/e3-speculators", target)      # an Eagle3Head, eval mode
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from verispec.head_kind import HeadKind
from verispec.heads.checkpoint import CONFIG, WEIGHTS, _frozen, check_target, load_head, load_weights, new_head, read_config, read_weights
from verispec.heads.config import FINAL, HeadConfig, TargetInfo
from verispec.heads.eagle3 import NORM_BEFORE_RESIDUAL, Eagle3Head
from verispec.models.base import FeatureChannel

SPECULATORS_VERSION = "0.9.0"
# The head's `layer` fields and the LlamaConfig fields speculators' transformer_layer_config holds.
LAYER_FIELDS = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps", "hidden_act")
# Variants of vLLM's EAGLE-3 that Eagle3Head does not compute: refused on import.
UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output", "attention_bias", "mlp_bias")


def write_speculators(head_dir: str | Path, out: str | Path, verifier: str | None = None, speculative_tokens: int = 3) -> Path:
    """Write the EAGLE-3 head in `head_dir` into `out` in speculators' format. verifier: the
    target's name or path recorded in the config (default: the name the head was trained for);
    speculative_tokens: the proposal length the config suggests (vLLM reads it when
    `num_speculative_tokens` is not given)."""
    config = read_config(head_dir)
    if config.kind != HeadKind.EAGLE3:
        raise ValueError(
            f"{head_dir} holds a head of kind {config.kind!r}; the speculators format takes an EAGLE-3 head "
            "(verispec train --head eagle3: the eagle head's layer has no vLLM counterpart); export a Medusa "
            "head with --format vllm-medusa"
        )
    if any(tap == FINAL for tap in config.feature_layers) or list(config.feature_layers) != sorted(config.feature_layers):
        raise ValueError(
            f"{head_dir} reads the taps {list(config.feature_layers)}; vLLM passes EAGLE-3 heads layer outputs in "
            "ascending order and never the final normed state: train with --taps eagle3"
        )
    state = read_weights(head_dir)
    d2t = state.pop("d2t")  # [N] target ids, ascending
    V, N = config.target.vocab_size, config.vocab_size
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[d2t] = True
    weights = {name: tensor.contiguous() for name, tensor in state.items()}
    weights["d2t"] = d2t - torch.arange(N)  # offsets: target id = i + d2t[i]
    weights["t2d"] = t2d
    dtype = next(t.dtype for t in state.values() if t.is_floating_point())
    layer = config.layer
    layer_config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": config.hidden_size, "num_hidden_layers": 1, "vocab_size": V,
        **{key: layer[key] for key in LAYER_FIELDS},
        "head_dim": config.hidden_size // layer["num_attention_heads"],
        "max_position_embeddings": int(layer.get("max_position_embeddings", 8192)),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(layer["rope_theta"])},
        "rope_theta": float(layer["rope_theta"]),
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
    }
    speculators_config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer_config,
        "draft_vocab_size": N,
        "norm_before_residual": bool(layer.get(NORM_BEFORE_RESIDUAL, False)),
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": list(config.feature_layers),
        "embed_requires_grad": False,
        "enable_sp_ulysses": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier or config.target.name, "architectures": ["LlamaForCausalLM"]},
        },
        "verispec": {"target": config.target.name, "training": {k: config.training[k] for k in ("command",) if k in config.training}},
    }
    return _write_new(out, speculators_config, weights)


def is_speculators(directory: str | Path) -> bool:
    """Whether `directory` holds a speculators-format config (rather than a verispec head's)."""
    path = Path(directory) / CONFIG
    try:
        return "speculators_model_type" in json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, TypeError):
        return False


def read_speculators(directory: str | Path, target: FeatureChannel) -> tuple[HeadConfig, dict[str, torch.Tensor]]:
    """The `HeadConfig` and state (d2t as ascending target ids) of the speculators-format
    EAGLE-3 checkpoint in `directory`, for `target`: its vocabulary and hidden size must be
    the checkpoint's; its taps are the checkpoint's `eagle_aux_hidden_state_layer_ids`, or
    vLLM's default for the target's depth (2, L // 2, L - 3)."""
    directory = Path(directory)
    try:
        data = json.loads((directory / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{directory / CONFIG} is not a readable config: {error}") from None
    if data.get("speculators_model_type") != "eagle3":
        raise ValueError(f"{directory} holds a speculators model of type {data.get('speculators_model_type')!r}, not eagle3")
    layer = data.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(f"{directory / CONFIG} has no transformer_layer_config")
    if layer.get("model_type", "llama") != "llama" or int(layer.get("num_hidden_layers", 1)) != 1:
        raise ValueError(
            f"{directory} holds a {layer.get('model_type')} EAGLE-3 head of {layer.get('num_hidden_layers')} layers; "
            "verispec reads a Llama-family head of one layer"
        )
    flags = [flag for flag in UNSUPPORTED_FLAGS if data.get(flag) or layer.get(flag)]
    if flags:
        raise ValueError(f"{directory} uses {', '.join(flags)}, a variant of EAGLE-3 that verispec's head does not compute")
    H = int(layer["hidden_size"])
    if data.get("target_hidden_size") not in (None, H):
        raise ValueError(f"{directory} reads a target of hidden size {data['target_hidden_size']}, its layer is {H} wide; verispec reads heads as wide as their target")
    V = int(target.input_embeddings().shape[0])
    if int(layer.get("vocab_size", V)) != V:
        raise ValueError(f"{directory} drafts for a vocabulary of {layer['vocab_size']} tokens, this target has {V}; use a head made for this model")
    if target.hidden_size != H:
        raise ValueError(f"{directory} reads a target of hidden size {H}, this one has {target.hidden_size}; use a head made for this model")
    if layer.get("head_dim") not in (None, H // int(layer["num_attention_heads"])):
        raise ValueError(f"{directory} has head_dim {layer['head_dim']}, not hidden_size / heads; verispec's head cannot read it")
    L = target.num_layers
    taps = data.get("eagle_aux_hidden_state_layer_ids") or (2, L // 2, L - 3)
    rope = layer.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"{directory} uses rope type {rope['rope_type']!r}; verispec's EAGLE-3 head reads default rope only")
    theta = rope.get("rope_theta", layer.get("rope_theta", 10000.0))
    fields = {key: layer[key] for key in LAYER_FIELDS if key in layer}
    fields.setdefault("num_key_value_heads", layer["num_attention_heads"])
    fields.setdefault("rms_norm_eps", 1e-6)
    fields.setdefault("hidden_act", "silu")
    name = ((data.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path") or "unknown"
    config = HeadConfig(
        "eagle3", TargetInfo(name=str(name), vocab_size=V, hidden_size=H, num_layers=L), tuple(int(t) for t in taps),
        vocab_size=int(data.get("draft_vocab_size") or V), trained_output=True,
        layer={**fields, "rope_theta": float(theta), "max_position_embeddings": int(layer.get("max_position_embeddings", 8192)),
               NORM_BEFORE_RESIDUAL: bool(data.get("norm_before_residual", False))},
        training={"imported": {"format": "speculators", "directory": str(directory)}},
    )
    return config, _speculators_state(directory, config, target)


def _speculators_state(directory: Path, config: HeadConfig, target: FeatureChannel) -> dict[str, torch.Tensor]:
    """The checkpoint's weights under `Eagle3Head`'s names, d2t as ascending ids (lm_head's rows
    permuted with it when the checkpoint's order differs)."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{directory} has a speculators config but no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            state.update(load_file(path))
        except SafetensorError as error:
            raise ValueError(f"{path} is not a readable safetensors file ({error})") from None
    state = {name.replace("midlayer.", "layers.0.").removeprefix("model."): tensor for name, tensor in state.items()}
    V, N = config.target.vocab_size, config.vocab_size
    embedding = state.pop("embed_tokens.weight", None)
    if embedding is not None and not torch.equal(embedding.to(target.input_embeddings().dtype), target.input_embeddings()):
        raise ValueError(f"{directory} carries its own token embedding, which differs from this target's; verispec's head reads the target's")
    t2d = state.pop("t2d", None)
    offsets = state.pop("d2t", None)
    ids = torch.arange(N) if offsets is None else torch.arange(N) + offsets.long()  # [N]
    if int(ids.min()) < 0 or int(ids.max()) >= V or ids.unique().numel() != N:
        raise ValueError(f"{directory}: d2t maps the draft vocabulary outside [0, {V}) or twice onto one token")
    if t2d is not None and (t2d.numel() != V or int(t2d.sum()) != N or not bool(t2d.bool()[ids].all())):
        raise ValueError(f"{directory}: t2d does not mark exactly the tokens d2t maps to")
    order = torch.argsort(ids)
    if "lm_head.weight" in state and not torch.equal(order, torch.arange(N)):
        state["lm_head.weight"] = state["lm_head.weight"][order]
    state["d2t"] = ids[order]
    return state


def load_eagle3(directory: str | Path, target: FeatureChannel, dtype: torch.dtype = torch.float32) -> Eagle3Head:
    """The EAGLE-3 head in `directory` (a verispec head directory or a speculators-format
    checkpoint) for `target`, in `dtype`, eval mode."""
    if not is_speculators(directory):
        head = load_head(directory, target, dtype)
        if not isinstance(head, Eagle3Head):
            raise ValueError(f"{directory} holds a head of kind {head.config.kind!r}, not an EAGLE-3 head; use {head.config.kind}:{directory}")
        return head
    config, state = read_speculators(directory, target)
    check_target(config, target)
    head = new_head(config, state["d2t"], target).to(dtype)
    return _frozen(load_weights(head, state, Path(directory)))


def write_vllm_medusa(head_dir: str | Path, out: str | Path, target_output: torch.Tensor | None = None) -> Path:
    """Write the Medusa head in `head_dir` into `out` in vLLM's Medusa format. Its output
    layer is the target's rows for d2t unless the head trained its own: pass the target's
    output weight [V, H] (`target_output`) for such a head."""
    config = read_config(head_dir)
    if config.kind != HeadKind.MEDUSA:
        raise ValueError(f"{head_dir} holds a head of kind {config.kind!r}; --format vllm-medusa takes a Medusa head (an EAGLE-3 head exports with --format speculators)")
    if config.feature_layers != (FINAL,):
        raise ValueError(f"{head_dir} reads the taps {list(config.feature_layers)}; vLLM's Medusa reads the final hidden state only")
    state = read_weights(head_dir)
    d2t = state.pop("d2t")
    if config.trained_output:
        rows = state.pop("output.weight")
    elif target_output is None:
        raise ValueError(f"{head_dir} drafts through the target's output rows, which it does not store; pass the target's output weight")
    else:
        if tuple(target_output.shape) != (config.target.vocab_size, config.hidden_size):
            raise ValueError(f"the target's output weight has shape {tuple(target_output.shape)}, the head expects [{config.target.vocab_size}, {config.hidden_size}]")
        rows = target_output.detach()[d2t]
    dtype = state["blocks.0.linear.weight"].dtype
    weights = {}
    for i in range(config.heads):
        weights[f"blocks.{i}.layers.0.weight"] = state[f"blocks.{i}.linear.weight"]
        weights[f"blocks.{i}.layers.0.bias"] = state[f"blocks.{i}.linear.bias"]
    # The K heads share one output layer [N, H] (vLLM's `original_lm_head`), over the N tokens
    # token_map names; stock vLLM 0.32 loads the map but never marks it loaded, and refuses the
    # checkpoint ("not initialized from checkpoint: {'token_map'}") until that is patched.
    weights["lm_heads.0.weight"] = rows.to(dtype).contiguous()
    weights["token_map"] = d2t
    medusa_config = {
        "architectures": ["MedusaModel"], "model_type": "medusa",
        "hidden_size": config.hidden_size, "vocab_size": config.target.vocab_size,
        "truncated_vocab_size": config.vocab_size, "num_heads": config.heads, "num_hidden_layers": 1,
        "original_lm_head": True, "medusa_fc_bias": True, "torch_dtype": str(dtype).removeprefix("torch."),
        "verispec": {"target": config.target.name},
    }
    return _write_new(out, medusa_config, weights)


def _write_new(out: str | Path, config: dict, weights: dict[str, torch.Tensor]) -> Path:
    """config.json and model.safetensors in a new directory `out`, written beside it and
    renamed into place, so a failure leaves nothing and nothing is ever overwritten."""
    out = Path(out)
    if out.exists():
        raise ValueError(f"{out} already exists; give a new directory to --out")
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    try:
        partial.mkdir(parents=True)
        (partial / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        save_file(weights, partial / WEIGHTS, metadata={"format": "pt"})
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out


__all__ = ["is_speculators", "load_eagle3", "read_speculators", "write_speculators", "write_vllm_medusa"]
