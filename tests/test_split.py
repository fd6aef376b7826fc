"""The validation split (app/data/input/split.py): deterministic by seed, disjoint, complete."""

from __future__ import annotations

import numpy as np
import pytest

from app.data.input import split as split_lib

COUNTS = [(1000, 0.1, 100), (7, 0.1, 1), (3, 0.4, 1), (10, 0.0, 0), (1, 0.3, 0), (2, 0.49, 1)]


@pytest.mark.parametrize(("n", "fraction", "held"), COUNTS)
def test_the_split_holds_out_the_documented_count(n: int, fraction: float, held: int) -> None:
    rows = split_lib.split(n, fraction, seed=0)
    assert len(rows.validation) == held and len(rows.train) == n - held
    assert rows.validating == (held > 0)


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_the_split_is_disjoint_sorted_and_covers_every_row_once(seed: int) -> None:
    rows = split_lib.split(5000, 0.2, seed)
    both = np.concatenate([rows.train, rows.validation])
    assert np.array_equal(np.sort(both), np.arange(5000))  # every row exactly once
    assert not np.intersect1d(rows.train, rows.validation).size
    assert np.all(np.diff(rows.train) > 0) and np.all(np.diff(rows.validation) > 0)
    assert rows.train.dtype == rows.validation.dtype == np.int64


def test_the_split_is_a_function_of_the_seed_only() -> None:
    a, b = split_lib.split(5000, 0.1, 3), split_lib.split(5000, 0.1, 3)
    assert np.array_equal(a.validation, b.validation) and np.array_equal(a.train, b.train)
    other = split_lib.split(5000, 0.1, 4)
    assert not np.array_equal(a.validation, other.validation)


def test_the_validation_rows_are_spread_over_the_file_not_a_block() -> None:
    rows = split_lib.split(10_000, 0.1, 0)
    counts = np.bincount(rows.validation // 1000, minlength=10)  # rows per tenth of the file
    assert counts.min() >= 60 and counts.max() <= 140, counts


@pytest.mark.parametrize(("count", "expected"), [(0, 800), (300, 300), (800, 800), (5000, 800)])
def test_the_evaluated_rows_are_a_fixed_sample_of_the_validation_rows(
    count: int, expected: int
) -> None:
    validation = split_lib.split(8000, 0.1, seed=4).validation
    picked = split_lib.evaluated(validation, count, seed=4)
    assert len(picked) == expected
    assert np.all(np.diff(picked) > 0) and np.isin(picked, validation).all()
    assert np.array_equal(picked, split_lib.evaluated(validation, count, seed=4))
    if expected < len(validation):  # another seed, another sample, spread over the rows
        assert not np.array_equal(picked, split_lib.evaluated(validation, count, seed=5))
        assert picked[0] < validation[len(validation) // 4] < picked[-1]
