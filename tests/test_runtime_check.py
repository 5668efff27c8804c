"""`verispec check-runtime`'s library: the tests' statistics, the exact law, the engines'
adapters, and the negative controls it must catch.

The controls run verispec's engine on rational tables (vocabulary 8, rows keyed on the last two
tokens, so a stale cache changes later rows; each row has one likely token, as a language
model's continuation of an echo) with a draft table of its own, at the N the docs recommend
(`Settings.n`, 1200 samples per side, over two prompts), temperature 1/2, every one of the 3
tokens of a sample keyed (k = 2: the bonus is the third). Each test is a G-test at alpha = 1e-3
with a simulated p-value; a correct engine fails its 3 tests with probability at most 3e-3 for
a fresh seed list (union bound, exact level); the seeds are fixed, so the outcome is
deterministic. Each broken engine must fail both tests that read speculation.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
import torch

from verispec.models.tables import random_table
from verispec.runtime_check import Reference, Settings, check_runtime, controls, greedy, law, power
from verispec.runtime_check.cases import SamplingCase, default_cases, next_token_law
from verispec.runtime_check.check import PLAIN_VS_EXACT, SPEC_VS_EXACT, SPEC_VS_PLAIN
from verispec.runtime_check.engines.base import Refused
from verispec.runtime_check.report import FAIL, HOLDS, LACKS, PASS, REFUSED, SKIPPED, LawRow
from verispec.runtime_check.jobs import merged_drafts, shares
from verispec.statistics import (
    RARE, _pool_probabilities, degrees_of_freedom, detectable_tv, goodness_of_fit, samples_for, two_sample,
)

VOCAB = 8


def peaked_row(rng: random.Random) -> tuple[Fraction, ...]:
    """Every token possible, one of them likely (about 0.4)."""
    weights = [rng.randint(1, 4) for _ in range(VOCAB)]
    weights[rng.randrange(VOCAB)] += 12
    return tuple(Fraction(w, sum(weights)) for w in weights)


TARGET = random_table(VOCAB, 2, seed=1, row=peaked_row)
DRAFT = random_table(VOCAB, 1, seed=2, row=peaked_row)
REFERENCE = Reference(TARGET.score, encode=None, eos_ids=())
CASE = SamplingCase("temperature", temperature=0.5)
SETTINGS = Settings(prompts=2, sample_prompts=[[3, 5], [7, 1]], cases=[CASE])


def run(engine) -> dict[str, str]:
    report = check_runtime(engine, REFERENCE, [controls.DRAFT], SETTINGS)
    assert report.tests == 3
    table = report.markdown()
    assert all(f"| {row.method} | temperature (temperature=0.5) | {row.test} | {row.status} |" in table for row in report.law_rows)
    assert json.loads(json.dumps(report.as_dict()))["false_failure_bound"] == pytest.approx(3e-3)
    speculative = [row for row in report.law_rows if row.test != PLAIN_VS_EXACT]
    assert all(row.drafts[0] > 1 and 0 < row.drafts[1] <= row.drafts[0] for row in speculative)  # the draft ran
    assert " / " in table.splitlines()[-3] or any(f"{row.drafts[0]:.2f} / " in table for row in speculative)
    return {row.test: row.status for row in report.law_rows}


def test_the_correct_engine_passes():
    assert run(controls.correct(TARGET, DRAFT)) == {PLAIN_VS_EXACT: PASS, SPEC_VS_PLAIN: PASS, SPEC_VS_EXACT: PASS}


# The controls whose change to the law is small on these tables, with the samples per side at
# which the test against the exact law catches them (at 1200 it does not).
WEAK = {"temperature 1.1x on speculative rounds": 3600, "double-accept rule": 7200}


@pytest.mark.parametrize("name", sorted(controls.CONTROLS))
def test_every_broken_engine_is_flagged(name):
    if name in WEAK:
        report = check_runtime(controls.CONTROLS[name](TARGET, DRAFT), REFERENCE, [controls.DRAFT],
                               replace(SETTINGS, n=WEAK[name]))
        statuses = {row.test: row.status for row in report.law_rows}
        assert statuses[PLAIN_VS_EXACT] == PASS and statuses[SPEC_VS_EXACT] == FAIL
        return
    statuses = run(controls.CONTROLS[name](TARGET, DRAFT))
    assert statuses == {PLAIN_VS_EXACT: PASS, SPEC_VS_PLAIN: FAIL, SPEC_VS_EXACT: FAIL}


REPETITION = SamplingCase("repetition_penalty", repetition_penalty=3.0)


@pytest.mark.parametrize("name", sorted(controls.PENALTY_CONTROLS))
def test_every_broken_penalty_is_flagged(name):
    """Under a repetition penalty of 3 (the per-step bug moves the law only after an accepted
    draft that is not in the prompt: 3600 samples per side)."""
    per_step = "per step" in name
    engine = controls.PENALTY_CONTROLS[name](TARGET, DRAFT, **({"penalty": 3.0} if per_step else {}))
    report = check_runtime(engine, REFERENCE, [controls.DRAFT], replace(SETTINGS, cases=[REPETITION], n=3600 if per_step else 1200))
    assert {row.test: row.status for row in report.law_rows} == {PLAIN_VS_EXACT: PASS, SPEC_VS_PLAIN: FAIL,
                                                                 SPEC_VS_EXACT: FAIL}, report.markdown()


def test_the_correct_engine_passes_under_a_repetition_penalty():
    report = check_runtime(controls.correct(TARGET, DRAFT), REFERENCE, [controls.DRAFT], replace(SETTINGS, cases=[REPETITION]))
    assert {row.status for row in report.law_rows} == {PASS}


def test_greedy_speculation_and_batching_equal_plain_greedy():
    engine = controls.correct(TARGET, DRAFT)
    prompts = [[3, 5], [7, 1], [2, 2]]
    plain = engine.greedy(prompts, 12, None, 1)
    assert engine.greedy(prompts, 12, controls.DRAFT, 1) == plain == engine.greedy(prompts, 12, controls.DRAFT, 3)
    assert engine.greedy(prompts, 12, None, 3) == plain


def test_the_engine_keeps_its_slots_across_calls():
    """A later call's requests take the slots an earlier call's left (a longer prompt and
    length on them before), none allocated again, and sample what a fresh engine samples for
    the same seeds (keyed rounds: a sample's tokens are its seed's alone)."""
    target = random_table(VOCAB, 2, seed=1, row=peaked_row)
    engine = controls.correct(target, DRAFT)
    made, new_slot = [], target.new_slot
    target.new_slot = lambda *capacity: made.append(1) or new_slot(*capacity)
    engine.sample([3, 5, 1, 1, 1, 2], CASE, 20, 9, controls.DRAFT, 0)
    assert len(made) == 20
    again = [engine.sample([7, 1], CASE, 20, 3, method, 100) for method in (controls.DRAFT, None)]
    assert len(made) == 20
    fresh = controls.correct(random_table(VOCAB, 2, seed=1, row=peaked_row), DRAFT)
    assert again == [fresh.sample([7, 1], CASE, 20, 3, method, 100) for method in (controls.DRAFT, None)]


def test_sample_texts_replace_the_spread_prompts():
    """`--sample-prompt`: the samples continue the given texts, encoded by the reference, and
    the report names them."""
    reference = replace(REFERENCE, encode=lambda text: [int(c) for c in text])
    settings = Settings(n=40, prompts=3, sample_texts=("35", "71"), cases=[CASE])
    report = check_runtime(controls.correct(TARGET, DRAFT), reference, [controls.DRAFT], settings)
    assert [(p["text"], p["ids"]) for p in report.prompts] == [("35", [3, 5]), ("71", [7, 1])]
    assert {row.status for row in report.law_rows} <= {PASS, SKIPPED}


def test_verispec_refuses_penalties_instead_of_dropping_them():
    engine = controls.correct(TARGET, DRAFT)
    with pytest.raises(Refused, match="frequency_penalty"):
        engine.sample([3, 5], SamplingCase("f", frequency_penalty=1.0), 2, 3, None, 0)
    report = check_runtime(engine, REFERENCE, [controls.DRAFT],
                           Settings(n=20, prompts=2, sample_prompts=[[3, 5], [7, 1]],
                                    cases=[SamplingCase("frequency_penalty", frequency_penalty=1.0)]))
    assert {row.status for row in report.law_rows} == {REFUSED}
    assert report.tests == 0 and report.passed


def test_the_exact_cells_partition_the_outcomes():
    cells = law.exact_cells(TARGET.score, [3, 5], CASE, 400, eos_ids=(), length=3)
    assert sum(cells.values()) == pytest.approx(1.0, abs=1e-12)
    full = law.exact_cells(TARGET.score, [3, 5], SamplingCase("default"), 10**7, eos_ids=(), length=3)
    # every sequence of 3 is listed at this N, each with the product of the table's rows
    row = lambda context, token: float(TARGET.distribution(context)[token])  # noqa: E731
    assert len(full) == VOCAB**3 + VOCAB**2 + VOCAB + 1  # the leaves and every split's (empty) rest cell
    assert full[(2, 6, 1)] == pytest.approx(row([3, 5], 2) * row([5, 2], 6) * row([2, 6], 1))
    assert law.cell_of((2, 6, 1), full) == (2, 6, 1)
    assert law.cell_of((2, 6, 1), {(2, 6, law.OTHER): 0.5, (2, law.OTHER): 0.25, (law.OTHER,): 0.25}) == (2, 6, law.OTHER)
    assert law.cell_of((2, 6, 1), {(2, 5, law.OTHER): 0.5, (2, law.OTHER): 0.25, (law.OTHER,): 0.25}) == (2, law.OTHER)
    assert law.key([2, 6, 1, 4], eos_ids={6}, depth=3) == (2, 6)


@pytest.mark.parametrize("cells", [2, 5, 24])
def test_a_capped_exact_law_splits_the_likeliest_prefixes_first(cells):
    """The cap keeps at most `cells` cells, split best first down to every token of the
    sample; `law_on` gives the same probabilities for the same cells."""
    capped = law.exact_cells(TARGET.score, [3, 5], CASE, 5000, (), 3, cells)
    assert len(capped) <= cells and sum(capped.values()) == pytest.approx(1.0)
    assert law.law_on(TARGET.score, [3, 5], CASE, list(capped)) == pytest.approx(capped)
    if cells == 24:
        assert max(len(cell) for cell in capped if cell[-1] != law.OTHER) == 3  # the bonus token has cells


def test_penalties_follow_their_definitions():
    logits = torch.tensor([2.0, -1.0, 0.5, 0.0])
    rep = next_token_law(logits, SamplingCase("r", repetition_penalty=2.0), [0, 1], [])
    assert rep.tolist() == pytest.approx(torch.softmax(torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64), 0).tolist())
    freq = next_token_law(logits, SamplingCase("f", frequency_penalty=0.5, presence_penalty=0.25), [9, 2, 2], [2, 2])
    assert freq.tolist() == pytest.approx(torch.softmax(torch.tensor([2.0, -1.0, -0.75, 0.0], dtype=torch.float64), 0).tolist())
    assert [case.name for case in default_cases(((1, 2.0),))][0] == "default"


def test_the_two_sample_test_keeps_its_level_and_sees_a_shift():
    rng = random.Random(0)
    p = [0.4, 0.3, 0.2, 0.1]
    shifted = [0.3, 0.3, 0.2, 0.2]  # total variation 0.1

    def draw(law_, n):
        return Counter(tuple([rng.choices(range(4), law_)[0]]) for _ in range(n))

    same = [two_sample([(draw(p, 1000), draw(p, 1000))], 1e-3).p_value for _ in range(20)]
    assert min(same) > 1e-3
    result = two_sample([(draw(shifted, 3000), draw(p, 3000))], 1e-3)
    assert not result.passed and result.tv == pytest.approx(0.1, abs=0.03)
    assert result.detectable_tv < 0.1
    exact = {(i,): x for i, x in enumerate(p)}
    assert goodness_of_fit([(draw(p, 2000), exact)], 1e-3).passed
    assert not goodness_of_fit([(draw(shifted, 2000), exact)], 1e-3).passed


def test_detectable_tv_shrinks_as_one_over_root_n():
    assert detectable_tv(4000, 20, 1e-3) == pytest.approx(detectable_tv(1000, 20, 1e-3) / 2)
    assert detectable_tv(1000, 20, 1e-3, exact=True) < detectable_tv(1000, 20, 1e-3)


@pytest.mark.parametrize(("argv", "says"), [
    (["check-runtime", "sglang"], "unknown engine 'sglang'"),
    (["check-runtime", "openai:localhost:8000"], "openai:URL"),
    (["check-runtime", "hf", "--parameter", "typical_p"], "unknown parameter 'typical_p'"),
    (["check-runtime", "hf", "--n", "1"], "--n"),
    (["check-runtime", "hf", "--prompts-file", "/nonexistent.jsonl"], "--prompts-file"),
    (["check-runtime", "hf", "--sample-prompt", " "], "--sample-prompt is empty"),
    (["check-runtime", "hf", "--model", "none", "--greedy-prompts", "0"], "the engine must be openai:URL,PLAIN_URL"),
])
def test_bad_input_is_one_error_line(argv, says, capsys):
    from verispec.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0]


class Diverging:
    """An engine whose method changes one greedy token, showing `row` as its own logits there."""

    name, methods, dtype = "diverging", ("m",), "float32"

    def __init__(self, plain: list[int], spec: list[int], row: torch.Tensor | None) -> None:
        self.plain, self.spec, self.row = plain, spec, row

    def greedy(self, prompts, max_new_tokens, method, concurrency):
        return [self.plain if method is None else self.spec for _ in prompts]

    def logits(self, prefix):
        return self.row


def test_greedy_divergences_are_read_in_the_engines_own_logits():
    prompt, plain = [3, 5], [1, 2, 6]
    fresh = TARGET.score([*prompt, 1])[-1]  # verispec's logits at the divergence
    expected, got = plain[1], int(torch.argmin(fresh))  # far apart for verispec: not a near tie there
    tie = torch.zeros(VOCAB)
    tie[[expected, got]] = 1.0  # a near tie in the engine's own logits
    apart = tie.clone()
    apart[got] = -5.0
    rows = {}
    for name, row in (("tie", tie), ("apart", apart), ("none", None)):
        engine = Diverging(plain, [1, got, 6], row)
        (rows[name],) = greedy.check(engine, ["m"], [prompt], [plain], 3, 1, TARGET.score)
    (tied,) = rows["tie"].divergences
    assert rows["tie"].status == PASS and tied["near_tie"] and not tied["verispec_near_tie"]
    assert tied["engine_top2_margin"] == 0.0 and tied["top2_margin"] > 0.01 and tied["position"] == 1
    assert "in diverging's" in rows["tie"].summary and "in verispec's" in rows["tie"].summary
    assert rows["apart"].status == FAIL and rows["apart"].divergences[0]["engine_behind_max"] == pytest.approx(6.0)
    assert rows["none"].status == FAIL and "engine_top2_margin" not in rows["none"].divergences[0]


def test_tv_chooses_the_samples_that_detect_it():
    report = check_runtime(controls.correct(TARGET, DRAFT), REFERENCE, [controls.DRAFT], replace(SETTINGS, tv=0.2))
    results = {row.test: row.result for row in report.law_rows}
    assert {row.status for row in report.law_rows} == {PASS}
    n = results[SPEC_VS_PLAIN].n
    assert n % 2 == 0 and results[SPEC_VS_EXACT].n == n and n != SETTINGS.n
    assert results[SPEC_VS_PLAIN].detectable_tv == pytest.approx(0.2, rel=0.05)  # the df it was chosen at
    assert results[SPEC_VS_EXACT].detectable_tv < 0.16  # the exact law needs about half the samples


def test_a_cap_on_the_cells_fixes_the_degrees_of_freedom():
    rng = random.Random(3)
    exact = {(i,): 0.5 ** (i / 8) for i in range(100)}
    total = sum(exact.values())
    exact = {key: p / total for key, p in exact.items()}
    assert degrees_of_freedom(exact, 1_000_000) == 99
    assert degrees_of_freedom(exact, 1_000_000, cells=24) == 23
    keys, weights = list(exact), list(exact.values())

    def draw(n):
        return Counter(rng.choices(keys, weights, k=n))

    result = goodness_of_fit([(draw(20_000), exact)], 1e-3, cells=24)
    assert result.df == 23 and result.passed
    assert two_sample([(draw(20_000), draw(20_000))], 1e-3, cells=24).df == 23
    assert samples_for(0.05, 1e-3, lambda n: 3 * 23) == 13458  # the default's need, 3 prompts of 24 cells
    assert samples_for(0.05, 1e-3, lambda n: 3 * 23) < samples_for(0.05, 1e-3, lambda n: min(3000, n // 15))


def test_jobs_deal_the_parameters_round_robin():
    assert shares(["a", "b", "c", "d", "e"], 2) == [["a", "c", "e"], ["b", "d"]]
    assert shares(["a"], 4) == [["a"]]


def test_jobs_list_the_drafts_as_one_process_does():
    """Each --jobs process reports the drafts it chose before its own parameters' samples; the
    merged list is in the grid's order, and a draft every process fitted alike (vLLM's, fitted
    once and kept) is listed once, for the first parameter, as one process lists it."""
    def share(*pairs):
        return {"drafts": [{"parameter": p, "draft": f"assisted, {p}" if d is None else d} for p, d in pairs]}

    names = ["default", "temperature", "top_k", "top_p"]
    per_parameter = [share(("default", None), ("top_k", None)), share(("temperature", None), ("top_p", None))]
    assert merged_drafts(per_parameter, names) == [(p, f"assisted, {p}") for p in names]
    once = [share(("default", "draft_model, kept")), share(("temperature", "draft_model, kept"))]
    assert merged_drafts(once, names) == [("default", "draft_model, kept")]
    assert merged_drafts([share(), share()], names) == []


@pytest.mark.slow
def test_jobs_give_the_rows_one_process_gives(tmp_path):
    """Each sample's seed depends on its method, prompt and index only, so two processes write
    the rows one process writes, in the grid's order (up to float32 rounding in the exact law:
    one thread and two sum the logits' products in another order)."""
    from verispec.cli import main

    argv = ["check-runtime", "verispec", "--method", "lookup", "--n", "60", "--parameter", "top_k",
            "--parameter", "default", "--parameter", "logit_bias", "--greedy-prompts", "0", "--seeded", "0"]
    assert main([*argv, "--out", str(tmp_path / "one")]) == 0
    assert main([*argv, "--jobs", "2", "--out", str(tmp_path / "two")]) == 0
    one, two = (json.loads((tmp_path / d / "check-runtime-verispec-lookup.json").read_text()) for d in ("one", "two"))
    assert [row["result"]["p_value"] for row in two["sampled_law"] if "result" in row] == pytest.approx(
        [row["result"]["p_value"] for row in one["sampled_law"] if "result" in row], rel=1e-3)
    strip = lambda rows: [{k: v for k, v in row.items() if k not in ("result", "effect_tv", "power")} for row in rows]  # noqa: E731
    assert strip(two["sampled_law"]) == strip(one["sampled_law"])
    flat = lambda rows: [(name, x) for row in rows for name, c in row.get("power", {}).items()  # noqa: E731
                         for x in c.values() if isinstance(x, float)]
    assert [name for name, _ in flat(two["sampled_law"])] == [name for name, _ in flat(one["sampled_law"])]
    assert [x for _, x in flat(two["sampled_law"])] == pytest.approx([x for _, x in flat(one["sampled_law"])], abs=1e-9)
    assert [p["ids"] for p in two["prompts"]] == [p["ids"] for p in one["prompts"]]
    assert [row["parameter"] for row in two["sampled_law"]][::3] == ["default", "top_k", "logit_bias"]
    assert "--jobs 2" in two["command"] and set(two["seconds"]) == {"sampled law"}


