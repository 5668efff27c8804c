"""The argument checks' predicates: is_int and is_number, their bounds, and what they never
accept (a bool, NaN, an infinity)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from verispec.checks import is_int, is_number


@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_neither_an_int_nor_a_number(value):
    assert not is_int(value)
    assert not is_int(value, integral=True)
    assert not is_number(value)


@pytest.mark.parametrize("value", [1.0, "1", None, Fraction(1), [1]])
def test_an_int_is_an_int_and_nothing_else(value):
    assert is_int(1)
    assert not is_int(value)


def test_integral_takes_numpy_integers_which_a_plain_check_refuses():
    assert is_int(np.int64(3), least=0, integral=True)
    assert not is_int(np.int64(3))
    assert not is_int(np.int64(-1), least=0, integral=True)
    assert not is_int(np.bool_(True), integral=True)


def test_int_bounds_are_inclusive():
    assert is_int(1, least=1) and not is_int(0, least=1)
    assert is_int(4, 1, 4) and not is_int(5, 1, 4)
    assert is_int(-10**30) and is_int(10**30, least=0)


def test_a_number_is_an_int_or_a_finite_float():
    assert is_number(0) and is_number(0.5) and is_number(np.float64(0.5))
    assert not is_number(np.float32(0.5))  # not a float subclass
    assert not is_number(Fraction(1, 2)) and not is_number("0.5") and not is_number(None)
    assert is_number(10**400, least=0)  # an int is finite, even past a float's range


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float64("nan")])
def test_nan_and_the_infinities_are_no_number(value):
    assert not is_number(value)
    assert not is_number(value, least=0)
    assert not is_number(value, 0, 1)


def test_number_bounds_are_inclusive_unless_opened():
    assert is_number(0, 0, 1) and is_number(1, 0, 1)
    assert not is_number(-1e-12, 0, 1) and not is_number(1 + 1e-12, 0, 1)
    assert not is_number(0, 0, 1, open_least=True) and is_number(1, 0, 1, open_least=True)
    assert is_number(0, 0, 1, open_most=True) and not is_number(1, 0, 1, open_most=True)
    assert not is_number(0.0, least=0, open_least=True) and is_number(1e-300, least=0, open_least=True)


def test_the_predicates_answer_bools():
    assert is_int(np.int64(3), 0, 5, integral=True) is True
    assert is_number(np.float64(0.5), 0, 1) is True


def test_options_that_took_a_bool_as_a_number_now_refuse_it():
    from verispec.cost import FixedCosts, OnlineCosts, optimal_k
    from verispec.proposers.suffix_index import SuffixIndex

    prior = FixedCosts(0.1, [1.0] * 5)
    with pytest.raises(ValueError, match="min_prob"):
        SuffixIndex(min_prob=True)
    with pytest.raises(ValueError, match="cost_prior_weight"):
        OnlineCosts(prior, prior_weight=True)
    with pytest.raises(ValueError, match="cost_memory"):
        OnlineCosts(prior, memory=True)
    with pytest.raises(ValueError, match="margin"):
        optimal_k(0.1, [1.0] * 5, alpha=0.5, margin=False)
