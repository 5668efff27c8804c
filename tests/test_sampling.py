"""Sampling transforms: logits -> p or q (float64), validation, and the filters' semantics on
small hand-computed examples."""

from __future__ import annotations

import math
import re

import pytest
import torch

from verispec.sampling import GREEDY, SamplingParams, penalised, probabilities

INF = math.inf


def logits_of(*probs: float) -> torch.Tensor:
    """logits[1, V] whose softmax is `probs` (zeros become -inf)."""
    return torch.tensor([[math.log(x) if x > 0 else -INF for x in probs]], dtype=torch.float64)


def assert_probs(actual: torch.Tensor, expected: list[float]) -> None:
    assert actual.dtype == torch.float64
    assert actual.shape == (1, len(expected))
    for a, e in zip(actual[0].tolist(), expected):
        if e == 0:
            assert a == 0.0  # filtered and masked tokens are exact zeros, not tiny numbers
        else:
            assert abs(a - e) < 1e-12


def test_probabilities_are_float64_even_from_float32_logits():
    logits = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.float32)
    p = probabilities(logits, SamplingParams())
    assert p.dtype == torch.float64
    e = [math.exp(x) for x in (0.0, 1.0, 2.0)]
    assert_probs(p, [x / sum(e) for x in e])


def test_softmax_of_log_probabilities_recovers_them_row_by_row():
    logits = torch.cat([logits_of(0.1, 0.3, 0.6), logits_of(0.6, 0.3, 0.1)])
    p = probabilities(logits, SamplingParams())
    assert p.shape == (2, 3)
    assert torch.allclose(p, torch.tensor([[0.1, 0.3, 0.6], [0.6, 0.3, 0.1]], dtype=torch.float64),
                          rtol=0, atol=1e-12)


def test_neg_inf_logits_give_exact_zeros():
    p = probabilities(torch.tensor([[0.0, -INF, 0.0, -INF]]), SamplingParams(temperature=0.7))
    assert p[0].tolist() == [0.5, 0.0, 0.5, 0.0]


def test_temperature_divides_the_logits():
    # logits (0, log 4) at T = 2 become (0, log 2): p = (1/3, 2/3).
    assert_probs(probabilities(logits_of(0.2, 0.8), SamplingParams(temperature=2.0)), [1 / 3, 2 / 3])
    # A low temperature sharpens: (1, 4) ** 2 = (1, 16).
    assert_probs(probabilities(logits_of(0.2, 0.8), SamplingParams(temperature=0.5)), [1 / 17, 16 / 17])


@pytest.mark.parametrize(
    ("top_k", "expected"),
    [
        (1, [0.5, 0.0, 0.5, 0.0]),  # two tokens tie for first: both kept
        (2, [0.5, 0.0, 0.5, 0.0]),
        (3, [math.e / (2 * math.e + 1), 0.0, math.e / (2 * math.e + 1), 1 / (2 * math.e + 1)]),
        (4, None),
        (9, None),  # larger than the vocabulary: no filtering
    ],
)
def test_top_k_keeps_ties_at_the_kth_value(top_k, expected):
    logits = torch.tensor([[3.0, 1.0, 3.0, 2.0]], dtype=torch.float64)
    p = probabilities(logits, SamplingParams(top_k=top_k))
    if expected is None:
        expected = torch.softmax(logits, dim=-1)[0].tolist()
    assert_probs(p, expected)


