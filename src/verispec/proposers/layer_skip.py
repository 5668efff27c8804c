"""Layer skipping: the target's own first L layers as the draft model (self-speculative
decoding: LayerSkip, Elhoushi et al. 2404.16710; Draft & Verify, Zhang et al. 2309.08168),
optionally with a pruned output head (FR-Spec, Zhao et al. 2502.14856).

The draft is a truncated-depth view of the target: the same embedding, its first L decoder
layers, the same final norm and output head, all shared by reference (no weight is copied but
the pruned head's rows). On the fast runtime it is a `LlamaRuntime` over the target's first L
layers; on a Hugging Face model, a view of it behind `HFCausalLM`. Either way it has its OWN
cache of L layers, so it never touches the target's cache and rolls back on its own, and it drafts
through `DraftModel`: q is sampled with the request's transforms, argmax at temperature 0.

Pruned head: the draft scores only N frequent tokens and gives every other token the logit
-inf. q is then still a distribution over the full vocabulary (zero outside the N tokens),
and the verifier uses that q as is, so decoding stays exact; only acceptance can drop, when
the target wants a token outside the N. The head's matmul shrinks by V / N, which matters
because in a small draft the head dominates (49k x 576 against a few 576-wide layers).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from verispec.checks import is_int
from verispec.proposers.draft_model import DraftModel
from verispec.proposers.kind import ProposerKind
from verispec.proposers.options import integer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from verispec.models.runtimes.hf import HFCausalLM
    from verispec.models.runtimes.llama import LlamaRuntime
    from verispec.models.loading.load import LoadedModel
    from verispec.models.table_pair import Tables


class PrunedHead(nn.Module):
    """An output head restricted to `token_ids`: logits[..., V] equal to the full head's on
    those tokens and -inf on every other.

    `weight` stays the full head's weight [V, H] (shared, so whatever reads the output
    embedding still sees the whole vocabulary); the forward uses only a copy of its rows
    `rows` [N, H].
    """

    def __init__(self, head: nn.Linear, token_ids: torch.Tensor) -> None:
        super().__init__()
        self.weight = head.weight  # [V, H]
        self.register_buffer("token_ids", token_ids.to(head.weight.device))  # [N]
        self.register_buffer("rows", head.weight.detach()[self.token_ids].clone())  # [N, H]
        bias = head.bias
        self.register_buffer("bias", None if bias is None else bias.detach()[self.token_ids].clone())  # [N]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden[..., H] -> logits[..., V]."""
        kept = nn.functional.linear(hidden, self.rows, self.bias)  # [..., N]
        logits = kept.new_full((*kept.shape[:-1], self.weight.shape[0]), -math.inf)
        return logits.index_copy_(-1, self.token_ids, kept)


def frequent_tokens(corpus: Iterable[Sequence[int]], n: int, vocab_size: int) -> torch.Tensor:
    """The n most frequent token ids of `corpus` (sequences of token ids), sorted, LongTensor[n].

    Ties, including every token the corpus never uses, go to the smaller id: in a byte-level
    BPE vocabulary ids follow merge order, which roughly follows frequency, so a small corpus
    is padded with the tokenizer's most common merges.

    >>> frequent_tokens([[5, 3, 5], [3, 5]], 3, 8).tolist()  # 5 and 3, then the smallest id
    [0, 3, 5]
    """
    if not is_int(n, 1, vocab_size):
        raise ValueError(f"the pruned head needs 1 <= N <= {vocab_size} tokens, got {n!r}")
    ids = [int(t) for sequence in corpus for t in sequence]
    if ids and not 0 <= min(ids) <= max(ids) < vocab_size:
        bad = min(ids) if min(ids) < 0 else max(ids)
        raise ValueError(f"corpus token id {bad} is outside the vocabulary [0, {vocab_size})")
    counts = torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab_size)  # [V]
    order = torch.sort(counts, descending=True, stable=True).indices  # ties: smaller id first
    return order[:n].sort().values


