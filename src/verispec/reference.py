"""The slow reference decoder: no caches, every prefix recomputed from scratch.

It consumes randomness in exactly the engine's order (the proposer's draws, then the
verifier's), so for the same random stream the engine must emit identical tokens. It shares
with the engine only pure pieces (proposers' stateless drafts, the verification rules, the EOS
cut), so any disagreement is a fault of the engine's incremental state: cache rollback, the
pending token, a proposer's index or cache, the budget.
"""

from __future__ import annotations

from collections.abc import Sequence

from verispec import verify
from verispec.drafts import EMPTY_DRAFT
from verispec.engine import EosIds, check_request, cut_after_eos, emitted_tokens
from verispec.models.base import CausalLM
from verispec.policies import KPolicy, as_policy
from verispec.proposers.base import Proposer
from verispec.randomness import Random
from verispec.sampling import SamplingParams, rule_rows
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
) -> list[int]:
    sampling = sampling or SamplingParams()
    context, eos_ids = check_request(target.vocab_size, prompt_ids, max_new_tokens, eos_token_id)
    choose_rule = verify.rule_chooser(verifier, sampling.greedy)
    policy = as_policy(k)
    policy.begin()
    if proposer is not None:
        # A request configures its proposer (a draft model's q uses the request's sampling).
        proposer.begin(list(context), sampling)
    stats = Stats()
    out: list[int] = []
    while len(out) < max_new_tokens and (not out or out[-1] not in eos_ids):
        k_round = min(policy.choose(stats), max_new_tokens - len(out) - 1)
        draft = proposer.propose_stateless(context, k_round, rng) if k_round > 0 else EMPTY_DRAFT
        draft = cut_after_eos(draft, eos_ids)
        logits = target.score(context + list(draft.tokens))[len(context) - 1 :]
        verdict = choose_rule(draft)(rule_rows(logits, sampling), draft, rng)
        emitted = emitted_tokens(draft, verdict, eos_ids)
        stats.record_round(len(draft), verdict.n_accepted, verdict.fallback)
        context += emitted
        out += emitted
    return out
