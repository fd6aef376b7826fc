"""Where a data set's text files are, and what identifies them: found by name, known by content.

Each of the four roles (:data:`ROLES`) is looked up in the data directory as its default
name or that name plus ``.gz`` (data as it arrives compressed), unless a name was given
explicitly; two candidates for one role is a usage error, not a guess. Whether a file is
gzip is decided by its magic bytes when it is read (app/data/formats/textfile/opener.py), whatever
its name. The fingerprint that keys the binary cache is made of what the files *are* —
size, modification time and a sample of their bytes — not of where they were mounted, so
a cache built on the host is reused in a container that mounts the same files elsewhere.
No TensorFlow here.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.errors import ConfigError, DataError

ROLES = ("train_features", "train_labels", "test_features", "test_labels")
DEFAULT_NAMES = {role: f"{role}.txt" for role in ROLES}
GZIP_SUFFIX = ".gz"
#: Bytes read from a file's start and end, and from each of the samples between, for its
#: fingerprint: enough to tell a changed file, little enough to cost nothing at 8 GB.
SAMPLE_BYTES = 1 << 16
SAMPLES = 16


@dataclass(frozen=True)
class Sources:
    """A data set in text: the file of each role (:data:`ROLES`) and how to parse them.

    Features are ``height``×``width`` floats per line; ``allow_nonfinite`` admits
    NaN/Inf tokens.
    """

    paths: Mapping[str, Path]
    height: int
    width: int
    allow_nonfinite: bool = False

    def path(self, role: str) -> Path:
        """The file of ``role`` (a key of :data:`ROLES`)."""
        return Path(self.paths[role])


def find(data_dir: Path, role: str, name: str | None = None) -> Path:
    """The file of ``role`` in ``data_dir``: ``name`` if given, else the default name or
    the default name + ``.gz``.

    Raises DataError (exit 3) when none exists, ConfigError (exit 2) when both the plain
    and the ``.gz`` name exist (which one is meant can't be known).
    """
    if name is not None:
        return regular(data_dir / name)
    plain = data_dir / DEFAULT_NAMES[role]
    packed = plain.with_name(plain.name + GZIP_SUFFIX)
    found = [p for p in (plain, packed) if p.exists()]
    if len(found) == 2:
        raise ConfigError(
            f"{data_dir}: both {plain.name} and {packed.name} are there for the "
            f"{role.replace('_', ' ')}: remove one, or name it with "
            f"--{role.replace('_', '-')}"
        )
    if not found:
        raise DataError(
            f"{plain}: missing data file ({role.replace('_', ' ')}; also looked for {packed.name})"
        )
    return regular(found[0])


#: What a path that is not a regular file is, for the message.
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def regular(path: Path) -> Path:
    """``path`` when it is a regular file (a symlink is followed: the data directory is the
    operator's) or missing (reported where it is read); checked with ``stat``, before
    anything opens it.

    Raises DataError (exit 3) naming the file when it is a FIFO, a device, a socket or a
    directory: opening a FIFO for reading blocks until a writer comes, a device or a
    socket is no data set, and neither can be fingerprinted or resumed.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from exc
    if not stat.S_ISREG(st.st_mode):
        kind = next((what for test, what in _KINDS if test(st.st_mode)), "not a file")
        raise DataError(f"{path}: data file is {kind}, not a regular file")
    return path


def fingerprint(path: Path) -> dict[str, object]:
    """What identifies ``path``'s content: size (bytes), modification time (ns) and a
    SHA-256 of its first and last :data:`SAMPLE_BYTES` and :data:`SAMPLES` evenly spaced
    samples between. Raises DataError (missing or unreadable)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            digest = hashlib.sha256()
            size = st.st_size
            between = [size * i // (SAMPLES + 1) for i in range(1, SAMPLES + 1)]
            for offset in dict.fromkeys([0, *between, max(size - SAMPLE_BYTES, 0)]):
                digest.update(os.pread(f.fileno(), SAMPLE_BYTES, offset))
    except FileNotFoundError as exc:
        raise DataError(f"{path}: missing data file") from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from exc
    return {"bytes": size, "mtime_ns": st.st_mtime_ns, "sample_sha256": digest.hexdigest()}
