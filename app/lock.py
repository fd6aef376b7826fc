"""One run per output directory: an exclusive ``fcntl`` lock on ``<output>/.lock``.

The kernel releases the lock when the holder exits, however it exits
(kill -9 included), so a stale lock file never blocks the next run. A run that restarts
itself with a new thread plan (``exec``) hands its open lock to the new image through
:data:`HELD_FD_ENV`, so no other run can slip in between. The lock file is opened with
``O_NOFOLLOW`` relative to the output directory's descriptor (app/atomic.py): a planted
symlink or a file of another owner is exit 4, and nothing is written to it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from app.atomic import Dir, open_dir, probe_writable
from app.errors import OutputLocked

LOCK_NAME = ".lock"
#: File descriptor of the lock this process inherited from its previous image (internal).
HELD_FD_ENV = "_CORETRAIN_LOCK_FD"


def _inherited(directory: Dir) -> int | None:
    """The lock file handed over by the previous image of this process, if it is this
    directory's."""
    raw = os.environ.pop(HELD_FD_ENV, "")
    if not raw.isdigit():
        return None
    fd = int(raw)
    try:
        here = directory.lstat(LOCK_NAME)
        same = here is not None and os.path.samestat(os.fstat(fd), here)
    except OSError:
        return None
    return fd if same else None


def acquire(output_dir: Path, below: Path | None = None) -> IO[str]:
    """Take the lock without waiting; keep the returned file open while running.

    ``below``: the operator's output directory when ``output_dir`` lies inside it (a
    worker's own directory; app/atomic.py's ``open_dir``). Raises OutputLocked (exit 75)
    if another process holds it, StorageError if the directory can't be created or
    written, or the lock's name is a symlink or not ours.
    """
    path = Path(output_dir) / LOCK_NAME
    with open_dir(output_dir, below=below) as directory:
        probe_writable(directory, "output directory")
        fd = _inherited(directory)
        if fd is None:
            fd = directory.open(LOCK_NAME, os.O_RDWR | os.O_CREAT, "lock file")
    handle = os.fdopen(fd, "r+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        raw = handle.read(32).strip()
        handle.close()
        holder = raw if raw.isdigit() else repr(raw[:20]) if raw else "unknown"
        raise OutputLocked(
            f"{path}: another coretrain run (pid {holder}) is using this output directory"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
