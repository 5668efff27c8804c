"""The target's own weights, quantized, as its draft model (a quantized self-draft).

The draft is the same network with its linear layers in int4 ("q4") or int8 on torch's CPU
weight-only kernels (`models.formats.quant`): for a GGUF target the file's own 4-bit blocks, for a
Hugging Face checkpoint its weights quantized on load. A draft need not be exact, so q4 takes
the kernel's cheaper single plane: a Q4 block's codes with d and m + 8 d rounded to bfloat16
(half the work of the exact two planes), and the Q8_0 head requantized to 4 bits. It needs no training and no second model, and,
being the same network, it agrees with the target on most tokens. Embedding, norms and rotary
tables are shared with the target by reference; the draft runs behind `HFCausalLM` with its
OWN cache and drafts through `DraftModel`: q sampled with the request's transforms (argmax at
temperature 0), every token verified exactly against the target.

For a Q4 GGUF target the draft's weights are the target's up to that rounding of the scales;
decoding plainly with the exact q4 format is then the same target (up to bfloat16
activations), and faster than drafting with its near-copy. The self-draft pays off where the target
must stay in float32 or bfloat16 arithmetic, or its weights are not 4-bit already (an HF
checkpoint, where q4 plainly would be a different model).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from verispec.models.runtime import Runtime, parse_runtime
from verispec.models.weight_format import AUTO, SELF_DRAFT, WeightFormat
from verispec.proposers.draft_model import DraftModel
from verispec.proposers.kind import ProposerKind

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from verispec.models.runtimes.hf import HFCausalLM
    from verispec.models.loading.load import LoadedModel
    from verispec.models.table_pair import Tables


FORMATS = SELF_DRAFT  # q4, int8 (`models.weight_format`)
RUNTIMES = (AUTO, Runtime.FAST, Runtime.HF)  # what a self-draft runs on


class SelfDraft(DraftModel):
    """Draft with the target's own weights in `fmt` ("q4" or "int8"), on its own cache.

    target: the target's transformers model (or `HFCausalLM` around it). gguf: the GGUF file
    it was loaded from, whose blocks q4 then uses (None: quantize on load). runtime: "fast"
    (a `LlamaRuntime` over the quantized projections), "hf" (a view of the transformers
    model with quantized linears, behind `HFCausalLM`) or "auto" (fast where it supports the
    model).

    >>> proposer = SelfDraft(loaded.transformers_model(), "q4", gguf=loaded.source)
    >>> generate(loaded.lm, proposer, prompt_ids, max_new_tokens=64, k=4)
    """

    def __init__(
        self,
        target: HFCausalLM | PreTrainedModel,
        fmt: WeightFormat | str = WeightFormat.Q4,
        gguf: str | os.PathLike | None = None,
        runtime: Runtime | str = AUTO,
    ):
        # transformers, imported when a self-draft is built (the registry imports this module)
        from transformers import PreTrainedModel

        from verispec.models.formats.gguf_blocks import gguf_weights
        from verispec.models.runtimes.hf import HFCausalLM
        from verispec.models.runtimes.llama import LlamaRuntime, fast_runtime_refusal
        from verispec.models.formats.quantized import quantized_model

        if fmt not in FORMATS:  # a name given to the class (the `selfdraft:FORMAT` spec is parsed once)
            raise ValueError(f"a self-draft runs in {' or '.join(FORMATS)}, got {fmt!r}")
        fmt = WeightFormat(fmt)
        runtime = parse_runtime(runtime, RUNTIMES)
        model = target if isinstance(target, PreTrainedModel) else target.model
        blocks = gguf_weights(gguf, model) if gguf is not None else None
        refusal = fast_runtime_refusal(model)
        if runtime == Runtime.FAST and refusal:
            raise ValueError(refusal)
        if runtime == Runtime.HF or refusal:
            draft = quantized_model(model, fmt, blocks, exact=False)
            lm, self.exact_weights = HFCausalLM(draft), draft.exact
        else:
            lm = LlamaRuntime.from_hf(model, fmt, blocks=blocks, exact=False)
            self.exact_weights = lm.exact_weights
        super().__init__(lm)
        self.fmt = fmt
        self.runtime = Runtime.HF if isinstance(lm, HFCausalLM) else Runtime.FAST


def parse(argument: str) -> WeightFormat:
    """The format of `selfdraft[:FORMAT]` (q4 when none)."""
    fmt = argument or "q4"
    if fmt not in FORMATS:
        raise ValueError(f"selfdraft:FORMAT takes q4 or int8, got 'selfdraft:{argument}'")
    return WeightFormat(fmt)


def build(fmt: WeightFormat, target: LoadedModel, corpus: Sequence[Sequence[int]]) -> SelfDraft:
    """The target's weights in `fmt` (q4 takes a GGUF target's own blocks)."""
    gguf = target.source if fmt == "q4" and target.source.is_file() else None
    return SelfDraft(target.transformers_model(), fmt, gguf=gguf, runtime=target.runtime)


KIND = ProposerKind(
    "selfdraft", "selfdraft[:FORMAT]", "sampled", build,
    "the target's own weights on int4 kernels (FORMAT q4, the default; a GGUF's own 4-bit blocks) or int8",
    not_audited="it needs a transformer's weights to quantize, which the audit's rational tables "
    "lack; its drafts are sampled with their q like draft's, whose rules the audit covers",
    example="selfdraft:q4", parse=parse,
)
