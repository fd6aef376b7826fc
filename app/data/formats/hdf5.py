"""HDF5 files (h5py), recognised by the format signature ``\\x89HDF\\r\\n\\x1a\\n`` at byte 0 or
at a user block's end (512, 1024, 2048, … bytes: the HDF5 file format specification,
"Superblock").

A dataset is read in blocks of whole chunks (its chunk rows, bounded as a text chunk is:
app/data/formats/arrays.py), so a chunked and compressed dataset never needs more memory
than a block; each block is converted once. A contiguous, uncompressed float32 dataset in
native byte order is used where it lies, like a ``.npy`` (its data's offset in the file,
``h5py.h5d.DatasetID.get_offset``), when it lies in the file itself: not through an
external link, in external raw files or a virtual dataset's sources, which are read
through h5py and identified by their content (:func:`stored_elsewhere`). No TensorFlow
here.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from app.data.formats.arrays import ArrayFile, Header, float_rows, listing, named, reading
from app.data.formats.base import CHUNK_BYTES, CHUNK_ROWS, Shape
from app.errors import ConfigError, DataError

MAGIC = b"\x89HDF\r\n\x1a\n"
#: What h5py raises for a damaged, cut or unexpected file.
_BROKEN = (OSError, KeyError, ValueError, RuntimeError, TypeError)


def is_hdf5(path: Path, size: int) -> bool:
    """True when the signature is at byte 0, 512, 1024, 2048, … of ``path``."""
    offset = 0
    with open(path, "rb") as f:
        while offset + len(MAGIC) <= size:
            if os.pread(f.fileno(), len(MAGIC), offset) == MAGIC:
                return True
            offset = 512 if offset == 0 else offset * 2
    return False


def _elsewhere(ds: h5py.Dataset, path: Path) -> bool:
    """Whether ``ds``'s values lie outside the HDF5 file ``path``: reached through an
    external link to another file, kept in external raw files, or a virtual dataset."""
    if ds.is_virtual or ds.external is not None:
        return True
    try:
        return not os.path.samefile(ds.file.filename, path)
    except OSError:
        return True


def stored_elsewhere(path: Path, names: Iterable[str]) -> dict[str, str]:
    """Of the datasets ``names`` of the HDF5 file ``path`` (as a role names them:
    :func:`arrays.named`), those whose values lie in other files (:func:`_elsewhere`), each
    with a SHA-256 of its values read through h5py: the files they lie in are named by
    rules of HDF5's (prefixes, the working directory), so what identifies them is their
    content, read in full at every run (app/data/formats/sources.py ``fingerprint``).
    Datasets the run does not read are not read. Raises DataError (unreadable)."""
    found = members(path)
    out: dict[str, str] = {}
    with reading(f"{path}: not a readable HDF5 file", _BROKEN), h5py.File(path, "r") as f:
        for name in sorted({n for wanted in names for n in named(found, wanted)[:1]}):
            with reading(f"{path}:{name}: cannot read", _BROKEN):
                ds = f[name]
                if not _elsewhere(ds, path):
                    continue
                digest = hashlib.sha256(f"{ds.dtype.str}{ds.shape}".encode())
                row = ds.dtype.itemsize * int(np.prod(ds.shape[1:]))
                rows = max(1, CHUNK_BYTES // max(row, 1))
                for a in range(0, ds.shape[0] if ds.shape else 0, rows):
                    digest.update(np.ascontiguousarray(ds[a : a + rows]).tobytes())
            out[name] = digest.hexdigest()
    return out


def members(path: Path) -> list[str]:
    """The datasets of the HDF5 file ``path`` by their path in it (:func:`_datasets`), kept
    for the process while the file's status (inode, size, times) is the same."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is None:
        return list(_listed(str(path), None))
    return list(_listed(str(path), (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)))


@functools.lru_cache(maxsize=8)
def _listed(path: str, status: tuple[int, ...] | None) -> tuple[str, ...]:
    with reading(f"{path}: not a readable HDF5 file", _BROKEN), h5py.File(path, "r") as f:
        return tuple(_datasets(f))


