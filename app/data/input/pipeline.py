"""tf.data input pipelines reading the binary cache (held in memory, or streamed).

The training batch for step ``s`` depends only on ``(seed, s)``: positions
:func:`app.data.input.order.batch_rows` of the run's training rows (a sorted int64 array of row
ids of the cache's training split; all rows by default), the same whichever way the rows
are read. A resumed run therefore sees the same batches as an uninterrupted one.

Where the batches come from (:func:`choose_input`): a training split that fits in
:data:`app.budget.memory.RESIDENT_SHARE` of the memory limit (physical memory when
unlimited), in a run that will read more rows than loading the whole split costs, is
**resident**: held in memory as tensors over a memory map of the cache's files
(app/data/input/mapped.py: no copy, the page cache's pages), and each batch is a ``tf.gather`` of
its row ids from them inside the training step, standardised there; the input pipeline then
only yields each step's row ids. Otherwise the split is **streamed**
(:mod:`app.data.input.stream`): the rows of a few steps read ahead as one chunk, in blocks, and
each step handed the chunk and its rows in it, gathered and standardised in the step as
from a resident split, so memory stays bounded by a few chunks however large the data set
is. Both give the same batches (tested).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from app import logs
from app.budget import memory
from app.data.cache import DataCache, rounded
from app.data.input import mapped, order, stream
from app.data.input.mapped import Resident
from app.data.input.stream import Stats
from app.errors import AppError, StorageError
from app.signals import end_now

PREFETCH_BATCHES = 2
#: Epochs a run gathers from a held split for it to make the rows rounded to bfloat16
#: (:func:`makes_rounded`; docs/performance.md, "Held in the step's precision").
ROUND_EPOCHS = 20
#: An elementwise function of a batch tensor (e.g. the standardisation).
Transform = Callable[[tf.Tensor], tf.Tensor]


def _identity(t: tf.Tensor) -> tf.Tensor:
    return t


def _ending(read: Callable[..., Any]) -> Callable[..., Any]:
    """``read`` for ``tf.numpy_function``: an AppError it raises (a file cut short under
    the run, app/data/cache/rows.py) ends the run at once with its own code and one line
    (app/signals.py ``end_now``); TensorFlow would turn it into an UnknownError, exit 1,
    with a traceback's text for its message."""

    def call(*args: Any) -> Any:
        try:
            return read(*args)
        except AppError as exc:
            end_now(exc)

    return call


def training_rows(cache: DataCache, rows: np.ndarray | None) -> int:
    """How many training rows a run reads: ``len(rows)``, or the whole split."""
    return cache.train_size if rows is None else len(rows)


def resident_limit(memory_limit: int | None) -> int:
    """Bytes of training split (features + labels) held in memory rather than streamed
    under a memory limit of ``memory_limit`` bytes (None: none):
    :func:`app.budget.memory.resident_limit`."""
    return memory.resident_limit(memory_limit)


def split_bytes(cache: DataCache, split: str = "train", rows: np.ndarray | None = None) -> int:
    """Bytes of ``split``'s features and labels as float32 (the training ``rows`` only)."""
    n = training_rows(cache, rows) if split == "train" else cache.test_size
    return memory.split_bytes(n, cache.height * cache.width, cache.num_outputs)


@dataclass
class TrainInput:
    """What the trainer consumes: ``dataset`` yields one element per step, from which the
    step gathers its batch with ``held`` (:func:`app.data.input.mapped.batch`): the row ids
    (B,) int64 of a split held in memory (``resident``; ``held`` is its rows), or a
    streamed chunk, raw, and the step's rows in it (``held`` is the standardisation;
    ``reader`` reads the chunks). Without ``held`` the elements are (x, y) batches."""

    dataset: tf.data.Dataset
    resident: Resident | None = None
    reader: stream.Reader | stream.Ahead | None = field(default=None, repr=False)
    held: tuple[tf.Tensor, ...] | None = None


