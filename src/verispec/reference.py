"""The slow reference decoder: no caches, every prefix recomputed from scratch.

It consumes randomness in exactly the engine's order (the proposer's draws, then the
verifier's), so for the same random stream the engine must emit identical tokens. It shares
with the engine only pure pieces (proposers' stateless drafts, the verification rules, the EOS
cut), so any disagreement is a fault of the engine's incremental state: cache rollback, the
pending token, a proposer's index or cache, the budget.

A proposer that learns from the target's rows (`ObservingProposer`) observes the recomputed
rows at the engine's point: after scoring, before the verdict.

It times each round's drafting (and observing) and scoring on `clock` as the engine does (two
reads around each, `verispec.engine.timed`), so a policy that learns from round timings (`AutoK`) sees the same seconds
in both when both run on the same fake clock (one that advances by a fixed tick per read).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from verispec import verify
from verispec.drafts import EMPTY_DRAFT, Draft, TreeDraft
from verispec.engine import EosIds, check_request, drafted, emitted_tokens, keyword_request, timed
from verispec.models.base import CausalLM
from verispec.policies import KPolicy, PerSource, as_policy
from verispec.proposers.base import ObservingProposer, Proposer, draft_source
from verispec.randomness import Random, Round, TorchRandom
from verispec.request import Request
from verispec.sampling import SamplingParams, penalised, rule_rows
from verispec.stats import Stats


def reference_generate(
    target: CausalLM,
    proposer: Proposer | None,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    rng: Random,
    sampling: SamplingParams | None = None,
    eos_token_id: EosIds = None,
    k: int | KPolicy = 4,
    verifier: str | verify.Verifier = "auto",
    clock: Callable[[], float] = time.perf_counter,
) -> list[int]:
    """The engine's keyword form, without caches (greedy unless `sampling` says otherwise)."""
    request, k = keyword_request(
        prompt_ids, max_new_tokens=max_new_tokens, sampling=sampling, eos_token_id=eos_token_id, k=k, verifier=verifier
    )
    return reference_request(target, proposer, request, policy=k, rng=rng, clock=clock)


def reference_request(
    target: CausalLM,
    proposer: Proposer | None,
    request: Request,
    *,
    policy: int | KPolicy | None = None,
    rng: Random | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[int]:
    """The reference decoding of `request` (as `Decoding` runs it): `policy` built from
    `request.k` when it is a spec, rng default `TorchRandom(request.seed)`."""
    check_request(request, target.vocab_size)
    rng = rng if rng is not None else TorchRandom(request.seed)
    sampling, eos_ids, budget = request.sampling, request.eos_token_ids, request.max_new_tokens
    choose_rule = verify.rule_chooser(request.verifier, sampling.greedy)
    keyed = verify.keyed_rounds(request.verifier, sampling.greedy)
    policies = PerSource(as_policy(request.k_for_decoding(policy)))
    policies.begin()
    context = list(request.prompt_ids)
    if proposer is not None:
        # A request configures its proposer (a draft model's q uses the request's sampling).
        proposer.begin(list(context), sampling)
    stats = Stats()
    out: list[int] = []
    while len(out) < budget and (not out or out[-1] not in eos_ids):
        source = draft_source(proposer, context, stateless=True)
        stats.context_tokens = len(context)
        plan = policies.choose(stats, source).budgeted(request.round_room(len(out)))
        draft, draft_seconds = EMPTY_DRAFT, 0.0
        if plan.nodes:
            draft, draft_seconds = timed(clock, drafted, proposer, plan, context, Round(rng, len(context), keyed), True)
        draft = draft.cut_after(eos_ids)
        logits, target_seconds = timed(clock, _recomputed_rows, target, context, draft)
        if isinstance(proposer, ObservingProposer):
            draft_seconds += timed(clock, proposer.observe, context, draft, logits)[1]
        logits = _penalised_rows(logits, sampling, context, draft, len(out), eos_ids)
        verdict = choose_rule(draft)(rule_rows(logits, sampling), draft, Round(rng, len(context), keyed))
        emitted = emitted_tokens(draft, verdict, eos_ids)
        stats.record(
            len(draft), verdict.n_accepted, len(emitted), plan=plan.describe(), fallback=verdict.fallback,
            draft_seconds=draft_seconds, target_seconds=target_seconds, offers=draft.offered(verdict), source=source,
        )
        context += emitted
        out += emitted
    return out


def _recomputed_rows(target: CausalLM, context: list[int], draft: Draft | TreeDraft) -> torch.Tensor:
    """The rows a round verifies, from scratch: after the context and each drafted prefix
    (for a tree, one full recomputation per node, of the context and that node's path)."""
    if not draft.is_tree:
        return target.score(context + list(draft.tokens))[len(context) - 1 :]
    return torch.stack([target.score(context + list(prefix))[-1] for prefix in draft.row_prefixes()])


def _penalised_rows(logits: torch.Tensor, sampling: SamplingParams, context: list[int], draft: Draft | TreeDraft,
                    emitted: int, eos_ids: frozenset[int]) -> torch.Tensor:
    """Each row after the penalties that read its context, one row at a time from its whole
    context (the context and the drafts on the way to it)."""
    if not sampling.reads_context:
        return logits
    return torch.cat([
        penalised(row[None], sampling, context + list(prefix), [()], emitted + len(prefix), eos_ids)
        for row, prefix in zip(logits, draft.row_prefixes())
    ])
