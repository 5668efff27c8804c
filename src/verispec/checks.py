"""The two predicates behind verispec's argument checks: an integer, a finite number, each
within optional bounds. A bool is never either (True is an int to Python, not a k or a
probability). Each caller keeps its own message and raises it itself:

    if not is_int(k, least=1):
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
"""

from __future__ import annotations

import math
import numbers


def is_int(value: object, least: int | None = None, most: int | None = None, *, integral: bool = False) -> bool:
    """Whether `value` is an int in [least, most] (a bound of None: none). integral: any
    `numbers.Integral` (numpy's integers too), as a token id read from an array may be.

    >>> is_int(3, least=1), is_int(True), is_int(2.0), is_int(5, most=4)
    (True, False, False, False)
    """
    kind = numbers.Integral if integral else int
    return not isinstance(value, bool) and isinstance(value, kind) and within(value, least, most)


def is_number(
    value: object,
    least: float | None = None,
    most: float | None = None,
    *,
    open_least: bool = False,
    open_most: bool = False,
) -> bool:
    """Whether `value` is an int or a finite float (numpy's float64 is a float) in [least, most],
    a bound excluded where open_least or open_most says so. NaN and the infinities never are.

    >>> is_number(0.5, 0, 1), is_number(0, 0, 1, open_least=True), is_number(float("inf"), least=0)
    (True, False, False)
    """
    finite = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    return not isinstance(value, bool) and finite and within(value, least, most, open_least=open_least, open_most=open_most)


def within(value, least, most, *, open_least: bool = False, open_most: bool = False) -> bool:
    """Whether `value` lies between the bounds (None: unbounded on that side)."""
    above = least is None or (value > least if open_least else value >= least)
    below = most is None or (value < most if open_most else value <= most)
    return bool(above and below)
