"""What a run could see: the law each named bug class would give on the test's cells, computed
exactly from the target's rows and a draft the check controls, and the run's power against it.

The engine is modelled as one speculative chain: a round at emitted position j drafts
min(k, length - j - 1) tokens (k = length - 1, so the first round's bonus is the last token a
sample keys), the draft q at each position is the target's own row at a temperature chosen so
that it accepts half its tokens (sum min(p, q) = 1/2; the rows' transforms applied to q as to
p, so the draft's raw row is the untransformed target row at that temperature), and each class
is the rule it breaks, as a pair of laws at a position: f(x), the chance of emitting x as an
accepted draft, and g(x), of emitting x and ending the round (a repair, or the bonus after
every draft). The law of a sample's cells then follows by summing over where each round ends
(`bug_law`). For a correct rule f + g = p at every position, whatever q. A rule reads the
state of the round too: a penalty counted per step scores every row of a round with the
tokens before the round only (`Rows.per_step`).

A stale cache after a rejection is the one class not computed (`NOT_COMPUTED`): the rows after
a rejection condition on the rejected drafts, so its law sums over every draft the round could
have rejected, V^2 forwards a prompt at length 3 (its control is caught on the tables all the
same). The draft here accepts half, so the TV of a class is what an engine accepting about
half would show; an engine that drafts nothing on the prompts (lookup after a bare opening)
shows none of the speculative classes, which its drafted / accepted column says. `bug_laws`
takes another draft (`DraftRows`) where the engine's own is known: the tests give it the controls'
draft table, to hold each modelled law to what its control samples.

Power: a law b that differs from the exact law p on the test's pooled cells has noncentrality
n sum (b - p)^2 / p against the exact law, and about half that between two samples of n each;
the power is the noncentral chi-square tail beyond the test's critical value at its degrees of
freedom (the p-values are simulated; the chi-square law is their large-sample limit).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
from scipy.optimize import brentq
from scipy.stats import chi2, ncx2

from verispec.runtime_check.cases import SamplingCase, neutral, next_token_law
from verispec.runtime_check.law import OTHER, Score
from verispec.statistics import RARE, _pool_probabilities

ACCEPTANCE = 0.5  # the controlled draft's share of accepted tokens

DraftRows = Callable[[tuple[int, ...], torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# (prefix, p[V], raw[V]) -> the draft's row under the case and its raw row (q[V], q_raw[V])


@dataclass
class Rows:
    """The laws at one prefix: p the case's row, raw the neutral row, q the draft under the case
    and q_raw its untransformed row, parent the case's row before the prefix's last token, and
    per_step(offset): p with its penalties counting only the tokens before a round that drafted
    `offset` of the prefix's last tokens."""

    p: torch.Tensor  # [V]
    raw: torch.Tensor  # [V]
    q: torch.Tensor  # [V]
    q_raw: torch.Tensor  # [V]
    parent: torch.Tensor  # [V]
    per_step: Callable[[int], torch.Tensor]


Rule = Callable[[Rows, int, int], tuple[torch.Tensor, torch.Tensor]]  # (rows, offset, drafts) -> f[V], g[V]


def _correct(p: torch.Tensor, q: torch.Tensor, offset: int, drafts: int) -> tuple[torch.Tensor, torch.Tensor]:
    if offset == drafts:
        return torch.zeros_like(p), p
    accepted = torch.minimum(p, q)  # [V]
    return accepted, (p - q).clamp_min(0.0)