def truncated_model(model: PreTrainedModel, layers: int, head: nn.Module | None = None) -> PreTrainedModel:
    """A view of `model` (a *ForCausalLM) that runs only its first `layers` decoder layers, then
    its final norm and `head` (default: its own output head). Modules are shared, not copied.

    Built as an empty model of depth `layers` (on the meta device, so nothing is allocated)
    whose every submodule is then replaced by the target's; transformers' own forward, masks
    and caches then work unchanged, and a new cache holds exactly `layers` layers.
    """
    base = getattr(model, model.base_model_prefix, None)
    total = getattr(model.config, "num_hidden_layers", None)
    if base is None or not isinstance(getattr(base, "layers", None), nn.ModuleList) or total is None:
        raise ValueError(
            f"{type(model).__name__} does not keep its decoder layers in "
            f"`{model.base_model_prefix}.layers`; layer skipping supports Llama-style models"
        )
    if not is_int(layers, 1, total):
        raise ValueError(f"the draft needs 1 <= layers <= {total} (the target has {total} layers), got {layers!r}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:layers]
    with torch.device("meta"):
        view = type(model)(config)
    view_base = getattr(view, model.base_model_prefix)
    for name, module in base.named_children():
        setattr(view_base, name, nn.ModuleList(module[:layers]) if name == "layers" else module)
    for name, module in model.named_children():
        if name != model.base_model_prefix:
            setattr(view, name, module)
    if head is not None:
        view.set_output_embeddings(head)
    left = [name for name, tensor in [*view.named_parameters(), *view.named_buffers()] if tensor.is_meta]
    if left:
        raise ValueError(f"{type(model).__name__} has parts layer skipping cannot share: {', '.join(left)}")
    return view.eval()


class LayerSkip(DraftModel):
    """Draft with the target's first `layers` layers (its own cache), optionally a pruned head.

    target: the target as `LlamaRuntime` (the draft is then a `LlamaRuntime` too, sharing its
        layers), as `HFCausalLM`, or its transformers model.
    head_tokens: None (full head), N (the N most frequent tokens of `corpus`, see
        `frequent_tokens`), or the token ids to keep (LongTensor[N] or a sequence).

    >>> proposer = LayerSkip(target, layers=4, head_tokens=8192, corpus=encoded_prompts)
    >>> generate(target, proposer, prompt_ids, max_new_tokens=64)
    """

    def __init__(
        self,
        target: LlamaRuntime | HFCausalLM | PreTrainedModel,
        layers: int,
        head_tokens: int | torch.Tensor | Sequence[int] | None = None,
        corpus: Iterable[Sequence[int]] = (),
    ) -> None:
        # transformers, imported when a layer skip is built (the registry imports this module)
        from transformers import PreTrainedModel

        from verispec.heads.vocab import check_d2t
        from verispec.models.runtimes.hf import HFCausalLM
        from verispec.models.runtimes.llama import LlamaRuntime

        fast = isinstance(target, LlamaRuntime)
        model = target if isinstance(target, PreTrainedModel) else None if fast else getattr(target, "model", None)
        if not fast and not isinstance(model, PreTrainedModel):
            raise ValueError(
                f"layer skip drafts with the target's own first layers on the fast runtime or transformers, and this "
                f"target is a {type(target).__name__}; choose runtime fast or hf, or another proposer"
            )
        head = None
        if head_tokens is not None:
            full = target.head_linear if fast else model.get_output_embeddings()
            vocab_size = full.weight.shape[0]
            if isinstance(head_tokens, int):
                ids = frequent_tokens(corpus, head_tokens, vocab_size)
            else:
                given = torch.as_tensor(head_tokens, dtype=torch.long).flatten()  # [N], any order
                ids = check_d2t(given.sort().values, vocab_size)
            head = PrunedHead(full, ids)
        draft = target.truncated(layers, head) if fast else HFCausalLM(truncated_model(model, layers, head))
        super().__init__(draft)
        self.layers = layers
        self.head_tokens = None if head is None else head.token_ids


@dataclass(frozen=True)
class LayerSkipSpec:
    """`layerskip:L[:N]`: the target's first L layers, its head pruned to N tokens (None: all)."""

    layers: int
    head_tokens: int | None = None


def parse(argument: str) -> LayerSkipSpec:
    """The options of `layerskip:L[:N]` (their bounds depend on the target: `build` checks them).

    >>> parse("8:512")
    LayerSkipSpec(layers=8, head_tokens=512)
    """
    parts = argument.split(":")
    if len(parts) > 2:
        raise ValueError(f"layerskip needs layerskip:L or layerskip:L:N, got 'layerskip:{argument}'")
    layers = integer(parts[0], "layerskip:L needs an integer number of layers L")
    head_tokens = integer(parts[1], "layerskip:L:N needs an integer number of head tokens N") if len(parts) == 2 else None
    return LayerSkipSpec(layers, head_tokens)


def build(spec: LayerSkipSpec, target: LoadedModel, corpus: Sequence[Sequence[int]]) -> LayerSkip:
    """The target's first L layers (1 <= L < its layers), its head pruned to the N (1 <= N <= its
    vocabulary) most frequent tokens of `corpus` when N is given."""
    total = target.config.num_hidden_layers
    vocab_size = target.lm.vocab_size
    if not 1 <= spec.layers < total:
        raise ValueError(f"layerskip:L needs 1 <= L < {total} (the target has {total} layers), got {spec.layers}")
    if spec.head_tokens is not None and not 1 <= spec.head_tokens <= vocab_size:
        raise ValueError(
            f"layerskip:L:N needs 1 <= N <= {vocab_size} (the vocabulary size), got {spec.head_tokens}"
        )
    return LayerSkip(target.lm, spec.layers, spec.head_tokens, corpus)


KIND = ProposerKind(
    "layerskip", "layerskip:L[:N]", "sampled", build,
    "the target's first L layers and its head (pruned to N tokens when N is given)",
    not_audited="it needs a transformer's layers, which the audit's rational tables lack; its "
    "drafts are sampled with their q like draft's, whose rules the audit covers",
    example="layerskip:8", parse=parse,
)