def _datasets(f: h5py.File) -> list[str]:
    """The paths of ``f``'s datasets: every link's name, in groups too (hard, soft and
    external links: h5py's ``visititems_links``), that leads to a dataset; a dataset under
    two names (hard links) is listed under both. A link that leads nowhere (a dangling soft
    link, an external link to a missing file) is not listed."""
    found: list[str] = []

    def visit(name: str, link: object) -> None:
        try:
            kind = f.get(name, getclass=True)
        except _BROKEN:
            return
        if kind is h5py.Dataset:
            found.append(name)

    f.visititems_links(visit)
    return found


def _missing_source(ds: h5py.Dataset, path: Path) -> str | None:
    """For a virtual dataset, the first source HDF5 would not find (it reads the fill value
    there, silently): its file, looked for as HDF5 does (as named when absolute, else under
    ``HDF5_VDS_PREFIX``, beside ``path``, in the working directory; ``.`` is ``path``
    itself), or ``FILE:DATASET`` when the file lacks the dataset; None when all are there."""
    if not ds.is_virtual:
        return None
    for source in ds.virtual_sources():
        name = source.file_name
        places = [path] if name == "." else [Path(name)] if os.path.isabs(name) else [
            *(Path(p) / name for p in os.environ.get("HDF5_VDS_PREFIX", "").split(":") if p),
            path.parent / name,
            Path(name),
        ]  # fmt: skip
        found = next((p for p in places if p.is_file()), None)
        if found is None:
            return name
        with h5py.File(found, "r") as src:
            if not isinstance(src.get(source.dset_name), h5py.Dataset):
                return f"{name}:{source.dset_name}"
    return None


class HdfArray(ArrayFile):
    """The dataset ``name`` of an HDF5 file, through the format seam: its path in the
    file, or a bare name that only one dataset's path ends in (:func:`arrays.named`)."""

    def __init__(self, path: Path, name: str) -> None:
        found = members(path)
        meant = named(found, name)
        if len(meant) > 1:
            raise ConfigError(
                f"{path}: {len(meant)} datasets are named {name} ({listing(meant)}): name "
                "the one to read by its path in the file"
            )
        self.name = meant[0] if meant else name
        self.name_member(path, self.name, found, "dataset in the HDF5 file")
        with reading(f"{self.label}: cannot read", _BROKEN), h5py.File(path, "r") as f:
            ds = f[self.name]
            lost = _missing_source(ds, path)
            if lost is not None:
                raise DataError(
                    f"{self.label}: a virtual dataset whose source {lost} is not there "
                    "(HDF5 would read its fill value in its place)"
                )
            self.header = Header(self.label, tuple(int(n) for n in ds.shape), ds.dtype)
            self.chunk_rows = ds.chunks[0] if ds.chunks else None
            # In place: contiguous (filters need chunks in HDF5), and in this very file (an
            # external link's offset is in the file it links to).
            plain = ds.chunks is None and not _elsewhere(ds, path)
            offset = ds.id.get_offset() if plain else None
        self.offset, self.file_size = offset, os.stat(path).st_size

    def chunks(
        self, shape: Shape, allow_nonfinite: bool, chunk_rows: int = CHUNK_ROWS
    ) -> Iterator[np.ndarray]:
        self.header.check(shape)
        step = max(1, min(chunk_rows, self.header.block_rows()))
        block = step  # rows read at once: whole chunks of the dataset when they fit the bound
        if self.chunk_rows and self.chunk_rows * self.header.row_values * 4 <= CHUNK_BYTES:
            block = -(-self.chunk_rows // step) * step
        with reading(f"{self.label}: cannot read", _BROKEN), h5py.File(self.path, "r") as f:
            ds = f[self.name]
            held: dict[str, Any] = {"start": -1, "rows": np.zeros(0)}  # the block read last

            def read(a: int, b: int) -> np.ndarray:
                first = a // block * block
                if held["start"] != first:
                    held["start"], held["rows"] = first, ds[first : first + block]
                rows: np.ndarray = held["rows"]
                return rows[a - first : b - first]

            yield from float_rows(self.header, read, shape.width, allow_nonfinite, step)
