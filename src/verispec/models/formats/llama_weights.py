"""One reader of a transformers Llama or Qwen2 checkpoint for verispec's runtimes: `read_llama`.

As gpt-fast's convert script maps a checkpoint's names once into its own layout, this module
reads a transformers `LlamaForCausalLM` or `Qwen2ForCausalLM` once into the layout both of
verispec's runtimes build from (`models.runtimes.llama.LlamaRuntime` packs it for the CPU,
`models.runtimes.static_llama.StaticLlama` puts it on a device):

    embed [V, H], norm [H], head [V, H] (+ bias [V]), the rotary frequencies and their scaling,
    and per decoder layer:
        attn_norm [H]
        qkv      q | k | v stacked [(Hq + 2 Hkv) D, H], + bias [(Hq + 2 Hkv) D] (Qwen2's)
        o        [H, Hq D]
        mlp_norm [H]
        gate_up  gate | up stacked [2 I, H]
        down     [H, I]

A projection's parts stay apart until a runtime asks for them (`Projection`): fused in its
dtype (`weight`, `bias`), or as stored (`stored`: a GGUF file's own blocks, for the quantized
formats). The decoder layers are read one at a time (`LlamaWeights.layers`), so with `consume`
each layer's weights leave the transformers model as soon as the runtime has built its own,
and the weights are never held twice.

What a runtime cannot read is said in its own words: `refusal(config, runtime)` names the
runtime asking.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from verispec.models.formats.gguf_blocks import GGUFWeight
from verispec.models.formats.quantized import stored_weights
from verispec.models.rope import rope_parameters
from verispec.models.runtime import Runtime

# Llama's forward; Qwen2 adds biases to q, k and v, which the fused projection carries.
ARCHITECTURES = ("llama", "qwen2")

# The one weight map, per decoder layer: each projection of the layout and the checkpoint's
# linears it stacks, in order; each norm and the checkpoint's norm it is.
PROJECTIONS = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}
NORMS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


def refusal(config, runtime: Runtime) -> str | None:
    """Why `runtime` cannot read a model of this transformers config (None: it can); from the
    config alone, before any weight is loaded. What the runtime computes in and where is its
    own to check."""
    kind = getattr(config, "model_type", None)
    if kind not in ARCHITECTURES:
        return f"{runtime.named} runs Llama-architecture models and this is {kind!r} (it runs {', '.join(ARCHITECTURES)}); use runtime 'hf'"
    if getattr(config, "use_sliding_window", False):
        return f"{runtime.named} attends to every cached position and this model uses sliding-window attention; use runtime 'hf'"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"{runtime.named}'s MLP is SiLU-gated and this model uses {config.hidden_act!r}; use runtime 'hf'"
    try:
        rope_parameters(config)
    except ValueError as error:
        return f"{runtime.named} cannot read this model: {error}; use runtime 'hf'"
    return None


@dataclass
class LlamaShape:
    layers: int
    hidden: int
    heads: int  # query heads
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab_size: int
    eps: float


@dataclass(frozen=True)
class Projection:
    """One projection of the layout: the checkpoint's linears whose outputs it stacks (q, k, v;
    gate, up; or one), read when asked for."""

    linears: tuple[nn.Linear, ...]
    read: Callable[[torch.Tensor], torch.Tensor]  # a parameter -> its tensor in the runtime's dtype and device
    as_stored: Callable[[torch.Tensor], GGUFWeight | torch.Tensor]  # a parameter -> as its file stores it

    def weight(self) -> torch.Tensor:
        """The parts' weights stacked [sum of outs, in], in the runtime's dtype."""
        weights = [self.read(linear.weight) for linear in self.linears]
        return torch.cat(weights) if len(weights) > 1 else weights[0]

    def bias(self) -> torch.Tensor | None:
        """The parts' biases side by side [sum of outs] (zeros for a part without one), or
        None where no part has one."""
        biases = [None if linear.bias is None else self.read(linear.bias) for linear in self.linears]
        present = [bias for bias in biases if bias is not None]
        if not present:
            return None
        return torch.cat([
            bias if bias is not None else present[0].new_zeros(linear.out_features)
            for bias, linear in zip(biases, self.linears)
        ])

    def stored(self) -> list[GGUFWeight | torch.Tensor]:
        """Each part's weight as stored: a GGUF file's own blocks where given, else the
        checkpoint's tensor, not cast (what the quantized formats start from)."""
        return [self.as_stored(linear.weight) for linear in self.linears]


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer of the layout (module doc)."""

    attn_norm: torch.Tensor  # [H]
    qkv: Projection  # [(Hq + 2 Hkv) D, H]
    o: Projection  # [H, Hq D]
    mlp_norm: torch.Tensor  # [H]
    gate_up: Projection  # [2 I, H]
    down: Projection  # [H, I]


@dataclass(frozen=True)
class LlamaWeights:
    """A checkpoint in the layout (module doc). `embed` is read; the head, the final norm and
    the layers when asked for. tied: the head is the embedding's matrix (a runtime may share
    `embed` instead of reading the head)."""

    shape: LlamaShape
    embed: torch.Tensor  # [V, H]
    head: Projection  # [V, H] (+ bias [V])
    tied: bool
    biased: tuple[str, ...]  # the projections with a bias: "qkv" (Qwen2), "o", "gate_up", "down", "head"
    rope: tuple[torch.Tensor, float]  # inv_freq [D/2] float32, attention scaling
    model: nn.Module
    read: Callable[[torch.Tensor], torch.Tensor]  # as `Projection`'s
    as_stored: Callable[[torch.Tensor], GGUFWeight | torch.Tensor]
    consume: bool

    def layers(self) -> Iterator[LayerWeights]:
        """The decoder layers in order, one at a time; with `consume`, each layer's projection
        weights leave the transformers model (they become None) once the next is asked for."""
        for layer in self.model.model.layers:
            linears = {name: tuple(layer.get_submodule(path) for path in paths) for name, paths in PROJECTIONS.items()}
            yield LayerWeights(
                **{name: self.read(layer.get_submodule(path).weight) for name, path in NORMS.items()},
                **{name: Projection(parts, self.read, self.as_stored) for name, parts in linears.items()},
            )
            if self.consume:
                for linear in itertools.chain(*linears.values()):
                    linear.weight = linear.bias = None

    def norm(self) -> torch.Tensor:
        """The final norm's weight [H]."""
        return self.read(self.model.model.norm.weight)


