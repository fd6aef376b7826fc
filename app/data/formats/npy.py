"""NumPy ``.npy`` files (format version 1, 2 or 3), recognised by their magic bytes
``\\x93NUMPY``: only the header is parsed (``allow_pickle`` never enters: an object dtype is
refused from the header alone).

A float32, native byte order, C-ordered array is used where it lies: :meth:`NpyArray.in_place`
gives its offset and the cache maps the file itself (no conversion, no copy). Any other real
dtype, or Fortran order, is read through a read-only memory map in blocks and converted
once. A file shorter than its header says is refused (truncated). No TensorFlow here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

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
        try:
            with open(path, "rb") as f:
                self.header, fortran, offset = read_header(f, self.label)
                self.file_size = os.fstat(f.fileno()).st_size
        except OSError as exc:
            raise DataError(f"{path}: cannot read: {exc.strerror}") from exc
        if offset + self.size > self.file_size:
            raise DataError(
                f"{path}: truncated: its header says {self.header.shape} {self.header.dtype} "
                f"({offset + self.size:,} bytes with the header), the file has "
                f"{self.file_size:,}"
            )
        self.offset = None if fortran else offset

    def chunks(
        self, shape: Shape, allow_nonfinite: bool, chunk_rows: int = CHUNK_ROWS
    ) -> Iterator[np.ndarray]:
        self.header.check(shape)
        try:
            mapped = np.load(self.path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise DataError(f"{self.path}: cannot map: {exc}") from None
        yield from float_rows(
            self.header, lambda a, b: mapped[a:b], shape.width, allow_nonfinite, chunk_rows
        )
