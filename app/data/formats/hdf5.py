"""HDF5 files (h5py), recognised by the format signature ``\\x89HDF\\r\\n\\x1a\\n`` at byte 0 or
at a user block's end (512, 1024, 2048, … bytes: the HDF5 file format specification,
"Superblock").

A dataset is read in blocks of whole chunks (its chunk rows, bounded as a text chunk is:
app/data/formats/arrays.py), so a chunked and compressed dataset never needs more memory
than a block; each block is converted once. A contiguous, uncompressed float32 dataset in
native byte order is used where it lies, like a ``.npy`` (its data's offset in the file,
``h5py.h5d.DatasetID.get_offset``), when it lies in the file itself: not through an
external link, in external raw files or a virtual dataset's sources, which are read
through h5py and identified by their content (:func:`stored_elsewhere`). The files HDF5
opens by name for a dataset are checked before it may: regular files, an external raw
file holding its segment (:func:`_external`), virtual sources that are there. No
TensorFlow here.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from app.data.formats import files
from app.data.formats.arrays import ArrayFile, Header, float_rows, listing, named, reading
from app.data.formats.base import CHUNK_BYTES, CHUNK_ROWS, Shape
from app.errors import ConfigError, DataError
from app.signals import truncated, waiting

MAGIC = b"\x89HDF\r\n\x1a\n"
#: What h5py raises for a damaged, cut or unexpected file.
_BROKEN = (OSError, KeyError, ValueError, RuntimeError, TypeError)


def is_hdf5(fd: int, size: int) -> bool:
    """True when the signature is at byte 0, 512, 1024, 2048, … of the file open as ``fd``
    (``size`` bytes)."""
    offset = 0
    while offset + len(MAGIC) <= size:
        if os.pread(fd, len(MAGIC), offset) == MAGIC:
            return True
        offset = 512 if offset == 0 else offset * 2
    return False


def _places(name: str, path: Path, variable: str, beside: bool) -> list[Path]:
    """Where HDF5 looks for the file ``name`` that the HDF5 file ``path`` refers to: as
    named when absolute (an external link's then also as relative, by its last part), under
    each directory of the environment variable ``variable`` (``${ORIGIN}``: ``path``'s
    directory), beside ``path`` (``beside``: links and virtual datasets), in the working
    directory. (HDF5 1.14: ``H5F__prefix_open_file``, ``H5D__build_file_prefix``.)"""
    if name == ".":
        return [path]
    if os.path.isabs(name):
        return [Path(name)]
    prefixes = [p for p in os.environ.get(variable, "").split(":") if p]
    places = [Path(p.replace("${ORIGIN}", str(path.parent))) / name for p in prefixes]
    return [*places, *([path.parent / name] if beside else []), Path(name)]


def _reached(
    name: str, path: Path, variable: str, what: str, beside: bool = True
) -> tuple[Path, os.stat_result] | None:
    """The file HDF5 opens for ``name`` (:func:`_places`) and its status: the first that is
    there, or None. Every place where something is there is checked first
    (app/data/formats/files.py): HDF5 opens by name and would wait on a FIFO, read a
    device. Raises DataError naming it and ``what`` it is to HDF5."""
    places = _places(name, path, variable, beside)
    found = [(p, st) for p in places if (st := files.checked(p, what)) is not None]
    return found[0] if found else None


def _open(path: Path, problem: str) -> h5py.File:
    """The HDF5 file ``path`` opened for reading, once it is a regular file and every file
    its external links reach is too (:func:`members`); the open bounded as a wait
    (app/signals.py ``waiting``). Raises DataError ``<problem>: <h5py's error>``."""
    members(path)
    with waiting(str(path)), reading(problem, _BROKEN):
        return h5py.File(path, "r")


def _elsewhere(ds: h5py.Dataset, path: Path) -> bool:
    """Whether ``ds``'s values lie outside the HDF5 file ``path``: reached through an
    external link to another file, kept in external raw files, or a virtual dataset."""
    if ds.is_virtual or ds.external is not None:
        return True
    try:
        return not os.path.samefile(ds.file.filename, path)
    except OSError:
        return True


def _dataset(f: h5py.File, name: str, path: Path) -> h5py.Dataset:
    """The dataset ``name`` of ``f`` (the file ``path``) once the files its values lie in
    are regular files: its external raw files (``HDF5_EXTFILE_PREFIX``, else the working
    directory) and its virtual sources. Raises DataError: a FIFO or device among them (HDF5
    would wait on it, or read it: ``/dev/zero`` trained on zeros), an external raw file
    shorter than its segment (:func:`_external`), a virtual source that is not there or
    that leads back to the dataset (:func:`_virtual`)."""
    with waiting(f"{path}:{name}"), reading(f"{path}:{name}: cannot read", _BROKEN):
        ds = f[name]
    _external(ds, path, name)
    _virtual(ds, f"{path}:{name}")
    return ds


def _external(ds: h5py.Dataset, path: Path, name: str, read: bool = False) -> None:
    """Check the external raw data files of ``ds`` (the dataset ``name`` of the HDF5 file
    ``path``) where HDF5 opens them (``HDF5_EXTFILE_PREFIX``, else the working directory):
    each a regular file that holds its segment's offset plus the bytes of values the segment
    holds (segments hold the values in order; the last may be declared longer, or
    unlimited). HDF5 reads zeros for what a file lacks (HDF5 1.14, ``H5D__efl_read``); a
    file not there fails HDF5's read. ``read``: checked again after rows were read (HDF5
    opens the files at each read). Raises DataError naming the file and the bytes it lacks
    (``read``: it was cut short while this run read it)."""
    left = ds.dtype.itemsize * int(np.prod(ds.shape, dtype=np.int64))
    what = f"the external raw data file of HDF5 dataset {path}:{name}"
    for raw, offset, size in ds.external or ():
        used = min(size, left)
        left -= used
        found = _reached(raw, path, "HDF5_EXTFILE_PREFIX", what, beside=False)
        if found is None or used == 0 or found[1].st_size >= offset + used:
            continue
        held, end = found[1].st_size, offset + used
        if read:
            raise DataError(
                f"{found[0]}: {what}, {truncated(held, end)} while this run read it: rerun "
                "once the file is complete"
            )
        raise DataError(
            f"{found[0]}: {what} holds {held:,} bytes, {end - held:,} fewer than its segment "
            f"needs ({used:,} bytes of values from byte {offset:,}): HDF5 would read zeros "
            "in their place"
        )


def _read(ds: h5py.Dataset, path: Path, name: str, start: int, stop: int) -> np.ndarray:
    """Rows ``start .. stop - 1`` of ``ds`` (the dataset ``name`` of the HDF5 file ``path``),
    bounded as a wait (HDF5 opens an external raw file by name at each read), its external
    raw files checked again after (:func:`_external`: cut short, HDF5 read zeros)."""
    label = f"{path}:{name}"
    with waiting(label), reading(f"{label}: cannot read", _BROKEN):
        rows = np.asarray(ds[start:stop])
    _external(ds, path, name, read=True)
    return rows


def stored_elsewhere(path: Path, names: Iterable[str]) -> dict[str, str]:
    """Of the datasets ``names`` of the HDF5 file ``path`` (as a role names them:
    :func:`arrays.named`), those whose values lie in other files (:func:`_elsewhere`), each
    with a SHA-256 of its values read through h5py: the files they lie in are named by
    rules of HDF5's (prefixes, the working directory), so what identifies them is their
    content, read in full at every run (app/data/formats/sources.py ``fingerprint``).
    Datasets the run does not read are not read. Raises DataError (unreadable)."""
    found = members(path)
    out: dict[str, str] = {}
    with _open(path, f"{path}: not a readable HDF5 file") as f:
        for name in sorted({n for wanted in names for n in named(found, wanted)[:1]}):
            ds = _dataset(f, name, path)
            if not _elsewhere(ds, path):
                continue
            digest = hashlib.sha256(f"{ds.dtype.str}{ds.shape}".encode())
            row = ds.dtype.itemsize * int(np.prod(ds.shape[1:]))
            rows = max(1, CHUNK_BYTES // max(row, 1))
            for a in range(0, ds.shape[0] if ds.shape else 0, rows):
                values = _read(ds, path, name, a, a + rows)
                digest.update(np.ascontiguousarray(values).tobytes())
            out[name] = digest.hexdigest()
    return out


def members(path: Path) -> list[str]:
    """The datasets of the HDF5 file ``path`` by their path in it (:func:`_datasets`), kept
    for the process while the file's status (inode, size, times) is the same. Raises
    DataError: not a regular file, not HDF5, an external link to a file that is not a
    regular one (:func:`_linked`)."""
    st = files.checked(path)
    if st is None:
        raise files.missing(path)
    _linked(path, set())  # every time: a linked file may have changed since
    return list(_listed(str(path), (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)))


@functools.lru_cache(maxsize=8)
def _listed(path: str, status: tuple[int, ...]) -> tuple[str, ...]:
    problem = f"{path}: not a readable HDF5 file"
    with waiting(path), reading(problem, _BROKEN), h5py.File(path, "r") as f:
        return tuple(_datasets(f))


def _linked(path: Path, seen: set[Path]) -> None:
    """Check every file the external links of the HDF5 file ``path`` reach, and theirs in
    turn (``seen``: those done), before HDF5 follows any of them: a regular file, or nothing
    there (a link that leads nowhere). Raises DataError naming the link and the file."""
    seen.add(path.resolve())
    found: list[tuple[str, h5py.ExternalLink]] = []

    def visit(name: str, link: object) -> None:
        if isinstance(link, h5py.ExternalLink):
            found.append((name, link))

    problem = f"{path}: not a readable HDF5 file"
    with waiting(str(path)), reading(problem, _BROKEN), h5py.File(path, "r") as f:
        f.visititems_links(visit)
    for name, link in found:
        what = f"the file of HDF5 external link {path}:{name}"
        reached = _reached(link.filename, path, "HDF5_EXT_PREFIX", what)
        if reached is None and os.path.isabs(link.filename):  # HDF5 then tries its last part
            reached = _reached(Path(link.filename).name, path, "HDF5_EXT_PREFIX", what)
        target = reached[0] if reached else None
        if target is not None and target.resolve() not in seen and is_hdf5_file(target):
            _linked(target, seen)


def is_hdf5_file(path: Path) -> bool:
    """:func:`is_hdf5` of the file ``path`` (app/data/formats/files.py's rule)."""
    with files.opened(path) as f:
        return is_hdf5(f.fileno(), os.fstat(f.fileno()).st_size)


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


def _identity(ds: h5py.Dataset) -> tuple[int, int]:
    """Which dataset ``ds`` is among the HDF5 files open in this process, whatever name or
    file name reached it: its file's number and its object header's address
    (``H5Oget_info``; HDF5 opens a file once, however often it is opened)."""
    info = h5py.h5o.get_info(ds.id)
    return int(info.fileno), int(info.addr)


def _virtual(ds: h5py.Dataset, label: str) -> None:
    """Check the sources of the virtual dataset ``ds`` (``label``: ``FILE:NAME``, as the run
    names it), and theirs in turn (a source may be virtual too), before HDF5 reads any: each
    source's file is there, looked for as HDF5 does (:func:`_places`, ``HDF5_VDS_PREFIX``,
    beside the file holding the virtual dataset; checked as a data file is), holds the
    source dataset, whose external raw files hold their segments (:func:`_external`), and
    no source leads back to a dataset on the way to it. Each file is opened once. Raises
    DataError: a source not there (HDF5 reads its fill value in its place, silently), a
    circle (HDF5 1.14 follows it until the process crashes, SIGSEGV, exit 139: h5py alone
    too), what :func:`_external` raises."""
    held = contextlib.ExitStack()
    opened: dict[Path, h5py.File] = {}

    def lost(at: str, name: str) -> DataError:
        of = "" if at == label else f" (a source of its source {at})"
        return DataError(
            f"{label}: a virtual dataset whose source {name}{of} is not there (HDF5 would "
            "read its fill value in its place)"
        )

    def source(node: h5py.Dataset, at: str, vds: Any) -> tuple[h5py.Dataset, str]:
        """The dataset the source ``vds`` of ``node`` (named ``at``) names, and its label."""
        what = f"the source file of HDF5 virtual dataset {at}"
        found = _reached(vds.file_name, Path(node.file.filename), "HDF5_VDS_PREFIX", what)
        if found is None:
            raise lost(at, vds.file_name)
        if (where := found[0]) not in opened:
            opened[where] = held.enter_context(_open(where, f"{where}: not a readable HDF5 file"))
        with reading(f"{where}: cannot read", _BROKEN):
            target = opened[where].get(vds.dset_name)
        if not isinstance(target, h5py.Dataset):
            raise lost(at, f"{vds.file_name}:{vds.dset_name}")
        _external(target, where, vds.dset_name.lstrip("/"))
        return target, f"{where}:{vds.dset_name.lstrip('/')}"

    def sources(node: h5py.Dataset) -> Iterator[Any]:
        return iter(node.virtual_sources() if node.is_virtual else ())

    with held:  # the files stay open while identities are compared
        stack = [(label, ds, _identity(ds), sources(ds))]
        done: set[tuple[int, int]] = set()
        while stack:
            at, node, _, todo = stack[-1]
            vds = next(todo, None)
            if vds is None:
                done.add(stack.pop()[2])
                continue
            target, step = source(node, at, vds)
            key = _identity(target)
            on_the_way = [entry[2] for entry in stack]
            if key in on_the_way:
                circle = [entry[0] for entry in stack[on_the_way.index(key) :]]
                raise DataError(
                    f"{label}: a virtual dataset whose sources lead in a circle "
                    f"({' → '.join([*circle, step])}): HDF5 would crash reading it"
                )
            if key not in done:
                stack.append((step, target, key, sources(target)))


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
        with _open(path, f"{self.label}: cannot read") as f:
            ds = _dataset(f, self.name, path)
            self.header = Header(self.label, tuple(int(n) for n in ds.shape), ds.dtype)
            self.chunk_rows = ds.chunks[0] if ds.chunks else None
            # In place: contiguous (filters need chunks in HDF5), and in this very file (an
            # external link's offset is in the file it links to).
            plain = ds.chunks is None and not _elsewhere(ds, path)
            self.offset = ds.id.get_offset() if plain else None
            self.file_size = f.id.get_filesize()

    def chunks(
        self, shape: Shape, allow_nonfinite: bool, chunk_rows: int = CHUNK_ROWS
    ) -> Iterator[np.ndarray]:
        self.header.check(shape)
        step = max(1, min(chunk_rows, self.header.block_rows()))
        block = step  # rows read at once: whole chunks of the dataset when they fit the bound
        if self.chunk_rows and self.chunk_rows * self.header.row_values * 4 <= CHUNK_BYTES:
            block = -(-self.chunk_rows // step) * step
        with _open(self.path, f"{self.label}: cannot read") as f:
            ds = _dataset(f, self.name, self.path)
            held: dict[str, Any] = {"start": -1, "rows": np.zeros(0)}  # the block read last

            def read(a: int, b: int) -> np.ndarray:
                first = a // block * block
                if held["start"] != first:
                    block_rows = _read(ds, self.path, self.name, first, first + block)
                    held["start"], held["rows"] = first, block_rows
                rows: np.ndarray = held["rows"]
                return rows[a - first : b - first]

            yield from float_rows(self.header, read, shape.width, allow_nonfinite, step)
