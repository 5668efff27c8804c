"""The target's own sequence distribution, computed exactly on `Fraction`s.

An independent implementation of the sampling transforms (`verispec.sampling` works on float64
logits; this works on a table's rational rows) and of plain autoregressive decoding, so the
exhaustive audit compares the engine with something that shares none of its code.

Rationality: temperature 1/m turns a row p into p^m / sum(p^m), rational for an integer m; top-k,
top-p and min-p only zero entries and renormalise; an integer repetition penalty theta turns a
seen token's p into p^theta, and min_tokens zeroes the EOS ids. Temperature 0 is the argmax, first index on
ties, as `torch.argmax`.

A filter whose threshold lies within `BOUNDARY_MARGIN` of a row's value (a top-p prefix mass, a
min-p floor) is refused: there float64 rounding, not the rule, decides which tokens survive, so
no exact answer is the engine's. So is a top-p cut through tied values, whose order
`torch.sort` leaves unspecified.

    >>> row = (Fraction(1, 6), Fraction(1, 3), Fraction(1, 2))
    >>> exact_probabilities(row, SamplingParams(temperature=0.5))
    (Fraction(1, 14), Fraction(2, 7), Fraction(9, 14))
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from fractions import Fraction

from verispec.engine import EosIds
from verispec.request import eos_ids as eos_set
from verispec.models.tables import Row, TableLM
from verispec.sampling import SamplingParams

BOUNDARY_MARGIN = 1e-9


def exact_probabilities(row: Sequence[Fraction], sampling: SamplingParams) -> Row:
    """A rational row -> the rational distribution after temperature, top-k, top-p, min-p
    (HF's order, as `verispec.sampling.probabilities`)."""
    if sampling.greedy:
        raise ValueError("temperature 0 is greedy decoding and has no sampling distribution")
    power = _inverse_temperature(sampling.temperature)
    scaled = [x**power for x in row]
    if sampling.top_k is not None and sampling.top_k < len(scaled):
        kth = sorted(scaled, reverse=True)[sampling.top_k - 1]
        scaled = [x if x >= kth else Fraction(0) for x in scaled]
    probs = _normalised(scaled)
    if sampling.top_p is not None and sampling.top_p < 1:
        probs = _nucleus(probs, Fraction(sampling.top_p))
    if sampling.min_p is not None and sampling.min_p > 0:
        floor = Fraction(sampling.min_p) * max(probs)
        if any(x > 0 and abs(x - floor) <= BOUNDARY_MARGIN for x in probs):
            raise ValueError(
                f"min_p {sampling.min_p} puts the floor {float(floor)} within {BOUNDARY_MARGIN} of "
                f"a probability in {[float(x) for x in probs]}; choose another min_p"
            )
        probs = _normalised([x if x >= floor else Fraction(0) for x in probs])
    return probs


def exact_penalised(
    row: Sequence[Fraction], sampling: SamplingParams, context: Sequence[int], emitted: int, eos_ids: Collection[int]
) -> Row:
    """A table's rational row (its logits are log p) after the penalties that read the context,
    as weights: a token in the context has log p multiplied by the repetition penalty theta
    (log p <= 0), so its weight is p^theta, rational for an integer theta; while fewer than
    min_tokens tokens have been emitted the EOS ids weigh 0; a token the grammar does not allow
    after the emitted tokens weighs 0."""
    theta = sampling.repetition_penalty
    if theta != 1:
        power = round(theta)
        if power < 1 or abs(theta - power) > 1e-9:
            raise ValueError(f"the exact audit needs an integer repetition_penalty >= 1, got {theta}")
        seen = set(context)
        row = [x**power if i in seen else x for i, x in enumerate(row)]
    if emitted < sampling.min_tokens:
        row = [Fraction(0) if i in eos_ids else x for i, x in enumerate(row)]
    if sampling.grammar is not None:
        allowed = sampling.grammar.allowed(list(context[len(context) - emitted :]))
        row = [x if allowed is not None and allowed[i] else Fraction(0) for i, x in enumerate(row)]
    return tuple(row)


def greedy_token(row: Sequence[Fraction]) -> int:
    """The argmax of a row, the first index on ties (as `torch.argmax`)."""
    return max(range(len(row)), key=lambda i: (row[i], -i))


def target_sequences(
    target: TableLM,
    prompt: Sequence[int],
    *,
    sampling: SamplingParams,
    max_new_tokens: int,
    eos_token_id: EosIds = None,
) -> dict[tuple[int, ...], Fraction]:
    """Exact probability of every output of plain autoregressive decoding from `prompt`: each
    sequence ends at EOS (any of them, when `eos_token_id` names several) or after
    `max_new_tokens` tokens. Zero-probability outputs are absent.

    Example: a bigram whose rows are all (1/2, 1/2), two tokens: four outputs, 1/4 each.
    """

    eos_ids = eos_set(eos_token_id)

    def next_row(emitted: tuple[int, ...]) -> Row:
        row = exact_penalised(target.distribution([*prompt, *emitted]), sampling, [*prompt, *emitted], len(emitted),
                              eos_ids)
        if sampling.greedy:
            best = greedy_token(row)
            return tuple(Fraction(int(i == best)) for i in range(len(row)))
        return exact_probabilities(row, sampling)

    return autoregressive({(): Fraction(1)}, next_row, max_new_tokens, eos_ids)


def autoregressive(
    start: dict[tuple[int, ...], Fraction],
    next_row: Callable[[tuple[int, ...]], Sequence[Fraction]],
    length: int,
    eos_ids: Collection[int] = (),
) -> dict[tuple[int, ...], Fraction]:
    """Each sequence of `start` (with its mass) extended by sampling `next_row(sequence)` until
    it has `length` tokens or ends with one of `eos_ids`: the exact distribution of the results."""
    done: dict[tuple[int, ...], Fraction] = {}
    pending = list(start.items())
    while pending:
        seq, mass = pending.pop()
        if len(seq) >= length or (seq and seq[-1] in eos_ids):
            done[seq] = done.get(seq, Fraction(0)) + mass
            continue
        pending.extend(((*seq, y), mass * p) for y, p in enumerate(next_row(seq)) if p > 0)
    return done


def _inverse_temperature(temperature: float) -> int:
    """m with temperature = 1/m; only then is p^m renormalised rational."""
    m = round(1 / temperature)
    if m < 1 or abs(1 / temperature - m) > 1e-9:
        raise ValueError(
            f"the exact audit needs temperature 1/m for an integer m >= 1 (1, 0.5, 0.25, ...), "
            f"got {temperature}"
        )
    return m


def _nucleus(probs: Row, top_p: Fraction) -> Row:
    """Keep the smallest prefix of the descending order whose mass reaches top_p."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    keep = [False] * len(probs)
    mass_before = Fraction(0)
    for rank, i in enumerate(order):
        if probs[i] > 0 and abs(mass_before - top_p) <= BOUNDARY_MARGIN:
            raise ValueError(
                f"top_p {float(top_p)} lies within {BOUNDARY_MARGIN} of a prefix mass of "
                f"{[float(x) for x in probs]}; choose a top_p away from every boundary"
            )
        keep[i] = mass_before < top_p
        previous = order[rank - 1] if rank else None
        if previous is not None and probs[i] == probs[previous] > 0 and keep[i] != keep[previous]:
            raise ValueError(
                f"top_p {float(top_p)} cuts through tied probabilities in "
                f"{[float(x) for x in probs]}, whose sorted order is unspecified; choose another"
            )
        mass_before += probs[i]
    return _normalised([x if kept else Fraction(0) for x, kept in zip(probs, keep)])


def _normalised(values: Sequence[Fraction]) -> Row:
    total = sum(values)
    return tuple(x / total for x in values)
