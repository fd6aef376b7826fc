"""Streamed training batches: the rows of :data:`app.data.input.order.WINDOW_STEPS` steps read as
one chunk, in blocks, ahead of the step that needs them.

Why chunks (measured at the seed's scale, docs/performance.md "Streaming"): a batch of
1,000 rows read one row at a time costs 2,000 ``preadv`` calls from Python, and from a
disk that the page cache can't cover (a container whose memory limit is below the split)
1,000 random 16 KB reads. The order (:mod:`app.data.input.order`) shuffles blocks of
:data:`~app.data.input.order.BLOCK_ROWS` consecutive rows and then each window of
``WINDOW_STEPS`` batches, so the rows of one window are whole blocks: a chunk is read as
a few thousand reads of ~62 KB, in file order, by a background thread while the steps
before it train, and standardised right after each read while it is still in the CPU's
cache. Each step's batch is then a gather from the chunk held in memory.

Memory: the chunk being used, the one being read, and the batches in flight (the memory
estimate, app/budget/memory.py, counts :data:`CHUNKS_HELD` chunks). Labels are read
through a memory map of the labels file (K floats a row: its pages stay mapped, a
``K / (H·W + K)`` share of the split at most). Never imports TensorFlow.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from app.data.cache import DataCache
from app.data.input import order
from app.errors import StorageError

#: Chunks a reader holds at once: the one the steps gather from and the next one.
CHUNKS_HELD = 2
#: Bytes read before the rows read so far are standardised (while in the CPU's L2 cache).
STANDARDIZE_BYTES = 1 << 20


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
    (r, K), standardised; ``local[i]`` (B,) are step ``first + i``'s rows in them."""

    first: int
    local: np.ndarray
    x: np.ndarray
    y: np.ndarray
    buffer: np.ndarray  # what ``x`` is a view of, kept for a later chunk


@dataclass
class _Slot:
    """A chunk being read or read, and how many calls gather from it now."""

    future: Future[Chunk]
    users: int = 0
    retired: bool = False  # no longer the chunk of any step to come
    recycled: bool = False


def _aligned(shape: tuple[int, ...]) -> np.ndarray:
    """A new float32 array of ``shape`` whose data start on a 64-byte boundary (TensorFlow's
    alignment: a ``numpy_function`` result so aligned becomes a tensor without a copy)."""
    count = int(np.prod(shape))
    raw = np.empty(count + 16, np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip : skip + count].reshape(shape)


