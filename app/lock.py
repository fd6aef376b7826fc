"""One run per output directory: an exclusive ``fcntl`` lock on ``<output>/.lock``.

The kernel releases the lock when the holder exits, however it exits
(kill -9 included), so a stale lock file never blocks the next run. A run that restarts
itself with a new thread plan (``exec``) hands its open lock to the new image through
:data:`HELD_FD_ENV`, so no other run can slip in between.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from app.atomic import ensure_dir
from app.errors import OutputLocked, StorageError

LOCK_NAME = ".lock"
#: File descriptor of the lock this process inherited from its previous image (internal).
HELD_FD_ENV = "_CORETRAIN_LOCK_FD"


def _inherited(path: Path) -> IO[str] | None:
    """The lock file handed over by the previous image of this process, if it is ``path``."""
    raw = os.environ.pop(HELD_FD_ENV, "")
    if not raw.isdigit():
        return None
    fd = int(raw)
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return None
    return os.fdopen(fd, "a+", encoding="utf-8") if same else None


def acquire(output_dir: Path) -> IO[str]:
    """Take the lock without waiting; keep the returned file open while running.

    Raises OutputLocked (exit 75) if another process holds it, StorageError if
    the directory can't be created or written.
    """
    path = ensure_dir(output_dir) / LOCK_NAME
    try:
        handle = _inherited(path) or open(path, "a+", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise StorageError(f"{path}: cannot open the lock file: {exc.strerror}") from exc
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise OutputLocked(
            f"{path}: another coretrain run (pid {holder}) is using this output directory"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
