"""The power model's laws are the laws its negative controls sample: each modelled bug class of
`verispec.runtime_check.power`, given the controls' draft table as its draft, against samples of
the control engine that has the bug (`verispec.runtime_check.controls`), on the rational tables
of tests/test_runtime_check.py (two prompts, 3 tokens keyed, k = 2, 24 cells a prompt).

Each sample must pass a G-test against its class's modelled law at alpha 1e-3 (simulated
p-value: a right model fails with probability at most 1e-3 a class, so at most 1.1e-2 over the
file; the seeds are fixed, so the outcome is deterministic) and, where the model gives the
test 99 % power against the exact law at this N, fail against the exact law: a model that
were the exact law, or another bug's, could not pass both.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_runtime_check import CASE, DRAFT, REPETITION, TARGET

from verispec.runtime_check import controls, law, power
from verispec.runtime_check.cases import SamplingCase, next_token_law
from verispec.statistics import degrees_of_freedom, goodness_of_fit

PROMPTS, N, ALPHA, CELLS, LENGTH = ([3, 5], [7, 1]), 1200, 1e-3, 24, 3

# modelled class -> (its control, the case it is checked under, the control's keyword arguments)
MODELLED = {
    "repair from p, not the residual": (controls.resample_from_p, CASE, {}),
    "bonus from the wrong row": (controls.wrong_bonus, CASE, {}),
    "parameters on the acceptance test only": (controls.acceptance_only, CASE, {}),
    "parameters on the bonus token only": (controls.bonus_only, CASE, {}),
    "temperature 1.1x on speculative rounds": (controls.hotter_speculation, CASE, {}),
    "argmax verification at any temperature": (controls.argmax_verification, CASE, {}),
    "draft noise reused to accept": (controls.reused_noise, CASE, {}),
    "double-accept rule": (controls.double_accept, CASE, {}),
    "q from raw logits": (controls.raw_q, CASE, {}),
    "penalty counted per step": (controls.penalty_per_step, REPETITION, {"penalty": 3.0}),
    "parameter dropped": (controls.penalties_dropped, REPETITION, {}),
}


def table_draft(prompt: list[int], case: SamplingCase):
    """The controls' draft (`power.DraftRows`): the draft table's row under the case, and raw."""

    def rows(prefix, p, raw):
        context = [*prompt, *prefix]
        logits = DRAFT.score(context)[-1]  # [V]
        return next_token_law(logits, case, context, prefix), torch.softmax(logits.double(), 0)

    return rows


def test_every_class_but_one_is_modelled_and_checked_here():
    assert set(MODELLED) == set(power.CLASSES)
    assert set(power.NOT_COMPUTED) == {"stale cache after a rejection"}


@pytest.mark.parametrize("name", sorted(MODELLED))
def test_the_modelled_law_is_what_the_control_samples(name):
    control, case, kwargs = MODELLED[name]
    engine = control(TARGET, DRAFT, **kwargs)
    exact, modelled, counts = [], [], []
    for i, prompt in enumerate(PROMPTS):
        cells = law.exact_cells(TARGET.score, prompt, case, N, (), LENGTH, CELLS)
        bug = power.bug_laws(TARGET.score, prompt, case, list(cells), LENGTH, draft=table_draft(prompt, case))
        samples = engine.sample(prompt, case, N, LENGTH, controls.DRAFT, 1000 * i)
        exact.append(cells)
        modelled.append(bug[name])
        counts.append(Counter(law.cell_of(law.key(s, (), LENGTH), cells) for s in samples))
    assert goodness_of_fit(list(zip(counts, modelled)), ALPHA, CELLS).passed, name
    df = sum(degrees_of_freedom(cells, N, CELLS) for cells in exact)
    lam = sum(power.noncentrality(cells, bug, N, CELLS)[1] for cells, bug in zip(exact, modelled))
    if power.run_power([lam], df, ALPHA) > 0.99:
        assert not goodness_of_fit(list(zip(counts, exact)), ALPHA, CELLS).passed, name
