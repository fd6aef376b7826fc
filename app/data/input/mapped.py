"""A training split held in memory without a copy: tensors over a memory map of the cache.

The cache's arrays are raw float32 rows, row-major, in native byte order
(app/data/cache/store.py), which is the layout of a (N, H, W, 1) and a (N, K) tensor. So a
split that is held in memory is not read and copied into variables: each file is mapped
(``MAP_PRIVATE``, copy-on-write, so nothing the process could do writes to the cache;
writable, because DLPack can't export a read-only array) and populated for reading
(:func:`populate`: the file is read once, in order, before training, as a load would), then
handed to TensorFlow through DLPack, which wraps the mapping's memory as a tensor without a
copy (``tf.convert_to_tensor`` copies a ``numpy.memmap``). Its pages are the page cache's:
shared with every other run on the same cache and the next run of this one, and counted
once. ``MAP_POPULATE`` is not used: on a writable private mapping it populates for writing,
which copies every page into the process's anonymous memory (12.6 GB of ``RssAnon`` and
26 s for the seed's split, against none and 3.6 s; docs/performance.md).

Each batch is then gathered from these tensors by row id inside the training step and
standardised there (:func:`gather`). A streamed run's step gathers its batch the same way
from the chunk it is handed (app/data/input/stream.py, :func:`batch`): the two give the
same bits (tested).
"""

from __future__ import annotations

import errno
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.data.cache import DataCache
from app.data.cache.rows import Lost
from app.data.input.stream import ALIGNMENT, Source, Stats, aligned
from app.signals import truncated, watch_mapped


@dataclass
class Resident:
    """A training split held in memory: ``features`` (N, H, W, 1) and ``labels`` (N, K),
    every row of the cache's training split by row id (a memory map of its files), and the
    standardisation applied to a gathered batch (``stats``: :func:`standardization`).
    The features are the cache's raw float32 rows, or with ``rounded`` the rows a
    bfloat16 step computes on (app/data/cache/rounded.py: standardised already when made
    so, and not what the evaluation gathers)."""

    features: tf.Tensor
    labels: tf.Tensor
    stats: tuple[tf.Tensor, ...] = ()
    rounded: bool = False

    def rows(self) -> tuple[tf.Tensor, ...]:
        """What the training step gathers from (:func:`gather`)."""
        return (self.features, self.labels, *self.stats)


