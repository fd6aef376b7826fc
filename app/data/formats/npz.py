"""NumPy ``.npz`` files (a zip of ``.npy`` members, stored or deflated), recognised by the zip
signature ``PK\\x03\\x04``: an array is read from its member ``<name>.npy`` as a stream, in
blocks, and converted once (a compressed member can't be mapped). A Fortran-ordered member
is refused (its rows are not contiguous in the stream), and so is a member whose name two
members of the zip have (not a guess: the rule of app/data/formats/sources.py ``find``,
exit 3 here as no option chooses between them). No pickles: only ``.npy`` headers are
parsed. No TensorFlow here.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import numpy as np

from app.data.formats import files
from app.data.formats.arrays import ArrayFile, Header, float_rows, reading
from app.data.formats.base import CHUNK_ROWS, Shape
from app.data.formats.npy import read_header
from app.errors import DataError

MAGIC = b"PK\x03\x04"
#: What a damaged or cut zip raises while it is read.
_BROKEN = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError)


def members(path: Path) -> list[str]:
    """The array names of the .npz ``path`` (its ``.npy`` members without the suffix)."""
    with (
        files.opened(path) as f,
        reading(f"{path}: not a readable .npz (zip) file", _BROKEN),
        zipfile.ZipFile(f) as zf,
    ):
        return [n.removesuffix(".npy") for n in zf.namelist() if n.endswith(".npy")]


class NpzArray(ArrayFile):
    """The array ``name`` of a ``.npz`` file, through the format seam."""

    def __init__(self, path: Path, name: str) -> None:
        self.name = name
        self.name_member(path, name, members(path), "array in the .npz")
        with self._stream() as (_, header, fortran):
            self.header = header
        if fortran:
            raise DataError(
                f"{self.label}: Fortran-ordered array; save it C-ordered (np.ascontiguousarray)"
            )

    def _member(self, zf: zipfile.ZipFile) -> str:
        """The name of this array's member in ``zf``. Raises DataError when two or more
        members have it (zip allows it; ``zipfile`` reads the last): which one is meant
        can't be known, and no option can tell them apart."""
        member = f"{self.name}.npy"
        if (copies := zf.namelist().count(member)) > 1:
            raise DataError(
                f"{self.label}: {copies} members of the zip are named {member} (which one is "
                "meant can't be known): save the .npz again with one"
            )
        return member

    @contextmanager
    def _stream(self) -> Iterator[tuple[IO[bytes], Header, bool]]:
        with (
            files.opened(self.path) as f,
            reading(f"{self.label}: truncated or corrupt .npz", _BROKEN),
            zipfile.ZipFile(f) as zf,
            zf.open(self._member(zf)) as stream,
        ):
            header, fortran, _ = read_header(stream, self.label)
            yield stream, header, fortran

    def chunks(
        self, shape: Shape, allow_nonfinite: bool, chunk_rows: int = CHUNK_ROWS
    ) -> Iterator[np.ndarray]:
        self.header.check(shape)
        with self._stream() as (stream, header, _):
            row_bytes = header.row_values * header.dtype.itemsize

            def read(start: int, stop: int) -> np.ndarray:
                data = stream.read((stop - start) * row_bytes)
                return np.frombuffer(data, header.dtype, len(data) // header.dtype.itemsize)

            yield from float_rows(header, read, shape.width, allow_nonfinite, chunk_rows)
