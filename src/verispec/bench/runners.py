"""Runners: one request of one method, timed the same way for every method and every caller
(`bench` and the greedy identity suite). verispec's own are here, built and timed by
`verispec.runner` as `generate --compare` and `demo` run theirs; the peers' (HF `generate`,
llama.cpp, vLLM) in `verispec.peers`, returning the same `Outcome`.

Every runner streams its output and notes when tokens arrive: the verispec engine by iterating
its `Decoding`, HF `generate` through a streamer (which it calls once per decoding step, and
once per assisted round with all the round's tokens). So the same clock measures, for every
method, the end-to-end wall time of the request (the primary number), the time to the first
new token (prompt prefill plus the first round) and the tokens emitted per round.

Every method of a comparison gets the same `SamplingParams` and seed. HF calls decode with
`do_sample` exactly when the transforms sample (temperature > 0) and then with the same
temperature, top-k, top-p and min-p; they get an all-ones attention mask, `pad_token_id` = the
EOS id, and the same single EOS id as the verispec engine, so their greedy outputs must equal
verispec-plain's token for token.

    >>> runner = VerispecRunner(target, PromptLookup(), 4, eos_token_ids=())
    >>> outcome = runner(prompt_ids, 32, on_token=print)   # prints each token as it commits
    >>> outcome.tokens_per_s, outcome.stats.mean_accepted
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from verispec.engine import Decoding, stream
from verispec.models.base import CausalLM
from verispec.peers.outcome import Outcome
from verispec.policies import KPolicy
from verispec.proposers.base import Proposer
from verispec.request import Request
from verispec.runner import timed
from verispec.sampling import GREEDY, SamplingParams


class VerispecRunner:
    """The verispec engine: plain (no proposer, k = 0) or speculative, under `sampling` (greedy
    by default) with the random stream of `seed`, the same for every request."""

    def __init__(
        self,
        target: CausalLM,
        proposer: Proposer | None,
        policy: int | KPolicy,
        eos_token_ids: Sequence[int],
        sampling: SamplingParams = GREEDY,
        seed: int = 0,
        peer: str | None = None,
    ) -> None:
        self.target = target
        self.peer = peer  # what its target is where it is not the bench's (`verispec-plain@FORMAT`)
        self.proposer = proposer
        self.policy = policy
        self.eos_token_ids = tuple(eos_token_ids)
        self.sampling = sampling
        self.seed = seed

    def __call__(
        self, prompt_ids: Sequence[int], max_new_tokens: int, on_token: Callable[[int], None] | None = None
    ) -> Outcome:
        """One request; on_token(token) is called as each new token is committed."""
        request = Request(tuple(prompt_ids), max_new_tokens, self.sampling, self.eos_token_ids, seed=self.seed)
        outcome = timed(Decoding(self.target, self.proposer, request, policy=self.policy), on_token)
        return outcome if self.peer is None else replace(outcome, peer=self.peer)


class GreedyReference:
    """prompt -> the target's plain greedy continuation, as `prepare` decoded it before a timed
    run (what a `verispec-oracle` method's `ControlledAcceptance` drafts); [] for a prompt not
    prepared."""

    def __init__(self, target: CausalLM, eos_token_ids: Sequence[int]) -> None:
        self.target = target
        self.eos_token_ids = tuple(eos_token_ids)
        self.known: dict[tuple[int, ...], list[int]] = {}

    def prepare(self, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
        key = tuple(prompt_ids)
        known = self.known.get(key)
        if known is not None and (len(known) >= max_new_tokens or (known and known[-1] in self.eos_token_ids)):
            return
        decoding = stream(
            self.target, None, prompt_ids, max_new_tokens=max_new_tokens, sampling=GREEDY,
            eos_token_id=self.eos_token_ids, k=0,
        )
        self.known[key] = list(decoding)

    def __call__(self, prompt_ids: Sequence[int]) -> list[int]:
        return self.known.get(tuple(prompt_ids), [])


class OracleRunner:
    """A `verispec-oracle:ALPHA` method: the prompt's plain greedy continuation is decoded
    first, untimed (`GreedyReference`), then `runner` runs with the proposer that drafts it."""

    def __init__(self, runner: VerispecRunner, reference: GreedyReference) -> None:
        self.runner = runner
        self.reference = reference

    def __call__(
        self, prompt_ids: Sequence[int], max_new_tokens: int, on_token: Callable[[int], None] | None = None
    ) -> Outcome:
        self.reference.prepare(prompt_ids, max_new_tokens)
        return self.runner(prompt_ids, max_new_tokens, on_token)


Runner = Callable[[Sequence[int], int], Outcome]
