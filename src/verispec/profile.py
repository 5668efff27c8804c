"""Measure the cost model's inputs on this machine: v(n) and c.

v(n) is the target's time to score n new tokens after the request's context, over the time of
one plain step (n = 1), so v(1) = 1; a round of k drafts scores n = k + 1 positions. c is the
proposer's time per drafted token over the same plain step. Both are measured at the actual
context length, the way the engine runs them: the context is prefilled once, then every
timed forward is `extend(n tokens)` followed by the `rollback` that a round performs. The n
values are interleaved and rotated across repeats so drift (thermal, other processes) spreads
over all of them instead of biasing the last; warm-up repeats are discarded.

A prompt-lookup proposer costs a dictionary probe per round: its c is honestly ~0.

Contexts (`measure_context_costs`): attention reads every cached key, so a forward's time
grows with the context, and not alike for every n (a runtime that attends row by row, as the
fast runtime's deterministic float32 and q4 attention does, pays the context once per scored
row). The profile then also times the chains n = 1..k_max + 1 and the drafts after each of
several context lengths (the context tiled, so each is a prefix of the longest): the longest
is prefilled once and each shorter one is a rollback of it: `Profile.contexts`, whose `context_table` the
auto policy reads at each request's current context (`verispec.cost.ContextCosts`).

Trees (`tree_nodes`): a tree round scores the pending token and a tree of n - 1 nodes in one
forward (`TreeScoring.extend_tree`), then keeps one root path (`keep_path`). The profile then
also times, interleaved with the rest, that round's target work for n = 1..tree_nodes + 1 on
a representative shape of n - 1 nodes (`representative_tree`), keeping its deepest path, and a
chain of the same n positions, so that the tree policy reads v(nodes + 1) for trees, and the
price of the tree mask and the compaction is their ratio within one run.

Batches (`measure_batch_costs`): with several requests in flight one forward scores every
request's rows (`SlotScoring.extend_slots`), so the cost that decides k is v over the batch's
rows in all. It times n = 1..64 rows spread over up to 8 slots that each hold the context
(`BATCH_ROWS`), and one row at several context lengths (attention's share grows with it):
`BatchProfile`, whose `costs` feed `verispec.batching.BatchK`.
"""

from __future__ import annotations

import heapq
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from verispec.checks import is_int
from verispec.cost import K_MAX, BatchCosts, ContextCosts, check_survival, check_v_curve
from verispec.drafts import ROOT, TreeDraft
from verispec.engine import scored_parents, tree_target
from verispec.tree_shape import TreeShape
from verispec.machine import describe
from verispec.models.base import CausalLM, SlotScoring
from verispec.policies import Adjustable, AutoK, BatchK
from verispec.proposers.base import Proposer
from verispec.randomness import TorchRandom
from verispec.sampling import SamplingParams
from verispec.transfers import synchronize


@dataclass(frozen=True)
class Timing:
    """Seconds over the measured repeats: median, quartiles and extremes."""

    median: float
    q1: float
    q3: float
    minimum: float
    maximum: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Timing:
        if not seconds:
            raise ValueError("a timing needs at least one measurement")
        quartiles = (
            statistics.quantiles(seconds, n=4, method="inclusive") if len(seconds) > 1 else [seconds[0]] * 3
        )
        return cls(statistics.median(seconds), quartiles[0], quartiles[2], min(seconds), max(seconds))


