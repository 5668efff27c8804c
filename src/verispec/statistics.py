"""The G-tests of sampled laws: the two a sampled-law check runs (`verispec check-runtime`),
with what each can and cannot see, and the asymptotic one the test suite runs (`g_test`).

Samples are keyed by their first tokens (`law.key`), one stratum per prompt. Cells whose
expected count is below `MIN_EXPECTED` are pooled into one rare cell per stratum (rare tokens
pooled), so the chi-square approximation holds; a change inside the rare cell is invisible.
`cells` caps a stratum's cells: the `cells` - 1 most likely (by the exact law, or by both
samples together, which does not depend on which sample a count came from) keep their own
cell and the rest join the rare one. Without a cap the cells grow with N (every outcome
expected `MIN_EXPECTED` times gets one), and so do the degrees of freedom and the
noncentrality a test needs: at TV 0.05 about 1000 degrees of freedom and 42,000 samples per
side on the default model, against 13,458 with 24 cells a prompt. The price: the TV detected
is the TV on those cells, so a change among the rarer outcomes counts only by how much mass it
moves in or out of the rare cell.

- `two_sample`: speculation on against off, a G-test of homogeneity per stratum (cells with
  fewer than `MIN_EXPECTED` expected in either sample pooled), the statistics and degrees of
  freedom summed over strata.
- `goodness_of_fit`: one engine's samples against the exact law (`law.exact_cells`), a G-test
  per stratum, summed the same way.

False failure: each test rejects a correct engine with probability at most `alpha`, exactly,
at any N and any cells: its p-value is simulated (`simulations(alpha)` draws, at least 20 / alpha),
not read from the chi-square tail. Against the exact law the G statistic is drawn under the
exact law itself (multinomial counts per stratum); between two samples it is drawn under
the permutation law given each cell's total (a multivariate hypergeometric split per
stratum), which holds whatever the common law is. p = (1 + draws at least the observed) /
(draws + 1), so P(p <= alpha) <= alpha. The chi-square tail the test used before failed
correct engines at 1.4-2.3 times alpha where cells were small (a G statistic's tail is heavier
than chi-square's there); it is still reported beside the simulated p-value (`p_chi2`), and
the power below still reads the chi-square approximation, as a G statistic's law approaches it.

Power: a law that differs by total variation delta on the test's cells at
every prompt (or by delta on average, weighted by samples) has noncentrality at least
4 delta^2 n1 n2 / (n1 + n2) (two samples of n1 and n2) or 4 delta^2 n (against the exact law)
by Cauchy-Schwarz (sum (p - q)^2 / m >= (sum |p - q|)^2 / sum m); `detectable_tv` is the
delta whose noncentrality gives 90 % power at the test's degrees of freedom. The bound holds
for every way of spreading the difference, so a real bug is usually caught at a smaller one.
`samples_for` turns this around: the samples per side at which a test detects a given TV.

`g_test`: one sample's counts against exact probabilities, its p-value read from the
chi-square tail, for a test whose alpha is too small to simulate (1e-7 would take 2e8 draws):
its false-failure rate is alpha up to the tail's error where cells are small.

    >>> round(detectable_tv(2000, 20, 1e-3, exact=True), 3)
    0.074
    >>> samples_for(0.05, 1e-3, lambda n: 30, exact=True), samples_for(0.05, 1e-3, lambda n: 30)
    (4965, 9929)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import brentq
from scipy.special import xlogy
from scipy.stats import chi2, ncx2

MIN_EXPECTED = 5.0
POWER = 0.9
RARE = ("rare",)


@dataclass(frozen=True)
class TestResult:
    """statistic: G summed over strata, df its degrees of freedom; p_value its simulated
    tail (module docstring), p_chi2 its chi-square tail (for scale: the simulated p-value
    stops at 1 / (draws + 1)). tv: the total variation between the compared laws on the test's cells, averaged over
    strata weighted by samples (the two-sample plug-in estimate carries sampling noise of about
    sqrt(cells / n)). n: samples per side (the engine's samples against the exact law).
    detectable_tv: the delta detected with 90 % power (module docstring). alpha: the level."""

    statistic: float
    df: int
    p_value: float
    tv: float
    n: int
    detectable_tv: float
    alpha: float
    p_chi2: float | None = None

    @property
    def passed(self) -> bool:
        return self.p_value >= self.alpha

    @classmethod
    def from_dict(cls, result: dict) -> TestResult:
        """The result `as_dict` wrote (JSON writes an infinite detectable TV as Infinity)."""
        return cls(result["statistic"], result["df"], result["p_value"], result["tv"], result["n"],
                   result["detectable_tv_90"], result["alpha"], result.get("p_chi2"))

    def as_dict(self) -> dict:
        return {
            "statistic": self.statistic, "df": self.df, "p_value": self.p_value, "tv": self.tv, "n": self.n,
            "detectable_tv_90": self.detectable_tv, "alpha": self.alpha, "passed": self.passed,
            "p_chi2": self.p_chi2,
        }


def simulations(alpha: float) -> int:
    """The draws a simulated p-value needs at level `alpha`: 20 / alpha - 1 (at least 199), so
    20 draws or fewer at least the observed statistic reject.

    >>> simulations(1e-3)
    19999
    """
    return max(199, math.ceil(20 / alpha) - 1)


def g_statistic(observed: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """G = 2 sum o log(o / e) over the last axis (0 log 0 = 0): one statistic per row."""
    return 2.0 * xlogy(observed, observed / expected).sum(axis=-1)


def two_sample(
    strata: Sequence[tuple[Counter, Counter]], alpha: float, cells: int | None = None, seed: int = 0
) -> TestResult:
    """strata: per prompt, (counts with speculation, counts without), keyed by cell; cells: the
    most cells a stratum keeps (None: no cap); seed: the simulation's generator."""
    draws, rng = simulations(alpha), np.random.default_rng(seed)
    total, df, tv_mass, simulated = 0.0, 0, 0.0, np.zeros(simulations(alpha))
    n1 = sum(sum(a.values()) for a, _ in strata)
    n2 = sum(sum(b.values()) for _, b in strata)
    for a, b in strata:
        size_a, size_b = sum(a.values()), sum(b.values())
        if not size_a or not size_b:
            continue
        share = min(size_a, size_b) / (size_a + size_b)
        pooled = _pool({key: a[key] + b[key] for key in a.keys() | b.keys()}, lambda key, count: count * share, cells)
        cells_a, cells_b = _cells(a, pooled), _cells(b, pooled)
        keys = sorted(cells_a.keys() | cells_b.keys(), key=repr)
        if len(keys) < 2:
            continue
        side_a = np.array([cells_a.get(key, 0) for key in keys], dtype=np.int64)  # [cells]
        both = side_a + np.array([cells_b.get(key, 0) for key in keys], dtype=np.int64)  # [cells]
        total += float(_homogeneity(side_a[None], both, size_a, size_b)[0])
        split = rng.multivariate_hypergeometric(both, size_a, size=draws)  # [draws, cells]
        simulated += _homogeneity(split, both, size_a, size_b)
        df += len(keys) - 1
        tv_mass += (size_a + size_b) / 2 * 0.5 * float(np.abs(side_a / size_a - (both - side_a) / size_b).sum())
    effective = n1 * n2 / (n1 + n2) if n1 and n2 else 0.0
    return _result(total, df, simulated, tv_mass / ((n1 + n2) / 2) if n1 + n2 else 0.0, min(n1, n2), 4 * effective, alpha)


def _homogeneity(side_a: np.ndarray, both: np.ndarray, size_a: int, size_b: int) -> np.ndarray:
    """G of the 2 x cells tables whose first rows are `side_a` [draws, cells], with column
    totals `both` [cells]: one statistic per draw."""
    scale = both / (size_a + size_b)  # [cells]
    return g_statistic(side_a, size_a * scale) + g_statistic(both - side_a, size_b * scale)


def goodness_of_fit(
    strata: Sequence[tuple[Counter, Mapping[Hashable, float]]], alpha: float, cells: int | None = None, seed: int = 0
) -> TestResult:
    """strata: per prompt, (counts, exact probability of every key), the keys partitioning
    the outcomes (`law.exact_cells`); cells: the most cells a stratum keeps (None: no cap);
    seed: the simulation's generator. A sample in a cell of probability 0 fails the test
    outright (p 0): the exact law cannot produce it."""
    draws, rng = simulations(alpha), np.random.default_rng(seed)
    total, df, tv_mass, n, simulated = 0.0, 0, 0.0, 0, np.zeros(simulations(alpha))
    impossible = False
    for counts, law in strata:
        size = sum(counts.values())
        if not size:
            continue
        n += size
        unknown = sum(count for key, count in counts.items() if key not in law)
        if unknown:
            raise ValueError(f"{unknown} samples fall outside every cell of the exact law; the cells must cover all outcomes")
        impossible |= any(count and law[key] <= 0 for key, count in counts.items())
        cells_law = _pool_probabilities(law, size, cells)
        pooled = _cells(counts, {key: RARE for key in law if key not in cells_law} | {key: key for key in cells_law})
        keys = list(cells_law)
        observed = np.array([pooled.get(key, 0) for key in keys], dtype=np.int64)  # [cells]
        probs = np.array([cells_law[key] for key in keys])  # [cells]
        probs = probs / probs.sum()
        total += float(g_statistic(observed[None], size * probs)[0])
        simulated += g_statistic(rng.multinomial(size, probs, size=draws), size * probs)
        df += len(keys) - 1
        tv_mass += size * 0.5 * float(np.abs(observed / size - probs).sum())
    result = _result(total, df, simulated, tv_mass / n if n else 0.0, n, 4 * n, alpha)
    return replace(result, p_value=0.0, statistic=math.inf) if impossible else result


def g_test(observed: Mapping[Hashable, int], law: Mapping[Hashable, float], runs: int) -> float:
    """The asymptotic p-value of a G-test of `runs` samples' counts against exact probabilities
    (`law`: every outcome's), the cells expecting fewer than `MIN_EXPECTED` samples pooled into
    one; ValueError for a sample outside `law`.

    >>> round(g_test({"a": 52, "b": 48}, {"a": 0.5, "b": 0.5}, 100), 3)
    0.689
    """
    if not set(observed) <= set(law):
        raise ValueError(f"outcomes outside the law were sampled: {sorted(map(repr, set(observed) - set(law)))}")
    big = [cell for cell, p in law.items() if p * runs >= MIN_EXPECTED]
    small = [cell for cell in law if cell not in big]
    counts = [observed.get(cell, 0) for cell in big]
    expected = [float(law[cell]) * runs for cell in big]
    if small:
        counts.append(sum(observed.get(cell, 0) for cell in small))
        expected.append(float(sum(law[cell] for cell in small)) * runs)
    statistic = float(g_statistic(np.array([counts]), np.array(expected))[0])
    return float(chi2.sf(statistic, len(counts) - 1))


def detectable_tv(n_effective: float, df: int, alpha: float, exact: bool = False) -> float:
    """The total variation detected with 90 % power: two samples of `n_effective` each (or
    against the exact law, `exact`), at `df` degrees of freedom and level `alpha`."""
    return _detectable(4 * n_effective if exact else 2 * n_effective, df, alpha)


def samples_for(tv: float, alpha: float, df_at: Callable[[int], int], exact: bool = False) -> int:
    """The fewest samples per side at which a test detects total variation `tv` with 90 %
    power: two samples of that size each (or against the exact law, `exact`), at level
    `alpha`, with `df_at(n)` the degrees of freedom its cells have at n samples (they grow
    with n, so n and df are iterated to a fixed point from df 30; the larger of the last two
    is kept if they alternate)."""
    per_sample = 4 if exact else 2  # noncentrality per sample per tv^2 (module docstring)
    n, previous = 0, None
    df = 30
    for _ in range(6):
        need = math.ceil(_noncentrality(max(1, df), alpha) / (per_sample * tv * tv) - 1e-9)
        if need == n:
            return n
        previous, n = n, need
        df = df_at(n)
    return max(n, previous or 0)


def _noncentrality(df: int, alpha: float) -> float:
    """The noncentrality at which a chi-square test of level `alpha` has `POWER`."""
    critical = chi2.isf(alpha, df)
    return brentq(lambda lam: ncx2.sf(critical, df, lam) - POWER, 1e-9, 1e7)


def _detectable(weight: float, df: int, alpha: float) -> float:
    """delta with noncentrality weight x delta^2 reaching `POWER`."""
    if df < 1 or weight <= 0:
        return math.inf
    return math.sqrt(_noncentrality(df, alpha) / weight)


def _result(statistic: float, df: int, simulated: np.ndarray, tv: float, n: int, weight: float, alpha: float) -> TestResult:
    """The result of `statistic` with its simulated draws (one per draw, summed over strata)."""
    if df <= 0:
        return TestResult(statistic, df, 1.0, tv, n, _detectable(weight, df, alpha), alpha, 1.0)
    at_least = int(np.count_nonzero(simulated >= statistic - 1e-9 * max(1.0, statistic)))
    p_value = (1 + at_least) / (len(simulated) + 1)
    return TestResult(statistic, df, p_value, tv, n, _detectable(weight, df, alpha), alpha, float(chi2.sf(statistic, df)))


def _pool(counts: Mapping[Hashable, float], expected, most: int | None = None) -> dict[Hashable, Hashable]:
    """key -> its cell: itself, or `RARE` when expected(key, count) < MIN_EXPECTED or when it
    is not among the `most` - 1 most expected (only when more than `most` cells would stay;
    ties broken by the key). A rare cell too small on its own is merged into the smallest kept
    cell's."""
    kept = {key for key, count in counts.items() if expected(key, count) >= MIN_EXPECTED}
    if most is not None and len(kept) + (len(kept) < len(counts)) > most:
        ranked = sorted(kept, key=lambda key: (-expected(key, counts[key]), repr(key)))
        kept = set(ranked[: most - 1])
    rare_mass = sum(expected(key, count) for key, count in counts.items() if key not in kept)
    cells = {key: key if key in kept else RARE for key in counts}
    if 0 < rare_mass < MIN_EXPECTED and kept:
        smallest = min(kept, key=lambda key: (expected(key, counts[key]), repr(key)))
        cells = {key: RARE if cell == smallest else cell for key, cell in cells.items()}
    return cells


def degrees_of_freedom(law: Mapping[Hashable, float], size: int, cells: int | None = None) -> int:
    """The degrees of freedom of a test of `size` samples against `law`, its cells pooled
    (at most `cells` of them)."""
    return len(_pool_probabilities(law, size, cells)) - 1


def _pool_probabilities(law: Mapping[Hashable, float], size: int, most: int | None = None) -> dict[Hashable, float]:
    """The law on pooled cells: key -> probability for the kept keys, `RARE` -> the rest."""
    cells = _pool(law, lambda key, p: size * p, most)
    out: dict[Hashable, float] = {}
    for key, cell in cells.items():
        out[cell] = out.get(cell, 0.0) + law[key]
    return {cell: p for cell, p in out.items() if p > 0}


def _cells(counts: Mapping[Hashable, int], cells: Mapping[Hashable, Hashable]) -> Counter:
    out: Counter = Counter()
    for key, count in counts.items():
        out[cells.get(key, RARE)] += count
    return out
