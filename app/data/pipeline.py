"""tf.data input pipelines reading the binary cache (memory-mapped, streamed).

The training batch for step ``s`` depends only on ``(seed, s)``: the sample
order is an endless sequence of seeded permutations of the training set, and
batch ``s`` is its slice ``[s·B, (s+1)·B)``. A resumed run therefore sees the
same batches as an uninterrupted one.

Where the batches come from (:func:`choose_input`): a training split that fits in
:data:`app.budget.memory.RESIDENT_SHARE` of the memory limit (physical memory when
unlimited), in a run that will read more rows than loading the whole split costs, is
**resident**: loaded once into
a pair of ``tf.Variable`` (held once: read from the cache file chunk by chunk, standardised
on the way, assigned into the variables' preallocated memory), and each batch is a
``tf.gather`` from them inside the training step; the input pipeline then only yields each
step's row indices. Otherwise the split is **streamed**: each batch read from the cache
file (``preadv``) in the tf.data pipeline, so memory stays bounded by a few batches however
large the data set is. Both give the same batches (tested).
"""

from __future__ import annotations

import gc
import mmap
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from app import logs
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


#: Rows read at a time while loading a resident split (bounds the transient memory).
LOAD_CHUNK_BYTES = 16 << 20


@dataclass
class Resident:
    """A training split held in memory: ``features`` (n, H, W, 1) and ``labels`` (n, K),
    transformed (standardised), as non-trainable float32 variables outside any
    distribution strategy (each worker holds its own copy)."""

    features: tf.Variable
    labels: tf.Variable


@dataclass
class TrainInput:
    """What the trainer consumes: ``dataset`` yields (x, y) batches, or with ``resident``
    the row indices (B,) int64 of each step, gathered from it in the step."""

    dataset: tf.data.Dataset
    resident: Resident | None = None


