"""tf.data input pipelines reading the binary cache (memory-mapped, streamed).

The training batch for step ``s`` depends only on ``(seed, s)``: the sample
order is an endless sequence of seeded permutations of the training set, and
batch ``s`` is its slice ``[s·B, (s+1)·B)``. A resumed run therefore sees the
same batches as an uninterrupted one.

Where the batches come from: a training split that fits in
:data:`app.budget.memory.RESIDENT_SHARE` of the memory limit (physical memory when
unlimited) is held in memory as one tensor and each batch is a ``tf.gather`` inside the
tf.data graph: one copy per batch, no Python, no syscall (measured in
docs/performance.md: ~4 CPU-ms per 1000×3900 batch against ~18 CPU-ms for reading the
rows from the file). A larger split is read from the cache file
batch by batch (``preadv``), so memory stays bounded by a few batches however large the
data set is. Both give the same batches (tested).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from app.budget import memory
from app.budget.plan import ThreadPlan
from app.data.cache import DataCache

PREFETCH_BATCHES = 2
#: An elementwise function of a batch tensor (e.g. the standardisation).
Transform = Callable[[tf.Tensor], tf.Tensor]


def _identity(t: tf.Tensor) -> tf.Tensor:
    return t


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


def batch_rows(
    seed: int, step: int, batch_size: int, n: int, workers: int = 1, index: int = 0
) -> np.ndarray:
    """Training rows of worker ``index`` of ``workers`` for ``step``: (batch_size,), int64, sorted.

    The global batch is the single-process batch of ``batch_size·workers`` samples
    (:func:`batch_indices`), sorted (rows in file order read fastest); this worker takes
    its positions ``index::workers``. The shards are disjoint and their union is the
    global batch; the training step uses the same positions of the global dropout mask.
    A single process is worker 0 of 1.
    """
    rows = np.sort(batch_indices(seed, step, batch_size * workers, n))
    return rows[index::workers]


def resident_limit(plan: ThreadPlan) -> int:
    """Bytes of training split (features + labels) held in memory rather than streamed
    (:func:`app.budget.memory.resident_limit` of the plan's memory limit)."""
    return memory.resident_limit(plan.memory_limit)


def split_bytes(cache: DataCache, split: str = "train") -> int:
    """Bytes of ``split``'s features and labels as float32."""
    n = cache.train_size if split == "train" else cache.test_size
    return memory.split_bytes(n, cache.height * cache.width, cache.num_outputs)


def fits_in_memory(cache: DataCache, plan: ThreadPlan) -> bool:
    """Whether the training split is held in memory: :func:`split_bytes` is at most
    :func:`resident_limit`."""
    return split_bytes(cache) <= resident_limit(plan)


def dataset_options(plan: ThreadPlan) -> tf.data.Options:
    """tf.data options from the plan: a private threadpool of the planned size, no autotuning.

    Without a private threadpool tf.data sizes itself from the host's CPUs, not the
    container's (docs/architecture.md, "TensorFlow facts"). Autotuning is off: the
    parallelism and prefetch depths here are fixed, and an iterator's destructor can
    wait for the autotune thread to wake up by itself (it sleeps 10 ms, 20 ms, …
    doubling), which held the end of a 25 s training loop until 41 s after its start
    (seen with gdb: ``~LogicalThreadWrapper`` of ``RootDataset::Iterator`` waiting on
    ``Model::OptimizeLoop``).
    """
    options = tf.data.Options()
    options.threading.private_threadpool_size = plan.tfdata_threads
    options.autotune.enabled = False
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
    workers: int = 1,
    index: int = 0,
    resident: bool | None = None,
    features: Transform | None = None,
    labels: Transform | None = None,
) -> tf.data.Dataset:
    """Batches for steps ``start_step .. end_step-1``: (x (B,H,W,1) float32, y (B,K)).

    The rows of a step are :func:`batch_rows` for worker ``index`` of ``workers``
    (``batch_size`` per worker). ``resident``: hold the split in memory (None:
    :func:`fits_in_memory`). ``features`` / ``labels``: elementwise transforms (the
    standardisation) applied once to a resident split, else to each batch in the
    pipeline; raw values without them.
    """
    features_fn, labels_fn = features or _identity, labels or _identity
    if resident is None:
        resident = fits_in_memory(cache, plan)
    n = cache.train_size

    def rows_of(step: int) -> np.ndarray:
        return batch_rows(seed, step, batch_size, n, workers, index)

    def streamed(step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        def load(step: np.int64) -> tuple[np.ndarray, np.ndarray]:
            idx = rows_of(int(step))
            x = cache.read_rows("train", "features", idx)
            return x[..., None], cache.read_rows("train", "labels", idx)

        x, y = tf.numpy_function(load, [step], (tf.float32, tf.float32), stateful=False)
        x.set_shape((batch_size, cache.height, cache.width, 1))
        y.set_shape((batch_size, cache.num_outputs))
        return features_fn(x), labels_fn(y)

    fetch = streamed
    if resident:
        # One copy from the memory map (no pages stay mapped), transformed once.
        x_all = features_fn(tf.constant(cache.features("train")[..., None]))
        y_all = labels_fn(tf.constant(cache.labels("train")))

        def gathered(step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            def indices(step: np.int64) -> np.ndarray:
                return rows_of(int(step)).astype(np.int64)

            idx = tf.numpy_function(indices, [step], tf.int64, stateful=False)
            idx.set_shape((batch_size,))
            return tf.gather(x_all, idx), tf.gather(y_all, idx)

        fetch = gathered

    ds = tf.data.Dataset.range(start_step, end_step)
    ds = ds.map(fetch, num_parallel_calls=min(2, plan.tfdata_threads), deterministic=True)
    return ds.prefetch(PREFETCH_BATCHES).with_options(dataset_options(plan))


def eval_dataset(
    cache: DataCache, plan: ThreadPlan, batch_size: int, features: Transform | None = None
) -> tf.data.Dataset:
    """The test set in order: (x (b,H,W,1), y (b,K) raw), the last batch may be short.

    ``features``: an elementwise transform of x (the standardisation); raw without it.
    """
    features_fn = features or _identity

    def load(start: np.int64) -> tuple[np.ndarray, np.ndarray]:
        idx = np.arange(int(start), min(int(start) + batch_size, cache.test_size))
        x = cache.read_rows("test", "features", idx)
        return x[..., None], cache.read_rows("test", "labels", idx)

    def fetch(start: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x, y = tf.numpy_function(load, [start], (tf.float32, tf.float32), stateful=False)
        x.set_shape((None, cache.height, cache.width, 1))
        y.set_shape((None, cache.num_outputs))
        return features_fn(x), y

    ds = tf.data.Dataset.range(0, cache.test_size, batch_size).map(fetch)
    return ds.prefetch(PREFETCH_BATCHES).with_options(dataset_options(plan))
