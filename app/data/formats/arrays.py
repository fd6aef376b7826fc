"""What the array formats (.npy, .npz, HDF5) share: an array's header checked against what a
row must hold, its rows read in bounded blocks and made float32, NaN/Inf refused.

An array is accepted when its dtype is a real number (floats, signed or unsigned integers:
never an object or structured dtype, which would need unpickling or fields) and its shape
is (n, H·W), (n, H, W) or (n, H, W, 1) for features, (n, K) or (n,) for labels. Values
other than float32 are converted as numpy's ``astype(float32)`` rounds them (a float64
beyond float32's range becomes Inf, as in text). No TensorFlow here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.data.formats.base import (
    CHUNK_BYTES,
    CHUNK_ROWS,
    Converted,
    Io,
    Place,
    Shape,
    too_many_columns,
    write_chunks,
)
from app.errors import DataError


@dataclass(frozen=True)
class Header:
    """An array as its header describes it: ``shape`` and ``dtype``; ``label`` names it."""

    label: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 0

    @property
    def row_values(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1

    def check_dtype(self) -> None:
        """Raises DataError unless the dtype is real numbers (float, int, uint)."""
        dt = self.dtype
        if dt.fields is not None or dt.kind == "V":
            raise DataError(f"{self.label}: structured dtype {dt}, not an array of numbers")
        if dt.kind == "O":
            raise DataError(f"{self.label}: object dtype (pickled Python objects are never read)")
        if dt.kind not in "fiu":
            raise DataError(
                f"{self.label}: dtype {dt}, not real numbers (float or integer arrays only)"
            )

    def columns(self, limit: int) -> int:
        """K of a label array: (n,) is 1, (n, K) is K. Raises DataError (K > ``limit``,
        not numbers, another shape, no rows)."""
        self.check_dtype()
        if len(self.shape) not in (1, 2):
            raise DataError(f"{self.label}: shape {self.shape}: labels are (n, K) or (n,)")
        self._check_rows()
        k = self.row_values
        if k < 1:
            raise DataError(f"{self.label}: shape {self.shape}: no label columns")
        if k > limit:
            raise too_many_columns(self.label, limit)
        return k

    def check(self, shape: Shape) -> None:
        """Raises DataError unless the array is real numbers whose rows hold ``shape``."""
        self.check_dtype()
        if shape.labels and len(self.shape) == 1 and shape.width == 1:
            self._check_rows()
            return
        fits = len(self.shape) >= 2 and self.row_values == shape.width
        if shape.hw is not None:
            h, w = shape.hw
            fits = fits and self.shape[1:] in ((h * w,), (h, w), (h, w, 1))
        elif shape.labels:
            fits = fits and len(self.shape) == 2
        if not fits:
            raise DataError(f"{self.label}: shape {self.shape}, {self._expected(shape)}")
        self._check_rows()

    def _expected(self, shape: Shape) -> str:
        if shape.hw is not None:
            h, w = shape.hw
            return f"expected (n, {h * w}), (n, {h}, {w}) or (n, {h}, {w}, 1) ({shape.hint})"
        return f"expected rows of {shape.width} values ({shape.hint})"

    def _check_rows(self) -> None:
        if any(n < 0 for n in self.shape):  # numpy's header reader lets them through
            raise DataError(f"{self.label}: shape {self.shape}: a negative length")
        if self.rows == 0:
            raise DataError(f"{self.label}: empty array (no rows)")

    def block_rows(self) -> int:
        """Rows read at a time: :data:`CHUNK_ROWS`, fewer when that many pass
        :data:`CHUNK_BYTES`."""
        row_bytes = max(self.row_values * max(self.dtype.itemsize, 4), 1)
        return max(1, min(CHUNK_ROWS, CHUNK_BYTES // row_bytes))


def is_native_float32(dtype: np.dtype) -> bool:
    """True for float32 in this machine's byte order: rows usable as they lie."""
    return dtype.kind == "f" and dtype.itemsize == 4 and dtype.isnative


def float_rows(
    header: Header,
    read: Callable[[int, int], np.ndarray],
    width: int,
    allow_nonfinite: bool,
    chunk_rows: int = CHUNK_ROWS,
) -> Iterator[np.ndarray]:
    """The rows of the array as C-ordered float32 (rows <= ``chunk_rows``, ``width``), in
    order. ``read(start, stop)``: rows ``[start, stop)`` as the array holds them. Raises
    DataError naming the first row (1-based) and column with NaN/Inf unless
    ``allow_nonfinite``, and whatever ``read`` raises."""
    step = max(1, min(chunk_rows, header.block_rows()))
    for start in range(0, header.rows, step):
        stop = min(start + step, header.rows)
        raw = read(start, stop)
        if raw.size != (stop - start) * width:
            raise DataError(f"{header.label}: truncated: rows {start + 1}-{stop} can't be read")
        chunk = np.ascontiguousarray(raw.reshape(stop - start, width), dtype=np.float32)
        if not allow_nonfinite:
            check_finite(header.label, chunk, start)
        yield chunk


