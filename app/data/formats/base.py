"""What every format answers, and what the array formats share.

A data set's file (or one array of a container file) is read through an :class:`Array`:

* ``label`` -- how messages name it: ``FILE`` or ``FILE:array``;
* :meth:`Array.columns` -- the values per row (K for labels; features are checked against
  H×W), read from the file's first line or its header;
* :meth:`Array.estimate` -- the bytes its cache array will take (0 when read in place);
* :meth:`Array.in_place` -- where its float32 rows lie in the file (:class:`Place`), when
  they can be used there, without a copy;
* :meth:`Array.chunks` -- its rows as float32 arrays of at most :data:`CHUNK_ROWS` rows;
* :meth:`Array.convert` -- its rows written to a new float32 file, with their column sums.

The cache (app/data/cache/), the input and ``predict`` use these alone: none of them knows
which format it reads. Which format a file is in is decided by its content
(app/data/formats/detect.py). No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from app.atomic import FILE_MODE
from app.data.formats.textfile import blocks
from app.errors import DataError, Preempted

#: Rows per chunk: the text parser's (app/data/formats/textfile/chunks.py), so the column sums
#: of the same values are added in the same order whatever the format.
CHUNK_ROWS = 512
#: Most bytes of values one chunk holds (the text reader's bound for a chunk of lines).
CHUNK_BYTES = 64 << 20
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Converted:
    """Rows written (or scanned in place): ``rows`` samples of ``width`` float32 values.

    ``sums`` / ``sums_sq``: float64 column sums of the values and of their squares, shape
    (width,). ``threads``: threads that read (1 for one pass); ``ranges``: byte ranges the
    file was cut into (1 for one pass). ``checksum``: the digest of the rows' bytes
    (app/data/cache/store.py's of a cache array) when they were scanned in place, or
    digested as they were written (``Io.hasher``), else None.
    """

    rows: int
    sums: np.ndarray
    sums_sq: np.ndarray
    threads: int = 1
    ranges: int = 1
    checksum: str | None = None


@dataclass(frozen=True)
class Place:
    """Where an array's float32 rows (native byte order, C order) lie in a file: ``path``
    (the real path: no symlink), from byte ``offset``, ``rows`` × ``width`` values."""

    path: Path
    offset: int
    rows: int
    width: int

    @property
    def nbytes(self) -> int:
        return self.rows * self.width * 4


@dataclass(frozen=True)
class Shape:
    """What a row must hold: ``width`` values, given as H×W (``hw``, features), as K
    (``labels``) or as a width alone (neither: a model's input); ``hint`` names it in
    messages ("H×W = 20×195")."""

    width: int
    hint: str = ""
    hw: tuple[int, int] | None = None
    labels: bool = False


class Array(Protocol):
    """One data file, or one array of a container (module docstring)."""

    label: str

    @property
    def size(self) -> int:
        """Bytes of the source read to give all rows (for progress)."""
        ...

    def columns(self, limit: int) -> int:
        """The values per row of a label array: K >= 1. Raises DataError (more than
        ``limit``: :func:`too_many_columns`; empty, unreadable, not numbers)."""
        ...

    def estimate(self, shape: Shape) -> int:
        """Bytes of its cache array (0 when read in place). Raises DataError."""
        ...

    def in_place(self, shape: Shape) -> Place | None:
        """Where its rows can be used as they lie; None when they must be converted."""
        ...

    def chunks(
        self, shape: Shape, allow_nonfinite: bool, chunk_rows: int = CHUNK_ROWS
    ) -> Iterator[np.ndarray]:
        """Its rows, float32 (rows <= chunk_rows, width), in order. Raises DataError naming
        ``label`` (a wrong width or shape, not numbers, NaN/Inf when not allowed)."""
        ...

    def convert(self, dst: Path, shape: Shape, allow_nonfinite: bool, io: Io) -> Converted:
        """Its rows written into the new file ``dst`` (in ``io.dir_fd``). Raises
        DataError, Preempted, what ``io.written`` raises; ``dst`` removed on failure."""
        ...


@dataclass(frozen=True)
class Io:
    """How a conversion writes and reports: ``threads`` it may use, ``stop`` polled between
    chunks, ``progress`` (source bytes read) and ``written`` (bytes written; may raise to
    stop), ``dir_fd`` the directory ``dst`` is created in, ``hasher`` what makes the digest
    a conversion may compute of its rows as it writes them (``Converted.checksum``)."""

    threads: int = 1
    stop: Callable[[], bool] = lambda: False
    progress: Callable[[int], None] | None = None
    written: Callable[[int], None] | None = None
    dir_fd: int | None = None
    hasher: Callable[[], Any] | None = None


def too_many_columns(where: str, limit: int) -> DataError:
    """The error of a label file with more than ``limit`` columns, at ``where``."""
    return DataError(
        f"{where}: more than {limit} label columns (the limit, app/data/cache/bounds.py): "
        "not a label file?"
    )


def add_sums(chunk: np.ndarray, total: np.ndarray, total_sq: np.ndarray) -> None:
    """Add the float64 column sums of ``chunk`` (float32, (rows, width)) and of its squares
    to ``total`` / ``total_sq``: the compiled adder when built (it releases the GIL), else
    numpy in the same order."""
    compiled = blocks.compiled
    if compiled is not None:
        compiled.add_column_sums(chunk, chunk.shape[1], total, total_sq)
    else:  # float64 sums without a float64 copy of the chunk
        total += chunk.sum(axis=0, dtype=np.float64)
        total_sq += np.einsum("ij,ij->j", chunk, chunk, dtype=np.float64)


def write_chunks(
    label: str, chunks: Iterable[np.ndarray], dst: Path, width: int, io: Io, per_value: int = 4
) -> Converted:
    """Write ``chunks`` (float32 rows of ``width``) into the new file ``dst`` (``O_EXCL``,
    no symlink followed; in ``io.dir_fd`` when given) and sum their columns; ``per_value``:
    bytes of the source per value, for ``io.progress``; the rows' digest as they are written
    when ``io.hasher`` is given (``Converted.checksum``). Raises Preempted (``io.stop``),
    what the chunks or ``io.written`` raise, OSError; ``dst`` is removed on any of them."""
    name = dst.name if io.dir_fd is not None else dst
    fd = os.open(name, _NEW_FILE, FILE_MODE, dir_fd=io.dir_fd)
    total, total_sq, rows, done = np.zeros(width), np.zeros(width), 0, False
    h = io.hasher() if io.hasher is not None else None
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                if io.stop():
                    raise Preempted(f"{label}: stopped by signal during cache conversion")
                if io.written is not None:
                    io.written(chunk.nbytes)
                f.write(chunk.data)
                if h is not None:
                    h.update(chunk.data)
                if io.progress is not None:
                    io.progress(chunk.size * per_value)
                add_sums(chunk, total, total_sq)
                rows += len(chunk)
        done = True
    finally:
        if not done:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=io.dir_fd)
    return Converted(rows, total, total_sq, checksum=h.hexdigest() if h is not None else None)
