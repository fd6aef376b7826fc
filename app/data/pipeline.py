"""tf.data input pipelines reading the binary cache (memory-mapped, streamed).

The training batch for step ``s`` depends only on ``(seed, s)``: the sample
order is an endless sequence of seeded permutations of the training set, and
batch ``s`` is its slice ``[s·B, (s+1)·B)``. A resumed run therefore sees the
same batches as an uninterrupted one, and memory stays bounded by a few
batches however large the data set is.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from app.data.cache import DataCache
from app.plan import ThreadPlan

PREFETCH_BATCHES = 2


def batch_indices(seed: int, step: int, batch_size: int, n: int) -> np.ndarray:
    """Sample indices of training batch ``step``: shape (batch_size,), int64.

    Permutation ``e`` of ``range(n)`` comes from ``numpy.random.default_rng([seed, e])``.
    """
    start = step * batch_size
    out = np.empty(batch_size, np.int64)
    filled = 0
    while filled < batch_size:
        epoch, offset = divmod(start + filled, n)
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        take = min(batch_size - filled, n - offset)
        out[filled : filled + take] = perm[offset : offset + take]
        filled += take
    return out


def dataset_options(plan: ThreadPlan) -> tf.data.Options:
    """tf.data options from the plan: private threadpool and autotune CPU/RAM budgets.

    Without these tf.data sizes itself from the host's CPUs and RAM, not the
    container's (DESIGN.md "Facts learned the hard way").
    """
    options = tf.data.Options()
    options.threading.private_threadpool_size = plan.tfdata_threads
    options.autotune.enabled = True
    options.autotune.cpu_budget = plan.tfdata_threads
    if plan.tfdata_ram_budget is not None:
        options.autotune.ram_budget = plan.tfdata_ram_budget
    options.deterministic = True
    return options


def train_dataset(
    cache: DataCache,
    plan: ThreadPlan,
    *,
    seed: int,
    batch_size: int,
    start_step: int,
    end_step: int,
    rows: Callable[[int], np.ndarray] | None = None,
) -> tf.data.Dataset:
    """Batches for steps ``start_step .. end_step-1``: (x (B,H,W,1) raw float32, y (B,K) raw).

    ``rows(step)`` gives the sorted training-row indices of a step (``batch_size``
    of them); default: :func:`batch_indices` (a multi-worker run passes its shard).
    """
    n = cache.train_size

    def default_rows(step: int) -> np.ndarray:
        return np.sort(batch_indices(seed, step, batch_size, n))

    rows_of = rows or default_rows

    def load(step: np.int64) -> tuple[np.ndarray, np.ndarray]:
        idx = rows_of(int(step))
        x = cache.read_rows("train", "features", idx)
        return x[..., None], cache.read_rows("train", "labels", idx)

    def fetch(step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x, y = tf.numpy_function(load, [step], (tf.float32, tf.float32), stateful=False)
        x.set_shape((batch_size, cache.height, cache.width, 1))
        y.set_shape((batch_size, cache.num_outputs))
        return x, y

    ds = tf.data.Dataset.range(start_step, end_step)
    ds = ds.map(fetch, num_parallel_calls=min(2, plan.tfdata_threads), deterministic=True)
    return ds.prefetch(PREFETCH_BATCHES).with_options(dataset_options(plan))


def eval_dataset(cache: DataCache, plan: ThreadPlan, batch_size: int) -> tf.data.Dataset:
    """The test set in order: (x (b,H,W,1) raw, y (b,K) raw), last batch may be short."""

    def load(start: np.int64) -> tuple[np.ndarray, np.ndarray]:
        idx = np.arange(int(start), min(int(start) + batch_size, cache.test_size))
        x = cache.read_rows("test", "features", idx)
        return x[..., None], cache.read_rows("test", "labels", idx)

    def fetch(start: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x, y = tf.numpy_function(load, [start], (tf.float32, tf.float32), stateful=False)
        x.set_shape((None, cache.height, cache.width, 1))
        y.set_shape((None, cache.num_outputs))
        return x, y

    ds = tf.data.Dataset.range(0, cache.test_size, batch_size).map(fetch)
    return ds.prefetch(PREFETCH_BATCHES).with_options(dataset_options(plan))