def load_resident(
    cache: DataCache, rows: np.ndarray | None = None, stats: Stats | None = None,
    source: stream.Source | None = None,
) -> Resident:  # fmt: skip
    """Hold the training split in memory (app/data/input/mapped.py: a memory map of the cache,
    no copy), its features from ``source`` (default the float32 rows), standardised on
    gather with ``stats``; log how long it took. ``rows``: the training rows the run reads
    (the event's size); every row is mapped, by row id."""
    t0 = time.perf_counter()
    split = mapped.hold(cache, stats, source)
    seconds = time.perf_counter() - t0
    row = (source or stream.Source.raw(cache)).row_bytes(cache) + 4 * cache.num_outputs
    size = training_rows(cache, rows) * row  # the features in their own width
    logs.event(
        "input_loaded",
        f"training split mapped into memory: {size / 1e6:,.0f} MB in {seconds:.1f} s "
        f"({size / 1e6 / max(seconds, 1e-9):,.0f} MB/s)",
        bytes=size,
        seconds=round(seconds, 2),
    )
    return split


@dataclass(frozen=True)
class InputChoice:
    """Resident or streamed, ``why``, and the two costs (seconds, estimated for the run:
    ``load_s`` to load the split, ``stream_s`` to stream its batches; None for a split
    that can't be held); ``cached``: the share of the features file the page cache held
    when that decided (a split over :func:`resident_limit`), else None."""

    resident: bool
    why: str
    load_s: float | None = None
    stream_s: float | None = None
    cached: float | None = None


