"""A whole profile of a loaded model and a built proposer, as `verispec profile` measures it:
v(n) and c at the request's context and optionally at other context lengths (the context
axis), optionally tree rounds, the survival of a generation at k = k_max, the batched
forward's costs and k per batch size, and the memory.

    settings = ProfileSettings(k_max=8, survival_tokens=64)      # every value checked here
    measured = profile_model(loaded, build_proposer("lookup", loaded), "lookup", prompt_ids, settings)
    measured.save("lookup.json")

`ProfileSettings` refuses a bad value when it is made, before any model loads; what needs the
model (a context longer than it holds, batched rows without request slots) is refused by
`profile_model` before any timing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verispec.checks import is_int
from verispec.cost import K_MAX
from verispec.engine import generate
from verispec.k_spec import K_BOUND, TREE_SHAPE_BOUND
from verispec.models.base import SlotScoring, TreeScoring
from verispec.models.loading.memory import memory_report
from verispec.profile import (
    BATCH_ROWS, Profile, k_per_batch_size, measure_batch_costs, measure_context_costs, measure_profile, tiled_context,
)
from verispec.sampling import GREEDY, SamplingParams

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel
    from verispec.proposers.base import Proposer

TREE_NODES = 16  # tree_nodes' default where the model scores trees
BATCH_ROWS_DEFAULT = 64  # batch_rows' default where the model has request slots
BATCH_ROWS_BOUND = 512  # 8 slots of 64 rows: past a server's batches, and a typo is refused, not run
SLOTS = 8  # the request slots batched rows are spread over, and the memory report's


@dataclass(frozen=True)
class ProfileSettings:
    """What to measure. k_max: v(n) for n = 1..k_max + 1. tree_nodes: also tree rounds of
    0..this many nodes (None: 16 where the model scores trees, else 0). repeats, warmup: timed
    and untimed repeats. context_tokens: time at this context length, the prompt tiled or cut
    (None: the prompt's). survival_tokens: generate this many tokens at k = k_max for the
    survival (0: skip). sampling: of the drafts and the survival run. batch_rows: also batched
    forwards of 1..this many rows over up to `SLOTS` request slots (None: 64 where the model
    has slots, else 0). contexts: also the chains' v(n) and c after each of these context
    lengths (the prompt tiled), the context axis the auto policy reads at each request's
    context; () measures none, and the costs are then taken as flat in context."""

    k_max: int = K_MAX
    tree_nodes: int | None = None
    repeats: int = 7
    warmup: int = 2
    context_tokens: int | None = None
    survival_tokens: int = 64
    sampling: SamplingParams = GREEDY
    batch_rows: int | None = None
    contexts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for length in self.contexts:
            if not is_int(length, least=2):
                raise ValueError(f"every context length must be an integer >= 2, got {length!r}")
        for name, value, least, most in (
            ("k_max", self.k_max, 1, K_BOUND), ("tree_nodes", self.tree_nodes, 0, TREE_SHAPE_BOUND),
            ("repeats", self.repeats, 1, None), ("warmup", self.warmup, 0, None),
            ("context_tokens", self.context_tokens, 2, None), ("survival_tokens", self.survival_tokens, 0, None),
            ("batch_rows", self.batch_rows, 0, BATCH_ROWS_BOUND),
        ):
            if value is not None and not is_int(value, least=least, most=most):
                bounds = f">= {least}" if most is None else f"in [{least}, {most}]"
                raise ValueError(f"{name} must be an integer {bounds}, got {value!r}")


def profile_model(
    loaded: LoadedModel, proposer: Proposer, proposer_name: str, prompt_ids: Sequence[int], settings: ProfileSettings
) -> Profile:
    """The whole profile of `proposer` (named `proposer_name` in it) on `loaded`'s target after
    `prompt_ids`, as `settings` asks; refuses, before any timing, a context longer than the
    model holds and batched rows on a model without request slots."""
    lm = loaded.lm
    context = list(prompt_ids) if settings.context_tokens is None else tiled_context(prompt_ids, settings.context_tokens)
    tree_nodes = settings.tree_nodes if settings.tree_nodes is not None else (TREE_NODES if isinstance(lm, TreeScoring) else 0)
    batch_rows = settings.batch_rows if settings.batch_rows is not None else (BATCH_ROWS_DEFAULT if isinstance(lm, SlotScoring) else 0)
    check_room(loaded, len(context), len(prompt_ids), settings, tree_nodes, batch_rows)
    if batch_rows and not isinstance(lm, SlotScoring):
        raise ValueError(f"batched rows need a model with request slots; the {loaded.runtime} runtime has none: give batch rows 0")
    measured = measure_profile(
        lm, proposer, context, k_max=settings.k_max, repeats=settings.repeats, warmup=settings.warmup,
        sampling=settings.sampling, tree_nodes=tree_nodes,
    )
    if settings.contexts:
        measured.contexts = measure_context_costs(
            lm, proposer, prompt_ids, settings.contexts, k_max=settings.k_max, repeats=settings.repeats,
            warmup=settings.warmup, sampling=settings.sampling,
        )
    measured.target, measured.proposer = loaded.name, proposer_name
    measured.machine["dtype"] = loaded.dtype_name
    measured.machine["runtime"] = loaded.runtime + (" (deterministic)" if getattr(lm, "deterministic", False) else "")
    if hasattr(lm, "projection_kernels"):
        measured.machine["projections"] = "; ".join(f"{kernel} x{count}" for kernel, count in lm.projection_kernels().items())
    if settings.survival_tokens:
        run = generate(
            lm, proposer, prompt_ids, max_new_tokens=settings.survival_tokens, sampling=settings.sampling,
            eos_token_id=loaded.eos_token_ids, k=settings.k_max,
        )
        measured.survival = run.stats.survival() or None
    if batch_rows:
        batch = measure_batch_costs(
            lm, context, rows=[n for n in BATCH_ROWS if n <= batch_rows] + [batch_rows], slots=SLOTS,
            repeats=settings.repeats, warmup=settings.warmup,
        )
        measured.batch = batch.to_dict()
        if measured.survival:
            measured.batch_k = k_per_batch_size(batch.costs, measured.c, measured.survival, settings.k_max)
    measured.memory = memory_report(lm, proposer, slots=SLOTS, context=len(context))
    return measured


def check_room(
    loaded: LoadedModel, context: int, prompt: int, settings: ProfileSettings, tree_nodes: int, batch_rows: int
) -> None:
    """Every forward the profile makes fits in the model's context: the context and the longest
    chain or tree after it, each slot's share of the batched rows, the survival run."""
    limit = loaded.context_limit
    if limit is None:
        return
    needs = {
        "the context and k_max + 1 scored tokens": context + max(settings.k_max, tree_nodes) + 1,
        "the longest of the contexts and k_max + 1 scored tokens": max(settings.contexts, default=0) + settings.k_max + 1,
        "each slot's context and its share of the batched rows": context + -(-batch_rows // SLOTS),
        "the prompt and the survival run's tokens": prompt + settings.survival_tokens,
    }
    over = [f"{what} ({n} tokens)" for what, n in needs.items() if n > limit]
    if over:
        raise ValueError(
            f"{', '.join(over)} exceed{'s' if len(over) == 1 else ''} the model's context of {limit} tokens; "
            "give a shorter context or fewer tokens"
        )
