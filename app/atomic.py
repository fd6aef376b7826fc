"""Atomic file output: write to a temporary name in the same directory, then rename.

A reader (or a run killed half-way) sees either the old file or the new one,
never a partial one (rename(2) is atomic within one file system).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from app.errors import StorageError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()
_MODE = 0o666 & ~_UMASK


def ensure_dir(directory: Path, what: str = "output directory") -> Path:
    """Create ``directory`` (and parents) if needed and check that files can be made in it.

    The check creates an unnamed temporary file (``O_TMPFILE`` where the file system has
    it, else a random name removed at once), so nothing is left behind and no planted
    name is followed. Raises StorageError naming the directory.
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise StorageError(f"{directory}: {what} not writable: {exc.strerror}") from exc
    return directory


def write_bytes(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data`` (fsynced). Raises StorageError."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise StorageError(f"{path}: cannot create a temporary file: {exc.strerror}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _MODE)  # mkstemp creates 0600; give the usual mode
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise StorageError(f"{path}: cannot write: {exc.strerror}") from exc


def write_json(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON (UTF-8). Raises StorageError."""
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def temp_dir(parent: Path, prefix: str) -> Path:
    """A new directory in ``parent`` to build output in before renaming it into place.

    Unlike ``tempfile.mkdtemp`` (mode 0700) it gets the usual mode (0777 minus
    the umask), so a group-shared output volume stays readable. Raises OSError.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o777 & ~_UMASK)
    return path
