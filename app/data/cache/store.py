"""The binary data cache on disk: its layout, its digests, and reading it back verified.

Layout: ``<cache_dir>/<key>/`` holds ``train_x.f32`` (N×H×W), ``train_y.f32``
(N×K), ``test_x.f32``, ``test_y.f32`` (row-major float32, native byte order),
``stats.npz`` (training-set mean and standard deviation of features (H×W) and
labels (K,)) and ``manifest.json``; ``key``: :func:`app.data.cache.source_key`.

An array used where it lies (a float32 ``.npy``, or a contiguous float32 HDF5 dataset:
app/data/formats/base.py, ``Place``) has no file here: the manifest's ``in_place`` maps
its file name to the source's real path and the byte offset of its rows.

Integrity: ``manifest.json`` records a BLAKE2b digest of each array and of ``stats.npz``
(:data:`CHECKSUM`); a reader verifies them before using the cache (:func:`load`), and a
mismatch is logged as a ``cache_corrupt`` warning (:func:`corrupt_event`) and converted
again. A file verified once is not read again while it is provably the same file:
:data:`VERIFIED` records, for each file verified, the digest it matched and the file's
status taken before it was read (device, inode, size, modification and change times, in ns;
written by the conversion for the arrays it digested, and by each reader for what it read);
a later reader whose ``lstat`` gives the same skips its digest. Any write, truncation,
``chmod`` or replacement of the file changes its change time or inode, which no process but
root can set back, so what this skips is only a file nothing has touched since
(docs/security.md, "Cache integrity"; at the seed's scale the digest of 13 GB took 16–41 s
of every start). An array read in place is digested when it is first read (the same digest
its copy would have) but not again at each reuse: it is the operator's file, known by the
fingerprint in the cache's key (size, modification and status change times, sampled bytes:
app/data/formats/sources.py), and reading 12 GB at every start would cost what reading in
place saves. Every file here is opened through the cache directory's descriptor without
following symlinks (app/atomic.py). Never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from app import logs
from app.atomic import Dir
from app.data.cache.rows import Lost, RowsFile
from app.errors import DataError, StorageError
from app.signals import watch_mapped

FORMAT_VERSION = 3
#: How the arrays' digests in the manifest are made: BLAKE2b (256 bits) of the whole file,
#: read in :data:`HASH_CHUNK` pieces (cost: docs/security.md, "Cache integrity").
CHECKSUM = "blake2b-256"
HASH_CHUNK = 8 << 20
MANIFEST = "manifest.json"
#: The descriptor of the cache lock a restarted process inherited (internal).
HELD_FD_ENV = "_CORETRAIN_CACHE_LOCK_FD"
STATS = "stats.npz"
#: Each file's digest and status when it was last verified (module docstring).
VERIFIED = "verified.json"
#: The array file of each source role.
FILES = {
    "train_features": "train_x.f32",
    "train_labels": "train_y.f32",
    "test_features": "test_x.f32",
    "test_labels": "test_y.f32",
}


#: A field of the reader's own: not an argument, compared or shown (nor copied by ``replace``).
_OWN: dict[str, Any] = {"init": False, "compare": False, "repr": False}


@dataclass(frozen=True)
class DataCache:
    """A converted data set on disk and its statistics.

    Shapes: ``feature_mean``/``feature_std`` (H, W); ``label_mean``/``label_std``
    (K,). ``baseline_rmse`` is the test RMSE of predicting the training-label
    mean, in raw label units.
    """

    path: Path
    height: int
    width: int
    num_outputs: int
    train_size: int
    test_size: int
    feature_mean: np.ndarray
    feature_std: np.ndarray
    label_mean: np.ndarray
    label_std: np.ndarray
    baseline_rmse: float
    #: The manifest's :data:`CHECKSUM` digest of each array file (name → hex).
    checksums: dict[str, str] = field(default_factory=dict)
    #: The arrays used where they lie (app/data/formats/base.py, ``Place``): file name of
    #: :data:`FILES` → (the source file, the byte offset of its rows). The others are in
    #: ``path``.
    in_place: dict[str, tuple[Path, int]] = field(default_factory=dict)
    #: The shared lock on the cache's marker that keeps it from eviction while this run
    #: uses it (app/data/cache/marker.py ``hold``); None when not held.
    hold: IO[bytes] | None = field(default=None, compare=False, repr=False)
    #: The array files opened for reading rows (:meth:`rows_file`), by path.
    _files: dict[Path, RowsFile] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    _lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, compare=False, repr=False
    )

    def release(self) -> None:
        """Let the cache go: eviction may remove it once no other run holds it."""
        if self.hold is not None:
            self.hold.close()

    def hand_over(self) -> None:
        """Keep the cache held across this process's ``exec`` (a restart with a new thread
        plan): the lock's descriptor is left open in the new image, named by
        :data:`HELD_FD_ENV`, until the new image holds the cache itself
        (:func:`app.data.cache.prepare`)."""
        if self.hold is not None:
            os.set_inheritable(self.hold.fileno(), True)
            os.environ[HELD_FD_ENV] = str(self.hold.fileno())

    def fingerprint(self, split: str) -> str:
        """What identifies the converted samples of ``split`` ("train"/"test"): a SHA-256
        (16 hex digits) of its features' and labels' digests. It depends only on the values
        (not on file names, compression or modification times)."""
        parts = [self.checksums.get(f"{split}_{a}.f32", "") for a in ("x", "y")]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    def where(self, name: str) -> tuple[Path, int]:
        """The file that holds the array ``name`` (a value of :data:`FILES`) and the byte
        offset of its first row: the cache's own file at 0, or the source read in place."""
        return self.in_place.get(name, (self.path / name, 0))

    def lost(self, path: Path) -> Lost:
        """The error of the array file ``path`` (this cache's, or a source it reads in
        place) found ``what`` while the run reads it: a source is the data's (DataError,
        exit 3: a rerun once it is whole resumes), a cache file the storage's (exit 4)."""
        if any(path == where for where, _ in self.in_place.values()):
            return lambda what: DataError(
                f"{path}: {what} while this run read it where it lies (not a copy): the run "
                "stops here, its checkpoints kept; rerun once the file is complete (the "
                "same values resume the run)"
            )
        return lambda what: StorageError(
            f"{path}: cache file {what} while this run read it; delete {self.path}"
        )

    def rows_file(self, where: tuple[Path, int], nbytes: int) -> RowsFile:
        """The file ``where`` names (app/data/cache/rows.py), opened once for the run,
        whose rows take ``nbytes`` from its offset. Raises StorageError (it can't be
        opened)."""
        path, base = where
        with self._lock:
            if path not in self._files:
                try:
                    self._files[path] = RowsFile(path, base + nbytes, self.lost(path))
                except OSError as exc:
                    raise StorageError(f"{path}: cannot read: {exc.strerror}") from exc
            return self._files[path]

    def _rows(self, split: str, what: str) -> tuple[RowsFile, int, int]:
        """The file of ``split``'s ``what`` ("features"/"labels"), the byte offset of its
        rows and a row's bytes."""
        n = self.train_size if split == "train" else self.test_size
        row = 4 * (self.height * self.width if what == "features" else self.num_outputs)
        where = self.where(f"{split}_{'x' if what == 'features' else 'y'}.f32")
        return self.rows_file(where, n * row), where[1], row

    def check(self, split: str, what: str) -> None:
        """Raises the file's error (:meth:`lost`) when ``split``'s ``what`` ("features" /
        "labels") is shorter than its rows: after a read of a memory map, whose last page
        reads zeros past a new end, not a SIGBUS."""
        self._rows(split, what)[0].check()

    def features(self, split: str) -> np.memmap:
        """Memory-mapped raw features of ``split`` ("train"/"test"), shape (N, H, W)."""
        n = self.train_size if split == "train" else self.test_size
        return self._map(f"{split}_x.f32", (n, self.height, self.width))

    def read_rows(self, split: str, what: str, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` (sorted int array) of ``what`` ("features" → (len, H, W), "labels" →
        (len, K)) read with ``preadv`` (app/data/cache/rows.py).

        Unlike slicing the memory map, the pages read are not left mapped in the
        process, so its RSS stays bounded by a batch however large the data set.
        Raises the file's error (:meth:`lost`) when it is shorter than the manifest says.
        """
        shape = (self.height, self.width) if what == "features" else (self.num_outputs,)
        out = np.empty((len(idx), *shape), np.float32)
        if len(idx):
            file, base, row = self._rows(split, what)
            file.read(idx, base, row, memoryview(out.reshape(-1).view(np.uint8).data))
        return out

    def labels(self, split: str) -> np.memmap:
        """Memory-mapped raw labels of ``split``, shape (N, K)."""
        n = self.train_size if split == "train" else self.test_size
        return self._map(f"{split}_y.f32", (n, self.num_outputs))

    def _map(self, name: str, shape: tuple[int, ...]) -> np.memmap:
        """A read-only float32 memory map of the array ``name`` (a symlink is not
        followed), watched for the SIGBUS of a file cut short under it (app/signals.py)."""
        path, offset = self.where(name)
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
            watch_mapped(f.fileno(), offset + 4 * int(np.prod(shape)), self.lost(path))
            return np.memmap(f, np.float32, "r", offset=offset, shape=shape)


def digest(directory: Dir, name: str) -> str:
    """The :data:`CHECKSUM` of the file ``name`` in ``directory`` (hex). Raises OSError,
    StorageError (a symlink)."""
    return digested(directory, name)[0]


def hasher() -> Any:
    """A new digest of :data:`CHECKSUM` (hashlib's ``update`` / ``hexdigest``)."""
    return hashlib.blake2b(digest_size=32)


def digested(directory: Dir, name: str) -> tuple[str, list[int]]:
    """:func:`digest` of ``name`` and its :func:`file_status` taken before it was read."""
    h = hasher()
    buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    with open(directory.open(name, os.O_RDONLY), "rb", buffering=0) as f:
        status = file_status(os.fstat(f.fileno()))
        while got := f.readinto(buf):
            h.update(view[:got])
    return h.hexdigest(), status


def file_status(st: os.stat_result) -> list[int]:
    """What identifies a file's content without reading it: [device, inode, size,
    modification time (ns), change time (ns)]."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _verify(d: Dir, names: list[str], checksums: dict[str, str]) -> None:
    """Check the files ``names`` in ``d`` against ``checksums`` (the manifest's), reading
    only those not recorded in :data:`VERIFIED` with the same digest and status; record
    what was read (best effort: a directory that can't be written is verified again next
    time). Raises Corrupt naming the first that does not match, OSError."""
    try:
        kept = json.loads(d.read_bytes(VERIFIED))
    except (OSError, ValueError, StorageError):
        kept = {}
    now = {}
    for name in names:
        st = d.lstat(name)
        entry = [checksums.get(name), *file_status(st)] if st is not None else None
        if isinstance(kept, dict) and entry is not None and kept.get(name) == entry:
            now[name] = entry
            continue
        found, status = digested(d, name)
        if found != checksums.get(name):
            raise Corrupt(name)
        now[name] = [found, *status]
    if now != kept:
        keep_verified(d, now)


def keep_verified(d: Dir, verified: dict[str, list[Any]]) -> None:
    """Write :data:`VERIFIED` in ``d``: file name → [digest, *status when it was digested]
    (best effort: a directory that can't be written is verified again next time)."""
    with contextlib.suppress(OSError, StorageError):
        d.write_json(VERIFIED, verified)


def npz(arrays: dict[str, np.ndarray]) -> bytes:
    """``arrays`` as the bytes of an .npz file."""
    out = io.BytesIO()
    np.savez(out, allow_pickle=False, **arrays)
    return out.getvalue()


def read_npz(directory: Dir, name: str) -> dict[str, np.ndarray]:
    """The arrays of the .npz file ``name`` in ``directory``, by name."""
    with np.load(io.BytesIO(directory.read_bytes(name))) as found:
        return {k: found[k] for k in found.files}


class Corrupt(Exception):
    """A cache file does not match its recorded digest (or is missing or unreadable)."""


def load(root: Dir, key: str, verify: bool = True) -> DataCache:
    """The cache ``root/key``, its files checked against the manifest's digests first
    (``verify``). Raises Corrupt naming what does not match; StorageError (a symlink, not
    ours)."""
    with root.sub(key, "data cache", create=False) as d:
        try:
            manifest = json.loads(d.read_bytes(MANIFEST))
            if not isinstance(manifest, dict) or not isinstance(manifest.get("checksums"), dict):
                raise ValueError(f"{MANIFEST}: not a coretrain manifest")
            checksums = manifest["checksums"]
            in_place = {
                name: (Path(where["path"]), int(where["offset"]))
                for name, where in manifest.get("in_place", {}).items()
            }
            if verify:
                names = [n for n in [*FILES.values(), STATS] if n not in in_place]
                _verify(d, names, checksums)
            stats = read_npz(d, STATS)
        except (OSError, ValueError, KeyError) as exc:
            raise Corrupt(getattr(exc, "filename", None) or MANIFEST) from exc
    return DataCache(
        path=root.path / key,
        height=manifest["height"],
        width=manifest["width"],
        num_outputs=manifest["num_outputs"],
        train_size=manifest["train_size"],
        test_size=manifest["test_size"],
        feature_mean=stats["feature_mean"],
        feature_std=stats["feature_std"],
        label_mean=stats["label_mean"],
        label_std=stats["label_std"],
        baseline_rmse=manifest["baseline_rmse"],
        checksums=dict(manifest["checksums"]),
        in_place=in_place,
    )


def corrupt_event(path: Path, what: str, problem: str = "", then: str = "converting again") -> None:
    """Log ``cache_corrupt`` (a warning): ``what`` at ``path`` has ``problem`` (default:
    does not match its recorded digest), and what is done instead, ``then``."""
    problem = problem or f"does not match its recorded {CHECKSUM} digest"
    logs.event(
        "cache_corrupt",
        f"{path}: {what} {problem}; {then}",
        level=logging.WARNING,
        path=str(path),
    )
