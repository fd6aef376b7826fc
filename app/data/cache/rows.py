"""Rows read from an array file while a run trains: the cache's own files, or a source read
where it lies (a float32 ``.npy`` or HDF5 dataset: the operator's file, which a producer may
rewrite meanwhile).

A file is opened once (:class:`RowsFile`) and every read goes to the file that was opened,
whatever its path names later; rows are read with ``preadv``, one call per run of
consecutive rows, and each read checks the file is still as long as the rows need: a file
cut short under the run is the file's error, naming it (:meth:`DataCache.lost
<app.data.cache.store.DataCache.lost>`: exit 3 for a source, 4 for a cache file), never
the SIGBUS that reading a memory map past the end of its file raises. A file that must be
mapped (a split held in memory, a ``numpy.memmap``) is watched for that SIGBUS instead
(app/signals.py ``watch_mapped``: its error ends the run). Never imports TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.errors import AppError
from app.signals import truncated

#: What a file found changed becomes: the error naming it, given what happened.
Lost = Callable[[str], AppError]


def runs(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs of consecutive values in sorted ``ids``: (starts, ends) as positions in ``ids``
    (``ids[starts[i]:ends[i]]`` is one run)."""
    if len(ids) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.diff(ids, prepend=ids[0] - 2) != 1)
    return starts, np.append(starts[1:], len(ids))


class RowsFile:
    """The file ``path`` opened for reading rows (a symlink is not followed), whose rows end
    at byte ``end``; ``lost`` is its error (module docstring). Raises OSError (open)."""

    def __init__(self, path: Path, end: int, lost: Lost) -> None:
        self.path, self.end, self.lost = path, end, lost
        self.fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead past a block

    def check(self) -> None:
        """Raises ``lost`` when the file is shorter than its rows."""
        size = os.fstat(self.fd).st_size
        if size < self.end:
            raise self.lost(truncated(size, self.end))

    def read(self, ids: np.ndarray, base: int, row: int, out: memoryview) -> None:
        """Rows ``ids`` (sorted) of ``row`` bytes each from byte ``base`` into ``out``
        (len(ids) × ``row`` bytes), one ``preadv`` per run. Raises ``lost`` (cut short)."""
        self.check()
        starts, ends = runs(ids)
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            at = base + int(ids[a]) * row
            if os.preadv(self.fd, [out[a * row : b * row]], at) != (b - a) * row:
                self.check()
                raise self.lost("truncated while read")

    def announce(self, ids: np.ndarray, base: int, row: int) -> None:
        """Tell the kernel rows ``ids`` (sorted) will be read (``POSIX_FADV_WILLNEED`` per
        run): it starts reading what the page cache lacks at once. Raises ``lost``."""
        self.check()
        starts, ends = runs(ids)
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            at = base + int(ids[a]) * row
            os.posix_fadvise(self.fd, at, (b - a) * row, os.POSIX_FADV_WILLNEED)
