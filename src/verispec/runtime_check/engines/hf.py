"""transformers' `generate` as an engine under check, in this process.

    assisted   `assistant_model`: a draft with the target's tokenizer (for the default model a
               copy of the target cut to its first `DRAFT_LAYERS` layers, a fair draft that
               shares its embeddings and head), verified by HF's speculative sampling
    lookup     `prompt_lookup_num_tokens`: n-gram prompt lookup, drafted tokens without q

Both against the same `generate` without them. Every sampling field is given explicitly, so
nothing is filled in from the model's own generation config (SmolLM2 ships top_p 0.9 and
temperature 0.2): temperature, top_k (0 = off), top_p, min_p, repetition_penalty and logit
bias (HF's `sequence_bias` on one-token sequences). HF has no frequency or presence penalty:
those are refused. Speculation serves one sequence at a time (HF refuses a batch); plain
sampling draws `BATCH` samples per call with `num_return_sequences`. `logits` shows the
model's own logits, so greedy divergences are diagnosed in HF's numerics too.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Sequence

import torch
import transformers
from transformers import GenerationConfig

from verispec.runtime_check.cases import SamplingCase
from verispec.runtime_check.engines.base import Refused

DRAFT_LAYERS = 8
LOOKUP_TOKENS = 4
BATCH = 64


def truncated_draft(model, layers: int = DRAFT_LAYERS):
    """A copy of a decoder-only transformers model keeping its first `layers` layers (same
    embeddings, final norm and head, so the same tokenizer and vocabulary)."""
    draft = copy.deepcopy(model)
    draft.model.layers = draft.model.layers[:layers]
    draft.config.num_hidden_layers = layers
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:layers]
    return draft


class HFEngine:
    name = "hf"
    methods = ("assisted", "lookup")

    def __init__(self, model, eos_ids: Collection[int], dtype: str, draft_layers: int = DRAFT_LAYERS) -> None:
        self.model = model
        self.eos_ids = sorted(eos_ids)
        self.dtype = dtype
        self.draft_layers = draft_layers
        self._draft = None

    def versions(self) -> dict[str, str]:
        return {"transformers": transformers.__version__, "torch": torch.__version__}

    def options(self, method: str | None) -> dict:
        if method is None:
            return {}
        if method == "assisted":
            if self._draft is None:
                self._draft = truncated_draft(self.model, self.draft_layers)
            return {"assistant_model": self._draft}
        if method == "lookup":
            return {"prompt_lookup_num_tokens": LOOKUP_TOKENS}
        raise ValueError(f"hf has no method {method!r}; choose from {', '.join(self.methods)}")

    def config(self, case: SamplingCase | None, length: int, sequences: int = 1) -> GenerationConfig:
        """`case` None: greedy."""
        sampled = {}
        if case is not None:
            if case.frequency_penalty or case.presence_penalty:
                raise Refused("transformers' generate has no frequency or presence penalty")
            sampled = dict(
                do_sample=True, temperature=case.temperature, top_k=case.top_k or 0, top_p=case.top_p or 1.0,
                min_p=case.min_p, repetition_penalty=case.repetition_penalty or 1.0,
                sequence_bias={(token,): bias for token, bias in case.logit_bias} or None,
            )
        return GenerationConfig(
            max_new_tokens=length, min_length=0, num_beams=1, no_repeat_ngram_size=0, num_return_sequences=sequences,
            eos_token_id=self.eos_ids or None, pad_token_id=self.eos_ids[0] if self.eos_ids else None,
            **({"do_sample": False, "repetition_penalty": 1.0} if case is None else sampled),
        )

    def _generate(self, ids: torch.Tensor, mask: torch.Tensor, config: GenerationConfig, method: str | None) -> list[list[int]]:
        try:
            with torch.inference_mode():
                out = self.model.generate(ids, attention_mask=mask, generation_config=config, **self.options(method))
        except ValueError as error:
            if method is None:
                raise
            raise Refused(f"transformers refuses it: {error}") from None
        rows = []
        for row in out[:, ids.shape[1]:].tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in self.eos_ids), len(row))
            rows.append(row[:cut])
        return rows

    def sample(
        self, prompt: Sequence[int], case: SamplingCase, n: int, length: int, method: str | None, seed: int
    ) -> list[list[int]]:
        ids = torch.tensor([list(prompt)], dtype=torch.long)  # [1, T]
        mask = torch.ones_like(ids)
        out: list[list[int]] = []
        batch = BATCH if method is None else 1
        while len(out) < n:
            size = min(batch, n - len(out))
            torch.manual_seed(seed + len(out))
            out += self._generate(ids, mask, self.config(case, length, size), method)
        return out

    def logits(self, prefix: Sequence[int]) -> torch.Tensor:
        """The model's own last-position logits after `prefix`, float [V] (`GivesLogits`)."""
        with torch.inference_mode():
            return self.model(torch.tensor([list(prefix)], dtype=torch.long)).logits[0, -1].float()

    def greedy(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, method: str | None, concurrency: int
    ) -> list[list[int]]:
        out = []
        for start in range(0, len(prompts), concurrency):
            group = [list(p) for p in prompts[start:start + concurrency]]
            width = max(len(p) for p in group)
            pad = self.eos_ids[0] if self.eos_ids else 0
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], dtype=torch.long)  # [b, T], left-padded
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], dtype=torch.long)
            if method is not None and len(group) > 1:
                raise Refused("transformers' assisted generation and prompt lookup decode one sequence at a time")
            out += self._generate(ids, mask, self.config(None, max_new_tokens), method)
        return out
