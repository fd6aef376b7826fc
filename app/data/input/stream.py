"""Streamed training batches: the rows of :data:`app.data.input.order.WINDOW_STEPS` steps read as
one chunk, in blocks, ahead of the step that needs them, and handed to the step whole.

Why chunks (measured at the seed's scale, docs/performance.md "Streaming"): a batch of
1,000 rows read one row at a time costs 2,000 ``preadv`` calls from Python, and from a
disk that the page cache can't cover (a container whose memory limit is below the split)
1,000 random 16 KB reads. The order (:mod:`app.data.input.order`) shuffles blocks of
:data:`~app.data.input.order.BLOCK_ROWS` consecutive rows and then each window of
``WINDOW_STEPS`` batches, so the rows of one window are whole blocks: a chunk is read as
a few thousand reads of ~62 KB, in file order, by a background thread while the steps
before it train.

The chunk is raw rows, as the cache holds them; or, for a step that computes in bfloat16
on a split read from the disk, the rows already standardised and rounded to bfloat16, as
that step computes on them, in half the bytes (:class:`Source`, app/data/cache/rounded.py).
Each step's element is the chunk and the
step's row positions in it (:meth:`Reader.element`); the training step gathers its batch
from the chunk and standardises it, with the same operations as for a split held in memory
(app/data/input/mapped.py ``gather``). So the rows are copied once, by the read, and no
Python code touches a batch: with the batches gathered and standardised in numpy, the
input took 23 % of a streamed run's CPU on 2 vCPUs, 13 % with the chunk handed to the step
(docs/performance.md, "Streaming at the step's speed"). TensorFlow takes the chunk without
a copy (it is aligned to 64 bytes), and its memory is used again for a later chunk only
once no tensor refers to it any more.

Memory: the chunk the steps gather from, the one being read, the one the batches still in
flight came from (the memory estimate, app/training/admit/memory.py, counts
:data:`CHUNKS_HELD` chunks). Labels are read through a memory map of the labels file (K
floats a row: its pages stay mapped, a ``K / (H·W + K)`` share of the split at most; a
``preadv`` per run of 4 rows of 12 bytes cost 3–6 ms a chunk against 0.02 ms), watched for
the SIGBUS of a file cut short (app/signals.py ``watch_mapped``). The features are read from
the file opened when the run began, and a file cut short under the run is its error
(app/data/cache/rows.py); an error in a background read ends the run at once with its code
(app/signals.py ``end_now``: TensorFlow would make it an UnknownError of exit 1). Never
imports TensorFlow.
"""

from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.data.cache import DataCache
from app.data.cache.rows import RowsFile
from app.data.formats import pagecache
from app.data.input import order
from app.errors import AppError
from app.signals import end_now

#: Bytes TensorFlow's CPU tensors are aligned to (``EIGEN_MAX_ALIGN_BYTES``); its kernels
#: refuse a tensor that is not (``Check failed: IsAligned()``).
ALIGNMENT = 64
#: Chunks alive at once: the one the steps gather from, the next one (being read), and the
#: one the batches still in flight (prefetched, being trained on) came from.
CHUNKS_HELD = 3


@dataclass(frozen=True)
class Stats:
    """The standardisation of the training rows: features ``(x - feature_mean) *
    feature_inv`` (each (H, W)), labels ``(y - label_mean) / label_std`` (each (K,));
    float32, the same operations as the trainer's."""

    feature_mean: np.ndarray
    feature_inv: np.ndarray
    label_mean: np.ndarray
    label_std: np.ndarray

    @classmethod
    def of(cls, cache: DataCache, standardize: bool = True) -> Stats | None:
        """The training-set statistics of ``cache``; None without ``standardize``."""
        if not standardize:
            return None
        inv = (1.0 / cache.feature_std).astype(np.float32)
        return cls(cache.feature_mean, inv, cache.label_mean, cache.label_std)


@dataclass(frozen=True)
class Chunk:
    """The rows of steps ``first .. first + len(local) - 1``: ``x`` (r, H, W, 1) and ``y``
    (r, K), raw, each aligned to 64 bytes; ``local[i]`` (B,) int64 are step ``first + i``'s
    rows in them."""

    first: int
    local: np.ndarray
    x: np.ndarray
    y: np.ndarray