P4 = (0.5, 0.25, 0.15, 0.1)


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [
        (0.3, [1.0, 0.0, 0.0, 0.0]),  # the first token alone reaches 0.3
        (0.6, [2 / 3, 1 / 3, 0.0, 0.0]),  # .5 < .6, .75 >= .6: keep two
        (0.8, [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0.0]),
        (0.95, list(P4)),
        (1.0, list(P4)),
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_top_p(top_p, expected):
    assert_probs(probabilities(logits_of(*P4), SamplingParams(top_p=top_p)), expected)
    # The nucleus is about probability order, not position in the vocabulary.
    order = [2, 0, 3, 1]
    shuffled = probabilities(logits_of(*[P4[i] for i in order]), SamplingParams(top_p=top_p))
    assert_probs(shuffled, [expected[i] for i in order])


@pytest.mark.parametrize(
    ("min_p", "expected"),
    [
        (0.0, list(P4)),
        (0.19, list(P4)),  # floor .095 keeps everything
        (0.25, [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0.0]),  # floor .125 drops .1
        (0.4, [2 / 3, 1 / 3, 0.0, 0.0]),  # floor .2 drops .15 and .1
        (0.9, [1.0, 0.0, 0.0, 0.0]),
    ],
)
def test_min_p_keeps_tokens_above_a_fraction_of_the_largest(min_p, expected):
    assert_probs(probabilities(logits_of(*P4), SamplingParams(min_p=min_p)), expected)


def test_filters_apply_in_order_temperature_top_k_top_p():
    # top-k 3 first renormalises (.5, .25, .15) / .9 = (.556, .278, .167); then top-p .8 stops
    # after two tokens. Top-p alone on P4 would keep three (.5 + .25 = .75 < .8).
    p = probabilities(logits_of(*P4), SamplingParams(top_k=3, top_p=0.8))
    assert_probs(p, [2 / 3, 1 / 3, 0.0, 0.0])
    assert_probs(probabilities(logits_of(*P4), SamplingParams(top_p=0.8)),
                 [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0.0])
    # Temperature 2 flattens P4 before top-p to sqrt(P4) / 1.911 = (.370, .262, .203, .165):
    # the first two hold .632 < .65, so a third token survives (at T = 1 two would do).
    root = [math.sqrt(x) for x in P4]
    kept = root[:3]
    assert_probs(probabilities(logits_of(*P4), SamplingParams(temperature=2.0, top_p=0.65)),
                 [x / sum(kept) for x in kept] + [0.0])
    assert_probs(probabilities(logits_of(*P4), SamplingParams(top_p=0.65)), [2 / 3, 1 / 3, 0.0, 0.0])


def test_greedy_has_no_distribution():
    assert GREEDY.greedy and SamplingParams(temperature=0).greedy
    assert not SamplingParams(temperature=0.1).greedy
    with pytest.raises(ValueError, match="greedy"):
        probabilities(logits_of(*P4), GREEDY)


@pytest.mark.parametrize(
    ("logits", "message"),
    [
        (torch.tensor([[0.0, math.nan]]), "NaN"),
        (torch.tensor([[0.0, INF]]), r"\+inf"),
        (torch.zeros(1, 0), r"V >= 1.*\(1, 0\)"),
        (torch.zeros(3), r"\[n, V\].*\(3,\)"),
        (torch.tensor([[0.0, 1.0], [-INF, -INF]]), "entirely -inf"),
    ],
)
def test_invalid_logits_raise_value_error(logits, message):
    with pytest.raises(ValueError, match=message):
        probabilities(logits, SamplingParams())


def test_temperature_that_overflows_the_logits_raises():
    with pytest.raises(ValueError, match="overflows"):
        probabilities(torch.tensor([[1e300, 0.0]], dtype=torch.float64), SamplingParams(temperature=1e-10))


@pytest.mark.parametrize("logits", [[[-1.0, -2.0]], [[0.0, -1.0], [-INF, -3.0]]], ids=["negative", "masked"])
def test_temperature_that_underflows_a_whole_row_raises(logits):
    # Every logit of a row negative, / 1e-320 is -inf: softmax would give NaN, and a draw from
    # NaN probabilities would return the index V.
    with pytest.raises(ValueError, match="underflows a whole row.*use a larger temperature"):
        probabilities(torch.tensor(logits, dtype=torch.float64), SamplingParams(temperature=1e-320))


def test_a_tiny_temperature_that_keeps_one_finite_logit_per_row_is_greedy_in_effect():
    probs = probabilities(torch.tensor([[0.0, -1.0, -INF]], dtype=torch.float64), SamplingParams(temperature=1e-320))
    assert probs.tolist() == [[1.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.5),
        ("temperature", math.nan),
        ("temperature", INF),
        ("temperature", True),
        ("temperature", "1"),
        ("top_k", 0),
        ("top_k", -3),
        ("top_k", 2.5),
        ("top_k", True),
        ("top_p", 0),
        ("top_p", -0.1),
        ("top_p", 1.5),
        ("top_p", math.nan),
        ("top_p", True),
        ("min_p", -0.1),
        ("min_p", 1),
        ("min_p", 1.5),
        ("min_p", math.nan),
        ("min_p", False),
    ],
)
def test_invalid_sampling_params_raise_naming_the_value(field, value):
    with pytest.raises(ValueError, match=rf"{field}.*{re.escape(repr(value))}"):
        SamplingParams(**{field: value})


def test_boundary_sampling_params_are_accepted():
    SamplingParams(temperature=0, top_k=1, top_p=1.0, min_p=0.0)
    SamplingParams(temperature=3, top_p=1e-9, min_p=0.999)


# --- the penalties that read the context ------------------------------------------------------


def test_repetition_penalty_reads_each_rows_own_context():
    """Row r follows the context and the first r drafts: token 2, drafted first, is penalised
    in row 1 on, token 0 (in the context) everywhere; positive logits divided, negative ones
    multiplied (HF's rule)."""
    logits = torch.tensor([[2.0, -1.0, 4.0, 1.0]] * 3)
    out = penalised(logits, SamplingParams(repetition_penalty=2.0), [0], [(), (2,), (2, 3)], 0, ())
    assert out.tolist() == [[1.0, -1.0, 4.0, 1.0], [1.0, -1.0, 2.0, 1.0], [1.0, -1.0, 2.0, 0.5]]


def test_min_tokens_masks_the_eos_ids_until_enough_were_emitted():
    logits = torch.zeros(3, 4)
    out = penalised(logits, SamplingParams(min_tokens=3), [1, 2], [(), (3,), (3, 3)], 1, {0, 2})
    assert torch.isneginf(out[:, [0, 2]]).tolist() == [[True, True], [True, True], [False, False]]
    assert (out[:, [1, 3]] == 0).all() and (logits == 0).all()  # the input is left as it was


def test_no_penalty_returns_the_logits_themselves():
    logits = torch.randn(2, 5)
    assert penalised(logits, SamplingParams(), [1, 2], [(), (3,)], 0, {0}) is logits


@pytest.mark.parametrize("bad", [{"repetition_penalty": 0}, {"repetition_penalty": -1.0},
                                 {"repetition_penalty": math.inf}, {"min_tokens": -1}, {"min_tokens": 1.5}])
def test_bad_penalties_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)
