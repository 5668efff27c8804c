"""A smaller causal LM as the proposer (Leviathan et al. 2211.17192).

At temperature > 0 each drafted token is sampled from q, the draft's distribution after the
same sampling transforms as the target, and q is returned for the verifier. At temperature 0
the draft takes its argmax (a chosen draft, q = None). A repetition penalty applies to the
draft's rows as to the target's, each after its own context and drafted prefix
(`sampling.penalised`), and so does a grammar, so a sampled draft never leaves it; min_tokens does not (a proposer is not told the EOS ids), which the
rules allow: q need only be what the draft was drawn from.

Trees (`propose_tree`, a `TreeProposer`): at temperature 0 a node's children are the draft's
top-ranked tokens after the node's path, best first (`tree_shape.fill`, chosen, q None), so
the shape's first-rank chain is the greedy chain draft. At temperature > 0 they are
independent draws, with replacement, from q after the node's path (`tree_shape.sample`: one
`rng.draw` per node, in the shape's order), each node's q row recorded for
`verify.tree_recursive` (SpecInfer's rule). The draft scores each parent's path on its own:
`extend([pending, *path])` then a rollback to the context in the cache (`propose_tree`), or
a full recomputation (`propose_tree_stateless`); the same rows either way.

The draft keeps its own cache, which nothing else may move (a draft model shared by two
decodings, such as two batch slots, is refused at its next draft). `processed` mirrors what
the cache holds: the context plus all but the last drafted token. `commit` crops it to the
longest prefix shared with the emitted context, so the next round resumes from the same logical
prefix a full recomputation would.

Given `tokenizers=(target_tokenizer, draft_tokenizer)`, a pair whose ids do not mean the same
tokens is refused with the tokenizer report (`verispec.tokenizer_contract`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from verispec.drafts import Draft, TreeDraft
from verispec.models import DEFAULT_MODEL
from verispec.models.base import CausalLM
from verispec.models.runtime import Runtime
from verispec.proposers.kind import ProposerKind
from verispec.randomness import Random
from verispec.sampling import SamplingParams, penalised, probabilities, to_host
from verispec.tokenizer_contract import check_tokenizers
from verispec.tree_shape import TreeShape, fill, ranked_top, sample

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel
    from verispec.models.table_pair import Tables


class DraftModel:
    def __init__(self, model: CausalLM, tokenizers: tuple[object, object] | None = None) -> None:
        if tokenizers is not None:
            check_tokenizers(*tokenizers).require_match()
        self.model = model
        self.vocab_size = model.vocab_size
        self.sampling = SamplingParams()
        self._processed: list[int] = []
        self._synced = 0  # leading entries of _processed known to match the context

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self.sampling = sampling
        self._prompt_length = len(prompt_ids)
        self.model.reset()
        self._processed = []
        self._synced = 0

    def commit(self, context: Sequence[int]) -> None:
        keep = self._synced
        limit = min(len(self._processed), len(context))
        while keep < limit and self._processed[keep] == context[keep]:
            keep += 1
        if keep < len(self._processed):
            self.model.rollback(keep)
            del self._processed[keep:]
        self._synced = keep

    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        new = self._uncached(context)
        logits = self.model.extend(new, keep=1)  # [1, V]
        self._processed.extend(new)
        self._synced = len(self._processed)
        tokens, q_rows = [], []
        for i in range(k):
            token, q = self._next(logits, rng, [*context, *tokens], i)
            tokens.append(token)
            q_rows.append(q)
            if i < k - 1:
                logits = self.model.extend([token], keep=1)
                self._processed.append(token)
        return self._draft(tokens, q_rows)

    def propose_tree(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        new = self._uncached(context)
        pending = new.pop()
        if new:
            self.model.extend(new, keep=1)
            self._processed.extend(new)
            self._synced = len(self._processed)
        cached = len(self._processed)  # the context but its last token

        def row_after(path: tuple[int, ...]) -> torch.Tensor:
            logits = self.model.extend([pending, *path], keep=1)  # [1, V]
            self.model.rollback(cached)
            return self._penalised(logits, [*context, *path])

        return self._tree(shape, row_after, rng)

    def propose_tree_stateless(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        return self._tree(
            shape, lambda path: self._penalised(self.model.score([*context, *path])[-1:], [*context, *path]), rng
        )

    def _uncached(self, context: Sequence[int]) -> list[int]:
        """Follow `context` (`commit`) and return its tokens the cache lacks: at least its last
        one, whose logits row the next draft starts from."""
        if self.model.length != len(self._processed):
            raise RuntimeError(
                f"the draft model's cache holds {self.model.length} positions where this proposer put "
                f"{len(self._processed)}: something else moved it; give each decoding (each batch slot) a draft "
                "model of its own"
            )
        self.commit(context)
        if len(self._processed) == len(context):
            # The whole context is cached (block verification may repair with the rejected
            # draft token itself), so re-process its last token to get the next logits.
            self.model.rollback(len(context) - 1)
            del self._processed[-1]
            self._synced = len(self._processed)
        return list(context[len(self._processed) :])

    def _tree(self, shape: TreeShape, row_after: Callable[[tuple[int, ...]], torch.Tensor], rng: Random) -> TreeDraft:
        """Fill `shape` from `row_after(path tokens)`, the draft's logits [1, V] after the
        context and that path: top-ranked children (greedy) or sampled ones."""
        if self._chosen_children:
            width = max((path[-1] + 1 for path in shape.paths), default=0)
            # softmax keeps the logits' order; ranked_top leaves out what has no mass.
            return fill(shape, lambda path: ranked_top(to_host(torch.softmax(row_after(path)[0].double(), -1)), width))
        return sample(shape, lambda path: to_host(probabilities(row_after(path), self.sampling))[0], rng)

    @property
    def _chosen_children(self) -> bool:
        """Whether tree children are the top-ranked tokens (chosen) rather than sampled."""
        return self.sampling.greedy

    def propose_stateless(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        ids = list(context)
        tokens, q_rows = [], []
        for i in range(k):
            token, q = self._next(self.model.score(ids)[-1:], rng, ids, i)
            tokens.append(token)
            q_rows.append(q)
            ids.append(token)
        return self._draft(tokens, q_rows)

    def _penalised(self, logits: torch.Tensor, context: Sequence[int]) -> torch.Tensor:
        """logits[1, V] after `context` with the request's repetition penalty and grammar."""
        return penalised(logits, self.sampling, context, [()], len(context) - self._prompt_length, ())

    def _next(
        self, logits: torch.Tensor, rng: Random, context: Sequence[int], position: int
    ) -> tuple[int, torch.Tensor | None]:
        """The drafted token at the round's `position` from logits[1, V] after `context` (on the
        model's device): argmax when greedy, else a draw from q [V], float64 on the host."""
        logits = self._penalised(logits, context)
        if self.sampling.greedy:
            return int(logits[0].argmax()), None
        q = to_host(probabilities(logits, self.sampling))[0]
        return rng.draw(position, q), q

    def _draft(self, tokens: list[int], q_rows: list[torch.Tensor | None]) -> Draft:
        if self.sampling.greedy or not tokens:
            return Draft(tuple(tokens))
        return Draft(tuple(tokens), torch.stack(q_rows))


