"""What proves that an entry of a cache directory is coretrain's, and the lock of its use.

A cache directory may be shared ground: ``.``, a home directory, ``/data``, a volume with
``.snapshot/``. coretrain removes an entry only when it proves it made it: every directory
it makes there holds :data:`MARKER`, a small JSON file whose content says so
(``{"made_by": "coretrain", "kind": "data-cache" | "cache-work", "key": <key>}``) and which
is checked by content, not by name: :func:`owned` accepts a ``data-cache`` only under its
own key's name, and work only under the names a conversion of that key uses
(``.partial-<key>``, ``.<key>.<pid>.<random>``: app/data/cache/workdir.py). Nothing else
in the directory is touched.

A run holds a shared ``flock`` on its cache's marker from the moment it uses the cache to
its end (:func:`hold`; the kernel drops it when the process ends, however it ends):
eviction (app/data/cache/evict.py) removes a cache only when it gets an exclusive lock on
the marker without waiting (:func:`remove_if_unused`). flock works across containers that
share the volume (one file system), whatever their PID namespaces. A cache's last use is
the marker's modification time, set by every :func:`hold`. Never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from typing import IO

from app.atomic import Dir
from app.errors import StorageError

MARKER = ".coretrain"
MADE_BY = "coretrain"
CACHE = "data-cache"
WORK = "cache-work"
#: A cache key (app/data/cache/entry.py ``source_key``): 16 lowercase hex digits.
KEY = re.compile(r"[0-9a-f]{16}")
#: The largest marker read: a marker is some 80 bytes; anything bigger is not one.
MAX_BYTES = 4096


def content(kind: str, key: str) -> bytes:
    """The marker of a directory of ``kind`` (:data:`CACHE`, :data:`WORK`) for ``key``."""
    return (json.dumps({"made_by": MADE_BY, "kind": kind, "key": key}) + "\n").encode()


def write(d: Dir, kind: str, key: str) -> None:
    """Mark ``d`` as coretrain's ``kind`` of ``key`` (atomic replace). Raises StorageError."""
    d.write_bytes(MARKER, content(kind, key))


def _parse(raw: bytes) -> tuple[str, str] | None:
    """(kind, key) of a marker's bytes; None when they are not a coretrain marker."""
    try:
        found = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(found, dict) or found.get("made_by") != MADE_BY:
        return None
    kind, key = found.get("kind"), found.get("key")
    if kind not in (CACHE, WORK) or not isinstance(key, str) or not KEY.fullmatch(key):
        return None
    return kind, key


def _read(fd: int) -> tuple[str, str] | None:
    """(kind, key) of the marker open as ``fd``; None when it is not a coretrain marker."""
    raw = os.pread(fd, MAX_BYTES + 1, 0)
    return None if len(raw) > MAX_BYTES else _parse(raw)


def is_work_name(name: str, key: str) -> bool:
    """Whether ``name`` is one a conversion of ``key`` works under: ``.partial-<key>``, or
    the private ``.<key>.<pid>.<8 hex digits>`` (app/data/cache/workdir.py ``claim``) — not
    any name that merely starts like one (a user's ``.<key>.bak``)."""
    return (
        name == f".partial-{key}"
        or re.fullmatch(rf"\.{re.escape(key)}\.\d+\.[0-9a-f]{{8}}", name) is not None
    )


def _matches(name: str, found: tuple[str, str] | None) -> str | None:
    """ "cache" or "work" when the marker ``found`` proves ``name`` is coretrain's."""
    if found is None:
        return None
    kind, key = found
    if kind == CACHE and name == key:
        return "cache"
    # a work directory, or one a killed conversion marked done before renaming it
    return "work" if is_work_name(name, key) else None


def _open(root: Dir, name: str) -> tuple[Dir, int] | None:
    """``name``'s directory and its marker opened read-only; None when either is missing,
    not a real directory or file of ours (a symlink, another owner), or unreadable."""
    try:
        d = root.sub(name, create=False)
    except (OSError, StorageError):
        return None
    try:
        return d, d.open(MARKER, os.O_RDONLY, "cache marker")
    except (OSError, StorageError):
        d.close()
        return None


def owned(root: Dir, name: str) -> str | None:
    """ "cache" or "work" when the directory ``name`` in ``root`` holds a marker proving it
    is coretrain's (module docstring); None for anything else, which is never touched."""
    opened = _open(root, name)
    if opened is None:
        return None
    d, fd = opened
    try:
        return _matches(name, _read(fd))
    finally:
        os.close(fd)
        d.close()


def _still_linked(root: Dir, name: str, fd: int) -> bool:
    """Whether ``root/name/MARKER`` is still the file ``fd`` (not removed, not replaced)."""
    st = root.lstat(f"{name}/{MARKER}")
    return st is not None and os.path.samestat(os.fstat(fd), st)


def hold(root: Dir, key: str) -> IO[bytes] | None:
    """A shared lock on the cache ``key``'s marker, held while the returned file is open;
    its last use set to now. None when ``root/key`` is not a marked cache, or was removed
    while waiting for the lock (an eviction holds it exclusively for a moment)."""
    opened = _open(root, key)
    if opened is None:
        return None
    d, fd = opened
    d.close()
    handle = os.fdopen(fd, "rb")
    fcntl.flock(handle, fcntl.LOCK_SH)
    if _matches(key, _read(fd)) != "cache" or not _still_linked(root, key, fd):
        handle.close()
        return None
    with contextlib.suppress(OSError):  # a read-only volume: the cache is used all the same
        os.utime(fd)
    return handle


def remove_if_unused(root: Dir, name: str) -> bool:
    """Remove the marked cache ``name`` when no run holds it (an exclusive lock on its
    marker, not waited for); True when removed. Everything but the marker goes first, so a
    removal cut short leaves a marked, incomplete cache that the next run removes."""
    opened = _open(root, name)
    if opened is None:
        return False
    d, fd = opened
    with d, os.fdopen(fd, "rb") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if _matches(name, _read(fd)) is None or not _still_linked(root, name, fd):
            return False
        for entry in d.names():
            if entry != MARKER:
                d.remove(entry)
        if any(entry != MARKER for entry in d.names()):
            return False  # something could not be removed: the marker keeps it provably ours
        d.remove(MARKER)
    try:
        os.rmdir(name, dir_fd=root.fd)
    except OSError:
        return False
    return True
