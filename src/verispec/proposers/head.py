"""The skeleton the trained-head proposers share (EAGLE-style, Medusa): one target with a
feature channel, the head's pruned vocabulary, the request's sampling, and the four ways to
draft, each once from the proposer's own state and once recomputed from the context alone.

A head reads the target's features of the emitted prefix, which live beside the target's
cache: the proposer holds the very target the engine drives and asks it at construction to
record the head's taps (`FeatureChannel.record_features`). When a round drafts, the target
has processed every emitted token but the pending one (the engine's cache contract), so a
context of n tokens has features at positions 0..n-2; a context of one token has none yet,
and the round decodes plainly.

The head runs where the target does (`heads.checkpoint.new_head` puts it on the target's
device, beside the features it reads); what it drafts is decided on the host: each head forward's
logits over its pruned vocabulary cross to the host once (`sampling.to_host`), where `HeadVocab`
takes the argmax or draws from q, as the rules read p there.

A subclass says what its state after a context is and how a chain and a tree are drafted
from it:

- `_state(context)`: from what the proposer has followed so far (fast);
- `_recomputed(context)`: the same state from the target's stateless features (slow; the
  reference decoder's path, which checks that the fast one never drifts);
- `_draft(state, k, rng)` and `_tree(state, shape, rng)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from verispec.drafts import EMPTY_DRAFT, Draft, TreeDraft
from verispec.heads.checkpoint import check_target
from verispec.heads.vocab import HeadVocab
from verispec.models.base import CausalLM, FeatureChannel
from verispec.randomness import Random
from verispec.sampling import SamplingParams
from verispec.tree_shape import TreeShape


class HeadProposer:
    """Drafts with `head` (an EAGLE-style or Medusa head with its `config` and pruned-vocabulary
    map `d2t`) for `target` (a `CausalLM` with a `FeatureChannel`: the very object the engine
    drives)."""

    def __init__(self, head: Any, target: CausalLM) -> None:
        check_target(head.config, target)
        self.head = head
        self.device = head.d2t.device  # the head's (and the target's) device
        self.target: FeatureChannel = target
        self.taps = head.config.feature_layers
        target.record_features(self.taps)
        self.vocab = HeadVocab(head.d2t, head.config.target.vocab_size)  # on the host, where drafts are drawn
        self.sampling = SamplingParams()

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self.sampling = sampling

    @torch.inference_mode()
    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        if len(context) < 2 or k < 1:
            return EMPTY_DRAFT
        return self._draft(self._state(context), k, rng)

    @torch.inference_mode()
    def propose_stateless(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        if len(context) < 2 or k < 1:
            return EMPTY_DRAFT
        return self._draft(self._recomputed(context), k, rng)

    @torch.inference_mode()
    def propose_tree(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        if len(context) < 2 or not len(shape):
            return TreeDraft((), ())
        return self._tree(self._state(context), shape, rng)

    @torch.inference_mode()
    def propose_tree_stateless(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        if len(context) < 2 or not len(shape):
            return TreeDraft((), ())
        return self._tree(self._recomputed(context), shape, rng)

    def check_target_follows(self, context: Sequence[int]) -> None:
        """Refuse to draft for a target that has not processed exactly the context but its
        pending token: the proposer was handed another target than the one the engine drives."""
        if self.target.length != len(context) - 1:
            raise RuntimeError(
                f"the target has processed {self.target.length} tokens, the head expects {len(context) - 1} (all "
                "but the pending token): the proposer must draft for the target the engine drives"
            )

    def as_draft(self, tokens: list[int], q_rows: list[torch.Tensor]) -> Draft:
        """The drafted tokens, with their q rows [k, V] when sampled (chosen, q None, when greedy)."""
        if self.sampling.greedy:
            return Draft(tuple(tokens))
        return Draft(tuple(tokens), torch.stack(q_rows))

    def _state(self, context: Sequence[int]) -> Any:
        raise NotImplementedError

    def _recomputed(self, context: Sequence[int]) -> Any:
        raise NotImplementedError

    def _draft(self, state: Any, k: int, rng: Random) -> Draft:
        raise NotImplementedError

    def _tree(self, state: Any, shape: TreeShape, rng: Random) -> TreeDraft:
        raise NotImplementedError