def build(path: str, target: LoadedModel, corpus: Sequence[Sequence[int]]) -> DraftModel:
    """`draft:PATH`: the model at PATH in the target's weight format (q4 for a q4 target, else
    its dtype) on the runtime "auto" picks for it, or on llama.cpp for a llama.cpp target
    (without the lone-token padding: a draft's numerics never change the output's law, only
    how often its guesses are accepted); its tokenizer must be the target's. On a GPU it loads
    on the target's device, without deterministic scoring (the static runtime's smallest shapes:
    a draft's rounding changes only what is accepted)."""
    from verispec.models.loading.load import load_model

    if target.runtime == Runtime.LLAMACPP:
        draft = load_model(path, runtime=Runtime.LLAMACPP, deterministic=False)
    elif target.device != "cpu":
        draft = load_model(path, dtype=target.dtype_name, device=target.device, deterministic=False)
    else:
        draft = load_model(path, dtype=target.dtype_name, device="cpu")
    return DraftModel(draft.lm, tokenizers=(target.tokenizer, draft.tokenizer))


def audit_fixture(tables: Tables) -> DraftModel:
    return DraftModel(tables.draft)


KIND = ProposerKind(
    "draft", "draft:PATH", "sampled", build,
    "a smaller model with the target's tokenizer (.gguf file, checkpoint directory or name)",
    audit=audit_fixture, example=f"draft:{DEFAULT_MODEL}", trees=True,
)
