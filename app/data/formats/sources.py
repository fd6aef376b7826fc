"""Where a data set's files are, and what identifies them: found by name, known by content.

Each of the four roles (:data:`ROLES`) is looked up in the data directory under one of its
default names (:data:`CANDIDATES`: ``<role>.txt``, ``<role>.txt.gz``, ``<role>.npy``),
unless a name was given explicitly; two candidates for one role is a usage error, not a
guess. A data *file* (``--data FILE``: a .npz or HDF5 container) holds the four as arrays
named after their roles. Which format a file is in is decided by its content when it is
read (app/data/formats/detect.py), whatever its name.
The fingerprint that keys the binary cache is made of what the files *are* — size,
modification and status change times and a sample of their bytes — not of where they were
mounted, so a cache built on the host is reused in a container that mounts the same files
elsewhere.
No TensorFlow here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.data.formats import files, hdf5
from app.data.formats.base import Array
from app.data.formats.detect import open_array
from app.errors import ConfigError, DataError

ROLES = ("train_features", "train_labels", "test_features", "test_labels")
#: The names a role's file is found by, in this order in messages.
SUFFIXES = (".txt", ".txt.gz", ".npy")
#: Bytes read from a file's start and end, and from each of the samples between, for its
#: fingerprint: enough to tell a changed file, little enough to cost nothing at 8 GB.
SAMPLE_BYTES = 1 << 16
SAMPLES = 16


@dataclass(frozen=True)
class Sources:
    """A data set: the file of each role (:data:`ROLES`), the array in it (``members``,
    for a container) and how to read them.

    Features are ``height``×``width`` values per row; ``allow_nonfinite`` admits NaN/Inf.
    """

    paths: Mapping[str, Path]
    height: int
    width: int
    allow_nonfinite: bool = False
    members: Mapping[str, str] = field(default_factory=dict)

    def path(self, role: str) -> Path:
        """The file of ``role`` (a key of :data:`ROLES`)."""
        return Path(self.paths[role])

    def label(self, role: str) -> str:
        """How messages name ``role``'s data: ``FILE``, or ``FILE:array`` in a container."""
        member = self.members.get(role)
        return f"{self.path(role)}:{member}" if member else str(self.path(role))

    def fingerprints(self) -> dict[str, dict[str, object]]:
        """:func:`fingerprint` of each role's file, by role; a file of several roles (a
        container holds all four) read once. Raises DataError (missing or unreadable)."""
        of: dict[Path, dict[str, object]] = {}
        for role in ROLES:
            path = self.path(role)
            if path not in of:
                read = [
                    self.members[r] for r in ROLES if self.path(r) == path and r in self.members
                ]
                of[path] = fingerprint(path, read)
        return {role: of[self.path(role)] for role in ROLES}

    def array(self, role: str) -> Array:
        """``role``'s data through the format seam (app/data/formats/base.py). Raises
        DataError (missing, unreadable, not the format its content says)."""
        return open_array(self.path(role), self.members.get(role))


def in_container(path: Path, names: Mapping[str, str | None]) -> dict[str, str]:
    """The members of the four roles in the container ``path`` (``--data FILE``): the
    array ``names[role]`` when given (``--train-features NAME``), else the one named after
    the role."""
    return {role: names.get(role) or role for role in ROLES}


def find(data_dir: Path, role: str, name: str | None = None) -> Path:
    """The file of ``role`` in ``data_dir``: ``name`` if given, else the one of its
    default names (:data:`SUFFIXES`) that exists. What it is (a regular file) is decided
    where it is opened (app/data/formats/files.py).

    Raises DataError (exit 3) when none exists (or ``data_dir`` is a FIFO, a device or a
    socket), ConfigError (exit 2) when two exist (which one is meant can't be known).
    """
    if name is not None:
        return data_dir / name
    names = [f"{role}{suffix}" for suffix in SUFFIXES]
    found = [data_dir / n for n in names if os.path.lexists(data_dir / n)]
    if len(found) > 1:
        raise ConfigError(
            f"{data_dir}: both {' and '.join(p.name for p in found)} are there for the "
            f"{role.replace('_', ' ')}: remove one, or name it with "
            f"--{role.replace('_', '-')}"
        )
    if not found:
        if not os.path.isdir(data_dir):  # a FIFO or a device given as --data
            files.checked(data_dir, "--data")
        raise DataError(
            f"{data_dir / names[0]}: missing data file ({role.replace('_', ' ')}; also "
            f"looked for {', '.join(names[1:])})"
        )
    return found[0]


def fingerprint(path: Path, members: Iterable[str] = ()) -> dict[str, object]:
    """What identifies ``path``'s content: size (bytes), modification time and status
    change time (ns) and a SHA-256 of its first and last :data:`SAMPLE_BYTES` and
    :data:`SAMPLES` evenly spaced samples between. The status change time is set by the
    kernel at every write and every change of the modification time, and no call sets it
    back: an edit between the samples whose modification time was put back (``touch -r``,
    ``os.utime``, a tool restoring timestamps) still changes the fingerprint; a copy is a
    new file (converted again), a mount of the same file is not. For an HDF5 file, a
    SHA-256 of the values of each of ``members`` (the datasets the run reads in it) that
    lies in another file too (``elsewhere``: app/data/formats/hdf5.py
    ``stored_elsewhere``). Raises DataError (missing, not a regular file, unreadable)."""
    try:
        with files.opened(path) as f:
            st = os.fstat(f.fileno())
            digest = hashlib.sha256()
            size = st.st_size
            between = [size * i // (SAMPLES + 1) for i in range(1, SAMPLES + 1)]
            for offset in dict.fromkeys([0, *between, max(size - SAMPLE_BYTES, 0)]):
                digest.update(os.pread(f.fileno(), SAMPLE_BYTES, offset))
            container = hdf5.is_hdf5(f.fileno(), size)
    except OSError as exc:
        raise files.unreadable(path, exc) from exc
    out: dict[str, object] = {
        "bytes": size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "sample_sha256": digest.hexdigest(),
    }
    if container and (elsewhere := hdf5.stored_elsewhere(path, members)):
        out["elsewhere"] = elsewhere
    return out
