"""NumPy ``.npy`` files (format version 1, 2 or 3), recognised by their magic bytes
``\\x93NUMPY``: only the header is parsed (``allow_pickle`` never enters: an object dtype is
refused from the header alone).

A float32, native byte order, C-ordered array is used where it lies: :meth:`NpyArray.in_place`
gives its offset and the cache maps the file itself (no conversion, no copy). Its rows, and
those of any other real dtype or of Fortran order (converted once), are read in blocks with
``preadv``, not through a memory map: a file cut short while it is read gives a short read
(DataError naming it), not the SIGBUS that ends a process reading a map past the end. A file
shorter than its header says is refused (truncated); a dtype that is not real numbers (an
object array's pickle) is refused from the header, before its size is measured. No
TensorFlow here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

from app.data.formats import files
from app.data.formats.arrays import ArrayFile, Header, float_rows
from app.data.formats.base import CHUNK_ROWS, Shape
from app.errors import DataError

MAGIC = b"\x93NUMPY"


def read_header(f: IO[bytes], label: str) -> tuple[Header, bool, int]:
    """(header, fortran_order, data offset) of the .npy stream ``f`` at its start. Raises
    DataError (not a .npy file, a header numpy can't read)."""
    try:
        version = np.lib.format.read_magic(f)
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read(f)
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"{label}: not a readable .npy header ({exc})") from None
    header = Header(label, tuple(int(n) for n in shape), np.dtype(dtype))
    return header, bool(fortran), f.tell()


class NpyArray(ArrayFile):
    """A ``.npy`` file read through the format seam (app/data/formats/base.py)."""

    def __init__(self, path: Path) -> None:
        self.path, self.label = path, str(path)
        with files.opened(path) as f:
            self.header, self.fortran, offset = read_header(f, self.label)
            self.file_size = os.fstat(f.fileno()).st_size
        self.header.check_dtype()  # an object array's pickle is never read, nor measured
        if offset + self.size > self.file_size:
            raise DataError(
                f"{path}: truncated: its header says {self.header.shape} {self.header.dtype} "
                f"({offset + self.size:,} bytes with the header), the file has "
                f"{self.file_size:,}"
            )
        self.values_at = offset
        self.offset = None if self.fortran else offset

    def chunks(
        self, shape: Shape, allow_nonfinite: bool, chunk_rows: int = CHUNK_ROWS
    ) -> Iterator[np.ndarray]:
        self.header.check(shape)
        with files.opened(self.path) as f:
            fd = f.fileno()
            yield from float_rows(
                self.header, lambda a, b: self._rows(fd, a, b), shape.width, allow_nonfinite,
                chunk_rows,
            )  # fmt: skip

    def _rows(self, fd: int, start: int, stop: int) -> np.ndarray:
        """Rows ``start .. stop - 1`` as the file holds them, read with ``preadv`` (a file
        cut short since gives fewer values, never a SIGBUS as a memory map would): (values,)
        in C order, or (rows, …) of a Fortran-ordered array (each of its columns a run of
        the file). Raises DataError (unreadable)."""
        h, dt = self.header, self.header.dtype
        try:
            if not self.fortran:
                out = np.empty((stop - start) * h.row_values, dt)
                at = self.values_at + start * h.row_values * dt.itemsize
                return out[: os.preadv(fd, [out.view(np.uint8).data], at) // dt.itemsize]
            cols = np.empty((h.row_values, stop - start), dt)
            for c, col in enumerate(cols):
                at = self.values_at + (c * h.rows + start) * dt.itemsize
                if os.preadv(fd, [col.view(np.uint8).data], at) != col.nbytes:
                    return cols[:0]
        except OSError as exc:
            raise files.unreadable(self.path, exc) from None
        return cols.reshape(*h.shape[1:][::-1], stop - start).T
