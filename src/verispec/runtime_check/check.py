"""One engine under check: the sampled law per method and parameter, then greedy identity.

For each `SamplingCase` and each prompt chosen for its spread (`law.spread_prompts`):

1. the exact law of every token a sample emits (`length` of them), on at most `cells` cells
   chosen best first (`law.exact_cells`), computed by verispec on the same weights;
2. N samples with speculation off: against the exact law (`plain vs exact`: is the engine's
   sampler right without speculation?);
3. per method, N samples with speculation on: against the samples without (`spec vs plain`:
   does speculation change the engine's law?) and against the exact law (`spec vs exact`).

A wrong sampler fails rows 2 and 3 alike; speculation that changes the law fails `spec vs
plain` and `spec vs exact` while `plain vs exact` passes. A parameter the engine refuses is a
`refused` row with the engine's reason. Each row also states `effect`: the total variation
the parameter itself makes to the exact law (against the same case with it dropped), so a
pass says whether the check could have seen the parameter ignored (effect above the
detectable TV) or not.

Seeded identity and the shared-stream probe (`verispec.runtime_check.seeded`) follow on the
same prompts, then greedy identity (`verispec.runtime_check.greedy`): every method, at 1 and
at `concurrency` requests in flight, against the engine's own plain greedy output at one.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

from verispec.runtime_check import greedy, law, power, seeded
from verispec.runtime_check.cases import SamplingCase, default_cases, neutral
from verispec.runtime_check.engines.base import CountsDrafts, Engine, FitsDraft, Refused
from verispec.runtime_check.report import LawRow, Report
from verispec.statistics import degrees_of_freedom, goodness_of_fit, samples_for, two_sample

PLAIN = "plain"
SPEC_VS_PLAIN, SPEC_VS_EXACT, PLAIN_VS_EXACT = "spec vs plain", "spec vs exact", "plain vs exact"
SEEDED_CASE = SamplingCase("default")  # seeded identity and the probe sample at temperature 1
NO_REFERENCE = "not run: the exact law needs the model's weights, which verispec could not load (--model none)"
NOT_RUN_WITHOUT_REFERENCE = (
    "plain vs exact and spec vs exact (the exact law needs the weights)",
    "the power against named bug classes (computed from the exact law)",
    "the logit-bias parameter (the biased token is chosen from the model's law)",
    "the shared-stream probe (its bound reads the exact law)",
    "greedy identity (its prompts need the tokenizer, a divergence's diagnosis the weights)",
)


@dataclass
class Reference:
    """verispec's copy of the engine's weights: score(ids) -> logits[len(ids), V] (a fresh full
    forward), encode(text) -> ids, the EOS ids. None of it is needed from the engine."""

    score: law.Score
    encode: Callable[[str], list[int]]
    eos_ids: Collection[int]


@dataclass
class Settings:
    """n: samples per side per method and parameter, split evenly over `prompts` prompts.
    length: new tokens per sample, every one keyed (an engine whose first round drafts k tokens
    needs k + 1 for its bonus token to be tested; speculation needs 2 at least). alpha: each
    test's false-failure probability. cases: the grid (None: `default_cases`). greedy_prompts:
    token ids for greedy identity (none: skipped); greedy_tokens: their budget; concurrency:
    the levels besides 1. seed: the first sample's seed. sampled: run the sampled-law checks.
    sample_prompts: their prompts as token ids (None: those of `law.SPREAD_TEXTS` it tests best).
    sample_texts: their prompts as raw text instead (`--sample-prompt`: prompts where the method
    under check drafts, which a short spread prompt may not give it).
    parameters: the names of the grid's cases to run (None: all). tv: when given, n is chosen
    instead: the fewest samples per side at which every test detects this total variation with
    90 % power (`samples_for`; the two-sample test needs about twice the samples of the test
    against the exact law), at the degrees of freedom the first case's exact law has there.
    cells: the most cells a prompt's test keeps (`statistics`; None: every outcome expected
    often enough, so the degrees of freedom, and the N a TV needs, grow with N). seeded: the
    seeds per prompt of seeded identity and the requests in flight of the shared-stream probe
    (`verispec.runtime_check.seeded`; 0: neither runs); the probe runs on as many prompts as
    the sampled law, the flattest of those and `law.SPREAD_TEXTS` (where identical samples are
    rarest)."""

    n: int = 1200
    length: int = 3
    prompts: int = 3
    alpha: float = 1e-3
    cases: Sequence[SamplingCase] | None = None
    greedy_prompts: Sequence[Sequence[int]] = ()
    greedy_tokens: int = 256
    concurrency: Sequence[int] = (8,)
    seed: int = 0
    sampled: bool = True
    sample_prompts: Sequence[Sequence[int]] | None = None
    sample_texts: Sequence[str] = ()
    parameters: Sequence[str] | None = None
    tv: float | None = None
    cells: int | None = 24
    seeded: int = 0
    progress: Callable[[str], None] = field(default=lambda line: None)


def check_runtime(engine: Engine, reference: Reference | None, methods: Sequence[str], settings: Settings) -> Report:
    """Run every check of `engine` with `methods` (its speculative methods to check). Without a
    `reference` (a model verispec cannot load) only what the engine's own samples can show runs:
    `spec vs plain` on cells chosen from both samples, and seeded identity, on the raw
    `sample_texts` sent as text; the rest is listed as not run."""
    report = Report(engine.name, engine.versions(), settings.alpha)
    started = time.perf_counter()
    if reference is None:
        if not settings.sample_texts:
            raise ValueError("without a reference model the prompts must be raw text the engine encodes: give --sample-prompt")
        report.not_run = list(NOT_RUN_WITHOUT_REFERENCE)
    full = reference.score if reference is not None else None  # greedy diagnoses read a fresh forward
    if reference is not None:
        reference = replace(reference, score=law.remembered(reference.score))  # the laws read last rows only
    if settings.sampled or settings.seeded:
        if reference is None:
            prompts = [(text, text, None) for text in settings.sample_texts]
        elif settings.sample_texts:
            encoded = [(text, reference.encode(text)) for text in settings.sample_texts]
            prompts = [(text, ids, law.entropy(reference.score, ids)) for text, ids in encoded]
        elif settings.sample_prompts is None:
            prompts = law.spread_prompts(reference.score, reference.encode, settings.prompts, settings.n // settings.prompts)
        else:
            prompts = [(str(ids), list(ids), law.entropy(reference.score, ids)) for ids in settings.sample_prompts]
        report.prompts = [{"text": text, "ids": ids, "entropy_nats": h} for text, ids, h in prompts]
    if settings.sampled:
        if reference is None:
            cases = settings.cases or [case for case in default_cases(()) if case.name != "logit_bias"]
        else:
            bias = tuple(dict.fromkeys((law.likely_tokens(reference.score, ids, 2)[1], 2.0) for _, ids, _ in prompts))
            cases = settings.cases or default_cases(bias)
        if settings.tv is not None:
            n = chosen_n(reference, [ids for _, ids, _ in prompts], cases[0], settings) if reference is not None else \
                samples_for(settings.tv, settings.alpha, lambda _: len(prompts) * ((settings.cells or 24) - 1))
            settings = replace(settings, n=-(-n // len(prompts)) * len(prompts))
            settings.progress(f"{engine.name}: {settings.n} samples per side detect a TV of {settings.tv:g} with 90 % power")
        for case in [c for c in cases if settings.parameters is None or c.name in settings.parameters]:
            if reference is not None and isinstance(engine, FitsDraft):
                chosen = engine.fit_draft([ids for _, ids, _ in prompts], methods, case, settings.length)
                report.drafts += [(case.name, line) for line in chosen]
            report.law_rows += check_case(engine, reference, methods, [ids for _, ids, _ in prompts], case, settings)
        report.seconds["sampled law"] = time.perf_counter() - started
    if settings.seeded:
        started = time.perf_counter()
        ids = [ids for _, ids, _ in prompts]
        report.seeded_rows = seeded.identity(engine, methods, ids, SEEDED_CASE, settings.length, settings.seeded,
                                             settings.seed, settings.progress)
        if reference is not None:
            texts = () if reference.encode is None else law.SPREAD_TEXTS
            probes = [list(p) for p in dict.fromkeys(tuple(p) for p in [*ids, *map(reference.encode, texts)])]
            largest = [law.most_likely(reference.score, p, SEEDED_CASE, reference.eos_ids, settings.length) for p in probes]
            flattest = sorted(range(len(probes)), key=lambda i: largest[i])[: len(ids)]  # the prompts it sees best
            report.probe_rows = seeded.shared_stream_probe(
                engine, methods, [probes[i] for i in flattest], [largest[i] for i in flattest], SEEDED_CASE,
                settings.length, settings.seeded, settings.alpha, reference.eos_ids)
        report.seconds["seeded identity and probe"] = time.perf_counter() - started
    if settings.greedy_prompts:
        started = time.perf_counter()
        settings.progress(f"{engine.name} greedy: plain at 1 request, {len(settings.greedy_prompts)} prompts")
        plain = engine.greedy(settings.greedy_prompts, settings.greedy_tokens, None, 1)
        for concurrency in (1, *settings.concurrency):
            report.greedy_rows += greedy.check(
                engine, methods, settings.greedy_prompts, plain, settings.greedy_tokens, concurrency, full,
                settings.progress,
            )
        report.seconds["greedy identity"] = time.perf_counter() - started
    return report


def chosen_n(reference: Reference, prompts: Sequence[Sequence[int]], case: SamplingCase, settings: Settings) -> int:
    """The samples per side at which a two-sample test on `prompts` detects `settings.tv` with
    90 % power, its degrees of freedom read from `case`'s exact law at each N tried."""

    def df_at(n: int) -> int:  # each N tried reads mostly the same rows, which `reference.score` keeps
        per_prompt = max(1, n // len(prompts))
        laws = [law.exact_cells(reference.score, p, case, per_prompt, reference.eos_ids, settings.length, settings.cells)
                for p in prompts]
        return sum(degrees_of_freedom(cells, per_prompt, settings.cells) for cells in laws)

    return samples_for(settings.tv, settings.alpha, df_at)


def check_case(
    engine: Engine, reference: Reference, methods: Sequence[str], prompts: Sequence[Sequence[int]],
    case: SamplingCase, settings: Settings,
) -> list[LawRow]:
    """The rows of one parameter: plain vs exact, then spec vs plain and spec vs exact per method."""
    per_prompt = max(1, settings.n // len(prompts))
    eos_ids = reference.eos_ids if reference is not None else ()
    laws, effect, bugs = None, 0.0, []
    if reference is not None:
        laws = [law.exact_cells(reference.score, p, case, per_prompt, eos_ids, settings.length, settings.cells)
                for p in prompts]
        dropped = [law.law_on(reference.score, p, neutral(case), list(cells)) for p, cells in zip(prompts, laws)]
        effect = sum(law.distance(a, b) for a, b in zip(laws, dropped)) / len(prompts)
        bugs = [power.bug_laws(reference.score, p, case, list(cells), settings.length, eos_ids)
                for p, cells in zip(prompts, laws)]
    row = lambda method, test: LawRow(engine.name, method, case.name, case.settings(), test, effect=effect)  # noqa: E731

    def against(row_: LawRow) -> LawRow:
        """The row with its power against each named class (plain: the parameter dropped only)."""
        if row_.result is None or laws is None:
            return row_
        names = [power.DROPPED] if row_.method == PLAIN else list(power.CLASSES)
        out = {}
        for name in names:
            shares = [power.noncentrality(cells, bug[name], per_prompt, settings.cells) for cells, bug in zip(laws, bugs)]
            lam = sum(share for _, share in shares) / (2 if row_.test == SPEC_VS_PLAIN else 1)
            out[name] = (sum(tv for tv, _ in shares) / len(shares), power.run_power([lam], row_.result.df, settings.alpha))
        if row_.method != PLAIN:
            out.update(dict.fromkeys(power.NOT_COMPUTED))
        return replace(row_, power=out)

    def draw(method: str | None, offset: int) -> list[Counter] | Refused:
        """Per prompt, the counts of sample keys; or the engine's refusal (or crash)."""
        counts = []
        before = engine.drafts() if isinstance(engine, CountsDrafts) else None
        for i, prompt in enumerate(prompts):
            settings.progress(f"{engine.name} {method or PLAIN} {case.name}: {per_prompt} samples at prompt {i + 1}")
            try:
                samples = engine.sample(prompt, case, per_prompt, settings.length, method,
                                        settings.seed + offset + i * per_prompt)
            except Refused as refusal:
                return refusal
            keys = Counter(law.key(s, eos_ids, settings.length) for s in samples)
            counts.append(keys if laws is None else _merge(keys, laws[i]))
        if before is not None and method is not None:
            (drafted, accepted), total = engine.drafts(), per_prompt * len(prompts)
            drafts[method] = ((drafted - before[0]) / total,
                              None if accepted is None or before[1] is None else (accepted - before[1]) / total)
        return counts

    def against_exact(counts: list[Counter]):
        return goodness_of_fit(list(zip(counts, laws)), settings.alpha, settings.cells, seed=next(tests))

    rows = []
    tests = itertools.count(settings.seed)  # each test's simulation seed
    drafts: dict[str, tuple[float, float | None]] = {}  # method -> drafted, accepted per sample
    plain = draw(None, 0)
    plain_row = row(PLAIN, PLAIN_VS_EXACT)
    if laws is None:
        rows.append(plain_row.skipped(NO_REFERENCE))
    else:
        rows.append(plain_row.refused(plain) if isinstance(plain, Refused) else against(plain_row.tested(against_exact(plain))))
    for index, method in enumerate(methods, start=1):
        spec = draw(method, index * 10_000_000)
        if isinstance(spec, Refused):
            rows += [row(method, SPEC_VS_PLAIN).refused(spec), row(method, SPEC_VS_EXACT).refused(spec)]
            continue
        versus = replace(row(method, SPEC_VS_PLAIN), drafts=drafts.get(method))
        rows.append(versus.skipped(f"the plain side is refused: {plain}") if isinstance(plain, Refused)
                    else against(versus.tested(two_sample(_on_sampled_cells(spec, plain, settings) if laws is None
                                                          else list(zip(spec, plain)), settings.alpha, settings.cells,
                                                          seed=next(tests)))))
        exact_row = replace(row(method, SPEC_VS_EXACT), drafts=drafts.get(method))
        rows.append(exact_row.skipped(NO_REFERENCE) if laws is None else against(exact_row.tested(against_exact(spec))))
    return rows


def _on_sampled_cells(spec: list[Counter], plain: list[Counter], settings: Settings) -> list[tuple[Counter, Counter]]:
    """Per prompt, both samples' keys folded onto cells chosen from the two together."""
    out = []
    for a, b in zip(spec, plain):
        cells = law.sampled_cells(a + b, (), settings.length, settings.cells)
        out.append((_merge(a, cells), _merge(b, cells)))
    return out


def _merge(counts: Counter, cells: Collection[tuple[int, ...]]) -> Counter:
    """Counts of sample keys folded onto the exact law's cells."""
    out: Counter = Counter()
    for key, count in counts.items():
        out[law.cell_of(key, cells)] += count
    return out