def load_resident(
    cache: DataCache, features: Transform, labels: Transform, rows: np.ndarray | None = None
) -> Resident:
    """Load the training rows ``rows`` (sorted; default all) once into variables, chunk by
    chunk, in that order; log how long it took.

    Memory: the rows once plus one chunk (:data:`LOAD_CHUNK_BYTES`); the chunks are read
    with ``preadv``, so no page of the cache file stays mapped.
    """
    rows = np.arange(cache.train_size, dtype=np.int64) if rows is None else rows
    n, h, w, k = len(rows), cache.height, cache.width, cache.num_outputs
    t0 = time.perf_counter()
    x_var = tf.Variable(tf.zeros((n, h, w, 1)), trainable=False, name="resident_features")
    y_var = tf.Variable(tf.zeros((n, k)), trainable=False, name="resident_labels")
    # The zeros the variables start from may linger in a reference cycle; while they live,
    # a write copies the whole variable (its buffer is shared): collect them first, so the
    # split is held once (measured in docs/performance.md).
    gc.collect()
    chunk = max(1, LOAD_CHUNK_BYTES // (4 * (h * w + k)))
    for a in range(0, n, chunk):
        idx = rows[a : a + chunk]
        where = tf.range(a, a + len(idx))
        x = features(cache.read_rows("train", "features", idx)[..., None])
        # scatter_update writes in place; ``var[a:b].assign`` would first read the whole
        # variable, and the write then copies it (its buffer is shared with that read).
        x_var.scatter_update(tf.IndexedSlices(x, where))
        y_var.scatter_update(
            tf.IndexedSlices(labels(cache.read_rows("train", "labels", idx)), where)
        )
    seconds = time.perf_counter() - t0
    size = memory.split_bytes(n, h * w, k)
    logs.event(
        "input_loaded",
        f"training split loaded into memory: {size / 1e6:,.0f} MB in {seconds:.1f} s "
        f"({size / 1e6 / max(seconds, 1e-9):,.0f} MB/s)",
        bytes=size,
        seconds=round(seconds, 2),
    )
    return Resident(x_var, y_var)


def choose_input(
    cache: DataCache, plan: ThreadPlan, batch_size: int, steps: int
) -> tuple[bool, str]:
    """Resident or streamed for a run of ``steps`` more steps of ``batch_size`` rows, and why.

    Resident needs the split to fit in :func:`resident_limit`, and pays when the run reads
    more rows than loading the split costs: loading reads the n rows once in order,
    streaming reads ``steps × batch_size`` rows at random. Both costs are measured here,
    each as the better of two tries on one batch of rows of the cache file (read in order
    and written into fresh memory, as a load does; read at random), so the page cache, the
    disk, page faults and the machine's load all count.
    """
    size, limit = split_bytes(cache), resident_limit(plan)
    if size > limit:
        return False, f"the split ({size / 1e6:,.0f} MB) is larger than {limit / 1e6:,.0f} MB"
    n = cache.train_size
    b = min(batch_size, n)
    in_order = np.arange(b)
    at_random = np.sort(np.random.default_rng(0).choice(n, b, replace=False))
    seq = min(_timed_load(cache, in_order) for _ in range(2))
    rnd = min(_timed_read(cache, at_random) for _ in range(2))
    load_s, stream_s = seq * n / b, rnd * steps
    why = f"loading {n} rows ≈ {load_s:.2f} s, streaming {steps} batches ≈ {stream_s:.2f} s"
    return load_s <= stream_s, why


def _timed_load(cache: DataCache, rows: np.ndarray) -> float:
    """Seconds to load ``rows`` as :func:`load_resident` does: read them, and write them
    into memory never touched before (a variable's pages fault in on the first write, its
    zeros, which costs more than the read where page faults are slow, as in a VM)."""
    t0 = time.perf_counter()
    for values in (
        cache.read_rows("train", "features", rows),
        cache.read_rows("train", "labels", rows),
    ):
        with mmap.mmap(-1, max(values.nbytes, 1)) as fresh:
            view = np.frombuffer(fresh, values.dtype, values.size).reshape(values.shape)
            view.fill(0)  # the variable's zeros: the pages fault in
            view[...] = values  # the chunk's scatter_update
            del view
    return time.perf_counter() - t0


def _timed_read(cache: DataCache, rows: np.ndarray) -> float:
    t0 = time.perf_counter()
    cache.read_rows("train", "features", rows)
    cache.read_rows("train", "labels", rows)
    return time.perf_counter() - t0


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


def train_input(
    cache: DataCache,
    plan: ThreadPlan,
    *,
    seed: int,
    batch_size: int,
    start_step: int,
    end_step: int,
    workers: int = 1,
    index: int = 0,
    resident: bool = False,
    features: Transform | None = None,
    labels: Transform | None = None,
    rows: np.ndarray | None = None,
) -> TrainInput:
    """The batches of steps ``start_step .. end_step-1``: x (B,H,W,1) float32, y (B,K).

    ``rows``: the training file's rows trained on (sorted int64; default all; the others
    are the validation split, app/data/split.py). The batch order is over positions in
    ``rows``: the rows of a step are ``rows[p]`` for the positions ``p`` of
    :func:`batch_rows` for worker ``index`` of ``workers`` (``batch_size`` per worker).
    ``resident``: hold those rows in memory (:func:`load_resident`) and yield positions;
    else stream the rows. ``features`` / ``labels``: elementwise transforms (the
    standardisation), applied once to a resident split, else to each batch; raw values
    without them.
    """
    features_fn, labels_fn = features or _identity, labels or _identity
    rows = np.arange(cache.train_size, dtype=np.int64) if rows is None else rows
    n = len(rows)

    def positions(step: np.int64) -> np.ndarray:
        return batch_rows(seed, int(step), batch_size, n, workers, index).astype(np.int64)

    def rows_of(step: np.int64) -> np.ndarray:
        return rows[positions(step)]

    def indices(step: tf.Tensor) -> tf.Tensor:
        idx = tf.numpy_function(positions, [step], tf.int64, stateful=False)
        idx.set_shape((batch_size,))
        return idx

    def streamed(step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        def load(step: np.int64) -> tuple[np.ndarray, np.ndarray]:
            idx = rows_of(step)
            x = cache.read_rows("train", "features", idx)
            return x[..., None], cache.read_rows("train", "labels", idx)

        x, y = tf.numpy_function(load, [step], (tf.float32, tf.float32), stateful=False)
        x.set_shape((batch_size, cache.height, cache.width, 1))
        y.set_shape((batch_size, cache.num_outputs))
        return features_fn(x), labels_fn(y)

    split = load_resident(cache, features_fn, labels_fn, rows) if resident else None
    ds = tf.data.Dataset.range(start_step, end_step)
    fetch = indices if split is not None else streamed
    ds = ds.map(fetch, num_parallel_calls=min(2, plan.tfdata_threads), deterministic=True)
    return TrainInput(ds.prefetch(PREFETCH_BATCHES).with_options(dataset_options(plan)), split)


def eval_dataset(
    cache: DataCache,
    plan: ThreadPlan,
    batch_size: int,
    features: Transform | None = None,
    split: str = "test",
    rows: np.ndarray | None = None,
) -> tf.data.Dataset:
    """Rows of ``split`` in order: (x (b,H,W,1), y (b,K) raw), the last batch may be short.

    ``rows``: sorted row numbers of the split's file (default all: the test set; the
    validation rows of the training file). ``features``: an elementwise transform of x (the
    standardisation); raw without it.
    """
    features_fn = features or _identity
    size = cache.train_size if split == "train" else cache.test_size
    rows = np.arange(size, dtype=np.int64) if rows is None else rows

    def load(start: np.int64) -> tuple[np.ndarray, np.ndarray]:
        idx = rows[int(start) : int(start) + batch_size]
        x = cache.read_rows(split, "features", idx)
        return x[..., None], cache.read_rows(split, "labels", idx)

    def fetch(start: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x, y = tf.numpy_function(load, [start], (tf.float32, tf.float32), stateful=False)
        x.set_shape((None, cache.height, cache.width, 1))
        y.set_shape((None, cache.num_outputs))
        return features_fn(x), y

    ds = tf.data.Dataset.range(0, len(rows), batch_size).map(fetch)
    return ds.prefetch(PREFETCH_BATCHES).with_options(dataset_options(plan))
