"""Broken engines the runtime check must catch: verispec's engine with one known bug class
injected at its seams, each a bug other engines have shipped (docs/check-runtime.md).

- `raw_q`: the draft samples after the request's transforms but reports q from its raw
  logits (HF transformers #47932; vllm-ascend PR #2881 zeroed q in place);
- `bonus_only`: the request's parameters shape only the bonus row; the rows that verify the
  drafted tokens are the target's raw softmax (vLLM #42744: min_p and logit_bias applied to
  the bonus token only; mistral.rs PR #2424: temperature and top-p ignored);
- `resample_from_p`: the repair token drawn from p instead of norm(max(0, p - q)) (the
  classic residual bug);
- `acceptance_only`: the request's parameters shape the acceptance test only, the repair and
  bonus rows are the raw softmax (temperature or top-p applied to the acceptance test only);
- `hotter_speculation`: rounds that draft run at 1.1x the temperature;
- `reused_noise`: the uniform that drew the drafted token decides its acceptance (vLLM #54282);
- `argmax_verification`: rounds that draft are verified greedily at any temperature (SGLang
  PR #39253);
- `double_accept`: a drafted token accepted by either of two tests (rtp-llm PR #1295's class);
- `penalty_per_step`: the repetition penalty counts the tokens before the round only (SGLang
  PR #33643); `penalties_dropped`: a speculative request's penalty dropped (TensorRT-LLM PR
  #17701) (both in `PENALTY_CONTROLS`, checked under a repetition penalty);
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

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

import torch

from verispec.drafts import Draft, Verdict
from verispec.models.base import CausalLM, ForwardingLM
from verispec.proposers import DraftModel
from verispec.randomness import Random
from verispec.runtime_check.cases import next_token_law
from verispec.runtime_check.engines.own import VerispecEngine, fresh_seed
from verispec.sampling import SamplingParams, penalised, probabilities
from verispec.verify import greedy, token_level

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
    """A `CausalLM` that passes every call to `inner` and keeps the last `extend`'s logits and
    the tokens processed."""

    def __init__(self, lm: CausalLM) -> None:
        super().__init__(lm)
        self.last: torch.Tensor | None = None  # [n, V]
        self.tokens: list[int] = []

    def reset(self) -> None:
        self.inner.reset()
        self.tokens = []

    def prefill(self, ids: Sequence[int]) -> None:
        self.inner.prefill(ids)
        self.tokens = list(ids)

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        self.last = self.inner.extend(tokens, keep)
        self.tokens += list(tokens)
        return self.last

    def rollback(self, length: int) -> None:
        self.inner.rollback(length)
        del self.tokens[length:]


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


def token_rule(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    """The unbroken engine verifying token by token: exact, but its randomness is drawn per round,
    so a seed does not fix its tokens across speculation (and it does not claim so)."""
    return VerispecEngine(target, {DRAFT: lambda lm: DraftModel(_own(draft))}, eos_ids, k=k, verifier="token")


def raw_q(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    # token-level verification reads q; the coupled rule never does, so a raw q cannot move its law
    return VerispecEngine(target, {DRAFT: lambda lm: RawQDraftModel(_own(draft))}, eos_ids, k=k, verifier="token")


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


def sampled_rule(
    p_accept: torch.Tensor, p_emit: torch.Tensor, draft: Draft, rng: Random,
    accept: Callable[[int, int, float], bool] | None = None, residual: bool = True,
) -> Verdict:
    """Token-level verification with its parts taken apart, for the controls to break one:
    drafted token x at position i is accepted by `accept(i, x, r)` (default: with probability
    r = min(1, p_accept[i, x] / q[i, x])); the repair token is drawn from norm(max(p_emit[i] -
    q[i], 0)) (`residual`) or from p_emit[i] itself; the bonus from p_emit[k]. p_accept and
    p_emit: [k + 1, V]; the draft sampled (q [k, V])."""
    for i, x in enumerate(draft.tokens):
        r = min(1.0, float(p_accept[i, x]) / float(draft.q[i, x]))
        if accept(i, x, r) if accept is not None else rng.bernoulli(r):
            continue
        row = (p_emit[i] - draft.q[i]).clamp_min(0.0) if residual else p_emit[i]  # [V]
        return Verdict(i, rng.categorical(row / row.sum() if float(row.sum()) > 0 else p_emit[i]))
    return Verdict(len(draft), rng.categorical(p_emit[len(draft)]))


def _ruled(target: CausalLM, draft: CausalLM, eos_ids: Collection[int], k: int,
           rule: Callable[[torch.Tensor, Draft, Random], Verdict]) -> VerispecEngine:
    """verispec's engine with `draft` as its draft model and `rule` verifying (chains with q)."""
    return VerispecEngine(target, {DRAFT: lambda lm: DraftModel(_own(draft))}, eos_ids, k=k,
                          verifier=lambda p, d, rng: token_level(p, d, rng) if not len(d) else rule(p, d, rng))


