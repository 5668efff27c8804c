"""One request on a loaded model, run the one way every command runs it: the request's proposer
and k policy built from the registry on the model (`built`), a short plain warm-up (`warm_up`),
the run timed as its tokens arrive (`timed`, an `Outcome`), and, to compare, plain decoding of
the same request after it, a greedy difference diagnosed (`run`).

`verispec generate` and `demo` call `run`; the bench's verispec runners `built` and `timed`; the
scheduler builds each request's proposer and policy on its slot with `built`, so the server's
warm-up requests are built as `generate` builds its one. The commands only parse, call and print.

    >>> loaded = load_model()
    >>> request = Request(tuple(loaded.encode("Hi")), 32, proposer="lookup", k="auto", seed=0)
    >>> done = run(loaded, request, compare=True)
    >>> done.speculative.tokens_per_s, done.identical
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from verispec.cost import PRIOR_RATE
from verispec.engine import Decoding
from verispec.identity import diagnose
from verispec.k_spec import KSpec
from verispec.logprobs import TokenLogprob
from verispec.models.base import CausalLM
from verispec.models.loading.format_costs import Drafting, Workload
from verispec.models.runtime import Runtime
from verispec.peers.outcome import Clock, Outcome
from verispec.policies import KPolicy
from verispec.proposers.base import Proposer
from verispec.proposers.trained import default_proposer
from verispec.registry import Corpus, ProposerSpec, build_policy, build_proposer, check_policy_proposer, parse_k, parse_spec
from verispec.request import Request

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel
    from verispec.models.loading.load_plan import LoadPlan


@dataclass(frozen=True)
class Run:
    """A timed speculative run and, when compared, the plain run of the same request after it.
    mismatch: `identity.diagnose`'s record of a greedy difference (None: identical, or sampled).
    first_difference: where the outputs first differ (None: identical, or not compared).
    logprobs, prompt_logprobs: the speculative run's, when the request asks
    (`Request.logprobs`, `Request.prompt_logprobs`; `verispec.logprobs`)."""

    speculative: Outcome
    plain: Outcome | None = None
    mismatch: dict | None = None
    first_difference: int | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.plain is not None and self.plain.tokens == self.speculative.tokens


NO_PROPOSER = "none"  # what `serve --proposer` and `load-plan --proposer` take for plain decoding


def specs(model: str, proposer: str | None, k: str) -> tuple[ProposerSpec, KSpec]:
    """The proposer (the model's default when None) and k a command was given, parsed once and
    refused where they do not combine (a tree for a proposer that cannot fill one)."""
    k_spec = parse_k(k)
    proposer_spec = parse_spec(proposer or default_proposer(model))
    check_policy_proposer(k_spec, proposer_spec)
    return proposer_spec, k_spec


def load_plan(
    model: str,
    dtype: str,
    runtime: str,
    deterministic: bool | None,
    device: str,
    proposer: ProposerSpec | None,
    k_spec: KSpec | int | None,
    concurrency: int = 1,
    *,
    trust_remote_code: bool = False,
    cache_type_v: str | None = None,
) -> LoadPlan:
    """What loading `model` will build (`models.loading.load_plan.plan_load`: it refuses what cannot
    load before any weights are read), its dtype and runtime weighed by what a step is expected to
    decode (`workload`). `generate`, `demo`, `serve` and `load-plan` all plan through here, so for
    the same model, proposer and k on the same machine they load the same target; the server
    weighs more requests in flight only when told (`serve --concurrency`)."""
    from verispec.models.loading.load_plan import plan_load

    return plan_load(model, dtype, runtime, deterministic, device=device, trust_remote_code=trust_remote_code,
                     workload=workload(proposer, k_spec, concurrency), cache_type_v=cache_type_v)


def workload(proposer: ProposerSpec | None, k_spec: KSpec | int | None, concurrency: int = 1) -> Workload:
    """What `--dtype auto` expects a step to decode: `concurrency` requests in flight, each
    drafting with `proposer` under `k_spec`, each drafted token accepted with AutoK's prior rate
    (`verispec.cost.PRIOR_RATE`, what AutoK assumes before a request's first round) and costing
    the proposer kind's `draft_cost`; plain decoding where no proposer is given, k is 0, or the
    kind declares no draft cost (nothing measured says what it costs).

        >>> workload(parse_spec("lookup"), parse_k("auto")).describe()[:30]
        'lookup at k auto, 1 request in'
        >>> workload(parse_spec("random"), parse_k("2")).note
        'no draft cost is known for random: weighed as plain decoding'
    """
    if proposer is None or not k_spec:  # no proposer, or k = 0
        return Workload(concurrency)
    k = k_spec if isinstance(k_spec, KSpec) else parse_k(k_spec)
    if proposer.kind.draft_cost is None:
        return Workload(concurrency, note=f"no draft cost is known for {proposer}: weighed as plain decoding")
    return Workload(concurrency, Drafting(str(proposer), k, PRIOR_RATE, proposer.kind.draft_cost))


def plain_alternatives(
    model: str, runtime: str, deterministic: bool | None, device: str, loaded: LoadPlan
) -> list[LoadPlan]:
    """The plans of the other formats `--dtype auto` weighs for `model` (each on its runtime):
    the demo decodes plainly in each too, so it reports its speedup against the fastest plain
    format as well as against plain decoding in the format loaded. Where auto weighs nothing
    (one format fits the machine), that format's plan where it is not the one loaded."""
    from verispec.models.loading.load_plan import plan_load

    plain = plan_load(model, "auto", runtime, deterministic, device=device, cache_type_v=loaded.cache_type_v)
    if plain.format_choice is None:
        targets = [(plain.weight_format, plain.runtime)]
    else:
        targets = [(c.cost.weight_format, c.cost.runtime) for c in plain.format_choice.candidates]
    return [
        plan_load(model, str(fmt), str(on), None if on == Runtime.HF else deterministic, device=device)
        for fmt, on in targets if (fmt, on) != (loaded.weight_format, loaded.runtime)
    ]


def built(loaded: LoadedModel, request: Request) -> tuple[Proposer | None, int | KPolicy]:
    """The request's proposer and k policy, built on `loaded`'s model."""
    proposer = proposer_for(loaded, request)
    return proposer, policy_for(request, loaded.lm, proposer)


def proposer_for(loaded: LoadedModel, request: Request, slot: CausalLM | None = None, corpus: Corpus = ()) -> Proposer | None:
    """The request's proposer, its registry spec built on `loaded` (on `slot`, a slot of its
    model, when given); None for plain decoding."""
    if request.proposer is None:
        return None
    return build_proposer(request.proposer, loaded if slot is None else replace(loaded, lm=slot), corpus)


def policy_for(request: Request, target: CausalLM, proposer: Proposer | None) -> int | KPolicy:
    """The request's k policy on `target`: an integer k as it is, a spec's policy built (`auto`
    and `tree` profile `proposer` after the request's prompt, without its grammar: a profile
    decodes other text)."""
    spec = request.k_spec
    if spec is None or spec.kind == "constant":
        return request.k_for_decoding()
    return build_policy(spec, target, proposer, request.prompt_ids, replace(request.sampling, grammar=None))


def warm_up(target: CausalLM, prompt_ids: Sequence[int]) -> None:
    """Two plain tokens, so that the timed run does not pay for lazy initialisation."""
    timed(Decoding(target, None, Request(tuple(prompt_ids), 2, seed=0)))


def timed(decoding: Decoding, on_token: Callable[[int], None] | None = None) -> Outcome:
    """`decoding` run to its end, each token passed to `on_token` as it is committed; its
    `Outcome` (the wall time, the first token's, the tokens each round emitted, `Stats`)."""
    clock = Clock()
    for token in decoding:
        clock.arrived()
        if on_token is not None:
            on_token(token)
    clock.per_round = emitted_per_round(decoding.stats.accepted, len(decoding.tokens))
    return clock.outcome(list(decoding.tokens), decoding.stats)


def run(
    loaded: LoadedModel, request: Request, *, on_token: Callable[[int], None] | None = None, compare: bool = False
) -> Run:
    """`request` on `loaded`: its proposer and policy built (`built`), a warm-up, the timed run
    (each token passed to `on_token` as it is committed) and, with `compare`, plain decoding of
    the same request (same sampling and seed) timed after it. Greedy output must equal plain
    decoding's, and so must sampled output for the same seed (the coupled rule: every token is
    the target's keyed sample at its position); a greedy difference is diagnosed
    (`verispec.identity`), a sampled one located."""
    proposer, policy = built(loaded, request)
    speculative = Decoding(loaded.lm, proposer, request, policy=policy)
    warm_up(loaded.lm, request.prompt_ids)
    spec = timed(speculative, on_token)
    logprobs = {"logprobs": speculative.logprobs, "prompt_logprobs": speculative.prompt_logprobs}
    if not compare:
        return Run(spec, **logprobs)
    plain = timed(Decoding(loaded.lm, None, replace(request, proposer=None, k=0)))
    mismatch = None
    if request.sampling.greedy:
        mismatch = diagnose(request.prompt_ids, plain.tokens, spec.tokens, loaded.lm.score, loaded.dtype_name)
    return Run(spec, plain, mismatch, first_difference(plain.tokens, spec.tokens), **logprobs)


def first_difference(plain: Sequence[int], speculative: Sequence[int]) -> int | None:
    """The index of the first token where the outputs differ (a length counts), or None.

    >>> first_difference([1, 2, 3], [1, 5, 3]), first_difference([1, 2], [1, 2])
    (1, None)
    """
    for i, (a, b) in enumerate(zip(plain, speculative)):
        if a != b:
            return i
    return None if len(plain) == len(speculative) else min(len(plain), len(speculative))


def emitted_per_round(accepted: Sequence[int], new_tokens: int) -> list[int]:
    """Tokens each round emitted: accepted + 1, except that EOS can cut the last round short."""
    per_round = [a + 1 for a in accepted]
    if per_round:
        per_round[-1] = new_tokens - sum(per_round[:-1])
    return per_round