@dataclass
class Profile:
    """Measured costs in plain target steps, with the raw seconds behind them.

    v: v[n - 1] = v(n) = score[n - 1].median / score[0].median, n = 1..k_max + 1 (v[0] = 1).
    c: draft.median / score[0].median, one drafted token in plain target steps.
    score: seconds to score n new tokens and roll back, n = 1..k_max + 1.
    draft: seconds per drafted token (one `propose(context, k_max)` / k_max).
    drafted: mean tokens the proposer returned when asked for k_max (prompt lookup returns
        fewer, or none, where the context has no match).
    survival: optional measured s_i = P(first i drafted tokens accepted), i = 1..
    tree_v: optional, tree_v[n - 1] = one tree round's target time (score the pending token
        and `tree_shapes[n - 1]`, keep its deepest path, roll back) / score[0].median, for
        n = 1..tree_nodes + 1 positions: the v(nodes + 1) a tree policy reads.
    tree_chain_v: a chain of the same n positions, timed in the same interleaved repeats
        (tree_v[n - 1] / tree_chain_v[n - 1] is the price of the tree mask and compaction).
    tree_score: seconds of the tree rounds, n = 1..tree_nodes + 1.
    tree_shapes: the shape timed at each n (`TreeShape.describe`).
    contexts: optional, the chains' costs after other context lengths (`ContextPoint`, in
        increasing length): the context axis. None: measured at `context_tokens` only, and
        taken as the same at every context.
    batch: optional, the batched forward's costs (`BatchProfile.to_dict`).
    batch_k: optional, the k `BatchK` drafts per request at each batch size ("1", "2", ...),
        for requests of this proposer with this survival (vLLM's
        num_speculative_tokens_per_batch_size).
    memory: optional, bytes: target weights, KV cache per token and per slot.
    """

    c: float
    v: list[float]
    score: list[Timing]
    draft: Timing
    drafted: float
    context_tokens: int
    repeats: int
    machine: dict = field(default_factory=dict)
    target: str = ""
    proposer: str = ""
    survival: list[float] | None = None
    tree_v: list[float] | None = None
    tree_chain_v: list[float] | None = None
    tree_score: list[Timing] | None = None
    tree_shapes: list[str] | None = None
    contexts: list[ContextPoint] | None = None
    batch: dict | None = None
    batch_k: dict[str, int] | None = None
    memory: dict | None = None

    def __post_init__(self) -> None:
        check_v_curve(self.v)
        if len(self.v) < 2 or len(self.score) != len(self.v):
            raise ValueError(
                f"a profile needs v(n) and its timings for n = 1..k_max + 1 with k_max >= 1, got "
                f"{len(self.v)} v values and {len(self.score)} timings"
            )
        if not self.c >= 0:
            raise ValueError(f"c must be >= 0, got {self.c!r}")
        if self.survival is not None:
            check_survival(self.survival)
        if self.tree_v is not None:
            check_v_curve(self.tree_v)
            parts = (self.tree_chain_v, self.tree_score, self.tree_shapes)
            if any(part is None or len(part) != len(self.tree_v) for part in parts):
                raise ValueError("a profile's tree_v needs tree_chain_v, tree_score and tree_shapes of the same length")
        for point in self.contexts or ():
            if len(point.score) != len(self.score):
                raise ValueError(
                    f"the profile's costs after {point.context_tokens} tokens time n = 1..{len(point.score)}, "
                    f"its others n = 1..{len(self.score)}"
                )

    @property
    def k_max(self) -> int:
        return len(self.v) - 1

    @property
    def step_seconds(self) -> float:
        """One plain target step (score one token, roll back), median seconds."""
        return self.score[0].median

    @property
    def context_table(self) -> ContextCosts | None:
        """The costs by context length, in seconds (this profile's own context and each of
        `contexts`), or None where it measured one context only (flat in context)."""
        if not self.contexts:
            return None
        points = {p.context_tokens: p for p in self.contexts}
        points[self.context_tokens] = ContextPoint(self.context_tokens, self.v, self.c, self.score, self.draft)
        ordered = [points[n] for n in sorted(points)]
        return ContextCosts(
            tuple(p.context_tokens for p in ordered),
            tuple(tuple(t.median for t in p.score) for p in ordered),
            tuple(p.draft.median for p in ordered),
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Profile:
        """A profile as `to_dict` wrote it; one written before profiles had a context axis
        (no `contexts`) loads as measured at one context, flat in context."""
        try:
            return cls(
                **{
                    **data,
                    "score": [Timing(**t) for t in data["score"]],
                    "draft": Timing(**data["draft"]),
                    "tree_score": None if data.get("tree_score") is None else [Timing(**t) for t in data["tree_score"]],
                    "contexts": None if data.get("contexts") is None else [ContextPoint.from_dict(p) for p in data["contexts"]],
                }
            )
        except (KeyError, TypeError) as error:
            raise ValueError(
                f"not a verispec profile ({error}); write one with `verispec profile --out FILE.json`"
            ) from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        text = Path(path).read_text()  # FileNotFoundError names the path
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not JSON ({error}); give a file from `verispec profile --out`") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} holds no profile object; give a file from `verispec profile --out`")
        return cls.from_dict(data)