def resample_from_p(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    """BROKEN: the repair token drawn from p instead of norm(max(0, p - q))."""
    return _ruled(target, draft, eos_ids, k, lambda p, d, rng: sampled_rule(p, p, d, rng, residual=False))


def acceptance_only(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    """BROKEN: the request's parameters (temperature, top-k, top-p, ...) shape the acceptance
    test only; the repair and bonus tokens come from the target's raw softmax."""
    tap = LogitsTap(target)

    def rule(p: torch.Tensor, d: Draft, rng: Random) -> Verdict:
        raw = probabilities(tap.last[-p.shape[0]:], SamplingParams())  # [k + 1, V]
        return sampled_rule(p, raw, d, rng)

    return _ruled(tap, draft, eos_ids, k, rule)


def hotter_speculation(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    """BROKEN: rounds that draft verify and emit at 1.1x the temperature (p^(1 / 1.1),
    renormalised)."""

    def rule(p: torch.Tensor, d: Draft, rng: Random) -> Verdict:
        hotter = p ** (1 / 1.1)  # [k + 1, V]
        return token_level(hotter / hotter.sum(dim=-1, keepdim=True), d, rng)

    return _ruled(target, draft, eos_ids, k, rule)


def reused_noise(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    """BROKEN: the uniform u that drew the drafted token x from q (inverse CDF) also decides
    its acceptance (u < r) instead of a fresh one. Given x, that u is uniform on x's CDF
    interval [a, a + q(x)), so the acceptance is a coin of probability (r - a) / q(x), clamped."""

    def rule(p: torch.Tensor, d: Draft, rng: Random) -> Verdict:
        def accept(i: int, x: int, r: float) -> bool:
            below, width = float(d.q[i, :x].sum()), float(d.q[i, x])
            return rng.bernoulli(min(1.0, max(0.0, (r - below) / width)))

        return sampled_rule(p, p, d, rng, accept)

    return _ruled(target, draft, eos_ids, k, rule)


def argmax_verification(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    """BROKEN: rounds that draft are verified greedily (accept the target's argmax, emit it),
    whatever the temperature."""
    return _ruled(target, draft, eos_ids, k, greedy)


def double_accept(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    """BROKEN: a drafted token is accepted by either of two tests: the ratio test, or equality
    with a token drawn from the target's row."""

    def rule(p: torch.Tensor, d: Draft, rng: Random) -> Verdict:
        return sampled_rule(p, p, d, rng, lambda i, x, r: rng.bernoulli(r) or rng.categorical(p[i]) == x)

    return _ruled(target, draft, eos_ids, k, rule)


def penalty_per_step(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2,
                     penalty: float = 1.5) -> VerispecEngine:
    """BROKEN, for a request with repetition penalty `penalty` at temperature 1: every row of a
    round penalises the tokens before the round only, not the drafted tokens before it (one
    token counted per step)."""
    tap = LogitsTap(target)

    def rule(p: torch.Tensor, d: Draft, rng: Random) -> Verdict:
        rows = p.shape[0]  # k + 1, after the pending token and each draft
        context = tap.tokens[: len(tap.tokens) - rows + 1]
        params = SamplingParams(repetition_penalty=penalty)
        stale = penalised(tap.last[-rows:].double(), params, context, [()] * rows, 0, ())  # [k + 1, V]
        return token_level(probabilities(stale, SamplingParams()), d, rng)

    return _ruled(tap, draft, eos_ids, k, rule)


class PenaltiesDroppedEngine(VerispecEngine):
    """BROKEN: a speculative request's repetition penalty is dropped without a word."""

    def sample(self, prompt, case, n, length, method, seed):
        return super().sample(prompt, case if method is None else replace(case, repetition_penalty=None), n, length,
                              method, seed)


def penalties_dropped(target: CausalLM, draft: CausalLM, eos_ids: Collection[int] = (), k: int = 2) -> VerispecEngine:
    return PenaltiesDroppedEngine(target, {DRAFT: lambda lm: DraftModel(_own(draft))}, eos_ids, k=k)


CONTROLS = {"q from raw logits": raw_q, "parameters on the bonus token only": bonus_only,
            "stale cache after a rejection": stale_cache, "bonus from the wrong row": wrong_bonus,
            "repair from p, not the residual": resample_from_p, "parameters on the acceptance test only": acceptance_only,
            "temperature 1.1x on speculative rounds": hotter_speculation, "draft noise reused to accept": reused_noise,
            "argmax verification at any temperature": argmax_verification, "double-accept rule": double_accept}
PENALTY_CONTROLS = {"repetition penalty counting one token per step": penalty_per_step,
                    "penalties dropped with speculation": penalties_dropped}  # for a repetition-penalty request


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