def test_simulated_p_values_keep_the_stated_false_failure_rate():
    """Correct-engine runs drawn straight from an exact law (two prompts of 24 cells, many
    expected only 5 to 10 times, where the chi-square tail of G is too light): each test
    rejects at most alpha of them. 600 runs at alpha 0.1: a rate above 0.14 has probability
    below 1e-3 for a test at its level (binomial tail), so the assertion fails a correct test
    about once in a thousand seeds; the seeds are fixed."""
    rng = np.random.default_rng(7)
    weights = np.array([0.8 ** i for i in range(24)])
    laws = [{(i,): float(w) for i, w in enumerate(weights / weights.sum())},
            {(i,): float(w) for i, w in enumerate(np.roll(weights, 5) / weights.sum())}]
    runs, alpha, size = 600, 0.1, 200
    exact_rejections = pair_rejections = 0
    for run_ in range(runs):
        def sample(law_):
            counts = rng.multinomial(size, list(law_.values()))
            return Counter({cell: int(c) for cell, c in zip(law_, counts)})

        drawn = [(sample(law_), law_) for law_ in laws]
        exact_rejections += not goodness_of_fit(drawn, alpha, cells=24, seed=run_).passed
        pair_rejections += not two_sample([(sample(law_), sample(law_)) for law_ in laws], alpha, cells=24,
                                          seed=run_).passed
    assert exact_rejections / runs <= 0.14 and pair_rejections / runs <= 0.14
    assert exact_rejections > 0 and pair_rejections > 0  # the simulation does reject at its level