def runs(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs of consecutive values in sorted ``ids``: (starts, ends) as positions in ``ids``
    (``ids[starts[i]:ends[i]]`` is one run)."""
    if len(ids) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.diff(ids, prepend=ids[0] - 2) != 1)
    return starts, np.append(starts[1:], len(ids))


def read_features(cache: DataCache, ids: np.ndarray, out: np.ndarray, stats: Stats | None) -> None:
    """Read training rows ``ids`` (sorted) of the features into ``out`` (len(ids), H, W, 1),
    one ``preadv`` per run, standardising every :data:`STANDARDIZE_BYTES`. Raises
    StorageError if the file is shorter than the manifest says."""
    path, base = cache.where("train_x.f32")
    row = 4 * cache.height * cache.width
    flat = out.reshape(len(ids), cache.height, cache.width)
    buf = memoryview(out.reshape(-1).view(np.uint8).data)
    starts, ends = runs(ids)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.posix_fadvise(fd, base, 0, os.POSIX_FADV_RANDOM)  # no readahead past a block
        done = 0
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            at = base + int(ids[a]) * row
            if os.preadv(fd, [buf[a * row : b * row]], at) != (b - a) * row:
                raise StorageError(f"{path}: cache file is truncated; delete {cache.path}")
            if stats is not None and (b - done) * row >= STANDARDIZE_BYTES:
                _standardize(flat[done:b], stats)
                done = b
        if stats is not None:
            _standardize(flat[done:], stats)
    finally:
        os.close(fd)


def read_labels(
    cache: DataCache, labels: np.ndarray, ids: np.ndarray, stats: Stats | None
) -> np.ndarray:
    """Training rows ``ids`` of ``labels`` (the labels' memory map, (N, K)): (len, K)
    float32, standardised with ``stats``."""
    y = np.array(labels[ids], np.float32)
    if stats is not None:
        np.subtract(y, stats.label_mean, out=y)
        np.divide(y, stats.label_std, out=y)
    return y


def _standardize(x: np.ndarray, stats: Stats) -> None:
    np.subtract(x, stats.feature_mean, out=x)
    np.multiply(x, stats.feature_inv, out=x)


class Reader:
    """The batches of one worker, chunk by chunk (see the module docstring).

    ``rows``: the training rows (sorted int64 row ids; None: all); ``batch_size`` per
    worker, worker ``index`` of ``workers``; steps before ``end_step``. :meth:`batch` is
    thread-safe and may be called for any step in any order; reading ahead assumes steps
    mostly come in order.
    """

    def __init__(
        self, cache: DataCache, rows: np.ndarray | None, *, seed: int, batch_size: int,
        end_step: int, workers: int = 1, index: int = 0, stats: Stats | None = None,
    ) -> None:  # fmt: skip
        self.cache, self.rows, self.stats = cache, rows, stats
        self.seed, self.batch_size, self.end_step = seed, batch_size, end_step
        self.workers, self.index = workers, index
        self.n = cache.train_size if rows is None else len(rows)
        self._labels = cache.labels("train")
        self._chunks: dict[int, _Slot] = {}
        self._free: list[np.ndarray] = []  # chunk buffers no call gathers from any more
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="coretrain-stream")

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Step ``step``'s batch: x (B, H, W, 1) and y (B, K), float32, standardised.

        x is a new array aligned for TensorFlow, which then takes it without a copy."""
        j = step // order.WINDOW_STEPS
        with self._lock:
            for old in [k for k in self._chunks if k < j]:
                gone = self._chunks.pop(old)
                gone.retired = True
                self._recycle(gone)
            for k in (j, j + 1):
                if k not in self._chunks and k * order.WINDOW_STEPS < self.end_step:
                    self._chunks[k] = _Slot(self._pool.submit(self._load, k))
            slot = self._chunks[j]
            slot.users += 1
        try:
            chunk = slot.future.result()
            local = chunk.local[step - chunk.first]
            x = _aligned((len(local), *chunk.x.shape[1:]))
            # mode="clip": the indices are valid by construction, and "raise" (the default)
            # writes through a temporary copy of ``out`` (numpy.take), 5x slower here.
            np.take(chunk.x, local, axis=0, out=x, mode="clip")
            return x, chunk.y[local]
        finally:
            with self._lock:
                slot.users -= 1
                self._recycle(slot)

    def close(self) -> None:
        """Stop reading ahead (a chunk being read finishes)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _recycle(self, slot: _Slot) -> None:
        """Keep a retired chunk's buffer for a later chunk once no call gathers from it
        (under the lock): fresh memory costs a page fault per 4 KiB page."""
        if slot.retired and slot.users == 0 and slot.future.done() and not slot.recycled:
            slot.recycled = True
            if slot.future.exception() is None and len(self._free) < CHUNKS_HELD:
                self._free.append(slot.future.result().buffer)

    def _load(self, j: int) -> Chunk:
        """Chunk ``j``: the rows of steps ``j·WINDOW_STEPS ..`` (before ``end_step``)."""
        first = j * order.WINDOW_STEPS
        steps = range(first, min(first + order.WINDOW_STEPS, self.end_step))
        positions = np.concatenate([
            order.batch_rows(self.seed, s, self.batch_size, self.n, self.workers, self.index)
            for s in steps
        ])  # fmt: skip
        unique, inverse = np.unique(positions, return_inverse=True)
        ids = unique if self.rows is None else self.rows[unique]
        c = self.cache
        with self._lock:
            buffer = self._free.pop() if self._free else None
        if buffer is None:
            rows = order.WINDOW_STEPS * self.batch_size
            buffer = np.empty((rows, c.height, c.width, 1), np.float32)
        x = buffer[: len(ids)]
        read_features(c, ids, x, self.stats)
        y = read_labels(c, self._labels, ids, self.stats)
        return Chunk(first, inverse.reshape(len(steps), self.batch_size), x, y, buffer)