def gather(rows: tuple[tf.Tensor, ...], ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The batch of row ids ``ids`` (B,) from ``rows`` (:meth:`Resident.rows`: features
    (N, H, W, 1), labels (N, K), and the standardisation when there is one,
    :func:`standardization`): x (B, H, W, 1) ``(x - mean) * inv``, y (B, K)
    ``(y - mean) / std``; features that are standardised already (only the labels'
    statistics follow them) are gathered as they are."""
    x, y = tf.gather(rows[0], ids), tf.gather(rows[1], ids)
    if len(rows) == 6:
        x = (x - rows[2]) * rows[3]
    if len(rows) in (4, 6):
        y = (y - rows[-2]) / rows[-1]
    return x, y


def batch(element: tf.Tensor | tuple[tf.Tensor, ...], held: tuple[tf.Tensor, ...]) -> tuple:
    """A training step's batch (x (B, H, W, 1), y (B, K), standardised) from its input
    element: a streamed chunk and the step's rows in it (x (r, H, W, 1), y (r, K),
    positions (B,); ``held`` is the standardisation, :func:`standardization`), or the row
    ids (B,) of a split held in memory (``held`` is :meth:`Resident.rows`)."""
    if isinstance(element, tuple):
        x, y, ids = element
        return gather((x, y, *held), ids)
    return gather(held, element)


def standardization(stats: Stats | None, features: bool = True) -> tuple[tf.Tensor, ...]:
    """``stats`` as the tensors :func:`gather` applies: feature mean (H, W, 1), 1/std (H, W,
    1) (without ``features``: not these, for rows standardised already), label mean (K,),
    std (K,); empty for None (raw batches)."""
    if stats is None:
        return ()
    parts = [stats.feature_mean[..., None], stats.feature_inv[..., None]] if features else []
    parts += [stats.label_mean, stats.label_std]
    return tuple(tf.constant(p, tf.float32) for p in parts)


#: ``madvise`` advice that maps a range's pages for reading, reading what the page cache
#: lacks (Linux 5.14; Python's mmap module names it from 3.12 on).
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)


def populate(mapping: mmap.mmap) -> None:
    """Map every page of ``mapping`` for reading (no copy: the page cache's pages); where
    the kernel lacks ``MADV_POPULATE_READ``, by reading a byte of each page. Raises OSError
    (EFAULT: the file is shorter than the mapping)."""
    try:
        mapping.madvise(MADV_POPULATE_READ)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL before Linux 5.14
            raise
        np.frombuffer(mapping, np.uint8)[:: mmap.PAGESIZE].sum()


def map_private(path: Path, start: int, end: int, lost: Lost) -> tuple[mmap.mmap, int]:
    """Bytes ``start .. end`` of the file ``path`` mapped private and writable (a symlink is
    not followed), populated for reading (:func:`populate`) and watched for a SIGBUS while
    it is mapped (app/signals.py ``watch_mapped``: ``lost`` ends the run): the mapping, from
    the page boundary at or below ``start``, and where ``start`` is in it. Raises
    ``lost(what)`` when the file is shorter than ``end``."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if (size := os.fstat(fd).st_size) < end:
            raise lost(truncated(size, end))
        watch_mapped(fd, end, lost)
        offset = start - start % mmap.ALLOCATIONGRANULARITY  # a mapping starts on a page
        length = max(end - offset, 1)
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        mapping = mmap.mmap(fd, length, mmap.MAP_PRIVATE, prot, offset=offset)
        try:
            populate(mapping)
        except OSError:  # cut short since the check
            raise lost(truncated(os.fstat(fd).st_size, end)) from None
    finally:
        os.close(fd)
    return mapping, start - offset


def _mapped(
    where: tuple[Path, int], shape: tuple[int, ...], dtype: np.dtype, lost: Lost
) -> tf.Tensor:
    """A tensor of ``shape`` and ``dtype`` (float32, or bfloat16: ml_dtypes') over a
    private, populated memory map of the file ``where`` names from its byte offset on (the
    cache's own file at 0, or an array read in place after its header;
    :func:`map_private`). An array at an offset that is not a multiple of
    :data:`ALIGNMENT` (HDF5 may put a dataset anywhere) is copied into aligned memory:
    TensorFlow's kernels refuse unaligned tensors (a ``Check failed: IsAligned()`` abort in
    ``GatherOp``). DLPack from numpy knows no bfloat16: those are handed over as uint16 and
    bitcast, which keeps the buffer. Raises ``lost(what)`` when the file is shorter than
    ``shape``; a SIGBUS when it is cut short later ends the run with it."""
    path, base = where
    count = int(np.prod(shape))
    mapping, skip = map_private(path, base, base + dtype.itemsize * count, lost)
    bits = np.dtype(np.float32) if dtype == np.float32 else np.dtype(f"u{dtype.itemsize}")
    array = np.frombuffer(mapping, bits, count, offset=skip).reshape(shape)
    if base % ALIGNMENT:  # TensorFlow's kernels check the alignment: a copy that has it
        copy = aligned(shape, bits)
        np.copyto(copy, array)
        array = copy  # the map is released with the view
    tensor = tf.experimental.dlpack.from_dlpack(array.__dlpack__())  # keeps the map alive
    return tensor if bits == dtype else tf.bitcast(tensor, tf.as_dtype(dtype))


def hold(cache: DataCache, stats: Stats | None, source: Source | None = None) -> Resident:
    """The training split of ``cache`` mapped (module docstring), its features from
    ``source`` (default the cache's float32 rows, raw), standardised on gather with
    ``stats`` (None: raw; the labels only for rows standardised already)."""
    n, h, w, k = cache.train_size, cache.height, cache.width, cache.num_outputs
    source = source or Source.raw(cache)
    features = _mapped(source.where, (n, h, w, 1), source.dtype, cache.lost(source.where[0]))
    where = cache.where("train_y.f32")
    labels = _mapped(where, (n, k), np.dtype(np.float32), cache.lost(where[0]))
    rounded = source.dtype != np.float32
    return Resident(features, labels, standardization(stats, not source.standardized), rounded)
