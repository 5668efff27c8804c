"""What a generation did, round by round: the numbers the cost model and the reports read."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Stats:
    """Per-request counters, updated once per round (`record`) by the engine and the reference.

    drafted[r], accepted[r]: tokens drafted and accepted in round r (k' and n).
    position_attempts[i], position_accepts[i]: rounds whose draft reached position i + 1 with
        the first i accepted, and those that accepted it too. Their ratio is the conditional
        acceptance at that position, their running product the survival estimate.
    Seconds: prefill (the prompt), draft (the proposer), target (the target's scoring
    forwards), verify (sampling transforms and the rule), commit (cache rollback, proposer
    bookkeeping). verify + commit is the engine's own per-round overhead.
    round_draft_seconds[r], round_target_seconds[r]: round r's proposer time (0 when it drafted
        nothing) and its one target forward, which scored drafted[r] + 1 positions; what an
        adaptive policy learns the cost model's c and v(n) from (`verispec.cost.OnlineCosts`).
    round_batch_rows[r]: the rows round r's forward scored in all, its own drafted[r] + 1 and
        those of the requests that shared it (`verispec.batching`); a round that shared its
        forward measures the batch's cost, not its own k's.
    fallbacks: rounds whose repair token came from p because rounding left a zero residual
        (`verispec.verify`); each adds at most its rejection mass, ~1e-16, to the distance
        from the exact law.
    rank_attempts[d][r], rank_accepts[d][r]: rounds (chains and trees) whose accepted path
        reached depth d and offered a child of sibling rank r there, and those that accepted
        that child. Their ratio estimates P(the rank-r child is accepted | its parent was), the
        per-depth, per-rank acceptance a tree's expected length is built from (Sequoia
        2402.12374); a chain offers rank 0 only. tree_rounds: rounds that drafted a tree
        (their drafted[r] counts nodes, and they leave the chain position counters alone).
    plans: how often the policy asked for each plan, in words ('plain step', 'chain k = 4',
        'tree 8 nodes: 3-3-2'; `verispec.tree_shape.describe_plan`), after the budget's cut.
    context_tokens: the request's context now (prompt and emitted tokens), which the next
        round's forward attends to; set by the decoder before each choice (`AutoK` reads its
        costs there).
    by_source: for a proposer that drafts from several sources (`lookup+eagle`: 'copy' or
        'head', `verispec.proposers.base.SourcedProposer`), the same counters over each
        source's rounds only (plans included); each source's policy reads its own.
    """

    new_tokens: int = 0
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    position_attempts: list[int] = field(default_factory=list)
    position_accepts: list[int] = field(default_factory=list)
    round_draft_seconds: list[float] = field(default_factory=list)
    round_target_seconds: list[float] = field(default_factory=list)
    round_batch_rows: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    verify_seconds: float = 0.0
    commit_seconds: float = 0.0
    fallbacks: int = 0
    rank_attempts: list[list[int]] = field(default_factory=list)
    rank_accepts: list[list[int]] = field(default_factory=list)
    tree_rounds: int = 0
    plans: Counter[str] = field(default_factory=Counter)
    context_tokens: int = 0
    by_source: dict[str, Stats] = field(default_factory=dict)

    def source(self, name: str | None) -> Stats:
        """The counters of one draft source's rounds (these, for a proposer with one), at the
        request's current context."""
        if name is None:
            return self
        part = self.by_source.setdefault(name, Stats())
        part.context_tokens = self.context_tokens
        return part

    def record(
        self,
        drafted: int,
        accepted: int,
        emitted: int,
        *,
        plan: str | None = None,
        fallback: bool = False,
        draft_seconds: float = 0.0,
        target_seconds: float = 0.0,
        verify_seconds: float = 0.0,
        offers: tuple[list[int], list[int]] | None = None,
        source: str | None = None,
        batch_rows: int | None = None,
    ) -> None:
        """One round, in one call (the engine's and the reference's alike): its drafted and
        accepted tokens, the tokens it emitted (accepted + the repair or bonus token, fewer when
        an EOS cut it), its plan in words (`plans`; None: not counted), whether its repair fell
        back to p, and its seconds (added to the totals too). offers: a tree round's (offered, ranks) along its accepted path
        (`TreeDraft.offers`); None for a chain. source: which source drafted it (`by_source`),
        None for a proposer with one. batch_rows: the rows of its forward in all (None: its
        own, drafted + 1)."""
        batch_rows = drafted + 1 if batch_rows is None else batch_rows
        if source is not None:
            self.source(source).record(
                drafted, accepted, emitted, plan=plan, fallback=fallback, draft_seconds=draft_seconds,
                target_seconds=target_seconds, verify_seconds=verify_seconds, offers=offers, batch_rows=batch_rows,
            )
        if offers is None:
            self._record_chain(drafted, accepted)
            offered = [1] * min(accepted + 1, drafted)
            ranks = [0] * accepted
        else:
            self.tree_rounds += 1
            offered, ranks = offers
        self._record_ranks(offered, ranks)
        self.new_tokens += emitted
        if plan is not None:
            self.plans[plan] += 1
        self.fallbacks += fallback
        self.drafted.append(drafted)
        self.accepted.append(accepted)
        self.round_draft_seconds.append(draft_seconds)
        self.round_target_seconds.append(target_seconds)
        self.round_batch_rows.append(batch_rows)
        self.draft_seconds += draft_seconds
        self.target_seconds += target_seconds
        self.verify_seconds += verify_seconds

    def _record_chain(self, drafted: int, accepted: int) -> None:
        while len(self.position_attempts) < drafted:
            self.position_attempts.append(0)
            self.position_accepts.append(0)
        for i in range(min(accepted + 1, drafted)):
            self.position_attempts[i] += 1
        for i in range(accepted):
            self.position_accepts[i] += 1

    def _record_ranks(self, offered: list[int], ranks: list[int]) -> None:
        for depth, width in enumerate(offered):
            while len(self.rank_attempts) <= depth:
                self.rank_attempts.append([])
                self.rank_accepts.append([])
            attempts, accepts = self.rank_attempts[depth], self.rank_accepts[depth]
            while len(attempts) < width:
                attempts.append(0)
                accepts.append(0)
            for rank in range(width):
                attempts[rank] += 1
            if depth < len(ranks):
                accepts[ranks[depth]] += 1

    def plan_counts(self) -> dict[str, int]:
        """`plans`, most frequent first."""
        return dict(self.plans.most_common())

    @property
    def rounds(self) -> int:
        return len(self.drafted)

    @property
    def speculative_rounds(self) -> int:
        return sum(1 for d in self.drafted if d > 0)

    @property
    def accepted_histogram(self) -> dict[int, int]:
        """Accepted-prefix length -> number of rounds that drafted at least one token."""
        return dict(sorted(Counter(a for a, d in zip(self.accepted, self.drafted) if d).items()))

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafted tokens / drafted tokens (0 when nothing was drafted)."""
        drafted = sum(self.drafted)
        return sum(self.accepted) / drafted if drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean tokens emitted per round (accepted + repair/bonus), the Spec-Bench tau."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    def survival(self) -> list[float]:
        """s[i] = estimated P(first i + 1 drafted tokens accepted), from conditional rates."""
        s, out = 1.0, []
        for attempts, accepts in zip(self.position_attempts, self.position_accepts):
            if attempts == 0:
                break
            s *= accepts / attempts
            out.append(s)
        return out

    @property
    def decode_seconds(self) -> float:
        return self.draft_seconds + self.target_seconds + self.verify_seconds + self.commit_seconds

    @property
    def overhead_seconds(self) -> float:
        return self.verify_seconds + self.commit_seconds

    def as_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "rounds": self.rounds,
            "drafted": sum(self.drafted),
            "accepted": sum(self.accepted),
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted": self.mean_accepted,
            "accepted_histogram": self.accepted_histogram,
            "position_attempts": self.position_attempts,
            "position_accepts": self.position_accepts,
            "survival": self.survival(),
            "fallbacks": self.fallbacks,
            "tree_rounds": self.tree_rounds,
            "plans": self.plan_counts(),
            "by_source": {
                name: {"rounds": part.rounds, "new_tokens": part.new_tokens, "drafted": sum(part.drafted),
                       "accepted": sum(part.accepted), "plans": part.plan_counts()}
                for name, part in sorted(self.by_source.items())
            },
            "rank_attempts": self.rank_attempts,
            "rank_accepts": self.rank_accepts,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
            "overhead_seconds": self.overhead_seconds,
        }
