"""verispec itself as an engine under check: the control every other engine is read against,
and the engine the negative controls break (`verispec.runtime_check.controls`).

On a target with slots (the fast runtime) sampling runs the continuous-batching `Scheduler`:
`BATCH` samples at once, each a request of its own with its own seed, so each sample's random
stream is its own and its law is the target's whatever shares its steps (`verispec.batching`;
k is constant, so a sample's tokens depend on its seed alone). Greedy decoding at concurrency
above 1 runs the same scheduler. Without slots (and with a verification rule given as a
function, as the negative controls pass) every sample is one `verispec.generate`. verispec
samples with temperature, top-k, top-p, min-p and the repetition penalty, and refuses
frequency and presence penalties and logit biases, as `verispec serve` does: they are reported
as refused.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Collection, Sequence

import torch

from verispec import Request, Scheduler, generate
from verispec.machine import version
from verispec.models.base import CausalLM, SlotScoring
from verispec.proposers.base import Proposer
from verispec.runtime_check.cases import SamplingCase
from verispec.runtime_check.engines.base import Refused
from verispec.sampling import GREEDY
from verispec.stats import Stats
from verispec.verify import Verifier, keyed_rounds

BATCH = 128  # samples decoded at once by the scheduler


def fresh_seed() -> int:
    """A seed of its own for a request that names none."""
    return secrets.randbits(63)

ProposerFactory = Callable[[CausalLM], Proposer]  # a proposer for a target (or one of its slots)


class VerispecEngine:
    """target: the model to decode; proposers: method name -> factory; k: drafted tokens per
    round; verifier: "auto" or a rule (the controls pass a broken one)."""

    name = "verispec"

    def __init__(
        self,
        target: CausalLM,
        proposers: dict[str, ProposerFactory],
        eos_ids: Collection[int],
        *,
        k: int = 4,
        verifier: str | Verifier = "auto",
        dtype: str = "float32",
    ) -> None:
        self.target = target
        self.factories = proposers
        self.methods = tuple(proposers)
        self.eos_ids = frozenset(eos_ids)
        self.k = k
        self.verifier = verifier
        # keyed rounds (the coupled rule): a seed fixes the tokens whatever the k, proposer or batch
        self.claims_seeded_identity = keyed_rounds(verifier, greedy_sampling=False)
        self.dtype = dtype
        self._built: dict[str, Proposer] = {}
        self._schedulers: dict[int, Scheduler] = {}  # by slots: each keeps its slots for every later call
        self._drafted = self._accepted = 0

    def drafts(self) -> tuple[int, int]:
        """Tokens drafted and accepted over every request decoded so far (`CountsDrafts`)."""
        return self._drafted, self._accepted

    def _count(self, stats: Stats) -> None:
        self._drafted += sum(stats.drafted)
        self._accepted += sum(stats.accepted)

    def versions(self) -> dict[str, str]:
        return {"verispec": version()}

    def proposer(self, method: str | None) -> Proposer | None:
        if method is None:
            return None
        if method not in self.factories:
            raise ValueError(f"verispec has no method {method!r} here; choose from {', '.join(self.methods)}")
        if method not in self._built:
            self._built[method] = self.factories[method](self.target)
        return self._built[method]

    def sample(
        self, prompt: Sequence[int], case: SamplingCase, n: int, length: int, method: str | None, seed: int
    ) -> list[list[int]]:
        return self._sample(prompt, case, length, method, [seed + i for i in range(n)])

    def _sample(
        self, prompt: Sequence[int], case: SamplingCase, length: int, method: str | None, seeds: Sequence[int]
    ) -> list[list[int]]:
        """One continuation per seed, all in flight together where the target has slots."""
        if case.penalties:
            raise Refused(
                f"verispec samples with temperature, top-k, top-p, min-p and repetition_penalty; {', '.join(case.penalties)} would change "
                "the output law, so it is refused (as `verispec serve` answers 400)"
            )
        if self._batched():
            return self._scheduled(
                [Request(tuple(prompt), length, sampling=case.sampling, eos_token_ids=self.eos_ids, seed=seed,
                         proposer=method, k=self.k if method is not None else 0, verifier=self.verifier)
                 for seed in seeds],
                BATCH,
            )
        proposer = self.proposer(method)
        out = []
        for seed in seeds:
            decoded = generate(
                self.target, proposer, list(prompt), max_new_tokens=length, sampling=case.sampling,
                eos_token_id=self.eos_ids, k=self.k if proposer is not None else 0, seed=seed, verifier=self.verifier,
            )
            self._count(decoded.stats)
            out.append(decoded.tokens)
        return out

    def sample_unseeded(
        self, prompt: Sequence[int], case: SamplingCase, n: int, length: int, method: str | None
    ) -> list[list[int]]:
        """n requests without a seed: each gets a fresh one, as `verispec serve` gives them
        (`SamplesUnseeded`)."""
        return self._sample(prompt, case, length, method, [fresh_seed() for _ in range(n)])

    def logits(self, prefix: Sequence[int]) -> torch.Tensor:
        """The target's last-position logits after `prefix` from a fresh full forward, float [V]
        (`GivesLogits`)."""
        return self.target.score(list(prefix))[-1]

    def greedy(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, method: str | None, concurrency: int
    ) -> list[list[int]]:
        k = self.k if method is not None else 0
        if concurrency == 1:
            proposer = self.proposer(method)
            return [
                generate(self.target, proposer, list(p), max_new_tokens=max_new_tokens, sampling=GREEDY,
                         eos_token_id=self.eos_ids, k=k, verifier=self.verifier).tokens
                for p in prompts
            ]
        if not isinstance(self.target, SlotScoring):
            raise Refused(f"{type(self.target).__name__} has one cache; concurrent requests need the fast runtime's slots")
        if not isinstance(self.verifier, str):
            raise Refused("a verification rule given as a function decodes single requests only")
        return self._scheduled(
            [Request(tuple(p), max_new_tokens, sampling=GREEDY, eos_token_ids=self.eos_ids, proposer=method, k=k,
                     verifier=self.verifier) for p in prompts],
            concurrency,
        )

    def _batched(self) -> bool:
        """Whether the scheduler can decode here: a target with slots and a rule by name."""
        return isinstance(self.target, SlotScoring) and isinstance(self.verifier, str)

    def _scheduled(self, requests: Sequence[Request], slots: int) -> list[list[int]]:
        """Every request's tokens, `slots` of them decoded at once, by one scheduler per slot
        count kept for the engine's life: its slots (and the proposers built on them) serve
        every later call's requests instead of being allocated again (`Scheduler`)."""
        if slots not in self._schedulers:
            self._schedulers[slots] = Scheduler(self.target, self._build, max_slots=slots)
        scheduler = self._schedulers[slots]
        jobs = [scheduler.submit(request) for request in requests]
        scheduler.run()
        for job in jobs:
            self._count(job.stats)
        return [list(job.tokens) for job in jobs]

    def _build(self, request: Request, slot: CausalLM) -> tuple[Proposer | None, int]:
        return (None if request.proposer is None else self.factories[request.proposer](slot)), request.k
