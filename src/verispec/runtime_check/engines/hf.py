"""transformers' `generate` as an engine under check, in this process.

    assisted   `assistant_model`: a draft with the target's tokenizer (for the default model a
               copy of the target cut to its first `DRAFT_LAYERS` layers, a fair draft that
               shares its embeddings and head), verified by HF's speculative sampling
    lookup     `prompt_lookup_num_tokens`: n-gram prompt lookup, drafted tokens without q

The sampled law's check builds its own assisted draft (`fit_draft`): a copy of the target whose
head is scaled so that it drafts p^beta, beta chosen per parameter so that a drafted token is
accepted half the time (`power.ACCEPTANCE`) on average over the positions a first round drafts
after the check's prompts, so the classes that act on
rejections move the law as the power model says (the cuts of the default model accept at most
about a third: a draft must lose little of the target to accept half). Every speculative call counts what HF drafted and what it kept, read
from its candidate generator's `update_candidate_strategy(input_ids, scores, num_matches)`
(`drafts`), so each row shows the acceptance it ran at.

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
from scipy.optimize import brentq
from transformers import GenerationConfig


from verispec.runtime_check.cases import SamplingCase, next_token_law
from verispec.runtime_check.engines.base import Refused
from verispec.runtime_check.power import ACCEPTANCE

DRAFT_LAYERS = 8
LOOKUP_TOKENS = 4
BATCH = 64
DEFAULT = SamplingCase("default")


def truncated_draft(model, layers: int = DRAFT_LAYERS):
    """A copy of a decoder-only transformers model keeping its first `layers` layers (same
    embeddings, final norm and head, so the same tokenizer and vocabulary)."""
    draft = copy.deepcopy(model)
    draft.model.layers = draft.model.layers[:layers]
    draft.config.num_hidden_layers = layers
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:layers]
    return draft


def flattened_draft(model, prompts: Sequence[Sequence[int]], case: SamplingCase = DEFAULT,
                    acceptance: float = ACCEPTANCE, draft=None, positions: int = 2):
    """A copy of `model` (or `draft`, an earlier one, rescaled) whose head is scaled by beta in
    (0, 1], so that its logits are beta times the target's (the power model's draft,
    `power.controlled_draft`: p^beta where `case` only scales logits), beta chosen so that a
    drafted token, sampled under `case`, is accepted with chance `acceptance` on average over
    the first `positions` positions after each of `prompts` along the case's likeliest path
    (where a first round drafts; sum_x min(p(x), q(x)), both under `case`), or as near as the
    flattest (beta 0.001) gets. Returns the copy, beta and that chance."""
    rows = []  # (logits[V], context, output) at each position
    with torch.inference_mode():
        for prompt in prompts:
            path: list[int] = []
            for _ in range(positions):
                logits = model(torch.tensor([[*prompt, *path]], dtype=torch.long)).logits[0, -1].double()  # [V]
                rows.append((logits, [*prompt, *path], list(path)))
                path.append(int(torch.argmax(next_token_law(logits, case, [*prompt, *path], path))))

    def chance(beta: float) -> float:
        return sum(float(torch.minimum(next_token_law(x, case, c, o), next_token_law(beta * x, case, c, o)).sum())
                   for x, c, o in rows) / len(rows)

    beta = 1e-3 if chance(1e-3) >= acceptance else brentq(lambda b: chance(b) - acceptance, 1e-3, 1.0, xtol=1e-4)
    if draft is None:
        draft = copy.deepcopy(model)
        draft.config.tie_word_embeddings = False
    head, target = draft.get_output_embeddings(), model.get_output_embeddings()
    head.weight = torch.nn.Parameter(target.weight.detach() * beta, requires_grad=False)  # untied from the embeddings
    if getattr(head, "bias", None) is not None:
        head.bias = torch.nn.Parameter(target.bias.detach() * beta, requires_grad=False)
    return draft, beta, chance(beta)


def fit_line(method: str, case: SamplingCase, beta: float, chance: float) -> str:
    """What `flattened_draft` built for `method` under `case`, for the report."""
    return (f"{method}, {case.name}: the target with its head scaled by beta {beta:.3f} (the power model's draft), "
            f"a drafted token accepted with chance {chance:.2f} on the first round's positions after these prompts")


class HFEngine:
    name = "hf"
    methods = ("assisted", "lookup")

    def __init__(self, model, eos_ids: Collection[int], dtype: str, draft_layers: int = DRAFT_LAYERS) -> None:
        self.model = model
        self.eos_ids = sorted(eos_ids)
        self.dtype = dtype
        self.draft_layers = draft_layers
        self._draft = None
        self._fitted = None  # the copy `fit_draft` rescales for each parameter
        self._drafted = self._accepted = 0

    def versions(self) -> dict[str, str]:
        return {"transformers": transformers.__version__, "torch": torch.__version__}

    def drafts(self) -> tuple[int, int]:
        """Tokens drafted and kept over every speculative call so far (`CountsDrafts`)."""
        return self._drafted, self._accepted

    def fit_draft(
        self, prompts: Sequence[Sequence[int]], methods: Sequence[str], case: SamplingCase, length: int
    ) -> list[str]:
        """The assisted draft made to accept about half after `prompts` under `case`
        (`flattened_draft` over the `length` - 1 positions a first round drafts; `FitsDraft`),
        and a line saying what it is."""
        if "assisted" not in methods:
            return []
        self._draft, beta, chance = flattened_draft(self.model, prompts, case, draft=self._fitted,
                                                    positions=max(1, length - 1))
        self._fitted = self._draft
        return [fit_line("assisted", case, beta, chance)]

    def _candidate_generator(self, *args, **kwargs):
        """HF's candidate generator for the call, counting each round's drafted and kept tokens
        (installed on the model for speculative calls only)."""
        generator = type(self.model)._get_candidate_generator(self.model, *args, **kwargs)
        update = generator.update_candidate_strategy

        def counted(input_ids, scores, num_matches):  # scores: [1, drafted + 1, V]
            self._drafted += scores.shape[1] - 1
            self._accepted += int(num_matches)
            return update(input_ids, scores, num_matches)

        generator.update_candidate_strategy = counted
        return generator

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
            if method is not None:
                self.model._get_candidate_generator = self._candidate_generator
            with torch.inference_mode():
                out = self.model.generate(ids, attention_mask=mask, generation_config=config, **self.options(method))
        except ValueError as error:
            if method is None:
                raise
            raise Refused(f"transformers refuses it: {error}") from None
        finally:
            self.model.__dict__.pop("_get_candidate_generator", None)
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