def choose_input(
    cache: DataCache, memory_limit: int | None, batch_size: int, steps: int,
    rows: np.ndarray | None = None, held: stream.Source | None = None,
) -> InputChoice:  # fmt: skip
    """Resident or streamed for a run of ``steps`` more steps of ``batch_size`` rows under a
    memory limit of ``memory_limit`` bytes (None: none), and why.

    Resident needs the split (the training ``rows``) to fit in :func:`resident_limit`, or,
    larger, the features file it would be held from (``held``: the rows a bfloat16 step
    computes on, when the cache keeps them, :func:`kept_rounded`; default the cache's
    float32 rows) to fit in :func:`app.budget.memory.page_cache_limit`: a held split is the
    page cache's pages, nothing is copied, and loading reads what the page cache lacks
    (``cached``, the share of that file it holds, is logged); in a memory group a third of
    its size a mapped split's pages were evicted and read back one page fault at a time,
    at 1 % of the rate (docs/performance.md). And it pays when the run reads more rows than
    loading the split costs: loading maps the n rows once in order, streaming reads
    ``steps × batch_size`` rows in blocks (:mod:`app.data.input.stream`). Both costs are
    measured here, each as the better of two tries on one batch of rows of the cache file
    (mapped and populated, as a load does; read in random blocks, as a stream does), so the
    page cache, the disk, page faults and the machine's load all count.
    """
    held = held or stream.Source.raw(cache)
    size, limit, cached = split_bytes(cache, rows=rows), resident_limit(memory_limit), None
    if size > limit:
        cached, against = _cached(cache, memory_limit, held)
        why = f"the split ({size / 1e6:,.0f} MB) is larger than {limit / 1e6:,.0f} MB"
        if against:
            return InputChoice(False, f"{why}, and {against}", cached=cached)
    n = training_rows(cache, rows)
    ids = np.arange(n) if rows is None else rows
    b = min(batch_size, n)
    rng = np.random.default_rng(0)
    blocks = -(-n // order.BLOCK_ROWS)
    picked = rng.choice(blocks, min(blocks, -(-b // order.BLOCK_ROWS)), replace=False)
    positions = np.sort(picked)[:, None] * order.BLOCK_ROWS + np.arange(order.BLOCK_ROWS)
    at_random = ids[positions.reshape(-1)[positions.reshape(-1) < n][:b]]
    seq = min(_timed_load(cache, ids[:b], held) for _ in range(2))
    rnd = min(_timed_read(cache, at_random, held) for _ in range(2))
    load_s, stream_s = seq * n / b, rnd * steps
    why = f"loading {n} rows ≈ {load_s:.2f} s, streaming {steps} batches ≈ {stream_s:.2f} s"
    if cached is not None:
        why += f" (the page cache holds {cached:.0%} of the split)"
    return InputChoice(load_s <= stream_s, why, round(load_s, 6), round(stream_s, 6), cached)


def _cached(
    cache: DataCache, memory_limit: int | None, held: stream.Source
) -> tuple[float, str]:  # fmt: skip
    """The share of the training features file ``held`` names that the page cache holds now
    (``mincore``, rounded to 0.001), and what stops a split over the resident limit from
    being held from it: "" when the file takes at most
    :func:`app.budget.memory.page_cache_limit` and its rows are aligned for TensorFlow
    (else holding would copy them: app/data/input/mapped.py)."""
    nbytes = _features_bytes(cache, held)
    room = memory.page_cache_limit(memory_limit)
    where = held.where
    cached = round(stream.cached_share(where, nbytes), 3)
    if nbytes > room:
        return (
            cached,
            f"its features file is more than the page cache may hold ({room / 1e6:,.0f} MB)",
        )
    if where[1] % stream.ALIGNMENT:
        return cached, "its rows, read in place, are not 64-byte aligned (holding would copy them)"
    return cached, ""


def _timed_load(cache: DataCache, rows: np.ndarray, held: stream.Source) -> float:
    """Seconds to load ``rows`` (sorted) as :func:`load_resident` does: the bytes from the
    first to the last row of the features file ``held`` names and of the labels file mapped
    and populated for reading (app/data/input/mapped.py ``populate``: what the page cache
    lacks is read)."""
    t0 = time.perf_counter()
    for (path, base), row in (
        (held.where, held.row_bytes(cache)),
        (cache.where("train_y.f32"), 4 * cache.num_outputs),
    ):
        start, end = base + int(rows[0]) * row, base + (int(rows[-1]) + 1) * row
        area, _ = mapped.map_private(path, start, end, cache.lost(path))
        area.close()
    return time.perf_counter() - t0


def _timed_read(cache: DataCache, rows: np.ndarray, source: stream.Source) -> float:
    """Seconds to stream ``rows`` of the features file ``source`` names as
    :class:`app.data.input.stream.Reader` does (blocks read into a chunk; the step's gather
    from it is the same as from a resident split)."""
    t0 = time.perf_counter()
    x = np.empty((len(rows), cache.height, cache.width, 1), source.dtype)
    stream.read_features(cache, rows, x, source)
    np.take(cache.labels("train"), rows, axis=0)
    return time.perf_counter() - t0


def dataset_options(threads: int) -> tf.data.Options:
    """tf.data options: a private threadpool of ``threads`` (the plan's tf.data threads), no
    autotuning.

    Without a private threadpool tf.data sizes itself from the host's CPUs, not the
    container's (docs/architecture.md, "TensorFlow facts"). Autotuning is off: the
    parallelism and prefetch depths here are fixed, and an iterator's destructor can
    wait for the autotune thread to wake up by itself (it sleeps 10 ms, 20 ms, …
    doubling), which held the end of a 25 s training loop until 41 s after its start
    (seen with gdb: ``~LogicalThreadWrapper`` of ``RootDataset::Iterator`` waiting on
    ``Model::OptimizeLoop``).
    """
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.autotune.enabled = False
    options.deterministic = True
    return options


def _checked(cache: DataCache, rows: np.ndarray | None) -> np.ndarray | None:
    """``rows`` as int64 (None stays None). Raises ValueError unless they are a non-empty,
    strictly increasing 1-D array of row ids of the training split."""
    if rows is None:
        return None
    rows = np.asarray(rows, np.int64)
    if rows.ndim != 1 or np.any(np.diff(rows) <= 0) or (len(rows) and rows[0] < 0):
        raise ValueError("rows must be a 1-D array of strictly increasing row ids")
    if len(rows) == 0 or rows[-1] >= cache.train_size:
        raise ValueError(f"rows must be non-empty ids below {cache.train_size}")
    return rows


def train_input(
    cache: DataCache,
    threads: int,
    *,
    seed: int,
    batch_size: int,
    start_step: int,
    end_step: int,
    workers: int = 1,
    index: int = 0,
    resident: bool = False,
    rows: np.ndarray | None = None,
    stats: Stats | None = None,
    source: stream.Source | None = None,
) -> TrainInput:
    """The elements of steps ``start_step .. end_step-1``, from which each step gathers its
    batch x (B,H,W,1) float32, y (B,K) (:class:`TrainInput`), made with ``threads`` tf.data
    threads (the plan's).

    ``rows``: the training rows (a sorted int64 array of row ids of the cache's training
    split; None: all of them); the positions of a step are
    :func:`app.data.input.order.batch_rows` for worker ``index`` of ``workers``
    (``batch_size`` per worker). ``resident``: hold the rows in memory
    (:func:`load_resident`) and yield row ids, the next chunk's announced
    (:class:`app.data.input.stream.Ahead`); else stream them in chunks
    (:class:`app.data.input.stream.Reader`). Either from ``source`` (default the cache's
    float32 rows: :func:`rounded_source`). ``stats``: the standardisation (raw without).
    """
    rows = _checked(cache, rows)
    ds = tf.data.Dataset.range(start_step, end_step)
    options = dataset_options(threads)
    parallel = min(2, threads)
    order_of = dict(seed=seed, batch_size=batch_size, end_step=end_step, workers=workers,
                    index=index)  # fmt: skip
    if resident:
        split = load_resident(cache, rows, stats, source)
        ahead = stream.Ahead(cache, rows, source, **order_of)

        def indices(step: tf.Tensor) -> tf.Tensor:
            idx = tf.numpy_function(_ending(lambda s: ahead.ids(int(s))), [step], tf.int64,
                                    stateful=False)  # fmt: skip
            idx.set_shape((batch_size,))
            return idx

        ds = ds.map(indices, num_parallel_calls=parallel, deterministic=True)
        return TrainInput(ds.prefetch(PREFETCH_BATCHES).with_options(options), split, ahead,
                          held=split.rows())  # fmt: skip
    reader = stream.Reader(cache, rows, source, **order_of)
    ds = ds.map(_chunks(reader, batch_size), num_parallel_calls=parallel, deterministic=True)
    ds = ds.prefetch(PREFETCH_BATCHES).with_options(options)
    held = mapped.standardization(stats, features=not reader.source.standardized)
    return TrainInput(ds, reader=reader, held=held)


def _chunks(
    reader: stream.Reader, batch_size: int
) -> Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor, tf.Tensor]]:
    """The map from a step to its streamed element (:meth:`app.data.input.stream.Reader.
    element`): the chunk x (r,H,W,1) of the reader's dtype, y (r,K), and the step's
    ``batch_size`` positions in it."""
    c = reader.cache
    types = (tf.as_dtype(reader.source.dtype), tf.float32, tf.int64)

    def streamed(step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        x, y, at = tf.numpy_function(
            _ending(lambda s: reader.element(int(s))), [step], types, stateful=False
        )
        x.set_shape((None, c.height, c.width, 1))
        y.set_shape((None, c.num_outputs))
        at.set_shape((batch_size,))
        return x, y, at

    return streamed


def makes_rounded(
    cache: DataCache, resident: bool, memory_limit: int | None, reads: int
) -> bool:  # fmt: skip
    """Whether a bfloat16 run makes the rows rounded to bfloat16 when the cache lacks them
    (:func:`rounded_source`): for a streamed split, when its float32 features file is more
    than the page cache may hold under ``memory_limit`` (every epoch is read from the disk,
    and half the bytes is half the reads' CPU); for a held split, when the run gathers
    ``reads`` rows, at least :data:`ROUND_EPOCHS` times the split: making them costs about
    what that many epochs' gathers save (docs/performance.md, "Held in the step's
    precision")."""
    if resident:
        return reads >= ROUND_EPOCHS * cache.train_size
    return _features_bytes(cache) > memory.page_cache_limit(memory_limit)


def _features_bytes(cache: DataCache, source: stream.Source | None = None) -> int:
    """Bytes of the training split's features in ``source``'s file (default the cache's
    float32 rows)."""
    return (source or stream.Source.raw(cache)).row_bytes(cache) * cache.train_size


def _rounded_rows(path: Path, standardize: bool) -> stream.Source:
    """The bfloat16 rows at ``path`` (app/data/cache/rounded.py), standardised already with
    ``standardize``."""
    return stream.Source((path, 0), rounded.DTYPE, standardized=standardize)


def kept_rounded(cache: DataCache, precision: str, standardize: bool) -> stream.Source | None:
    """For a step computing in "bfloat16", the rows as it computes on them when the cache
    keeps them, valid (app/data/cache/rounded.py ``find``: half the bytes, standardised
    already with ``standardize``); else None."""
    if precision != "bfloat16":
        return None
    path = rounded.find(cache, standardize)
    return None if path is None else _rounded_rows(path, standardize)


def rounded_source(
    cache: DataCache, precision: str, standardize: bool, make: bool,
    max_bytes: int | None = None, threads: int = 1,
) -> stream.Source | None:  # fmt: skip
    """The rows a step computing in ``precision`` gathers its batches from: the rows the
    cache keeps for it (:func:`kept_rounded`), or else :func:`made_rounded`."""
    kept = kept_rounded(cache, precision, standardize)
    return kept or made_rounded(cache, precision, standardize, make, max_bytes, threads)


def made_rounded(
    cache: DataCache, precision: str, standardize: bool, make: bool,
    max_bytes: int | None = None, threads: int = 1,
) -> stream.Source | None:  # fmt: skip
    """For a step computing in "bfloat16", its rows made now when ``make``
    (:func:`makes_rounded`; the cache does not keep them); else None, the float32 rows.
    Rows that would pass the free space or ``max_bytes`` (``--max-cache-bytes``), or a
    cache directory that can't be written, are an ``input_not_rounded`` warning and the
    float32 rows. ``threads`` make them (the plan's intra-op threads: nothing else runs
    yet)."""
    if precision != "bfloat16" or not make:
        return None
    try:
        path = rounded.make(cache, standardize, max_bytes, threads)
    except StorageError as exc:
        logs.event("input_not_rounded", f"training from the float32 rows: {exc}",
                   level=logging.WARNING)  # fmt: skip
        return None
    return _rounded_rows(path, standardize)


def eval_dataset(
    cache: DataCache,
    threads: int,
    batch_size: int,
    features: Transform | None = None,
    split: str = "test",
    rows: np.ndarray | None = None,
) -> tf.data.Dataset:
    """Rows of ``split`` in order: (x (b,H,W,1), y (b,K) raw), the last batch may be short;
    ``threads``: tf.data threads (the plan's).

    ``rows``: sorted row numbers of the split's file (default all: the test set; the
    validation rows of the training file, scattered: read as a streamed chunk is, each
    batch's rows announced to the kernel first, so a disk has them all in flight).
    ``features``: an elementwise transform of x (the standardisation); raw without it.
    """
    features_fn = features or _identity
    size = cache.train_size if split == "train" else cache.test_size
    rows = np.arange(size, dtype=np.int64) if rows is None else rows

    def load(start: np.int64) -> tuple[np.ndarray, np.ndarray]:
        idx = rows[int(start) : int(start) + batch_size]
        if split == "train":
            return read_train_rows(cache, idx)
        return cache.read_rows(split, "features", idx)[..., None], cache.read_rows(
            split, "labels", idx
        )

    def fetch(start: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x, y = tf.numpy_function(_ending(load), [start], (tf.float32, tf.float32), stateful=False)
        x.set_shape((None, cache.height, cache.width, 1))
        y.set_shape((None, cache.num_outputs))
        return features_fn(x), y

    ds = tf.data.Dataset.range(0, len(rows), batch_size).map(fetch)
    return ds.prefetch(PREFETCH_BATCHES).with_options(dataset_options(threads))


def read_train_rows(cache: DataCache, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Training rows ``rows`` (sorted int64 ids), raw: x (n,H,W,1) float32, y (n,K)
    float32, the features read as a streamed chunk is (:func:`app.data.input.stream.
    read_features`: every run announced first). Raises StorageError (a truncated file)."""
    x = np.empty((len(rows), cache.height, cache.width, 1), np.float32)
    stream.read_features(cache, rows, x)
    return x, cache.read_rows("train", "labels", rows)


def holds_validation(cache: DataCache, rows: int, memory_limit: int | None) -> bool:
    """Whether ``rows`` validation rows of a streamed split are read once and held in
    memory for every evaluation rather than read from the cache at each: when their bytes
    (features and labels, float32) fit :func:`app.budget.memory.validation_held` (the rest
    of the memory is left to the streamed chunks)."""
    held = memory.split_bytes(rows, cache.height * cache.width, cache.num_outputs)
    return memory.validation_held(held, memory_limit)


def eval_ids(rows: np.ndarray, batch_size: int, threads: int) -> tf.data.Dataset:
    """``rows`` (sorted int64 row ids) in order, as batches of ``batch_size`` ids (b,) int64
    (the last may be short): :func:`eval_dataset`'s batches, for rows gathered from a split
    held in memory; ``threads``: tf.data threads (the plan's)."""
    ids = tf.constant(rows, tf.int64)
    ds = tf.data.Dataset.range(0, len(rows), batch_size)
    ds = ds.map(lambda start: ids[start : start + batch_size])
    return ds.prefetch(PREFETCH_BATCHES).with_options(dataset_options(threads))
