"""The training data order depends only on (seed, step)."""

from __future__ import annotations

import numpy as np

from app.data.pipeline import batch_indices


def test_batches_depend_only_on_seed_and_step() -> None:
    a = batch_indices(3, 17, 32, 100)
    b = batch_indices(3, 17, 32, 100)
    assert a.tolist() == b.tolist()
    assert batch_indices(4, 17, 32, 100).tolist() != a.tolist()
    assert batch_indices(3, 18, 32, 100).tolist() != a.tolist()


def test_each_epoch_is_a_permutation() -> None:
    n, batch = 10, 4
    stream = np.concatenate([batch_indices(0, s, batch, n) for s in range(5)])  # 20 = 2 epochs
    assert sorted(stream[:10].tolist()) == list(range(10))
    assert sorted(stream[10:20].tolist()) == list(range(10))
    assert stream[:10].tolist() != stream[10:20].tolist()


def test_batch_larger_than_data_set_wraps_epochs() -> None:
    idx = batch_indices(0, 0, 25, 10)
    assert len(idx) == 25
    assert sorted(idx[:10].tolist()) == list(range(10))