def check_finite(label: str, chunk: np.ndarray, first_row: int) -> None:
    """Raises DataError naming the first NaN/Inf of ``chunk`` (whose first row is row
    ``first_row`` + 1 of the array), and how to admit them."""
    finite = np.isfinite(chunk)
    if finite.all():
        return
    row, col = (int(i) for i in np.argwhere(~finite)[0])
    raise DataError(
        f"{label}: row {first_row + row + 1}, column {col + 1}: {chunk[row, col]} "
        "(NaN/Inf values are refused; --allow-nonfinite admits them)"
    )


@contextmanager
def reading(problem: str, errors: tuple[type[BaseException], ...]) -> Iterator[None]:
    """Turn ``errors`` raised inside into DataError: ``<problem>: <the error>``."""
    try:
        yield
    except errors as exc:
        raise DataError(f"{problem}: {exc}") from None


#: The most names a message lists (a container may hold thousands).
LISTED = 20


def listing(names: list[str]) -> str:
    """``names`` for a message: the first :data:`LISTED`, then how many more."""
    shown = ", ".join(names[:LISTED])
    return shown + (f", … ({len(names) - LISTED} more)" if len(names) > LISTED else "")


def named(names: list[str], name: str) -> list[str]:
    """The arrays of a container (``names``: paths in it, ``data/train_features`` in an
    HDF5 group) that ``name`` means: the one of that path (a leading ``/`` aside), else each
    whose last part is ``name`` (a bare name finds a dataset in a group)."""
    path = name.strip("/")
    if path in names:
        return [path]
    return [n for n in names if n.rsplit("/", 1)[-1] == path] if "/" not in path else []


class ArrayFile:
    """What a .npy file, a .npz member and an HDF5 dataset share through the format seam
    (app/data/formats/base.py): set ``path``, ``label``, ``header``, and ``offset`` (the
    byte offset of its values in ``path`` when they lie there contiguous, C-ordered, else
    None) with ``file_size``; give :meth:`chunks`."""

    path: Path
    label: str
    header: Header
    offset: int | None = None
    file_size: int = 0

    @property
    def size(self) -> int:
        """Bytes of values it holds (what reading it all reads)."""
        return self.header.rows * self.header.row_values * self.header.dtype.itemsize

    def name_member(self, path: Path, name: str, found: list[str], what: str) -> None:
        """This is the array ``name`` of the container ``path``; raises DataError naming
        the container's arrays (``found``) when it has none of that name (``what``: "array
        in the .npz", "dataset in the HDF5 file")."""
        self.path, self.label = path, f"{path}:{name}"
        if name not in found:
            raise DataError(f"{self.label}: no such {what} (it holds: {listing(found) or 'none'})")

    def columns(self, limit: int) -> int:
        return self.header.columns(limit)

    def estimate(self, shape: Shape) -> int:
        return 0 if self.in_place(shape) else self.header.rows * shape.width * 4

    def in_place(self, shape: Shape) -> Place | None:
        """Where its rows lie, when they are native float32 at ``offset``. Raises DataError
        (another shape; a file that ends inside the values: truncated)."""
        self.header.check(shape)
        if self.offset is None or not is_native_float32(self.header.dtype):
            return None
        if self.offset + self.size > self.file_size:
            raise DataError(
                f"{self.label}: truncated: its header says {self.header.shape} "
                f"{self.header.dtype} ({self.offset + self.size:,} bytes with the header), "
                f"the file has {self.file_size:,}"
            )
        return Place(Path(os.path.realpath(self.path)), self.offset, self.header.rows, shape.width)

    def chunks(
        self, shape: Shape, allow_nonfinite: bool, chunk_rows: int = CHUNK_ROWS
    ) -> Iterator[np.ndarray]:
        raise NotImplementedError

    def convert(self, dst: Path, shape: Shape, allow_nonfinite: bool, io: Io) -> Converted:
        chunks = self.chunks(shape, allow_nonfinite)
        return write_chunks(self.label, chunks, dst, shape.width, io, self.header.dtype.itemsize)
