"""Which format a file is in, by its content (never by its name), and its :class:`Array`
(app/data/formats/base.py).

The first bytes decide: ``\\x93NUMPY`` is a .npy file, ``PK\\x03\\x04`` a .npz (zip),
the HDF5 signature (at 0 or a user block's end) HDF5; anything else is text, plain or
gzip (app/data/formats/textfile/opener.py tells those apart). A .npz or HDF5 file is a
container: its arrays are named (``member``). No TensorFlow here.
"""

from __future__ import annotations

import os
from pathlib import Path

from app.data.formats import files, hdf5, npy, npz
from app.data.formats.arrays import listing, named
from app.data.formats.base import Array
from app.data.formats.text import TextArray
from app.errors import ConfigError, DataError

#: The container formats.
CONTAINERS = ("npz", "hdf5")


def _member(found: str, path: Path, name: str) -> Array:
    return npz.NpzArray(path, name) if found == "npz" else hdf5.HdfArray(path, name)


def _members(found: str, path: Path) -> list[str]:
    return npz.members(path) if found == "npz" else hdf5.members(path)


def kind(path: Path) -> str:
    """ "npy", "npz", "hdf5" or "text", from the content of ``path`` (its first bytes, none
    past its size). Raises DataError (missing, not a regular file, unreadable)."""
    try:
        with files.opened(path) as f:
            size = os.fstat(f.fileno()).st_size
            head = os.pread(f.fileno(), 8, 0) if size else b""
            if head.startswith(npy.MAGIC):
                return "npy"
            if head.startswith(npz.MAGIC):
                return "npz"
            return "hdf5" if hdf5.is_hdf5(f.fileno(), size) else "text"
    except OSError as exc:
        raise files.unreadable(path, exc) from exc


def open_array(path: Path, member: str | None = None) -> Array:
    """The :class:`Array` of ``path`` (the array ``member`` of a container). Raises
    DataError naming the file: a container without ``member``, ``member`` of a file that
    is not a container, what the format's reader raises."""
    found = kind(path)
    if member is not None:
        if found not in CONTAINERS:
            raise DataError(
                f"{path}: not a .npz or HDF5 file (the array {member} is read from those)"
            )
        return _member(found, path, member)
    if found in CONTAINERS:
        raise DataError(f"{path}: a {found} file holds several arrays: name the one to read")
    return npy.NpyArray(path) if found == "npy" else TextArray(path)


def features_array(path: Path) -> Array:
    """The features of ``path`` for ``predict``: the file itself, or of a container its
    array ``features``, else ``test_features`` (in an HDF5 group too, when only one dataset
    has that name), else its only array. Raises DataError."""
    found = kind(path)
    if found not in CONTAINERS:
        return open_array(path)
    names = _members(found, path)
    for name in ("features", "test_features"):
        meant = named(names, name)
        if len(meant) > 1:
            raise ConfigError(
                f"{path}: {len(meant)} arrays are named {name} ({listing(meant)}): save "
                "the one to predict on as its own .npy file"
            )
        if meant:
            return open_array(path, meant[0])
    if len(names) == 1:
        return open_array(path, names[0])
    held = f"more than one array ({listing(names)})" if names else "no arrays at all"
    raise DataError(f"{path}: no array named features or test_features, and {held}")