def read_llama(
    model: nn.Module,
    runtime: Runtime,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    checkpoint: Callable[[str], torch.Tensor | None] | None = None,
    blocks: Mapping[str, GGUFWeight] | None = None,
    consume: bool = False,
) -> LlamaWeights:
    """`model` (a transformers `LlamaForCausalLM` or `Qwen2ForCausalLM`) in the layout, for
    `runtime`, which words the ValueError for a model it cannot read (`refusal`).

    dtype: what every float weight is cast to as it is read (default: the model's; torch's
    rounding, as transformers' own cast on load), on `device`. checkpoint: reads a tensor by
    parameter name from the model's files (`load.checkpoint_tensors`), used instead of the
    parameter where it has the parameter's dtype and shape (`quantized.stored_weights`).
    blocks: a GGUF file's own blocks by parameter name, which `Projection.stored` gives.
    consume: release each decoder layer's projection weights from `model` once read
    (`LlamaWeights.layers`); `model` cannot run afterwards.
    """
    reason = refusal(model.config, runtime)
    if reason:
        raise ValueError(reason)
    config, base, output = model.config, model.model, model.get_output_embeddings()
    dtype = dtype or output.weight.dtype
    device = torch.device(device)
    shape = LlamaShape(
        layers=len(base.layers),
        hidden=config.hidden_size,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        head_dim=base.layers[0].self_attn.head_dim,
        intermediate=config.intermediate_size,
        vocab_size=int(output.weight.shape[0]),
        eps=float(config.rms_norm_eps),
    )
    float_weight = stored_weights(model, None, checkpoint)

    def read(weight: torch.Tensor) -> torch.Tensor:
        """A parameter's float tensor (detached) in the runtime's dtype, on its device."""
        return float_weight(weight).to(device=device, dtype=dtype)

    as_stored = stored_weights(model, blocks, checkpoint)
    biased = [
        name for name, paths in PROJECTIONS.items()
        if any(layer.get_submodule(path).bias is not None for layer in base.layers for path in paths)
    ]
    return LlamaWeights(
        shape=shape,
        embed=read(base.embed_tokens.weight),
        head=Projection((output,), read, as_stored),
        tied=output.weight is base.embed_tokens.weight,
        biased=(*biased, *(["head"] if output.bias is not None else [])),
        rope=rope_parameters(config),
        model=model,
        read=read,
        as_stored=as_stored,
        consume=consume,
    )
