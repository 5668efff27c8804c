"""Table language models: the three kinds the engine is tested on (the seed's bigram pair,
tables keyed on the last two tokens, tables that can emit EOS) and the cache contract that
extend / rollback / score must keep."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch

from verispec.models.tables import TableLM, bigram, random_table, seed_pair


def log_row(row) -> list[float]:
    return [math.log(x) if x > 0 else -math.inf for x in row]


def test_seed_pair_is_the_lessons_bigram_pair():
    target, draft = seed_pair()
    assert (target.vocab_size, target.order, draft.vocab_size, draft.order) == (3, 1, 3, 1)
    tenth = [Fraction(n, 10) for n in range(11)]
    assert target.distribution([0]) == (tenth[1], tenth[3], tenth[6])
    assert target.distribution([1]) == (tenth[6], tenth[3], tenth[1])
    assert target.distribution([2]) == (tenth[2], tenth[7], tenth[1])
    assert draft.distribution([0]) == (tenth[4], tenth[4], tenth[2])
    assert draft.distribution([1]) == (tenth[2], tenth[5], tenth[3])
    assert draft.distribution([2]) == draft.distribution([0])
    # A bigram reads only the last token; its logits are the rows' logarithms.
    assert target.distribution([2, 1, 0]) == target.distribution([0])
    assert target.score([0, 2]).tolist() == [log_row(target.distribution([a])) for a in (0, 2)]


def test_order_two_tables_are_keyed_on_the_last_two_tokens():
    table = random_table(3, 2, seed=5)
    assert set(table.rows) == {(a,) for a in range(3)} | {(a, b) for a in range(3) for b in range(3)}
    assert table.distribution([1]) == table.rows[(1,)]
    assert table.distribution([2, 0, 1]) == table.rows[(0, 1)]
    assert table.distribution([0, 0, 1]) == table.rows[(0, 1)]
    logits = table.score([2, 0, 1])
    assert logits.dtype == torch.float64
    assert logits.tolist() == [log_row(table.rows[key]) for key in [(2,), (2, 0), (0, 1)]]
    # Different two-token contexts do get different rows (the table is not a bigram in disguise).
    assert len({table.rows[(a, 1)] for a in range(3)}) > 1


def test_zeros_are_exact_and_optional():
    with_zeros = random_table(5, 1, seed=0, denominator=6)
    assert any(0 in row for row in with_zeros.rows.values())
    assert math.isinf(with_zeros.score([0, 1, 2, 3, 4]).min())
    without = random_table(5, 1, seed=0, denominator=6, zeros=False)
    assert all(min(row) > 0 for row in without.rows.values())


@pytest.mark.parametrize("order", [1, 2])
def test_eos_tables_give_every_row_some_eos_mass(order):
    eos = 2
    plain = random_table(4, order, seed=3, denominator=6)
    table = random_table(4, order, seed=3, denominator=6, eos_token_id=eos)
    moved = 0
    for key, row in plain.rows.items():
        new = table.rows[key]
        assert sum(new) == 1 and min(new) >= 0 and new[eos] > 0
        if row[eos] > 0:
            assert new == row
        else:  # a quarter of the largest entry went to EOS
            big = max(range(4), key=lambda i: row[i])
            assert new[eos] == row[big] / 4 and new[big] == row[big] * 3 / 4
            moved += 1
    assert moved > 0


def check_cache(table: TableLM, seed: int) -> None:
    """Random extend / rollback calls; every answer equals a full recomputation."""
    rng = random.Random(seed)
    processed: list[int] = []
    table.prefill([])
    for _ in range(60):
        if processed and rng.random() < 0.35:
            length = rng.randint(0, len(processed))
            table.rollback(length)
            del processed[length:]
        else:
            tokens = [rng.randrange(table.vocab_size) for _ in range(rng.randint(1, 4))]
            keep = rng.choice([None, 1, len(tokens)])
            logits = table.extend(tokens, keep=keep)
            processed += tokens
            full = table.score(processed)
            expected = full[len(processed) - len(tokens):] if keep is None else full[-keep:]
            assert torch.equal(logits, expected)
        assert table.length == len(processed)


@pytest.mark.parametrize(
    "table", [seed_pair()[0], random_table(3, 2, seed=1), random_table(4, 2, seed=2, eos_token_id=0)]
)
def test_extend_rollback_and_score_agree(table):
    for seed in range(5):
        check_cache(table, seed)


def test_prefill_reset_and_score_leave_or_replace_the_cache():
    table = random_table(3, 2, seed=4)
    table.prefill([0, 1, 2])
    assert table.length == 3
    table.score([2, 2, 2, 2, 2])  # stateless
    assert table.length == 3
    assert torch.equal(table.extend([1]), table.score([0, 1, 2, 1])[-1:])
    table.prefill([2])
    assert table.length == 1
    assert torch.equal(table.extend([0]), table.score([2, 0])[-1:])
    table.reset()
    assert table.length == 0
    with pytest.raises(ValueError, match="cannot roll back to 1; 0 tokens"):
        table.rollback(1)
    with pytest.raises(ValueError, match="roll back to -1"):
        table.rollback(-1)


@pytest.mark.parametrize(
    ("rows", "order", "message"),
    [
        ({(0,): ["1/2", "1/2"], (1,): ["1"]}, 1, "same vocabulary size"),
        ({(0,): ["1/2", "1/3"]}, 1, "not a probability distribution"),
        ({(0,): ["3/2", "-1/2"]}, 1, "not a probability distribution"),
        ({(0,): ["1/2", "1/2"]}, 0, "order must be >= 1"),
    ],
)
def test_invalid_tables_raise(rows, order, message):
    with pytest.raises(ValueError, match=message):
        TableLM({key: [Fraction(x) for x in row] for key, row in rows.items()}, order)


def test_missing_context_names_the_suffix():
    with pytest.raises(KeyError, match=r"\(5,\)"):
        bigram([["1/2", "1/2"], ["1", "0"]]).distribution([5])