@pytest.mark.parametrize(("argv", "says"), [
    (["--n", "100", "--tv", "0.1"], "--n and --tv"),
    (["--prompts", "2", "--sample-prompt", "Coffee or tea?"], "--prompts picks spread prompts"),
    (["--no-sampled", "--n", "100"], "--n sets the sampled law"),
    (["--no-sampled", "--cells", "8"], "--cells sets the sampled law"),
    (["--no-sampled", "--parameter", "top_k"], "--parameter sets the sampled law"),
    (["--no-sampled", "--jobs", "2"], "--jobs splits the sampled law"),
    (["--greedy-prompts", "0", "--concurrency", "4"], "--concurrency sets greedy identity"),
    (["--greedy-prompts", "0", "--greedy-tokens", "4"], "--greedy-tokens sets greedy identity"),
])
def test_options_that_do_not_combine_are_refused(argv, says, capsys):
    from verispec.cli import main

    assert main(["check-runtime", "verispec", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0]


SEEDED = Settings(n=400, prompts=2, sample_prompts=[[3, 5], [7, 1]], sampled=False, seeded=8)


def test_seeded_identity_is_a_property_where_not_claimed():
    """verispec's token-level rule draws its randomness per round: a seed fixes plain sampling
    alone and in a batch, and other tokens with speculation, reported as a property it lacks."""
    report = check_runtime(controls.token_rule(TARGET, DRAFT), REFERENCE, [controls.DRAFT], SEEDED)
    statuses = {(row.method, row.in_flight): row.status for row in report.seeded_rows}
    assert statuses == {("plain, again", 1): HOLDS, ("plain", 8): HOLDS, (controls.DRAFT, 1): LACKS,
                        (controls.DRAFT, 8): LACKS}
    assert report.passed and "does not claim" in report.markdown()
    assert [row.status for row in report.probe_rows] == [PASS, PASS]  # fresh seeds: independent samples


def test_an_engine_claiming_seeded_identity_is_held_to_it():
    keyed = controls.KeyedTable(TARGET)
    report = check_runtime(keyed, REFERENCE, [controls.DRAFT], SEEDED)
    assert {row.status for row in report.seeded_rows} == {PASS} and report.passed
    assert keyed.sample([3, 5], CASE, 3, 3, None, 10) == [keyed.sample([3, 5], CASE, 1, 3, controls.DRAFT, 10 + i)[0]
                                                          for i in range(3)]
    broken = controls.token_rule(TARGET, DRAFT)
    broken.claims_seeded_identity = True
    claimed = check_runtime(broken, REFERENCE, [controls.DRAFT], SEEDED)
    assert {row.status for row in claimed.seeded_rows if row.method == controls.DRAFT} == {FAIL} and not claimed.passed


def test_unseeded_requests_sharing_one_stream_are_caught():
    """8 requests in flight returning one sample: on these tables the largest cell has
    probability about 0.2, so 4 identical of 8 on either prompt happen with probability below
    1e-3 for independent samples."""
    report = check_runtime(controls.shared_stream(TARGET, DRAFT), REFERENCE, [controls.DRAFT], SEEDED)
    (plain, draft) = report.probe_rows
    assert plain.status == draft.status == FAIL and plain.group == 8 and plain.bound <= 1e-3
    assert not report.passed and "identical on 2 prompts" in report.markdown()


def test_the_power_model_gives_the_exact_law_for_the_correct_rule():
    """Summed over where each round ends, the correct rule's law on the cells is the exact law
    (whatever the controlled draft), and each modelled class a law of its own."""
    cells = law.exact_cells(TARGET.score, [3, 5], CASE, 600, (), 3, 24)
    laws = power.bug_laws(TARGET.score, [3, 5], CASE, list(cells), 3)
    assert laws["exact"] == pytest.approx(cells, abs=1e-12)
    assert set(laws) == {"exact", *power.CLASSES}
    for name in power.CLASSES:
        assert sum(laws[name].values()) == pytest.approx(1.0, abs=1e-9)
        moved = power.noncentrality(cells, laws[name], 600, 24)[0]
        assert moved == pytest.approx(0.0, abs=1e-12) if name == "penalty counted per step" else moved > 0.01, name
    assert power.noncentrality(cells, laws["exact"], 600, 24)[1] == pytest.approx(0.0, abs=1e-12)
    # no transform, no raw q and no penalty: the draft's raw row is its row, and nothing counts a step
    plain = power.bug_laws(TARGET.score, [3, 5], SamplingCase("default"), list(cells), 3)
    assert plain["q from raw logits"] == pytest.approx(plain["exact"], abs=1e-12)


def test_each_row_states_its_power_against_the_named_classes():
    report = check_runtime(controls.correct(TARGET, DRAFT), REFERENCE, [controls.DRAFT], SETTINGS)
    plain, versus, exact = report.law_rows
    assert set(plain.power) == {power.DROPPED} and set(exact.power) == {*power.CLASSES, *power.NOT_COMPUTED}
    assert all(0 <= pair[1] <= 1 for name, pair in exact.power.items() if name not in power.NOT_COMPUTED)
    assert exact.power["stale cache after a rejection"] is None and "| not computed |" in report.markdown()
    assert exact.power["bonus from the wrong row"][1] > 0.99  # the bonus token is keyed, and the test sees it
    assert versus.power["double-accept rule"][1] < exact.power["double-accept rule"][1]  # two samples need more
    assert "### Power against named bug classes" in report.markdown()
    flat = lambda row: {(name, i): x for name, pair in row.power.items() for i, x in enumerate(pair or ())}  # noqa: E731
    back = LawRow.from_dict(json.loads(json.dumps(exact.as_dict())))
    assert flat(back) == pytest.approx(flat(exact)) and back.power["stale cache after a rejection"] is None


def test_the_most_likely_continuation_is_bounded_from_above():
    from itertools import product

    best = max(float(TARGET.distribution([3, 5])[a] * TARGET.distribution([5, a])[b] * TARGET.distribution([a, b])[c])
               for a, b, c in product(range(VOCAB), repeat=3))
    assert law.most_likely(TARGET.score, [3, 5], SamplingCase("default"), (), 3) == pytest.approx(best)
    assert law.most_likely(TARGET.score, [3, 5], SamplingCase("default"), (), 3, forwards=1) >= best


def test_the_report_spells_the_command_every_default_included():
    """The command a report records, and what each --jobs process runs, are spelled in one place
    from the check's settings (`runtime_check.jobs`)."""
    from verispec.runtime_check.check import Settings
    from verispec.runtime_check.jobs import command_words, common_options, law_options

    settings = Settings(n=60, concurrency=(), parameters=["top_k"], tv=None, cells=24, sample_texts=("a b a b",), seeded=0)
    words = command_words("verispec", ["lookup"], "m", "float32", settings, greedy_count=2, prompts_file=None, jobs=2,
                          out=None)
    assert words == ["verispec", "check-runtime", "verispec", "--method", "lookup", "--model", "m", "--dtype", "float32",
                     "--n", "60", "--cells", "24", "--length", "3", "--sample-prompt", "a b a b", "--alpha", "0.001",
                     "--parameter", "top_k", "--seed", "0", "--seeded", "0", "--greedy-prompts", "2",
                     "--greedy-tokens", "256", "--concurrency", "1", "--jobs", "2"]
    assert [*common_options("verispec", ["lookup"], "m", "float32"), *law_options(settings)] == [
        *words[1:10], *words[10:19], "--seed", "0"]
    off = command_words("hf", None, "m", "float32", Settings(sampled=False), greedy_count=0, prompts_file=None, jobs=1,
                        out=None)
    assert off == ["verispec", "check-runtime", "hf", "--model", "m", "--dtype", "float32", "--no-sampled", "--seed", "0",
                   "--seeded", "0", "--greedy-prompts", "0"]