def measure_profile(
    target: CausalLM,
    proposer: Proposer,
    prompt_ids: Sequence[int],
    *,
    k_max: int = K_MAX,
    repeats: int = 7,
    warmup: int = 2,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
    tree_nodes: int = 0,
    prefilled: bool = False,
) -> Profile:
    """Time the target's scoring of n = 1..k_max + 1 tokens and the proposer's drafting after
    `prompt_ids` (the context; its last token plays the round's pending token). `clock` reads
    seconds. tree_nodes > 0: also tree rounds of 0..tree_nodes nodes and chains of as many
    positions (the target must implement `TreeScoring`). prefilled: the target's cache holds
    the context but its last token already (`measure_context_costs`).

    Leaves the target's cache holding the context minus its last token; a request prefills
    anew.
    """
    for name, value, least in (
        ("k_max", k_max, 1), ("repeats", repeats, 1), ("warmup", warmup, 0), ("tree_nodes", tree_nodes, 0)
    ):
        if not is_int(value, least=least):
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    context = [int(t) for t in prompt_ids]
    if not context:
        raise ValueError("the profile needs a nonempty context; give a prompt or --context-tokens")
    if not all(0 <= t < target.vocab_size for t in context):
        raise ValueError(f"context token ids must lie in the vocabulary [0, {target.vocab_size})")
    sampling = sampling or SamplingParams()
    rng = TorchRandom(seed)
    trees = {n: representative_tree(n - 1) for n in range(1, tree_nodes + 2)} if tree_nodes else {}
    scorer = tree_target(target) if trees else None
    # A round scores [pending, x_1..x_k]; which ids fill the x_i does not change the time.
    chain_n = max(k_max, tree_nodes) + 1
    block = [context[-1], *(context * (chain_n // len(context) + 1))[: chain_n - 1]]
    jobs = [("chain", n) for n in range(1, chain_n + 1)] + [("tree", n) for n in trees]
    times: dict[tuple[str, int], list[float]] = {job: [] for job in jobs}
    draft: list[float] = []
    drafted: list[int] = []

    if not prefilled:
        target.prefill(context[:-1])
    elif target.length != len(context) - 1:
        raise ValueError(f"a prefilled target must hold the context but its last token ({len(context) - 1}), holds {target.length}")
    proposer.begin(context, sampling)
    for repeat in range(warmup + repeats):
        shift = repeat % len(jobs)
        for kind, n in jobs[shift:] + jobs[:shift]:
            start = clock()
            if kind == "chain":
                target.extend(block[:n])
            else:
                parents = scored_parents(TreeDraft(tuple(block[1:n]), trees[n].parents))
                scorer.extend_tree(block[:n], parents)
                scorer.keep_path(deepest_path(parents))
            target.rollback(len(context) - 1)
            synchronize()
            times[kind, n].append(clock() - start)
        start = clock()
        tokens = proposer.propose(context, k_max, rng)
        synchronize()
        draft.append((clock() - start) / k_max)
        proposer.commit(context)
        drafted.append(len(tokens))

    measured = slice(warmup, None)
    timings = [Timing.of(times["chain", n][measured]) for n in range(1, k_max + 2)]
    step = timings[0].median
    tree_timings = [Timing.of(times["tree", n][measured]) for n in trees]
    chain_medians = [statistics.median(times["chain", n][measured]) for n in trees]
    return Profile(
        c=Timing.of(draft[measured]).median / step,
        v=[t.median / step for t in timings],
        score=timings,
        draft=Timing.of(draft[measured]),
        drafted=statistics.fmean(drafted[measured]),
        context_tokens=len(context),
        repeats=repeats,
        machine=describe(),
        tree_v=[t.median / step for t in tree_timings] if trees else None,
        tree_chain_v=[median / step for median in chain_medians] if trees else None,
        tree_score=tree_timings if trees else None,
        tree_shapes=[shape.describe() for shape in trees.values()] if trees else None,
    )


@dataclass
class ContextPoint:
    """The chains' costs after one context length: score[n - 1], seconds to score n new
    tokens and roll back (n = 1..k_max + 1); draft, seconds per drafted token; v and c
    relative to this context's own plain step, as `Profile`'s."""

    context_tokens: int
    v: list[float]
    c: float
    score: list[Timing]
    draft: Timing

    @classmethod
    def from_dict(cls, data: dict) -> ContextPoint:
        return cls(**{**data, "score": [Timing(**t) for t in data["score"]], "draft": Timing(**data["draft"])})


def measure_context_costs(
    target: CausalLM,
    proposer: Proposer,
    prompt_ids: Sequence[int],
    contexts: Sequence[int],
    **options,
) -> list[ContextPoint]:
    """The chains' costs (`measure_profile`'s, without trees; `options` go to it) after each of
    `contexts` tokens, the prompt tiled to each (so each is a prefix of the longest): the
    longest is prefilled once and each shorter one is a rollback, from the longest down.
    Returns them in increasing length.

    Leaves the target's cache holding the shortest context minus its last token."""
    lengths = sorted(set(contexts))
    if not lengths or not all(is_int(n, least=2) for n in lengths):
        raise ValueError(f"context lengths must be integers >= 2, got {list(contexts)}")
    ids = tiled_context(prompt_ids, lengths[-1])
    target.prefill(ids[:-1])
    points = []
    for length in reversed(lengths):
        target.rollback(length - 1)
        measured = measure_profile(target, proposer, ids[:length], prefilled=True, **options)
        points.append(ContextPoint(length, measured.v, measured.c, measured.score, measured.draft))
    return points[::-1]


BATCH_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
CONTEXTS = (64, 256, 1024)


@dataclass
class BatchProfile:
    """The batched forward's cost: rows [P] (total rows over every slot, from 1), v [P] (time /
    one row's, v(1) = 1), score [P] (seconds), slots (the most slots the rows were spread
    over), context_tokens (each slot's context); contexts [C] and context_score [C]: one row's
    forward at each context length (the attention's share)."""

    rows: list[int]
    v: list[float]
    score: list[Timing]
    slots: int
    context_tokens: int
    contexts: list[int] = field(default_factory=list)
    context_score: list[Timing] = field(default_factory=list)

    @property
    def costs(self) -> BatchCosts:
        return BatchCosts(tuple(self.rows), tuple(self.v))

    def to_dict(self) -> dict:
        return asdict(self)


def measure_batch_costs(
    target: SlotScoring,
    prompt_ids: Sequence[int],
    *,
    rows: Sequence[int] = BATCH_ROWS,
    slots: int = 8,
    contexts: Sequence[int] = CONTEXTS,
    repeats: int = 5,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> BatchProfile:
    """Time one `extend_slots` forward of n rows in all, spread as evenly as they go over
    min(n, slots) slots that each hold `prompt_ids` but its last token, then each slot's
    rollback, for every n in `rows` (interleaved and rotated over repeats, warm-ups dropped);
    and one row after each of `contexts` tokens (the prompt tiled). Uses fresh slots of
    `target`, never its own cache."""
    context = [int(t) for t in prompt_ids]
    if not context or not all(0 <= t < target.vocab_size for t in context):
        raise ValueError(f"the batch profile needs a nonempty context of ids in [0, {target.vocab_size})")
    rows = sorted(set(rows))
    if not rows or rows[0] != 1 or not is_int(slots, least=1):
        raise ValueError(f"batch rows must start at 1 and slots be >= 1, got rows {rows} and slots {slots!r}")
    pool = [target.new_slot(len(context) + max(rows)) for _ in range(min(slots, max(rows)))]
    for slot in pool:
        slot.prefill(context[:-1])
    deep = {length: target.new_slot(length + 1) for length in contexts}
    for length, slot in deep.items():
        slot.prefill(tiled_context(context, length))
    block = (context * (max(rows) // len(context) + 2))[: max(rows) + 1]
    jobs = [("rows", n) for n in rows] + [("context", length) for length in contexts]
    times: dict[tuple[str, int], list[float]] = {job: [] for job in jobs}
    for repeat in range(warmup + repeats):
        shift = repeat % len(jobs)
        for kind, n in jobs[shift:] + jobs[:shift]:
            if kind == "rows":
                used = pool[: min(n, len(pool))]
                split = [n // len(used) + (i < n % len(used)) for i in range(len(used))]
                tokens = [[context[-1], *block[1:m]] for m in split]
                start = clock()
                target.extend_slots(used, tokens)
                synchronize()
                seconds = clock() - start
                for slot in used:
                    slot.rollback(len(context) - 1)
            else:
                slot = deep[n]
                start = clock()
                slot.extend([context[-1]])
                synchronize()
                seconds = clock() - start
                slot.rollback(n)
            times[kind, n].append(seconds)
    measured = slice(warmup, None)
    score = [Timing.of(times["rows", n][measured]) for n in rows]
    return BatchProfile(
        rows=list(rows),
        v=[t.median / score[0].median for t in score],
        score=score,
        slots=len(pool),
        context_tokens=len(context),
        contexts=list(contexts),
        context_score=[Timing.of(times["context", n][measured]) for n in contexts],
    )


def tiled_context(ids: Sequence[int], length: int) -> list[int]:
    """`ids` repeated or cut to `length` tokens."""
    return (list(ids) * (length // len(ids) + 1))[:length]


def k_per_batch_size(
    costs: BatchCosts, c: float, survival: Sequence[float], k_max: int, sizes: Sequence[int] = (1, 2, 4, 8, 16, 32)
) -> dict[str, int]:
    """The k `BatchK` gives each of b identical requests (cost c per drafted token, `survival`)
    at each batch size b: drafting shrinks as the batch's forward turns compute-bound."""
    planner = BatchK(costs)
    most = min(k_max, len(survival))
    return {str(b): max(planner.plan([Adjustable(most, survival, c)] * b)) for b in sizes}


def representative_tree(nodes: int) -> TreeShape:
    """A tree shape of `nodes` nodes as a cost-driven policy grows one (Sequoia's greedy
    construction): the rank paths of highest acceptance probability when the rank-r candidate
    is accepted with probability 0.6 * 0.5^r at every depth, ties broken by depth then path.

    >>> representative_tree(6).describe()
    '6 nodes: 2-3-1'
    """
    chosen: list[tuple[int, ...]] = []
    frontier = [(-0.6, (0,))]
    while frontier and len(chosen) < nodes:
        score, path = heapq.heappop(frontier)
        chosen.append(path)
        heapq.heappush(frontier, (score * 0.6, (*path, 0)))
        heapq.heappush(frontier, (score * 0.5, (*path[:-1], path[-1] + 1)))
    return TreeShape.of(chosen)


def deepest_path(parents: Sequence[int]) -> tuple[int, ...]:
    """The root path to the deepest node (the last one at that depth): the path a round that
    accepts the most keeps; () for no nodes."""
    tree = TreeDraft(tuple(range(len(parents))), tuple(parents))  # the tokens do not matter
    return tree.path_to(max(range(len(tree)), key=lambda node: (tree.depths[node], node), default=ROOT))


def measured_autok(
    target: CausalLM,
    proposer: Proposer,
    prompt_ids: Sequence[int],
    *,
    k_max: int = K_MAX,
    sampling: SamplingParams | None = None,
    **options,
) -> AutoK:
    """An AutoK from a brief profile of this target and proposer after this prompt (two
    timed repeats after one warm-up: about a second on the default model); `options` go to
    `AutoK`. The profile is its prior: AutoK goes on measuring c and v(n) from its rounds."""
    profile = measure_profile(target, proposer, prompt_ids, k_max=k_max, repeats=2, warmup=1, sampling=sampling)
    return AutoK(profile, **options)
