"""Broken engines the runtime check must catch: verispec's engine with one known bug class
injected at its seams, each a bug other engines have shipped (docs/check-runtime.md).

- `raw_q`: the draft samples after the request's transforms but reports q from its raw
  logits (HF transformers #47932; vllm-ascend PR #2881 zeroed q in place);
- `bonus_only`: the request's parameters shape only the bonus row; the rows that verify the
  drafted tokens are the target's raw softmax (vLLM #42744: min_p and logit_bias applied to
  the bonus token only; mistral.rs PR #2424: temperature and top-p ignored);
- `wrong_bonus`: after a full acceptance the bonus token is drawn from the last drafted
  position's row instead of the row after it (an off-by-one in the bonus row's index);
- `stale_cache`: the target's rollback after a rejection reports the cropped length but keeps
  the rejected tokens, so later rows condition on them (HF #30042, openvino.genai #4190).

Each returns a `VerispecEngine`; only the check's tests use them.

For seeded identity and the shared-stream probe (`verispec.runtime_check.seeded`):
- `KeyedTable`: an engine whose every token is the argmax of log p plus Gumbel noise keyed by
  (seed, position), so a seed fixes its tokens with or without speculation and in any batch
  (arXiv 2408.07978); it claims the identity;
- `shared_stream`: verispec's engine, but every unseeded request of a call draws from one
  stream seeded alike (TensorRT-LLM #19487), so requests in flight together return one sample.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from verispec.drafts import Draft, Verdict
from verispec.models.base import CausalLM, ForwardingLM
from verispec.proposers import DraftModel
from verispec.randomness import Random
from verispec.runtime_check.cases import next_token_law
from verispec.runtime_check.engines.own import VerispecEngine, fresh_seed
from verispec.sampling import SamplingParams, probabilities
from verispec.verify import token_level

DRAFT = "draft"


class RawQDraftModel(DraftModel):
    """BROKEN: draws each token from the transformed q but reports q[k, V] from the raw logits
    (the draft model's full forward over the context and the drafts before each row)."""

    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        draft = super().propose(context, k, rng)
        if draft.q is None or not draft.tokens:
            return draft
        logits = self.model.score([*context, *draft.tokens])[len(context) - 1:-1]  # [k, V]
        return Draft(draft.tokens, probabilities(logits, SamplingParams()))


class LogitsTap(ForwardingLM):
    """A `CausalLM` that passes every call to `inner` and keeps the last `extend`'s logits."""

    def __init__(self, lm: CausalLM) -> None:
        super().__init__(lm)
        self.last: torch.Tensor | None = None  # [n, V]

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        self.last = self.inner.extend(tokens, keep)
        return self.last


class StaleCache:
    """BROKEN: a `CausalLM` over `lm` whose `rollback` lowers the reported length but keeps the
    rolled-back tokens, so `extend` scores its tokens after them (full recomputation by
    `lm.score`, so any model with a `score` can be broken this way)."""

    def __init__(self, lm: CausalLM) -> None:
        self.lm = lm
        self.vocab_size = lm.vocab_size
        self._tokens: list[int] = []
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    def reset(self) -> None:
        self._tokens, self._length = [], 0

    def prefill(self, ids: Sequence[int]) -> None:
        self._tokens, self._length = list(ids), len(ids)

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        self._tokens += list(tokens)
        self._length += len(tokens)
        rows = self.lm.score(self._tokens)[-len(tokens):]  # [n, V]
        return rows if keep is None else rows[-keep:]

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot roll back to {length}; {self._length} tokens processed")
        self._length = length

    def score(self, ids: Sequence[int]) -> torch.Tensor:
        return self.lm.score(ids)


def _own(draft: CausalLM) -> CausalLM:
    """A draft model with a cache of its own (each decoding or batch slot needs one)."""
    return draft.new_slot() if hasattr(draft, "new_slot") else draft


def correct(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    """The unbroken engine: `draft` as a draft model, k tokens a round."""
    return VerispecEngine(target, {DRAFT: lambda lm: DraftModel(_own(draft))}, eos_ids, k=k)


def raw_q(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    return VerispecEngine(target, {DRAFT: lambda lm: RawQDraftModel(_own(draft))}, eos_ids, k=k)


def bonus_only(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    tap = LogitsTap(target)

    def rule(p: torch.Tensor, draft_: Draft, rng: Random) -> Verdict:
        """p[k + 1, V] with the request's transforms: the drafted rows replaced by the raw softmax."""
        drafted = len(draft_)
        if drafted == 0 or draft_.q is None:
            return token_level(p, draft_, rng)
        raw = probabilities(tap.last[-(drafted + 1):-1], SamplingParams())  # [k, V]
        return token_level(torch.cat([raw, p[drafted:]]), draft_, rng)

    return VerispecEngine(tap, {DRAFT: lambda lm: DraftModel(_own(draft))}, eos_ids, k=k, verifier=rule)


def wrong_bonus(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    def rule(p: torch.Tensor, draft_: Draft, rng: Random) -> Verdict:
        """p[k + 1, V]: row k (the bonus row) replaced by row k - 1."""
        return token_level(torch.cat([p[:-1], p[-2:-1]]) if len(draft_) else p, draft_, rng)

    return VerispecEngine(target, {DRAFT: lambda lm: DraftModel(_own(draft))}, eos_ids, k=k, verifier=rule)


def stale_cache(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    return VerispecEngine(StaleCache(target), {DRAFT: lambda lm: DraftModel(_own(draft))}, eos_ids, k=k)


CONTROLS = {"q from raw logits": raw_q, "parameters on the bonus token only": bonus_only,
            "stale cache after a rejection": stale_cache, "bonus from the wrong row": wrong_bonus}


class SharedStreamEngine(VerispecEngine):
    """BROKEN: unseeded requests in flight together all draw from the same stream."""

    def sample_unseeded(self, prompt, case, n, length, method):
        return self.sample(prompt, case, n, length, method, 0)[:1] * n


def shared_stream(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    return SharedStreamEngine(target, {DRAFT: lambda lm: DraftModel(_own(draft))}, eos_ids, k=k)


class KeyedTable:
    """An engine over `target` (any `CausalLM` with `score`) that samples token t of a request
    seeded s as argmax over x of log p_t(x) + G(s, t, x), G Gumbel noise from a generator keyed
    by (s, t) alone: the tokens are a function of the seed, so its one method (`DRAFT`, as
    coupled speculation would give) and any batch give plain's tokens."""

    name, methods, dtype = "keyed", (DRAFT,), "float32"
    claims_seeded_identity = True

    def __init__(self, target: CausalLM, eos_ids: Collection[int] = ()) -> None:
        self.target, self.eos_ids = target, frozenset(eos_ids)

    def versions(self) -> dict[str, str]:
        return {}

    def sample(self, prompt, case, n, length, method, seed):
        return [self._one(list(prompt), case, length, seed + i) for i in range(n)]

    def sample_unseeded(self, prompt, case, n, length, method):
        return [self._one(list(prompt), case, length, fresh_seed()) for _ in range(n)]

    def greedy(self, prompts, max_new_tokens, method, concurrency):
        return [self._one(list(p), None, max_new_tokens, 0) for p in prompts]

    def _one(self, prompt: list[int], case, length: int, seed: int) -> list[int]:
        out: list[int] = []
        while len(out) < length and not (out and out[-1] in self.eos_ids):
            logits = self.target.score([*prompt, *out])[-1]  # [V]
            if case is None:
                out.append(int(torch.argmax(logits)))
                continue
            p = next_token_law(logits, case, [*prompt, *out], out)  # [V]
            noise = torch.Generator().manual_seed(hash((seed, len(prompt) + len(out))) & (2**63 - 1))
            gumbel = -torch.log(-torch.log(torch.rand(p.shape, generator=noise, dtype=torch.float64)))  # [V]
            out.append(int(torch.argmax(torch.log(p) + gumbel)))
        return out