def aligned(shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
    """A new array of ``shape`` and ``dtype`` whose data start on an :data:`ALIGNMENT`
    boundary (a ``numpy_function`` result so aligned becomes a tensor without a copy)."""
    count, size = int(np.prod(shape)), np.dtype(dtype).itemsize
    raw = np.empty(count + ALIGNMENT // size, dtype)
    skip = (-raw.ctypes.data % ALIGNMENT) // size
    return raw[skip : skip + count].reshape(shape)


@dataclass(frozen=True)
class Source:
    """Where a chunk's feature rows are read from: ``where`` (the file, the byte offset of
    row 0), their ``dtype``, and whether they are ``standardized`` already (the bfloat16
    rows of app/data/cache/rounded.py) or raw (the cache's float32 rows)."""

    where: tuple[Path, int]
    dtype: np.dtype
    standardized: bool = False

    @classmethod
    def raw(cls, cache: DataCache) -> Source:
        """The cache's float32 training rows, raw."""
        return cls(cache.where("train_x.f32"), np.dtype(np.float32))

    def row_bytes(self, cache: DataCache) -> int:
        """Bytes of one row (H·W values)."""
        return self.dtype.itemsize * cache.height * cache.width


def _file(cache: DataCache, source: Source) -> RowsFile:
    """The training features file of ``source`` (app/data/cache/rows.py), opened once."""
    return cache.rows_file(source.where, source.row_bytes(cache) * cache.train_size)


def announce(cache: DataCache, ids: np.ndarray, source: Source | None = None) -> None:
    """Tell the kernel that training rows ``ids`` (sorted) of the features will be read
    (``POSIX_FADV_WILLNEED`` per run of consecutive rows): it starts reading all that the
    page cache does not hold at once, so a split read from the disk has many reads in
    flight, not one 62 KB read at a time (docs/performance.md, "Streaming from disk").
    ``source``: the rows' file (default the cache's float32 rows). Raises the file's error
    when it was cut short (``DataCache.lost``)."""
    source = source or Source.raw(cache)
    _file(cache, source).announce(ids, source.where[1], source.row_bytes(cache))


def read_features(
    cache: DataCache, ids: np.ndarray, out: np.ndarray, source: Source | None = None
) -> None:
    """Read training rows ``ids`` (sorted) of the features into ``out`` (len(ids), H, W, 1)
    of ``source``'s dtype (default the cache's float32 rows, raw), one ``preadv`` per run,
    all of them announced first (:func:`announce`). Raises the file's error when it is
    shorter than the manifest says (``DataCache.lost``)."""
    source = source or Source.raw(cache)
    announce(cache, ids, source)
    view = memoryview(out.reshape(-1).view(np.uint8).data)
    _file(cache, source).read(ids, source.where[1], source.row_bytes(cache), view)


def cached_share(where: tuple[Path, int], nbytes: int) -> float:
    """Share (0..1) of the ``nbytes`` from the byte offset of the file ``where`` names that
    the page cache holds now (app/data/formats/pagecache.py: nothing is read;
    0 when the kernel does not say, or the file can't be opened)."""
    path, base = where
    if nbytes <= 0:
        return 1.0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # unreadable: not known to be cached
        return 0.0
    try:
        return pagecache.cached_share(fd, base, base + nbytes)
    finally:
        os.close(fd)


class _Steps:
    """The order's rows of one worker's steps, chunk by chunk: ``rows`` the training rows
    (sorted int64 row ids; None: all); ``batch_size`` per worker, worker ``index`` of
    ``workers``; steps before ``end_step``."""

    def __init__(
        self, cache: DataCache, rows: np.ndarray | None, *, seed: int, batch_size: int,
        end_step: int, workers: int = 1, index: int = 0,
    ) -> None:  # fmt: skip
        self.cache, self.rows = cache, rows
        self.seed, self.batch_size, self.end_step = seed, batch_size, end_step
        self.workers, self.index = workers, index
        self.n = cache.train_size if rows is None else len(rows)
        # Reentrant: a chunk dropped under it may free the last reference to its buffer,
        # whose finalizer (Reader._recycle) takes it again.
        self._lock = threading.RLock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="coretrain-stream")

    def close(self) -> None:
        """Stop reading ahead (a chunk being read finishes)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _positions(self, step: int) -> np.ndarray:
        """Step ``step``'s positions in the training rows (B,), sorted."""
        return order.batch_rows(self.seed, step, self.batch_size, self.n, self.workers, self.index)

    def _chunk(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk ``j`` (steps ``j·WINDOW_STEPS ..``, before ``end_step``): the row ids it
        reads (sorted, unique), and each step's rows as indices into them (steps, B)."""
        first = j * order.WINDOW_STEPS
        steps = range(first, min(first + order.WINDOW_STEPS, self.end_step))
        positions = np.concatenate([self._positions(s) for s in steps])
        unique, inverse = np.unique(positions, return_inverse=True)
        ids = unique if self.rows is None else self.rows[unique]
        return ids, inverse.reshape(len(steps), self.batch_size).astype(np.int64)


class Reader(_Steps):
    """The steps' chunks, read from the cache file (see the module docstring).
    :meth:`element` is thread-safe and may be called for any step in any order; reading
    ahead assumes steps mostly come in order."""

    def __init__(
        self, cache: DataCache, rows: np.ndarray | None, source: Source | None = None,
        **order_of: int,
    ) -> None:  # fmt: skip
        super().__init__(cache, rows, **order_of)
        #: Where the feature rows are read from (default the cache's float32 rows, raw).
        self.source = source or Source.raw(cache)
        self._labels = cache.labels("train")  # mapped, watched (K floats a row)
        self._chunks: dict[int, Future[Chunk]] = {}
        self._free: list[np.ndarray] = []  # chunk buffers nothing refers to any more

    def element(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step ``step``'s chunk and its rows in it: x (r, H, W, 1) as :attr:`source` holds
        them, y (r, K) float32 raw, and positions (B,) int64; its batch is
        ``x[positions]``, ``y[positions]`` (the step standardises what is raw). Every step
        of a chunk gets the same ``x`` and ``y`` objects."""
        j = step // order.WINDOW_STEPS
        with self._lock:
            for old in [k for k in self._chunks if k < j]:
                del self._chunks[old]
            for k in (j, j + 1):
                if k not in self._chunks and k * order.WINDOW_STEPS < self.end_step:
                    self._chunks[k] = self._pool.submit(self._load, k)
            future = self._chunks[j]
        chunk = future.result()
        return chunk.x, chunk.y, chunk.local[step - chunk.first]

    def _recycle(self, buffer: np.ndarray) -> None:
        """Keep the buffer of a chunk nothing refers to any more (its ``x`` was freed) for
        a later chunk: fresh memory costs a page fault per page."""
        with self._lock:
            if len(self._free) < CHUNKS_HELD:
                self._free.append(buffer)

    def _load(self, j: int) -> Chunk:
        """Chunk ``j``, read."""
        ids, local = self._chunk(j)
        c = self.cache
        with self._lock:
            buffer = self._free.pop() if self._free else None
        if buffer is None:
            shape = (order.WINDOW_STEPS * self.batch_size, c.height, c.width, 1)
            buffer = aligned(shape, self.source.dtype)
        x = buffer[: len(ids)]  # a view of its own: when it is freed, so is the buffer
        weakref.finalize(x, self._recycle, buffer)
        read_features(c, ids, x, self.source)
        y = aligned((len(ids), c.num_outputs))
        np.take(self._labels, ids, axis=0, out=y)
        c.check("train", "labels")  # a last page cut short reads zeros
        return Chunk(j * order.WINDOW_STEPS, local, x, y)


class Ahead(_Steps):
    """The row ids of each step of a split held in memory (app/data/input/mapped.py: the
    page cache's pages, mapped), which the step gathers from. When a chunk's steps begin, a
    background thread announces the next chunk's rows (:func:`announce`) in the file the
    split holds (``source``, default the cache's float32 rows): a page that left the page
    cache since the split was mapped (memory pressure) is read back before the step needs
    it, not by the step, one page fault at a time. Announcing another file than the one
    held reads rows nothing gathers: 125 MB a chunk of the seed's float32 rows, from the
    disk, for a split held as its bfloat16 rows (docs/performance.md, "The held split's
    announcements")."""

    def __init__(
        self, cache: DataCache, rows: np.ndarray | None, source: Source | None = None,
        **order_of: int,
    ) -> None:  # fmt: skip
        super().__init__(cache, rows, **order_of)
        #: The file the held split is mapped from, whose rows are announced.
        self.source = source or Source.raw(cache)
        self._announced: set[int] = set()

    def ids(self, step: int) -> np.ndarray:
        """Step ``step``'s row ids (B,) int64, sorted."""
        k = step // order.WINDOW_STEPS + 1  # the next chunk
        with self._lock:
            if k not in self._announced and k * order.WINDOW_STEPS < self.end_step:
                self._announced.add(k)
                self._pool.submit(self._announce, k)
        at = self._positions(step)
        return at if self.rows is None else self.rows[at]

    def _announce(self, j: int) -> None:
        """Announce chunk ``j``'s rows; a file of the held split cut short (its last page
        reads zeros past the new end, without a SIGBUS) ends the run (nothing waits for this
        thread: app/signals.py ``end_now``)."""
        try:
            announce(self.cache, self._chunk(j)[0], self.source)
            self.cache.check("train", "labels")
        except AppError as exc:
            end_now(exc)
