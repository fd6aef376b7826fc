"""The training order depends only on (seed, step), and is a permutation of every epoch."""

from __future__ import annotations

import numpy as np
import pytest

from app.data.input import order
from app.data.input.order import BLOCK_ROWS, WINDOW_STEPS, batch_indices, batch_rows, epoch_order


def test_batches_depend_only_on_seed_and_step() -> None:
    a = batch_indices(3, 17, 32, 100)
    order.epoch_order.cache_clear()  # computed again from nothing: the same
    b = batch_indices(3, 17, 32, 100)
    assert a.tolist() == b.tolist()
    assert batch_indices(4, 17, 32, 100).tolist() != a.tolist()
    assert batch_indices(3, 18, 32, 100).tolist() != a.tolist()


def test_the_order_does_not_depend_on_which_steps_were_asked_before() -> None:
    # A resumed run asks for step 700 first; an uninterrupted one got there from step 0.
    n, batch = 5_000, 30
    order.epoch_order.cache_clear()
    resumed = [batch_rows(1, s, batch, n) for s in range(700, 710)]
    order.epoch_order.cache_clear()
    for s in range(700):
        batch_rows(1, s, batch, n)
    straight = [batch_rows(1, s, batch, n) for s in range(700, 710)]
    assert all(np.array_equal(a, b) for a, b in zip(resumed, straight, strict=True))


def test_each_epoch_is_a_permutation() -> None:
    n, batch = 10, 4
    stream = np.concatenate([batch_indices(0, s, batch, n) for s in range(5)])  # 20 = 2 epochs
    assert sorted(stream[:10].tolist()) == list(range(10))
    assert sorted(stream[10:20].tolist()) == list(range(10))
    assert stream[:10].tolist() != stream[10:20].tolist()


@pytest.mark.parametrize(("n", "batch"), [(1_003, 10), (4_096, 32), (50_001, 100)])
def test_every_position_exactly_once_per_epoch_over_many_windows(n: int, batch: int) -> None:
    # Data sets many windows long, with a short last block and a short last window.
    assert n > 3 * WINDOW_STEPS * batch
    steps = -(-3 * n // batch)  # three epochs and a bit
    seq = np.concatenate([batch_indices(7, s, batch, n) for s in range(steps)])
    for e in range(3):
        assert np.array_equal(np.sort(seq[e * n : (e + 1) * n]), np.arange(n))
    assert not np.array_equal(seq[:n], seq[n : 2 * n])


def test_a_window_is_whole_blocks_and_a_batch_mixes_the_whole_set() -> None:
    n, batch = 100_000, 100
    window = WINDOW_STEPS * batch
    epoch = epoch_order(2, 0, n, window)
    first = np.sort(epoch[:window])
    # The window's positions are whole blocks of BLOCK_ROWS consecutive positions ...
    blocks = np.unique(first // BLOCK_ROWS)
    assert len(blocks) * BLOCK_ROWS == window
    # ... drawn from the whole set; a batch, a uniform sample of its window's 2·B blocks,
    # takes rows of 2·(1 - (7/8)^4) = 0.83·B distinct blocks on average (B under a full
    # permutation of a large set).
    assert first[0] < n // 10 and first[-1] > n - n // 10
    distinct = [
        len(np.unique(batch_indices(2, s, batch, n) // BLOCK_ROWS)) for s in range(WINDOW_STEPS)
    ]
    assert np.mean(distinct) == pytest.approx(0.83 * batch, abs=0.05 * batch)


def test_a_small_split_is_shuffled_as_a_whole() -> None:
    # At most one window: the in-window shuffle makes it a uniform permutation, so
    # consecutive positions are no more likely to be neighbours than any others.
    n, batch = 4_000, 1_000
    assert n <= WINDOW_STEPS * batch
    together = 0
    for e in range(40):
        epoch = epoch_order(0, e, n, WINDOW_STEPS * batch)
        where = np.empty(n, np.int64)
        where[epoch] = np.arange(n)
        together += int(np.sum(where[0::2][: n // 2] // batch == where[1::2][: n // 2] // batch))
    share = together / (40 * n // 2)
    assert share == pytest.approx(batch / n, abs=0.02)  # 0.25 for uniform, 1 for blocks


def test_batch_larger_than_data_set_wraps_epochs() -> None:
    idx = batch_indices(0, 0, 25, 10)
    assert len(idx) == 25
    assert sorted(idx[:10].tolist()) == list(range(10))


def test_the_epoch_order_is_read_only() -> None:
    with pytest.raises(ValueError, match="read-only"):
        epoch_order(0, 0, 100, 80)[0] = 5