def _with_repair(f: torch.Tensor, repair: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """f, and the rest of the mass spread as `repair` (normalised)."""
    mass = float(repair.sum())
    return f, (1.0 - float(f.sum())) * (repair / mass if mass > 0 else repair)


def _resample(rows: Rows, offset: int, drafts: int):
    p, q = rows.p, rows.q
    return _correct(p, q, offset, drafts) if offset == drafts else _with_repair(torch.minimum(p, q), p)


def _wrong_bonus(rows: Rows, offset: int, drafts: int):
    if offset == drafts and drafts > 0:
        return torch.zeros_like(rows.p), rows.parent
    return _correct(rows.p, rows.q, offset, drafts)


def _acceptance_only(rows: Rows, offset: int, drafts: int):
    p, q, raw = rows.p, rows.q, rows.raw
    if drafts == 0:  # a round that drafts nothing samples as plain decoding
        return _correct(p, q, offset, drafts)
    if offset == drafts:
        return torch.zeros_like(p), raw
    return _with_repair(torch.minimum(p, q), (raw - q).clamp_min(0.0))


def _bonus_only(rows: Rows, offset: int, drafts: int):
    return _correct(rows.p if offset == drafts else rows.raw, rows.q, offset, drafts)


def _hotter(rows: Rows, offset: int, drafts: int):
    if drafts == 0:
        return _correct(rows.p, rows.q, offset, drafts)
    hot = rows.p ** (1 / 1.1)
    return _correct(hot / hot.sum(), rows.q, offset, drafts)


def _argmax(rows: Rows, offset: int, drafts: int):
    if drafts == 0:
        return _correct(rows.p, rows.q, offset, drafts)
    top = torch.zeros_like(rows.p)
    top[int(torch.argmax(rows.p))] = 1.0
    return (torch.zeros_like(top), top) if offset == drafts else _with_repair(rows.q * top, top)


def _reused_noise(rows: Rows, offset: int, drafts: int):
    p, q = rows.p, rows.q
    if offset == drafts:
        return _correct(p, q, offset, drafts)
    ratio = torch.where(q > 0, torch.minimum(torch.ones_like(p), p / q.clamp_min(1e-300)), torch.zeros_like(p))
    below = torch.cumsum(q, 0) - q  # [V]: the CDF before each token
    chance = torch.where(q > 0, ((ratio - below) / q.clamp_min(1e-300)).clamp(0.0, 1.0), torch.zeros_like(p))
    return _with_repair(q * chance, (p - q).clamp_min(0.0))


def _double_accept(rows: Rows, offset: int, drafts: int):
    p, q = rows.p, rows.q
    if offset == drafts:
        return _correct(p, q, offset, drafts)
    ratio = torch.where(q > 0, torch.minimum(torch.ones_like(p), p / q.clamp_min(1e-300)), torch.zeros_like(p))
    return _with_repair(q * (ratio + (1 - ratio) * p), (p - q).clamp_min(0.0))


def _dropped(rows: Rows, offset: int, drafts: int):
    return _correct(rows.raw, _draft(rows.raw)[0], offset, drafts)


def _raw_q(rows: Rows, offset: int, drafts: int):
    p, q, q_raw = rows.p, rows.q, rows.q_raw
    if offset == drafts:
        return _correct(p, q, offset, drafts)
    ratio = torch.where(q_raw > 0, torch.minimum(torch.ones_like(p), p / q_raw.clamp_min(1e-300)), torch.zeros_like(p))
    return _with_repair(q * ratio, (p - q_raw).clamp_min(0.0))


def _penalty_per_step(rows: Rows, offset: int, drafts: int):
    return _correct(rows.per_step(offset), rows.q, offset, drafts)


CLASSES: dict[str, Rule] = {
    "repair from p, not the residual": _resample,
    "bonus from the wrong row": _wrong_bonus,
    "parameters on the acceptance test only": _acceptance_only,
    "parameters on the bonus token only": _bonus_only,
    "temperature 1.1x on speculative rounds": _hotter,
    "argmax verification at any temperature": _argmax,
    "draft noise reused to accept": _reused_noise,
    "double-accept rule": _double_accept,
    "q from raw logits": _raw_q,
    "penalty counted per step": _penalty_per_step,
    "parameter dropped": _dropped,
}
DROPPED = "parameter dropped"  # the one class a plain row can see
NOT_COMPUTED = {"stale cache after a rejection": "its rows condition on the rejected drafts: a sum over V^2 forwards "
                                                 "a prompt"}  # class -> why no row states its power


def _flattened(p: torch.Tensor, beta: float) -> torch.Tensor:
    q = torch.where(p > 0, p.clamp_min(1e-300) ** beta, torch.zeros_like(p))
    return q / q.sum()


def _draft(p: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The controlled draft at a row, and its beta: p^beta normalised, beta in (0, 1] chosen so
    that sum min(p, q) = ACCEPTANCE (the flattest, uniform on p's support, where even it accepts
    more: a row with one or two likely tokens)."""
    overlap = lambda beta: float(torch.minimum(p, _flattened(p, beta)).sum()) - ACCEPTANCE  # noqa: E731
    beta = 1e-6 if overlap(1e-6) >= 0 else brentq(overlap, 1e-6, 1.0, xtol=1e-4)
    return _flattened(p, beta), beta


def controlled_draft(prefix: tuple[int, ...], p: torch.Tensor, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The check's own draft (`DraftRows`): q = `_draft(p)`, and its raw row the neutral row at the
    same beta (a draft model whose logits are beta times the target's, the case applied to them)."""
    q, beta = _draft(p)
    return q, _flattened(raw, beta)


def bug_laws(
    score: Score, prompt: Sequence[int], case: SamplingCase, cells: Collection[tuple[int, ...]], length: int,
    eos_ids: Collection[int] = (), draft: DraftRows = controlled_draft,
) -> dict[str, dict[tuple[int, ...], float]]:
    """class -> its law on `cells` (a partition `law.exact_cells` built), the sample of
    `length` tokens after `prompt` under `case` with `draft` drafting; "exact" -> the correct
    rule's (the exact law)."""
    prompt = list(prompt)
    cached: dict[tuple[int, ...], Rows] = {}

    def rows(prefix: tuple[int, ...]) -> Rows:
        if prefix not in cached:
            logits = score([*prompt, *prefix])[-1]
            p = next_token_law(logits, case, [*prompt, *prefix], prefix)  # [V]
            raw = next_token_law(logits, neutral(case), [*prompt, *prefix], prefix)  # [V]

            def per_step(offset: int) -> torch.Tensor:
                before = prefix[:len(prefix) - offset]
                return p if offset == 0 else next_token_law(logits, case, [*prompt, *before], before)

            cached[prefix] = Rows(p, raw, *draft(prefix, p, raw), rows(prefix[:-1]).p if prefix else p, per_step)
        return cached[prefix]

    listed: dict[tuple[int, ...], set[int]] = {}
    for cell in cells:
        for i in range(len(cell)):
            if cell[i] != OTHER:
                listed.setdefault(cell[:i], set()).add(cell[i])
    rules: dict[str, Rule] = {"exact": lambda r, offset, drafts: _correct(r.p, r.q, offset, drafts), **CLASSES}
    return {name: _law(rule, rows, cells, listed, length, eos_ids) for name, rule in rules.items()}


def _law(rule: Rule, rows: Callable[[tuple[int, ...]], Rows], cells, listed, length, eos_ids) -> dict:
    """The law of `cells` under `rule`: state at a prefix = (offset in the round, drafts of the
    round) -> probability of the prefix with that state; a round ends with its g token."""
    states: dict[tuple[int, ...], dict[tuple[int, int], float]] = {(): {(0, length - 1): 1.0}}
    emitted: dict[tuple[int, ...], torch.Tensor] = {}  # prefix -> [V] law of the next token, weighted by the prefix

    def expand(prefix: tuple[int, ...]) -> None:
        r = rows(prefix)
        total = torch.zeros_like(r.p)  # [V]
        children: dict[int, dict[tuple[int, int], float]] = {t: {} for t in listed.get(prefix, ())}
        for (offset, drafts), mass in states[prefix].items():
            f, g = rule(r, offset, drafts)
            total += mass * (f + g)
            after = len(prefix) + 1
            for t, child in children.items():
                if offset < drafts and float(f[t]) > 0:
                    child[(offset + 1, drafts)] = child.get((offset + 1, drafts), 0.0) + mass * float(f[t])
                if float(g[t]) > 0:
                    fresh = (0, max(0, min(length - 1, length - after - 1)))
                    child[fresh] = child.get(fresh, 0.0) + mass * float(g[t])
        emitted[prefix] = total
        for t, child in children.items():
            states[(*prefix, t)] = child
            if t not in eos_ids and len(prefix) + 1 < length and (*prefix, t) in listed:
                expand((*prefix, t))

    expand(())
    out = {}
    for cell in cells:
        if cell[-1] != OTHER:
            out[cell] = sum(states.get(cell, {}).values())
        else:
            prefix = cell[:-1]
            named = sorted(listed.get(prefix, ()))
            whole = sum(states.get(prefix, {}).values())
            out[cell] = max(0.0, whole - float(emitted[prefix][named].sum())) if named and prefix in emitted else whole
    return out


def noncentrality(exact: dict, bug: dict, n: int, cells: int | None) -> tuple[float, float]:
    """(TV, n sum (b - p)^2 / p) on the cells the test pools at n samples."""
    kept = _pool_probabilities(exact, n, cells)
    pooled_bug: dict = {}
    for key, cell in _cell_map(exact, kept).items():
        pooled_bug[cell] = pooled_bug.get(cell, 0.0) + bug.get(key, 0.0)
    tv = 0.5 * sum(abs(pooled_bug.get(c, 0.0) - p) for c, p in kept.items())
    return tv, n * sum((pooled_bug.get(c, 0.0) - p) ** 2 / p for c, p in kept.items() if p > 0)


def _cell_map(law: dict, kept: dict) -> dict:
    return {key: key if key in kept else RARE for key in law}


def run_power(noncentralities: Sequence[float], df: int, alpha: float) -> float:
    """The power of a test of `df` degrees of freedom at level alpha with the strata's
    noncentralities summed."""
    return float(ncx2.sf(chi2.isf(alpha, df), df, sum(noncentralities))) if df > 0 else 0.0

