"""The work directory of a cache conversion: claimed, published, left after a failure, and
removed once its conversion is dead.

A conversion is built in ``<cache_dir>/.partial-<key>/`` (:data:`PARTIAL`) and renamed
into place (:func:`swap_in`), so a reader never sees a partial cache; what a stopped
conversion finished stays there for the next run (:func:`leave`). The converting process
holds an flock on the directory's ``.owner`` file (:data:`OWNER`): a second run converting
the same data at once works in a private ``.<key>.<pid>.<random>`` directory instead
(:func:`claim`). Each work directory is marked as coretrain's (app/data/cache/marker.py)
once its ``.owner`` lock is held, so a marked work directory nobody holds is a dead
conversion's, removed (:func:`remove_stale`); a directory without the marker is not
coretrain's to remove, whatever its name. Never imports TensorFlow.
"""

from __future__ import annotations

import fcntl
import os
from typing import IO

from app import logs
from app.atomic import Dir
from app.data.cache import marker
from app.data.cache.store import MANIFEST
from app.errors import StorageError

OWNER = ".owner"  # flock-ed by the process converting into a work directory
PARTIAL = ".partial-"  # the resumable work directory of a key: <cache_dir>/.partial-<key>


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not: killed, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _in_use(root: Dir, name: str) -> bool:
    """Whether a live conversion owns the temporary directory ``name`` in ``root``.

    The converting process holds an flock on ``<name>/.owner``; the kernel drops it when
    that process dies however it dies, and flock works across PID namespaces (two
    containers sharing a cache volume, both pid 7). Without ``.owner`` (the moment
    after its directory was made) the pid in the name decides.
    """
    try:
        with root.sub(name, create=False) as tmp:
            handle = open(tmp.open(OWNER, os.O_RDONLY), "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        fields = name.split(".")  # ".<key>.<pid>.<random>"
        return len(fields) > 2 and fields[2].isdigit() and _pid_alive(int(fields[2]))
    except (OSError, StorageError):
        return True  # can't tell (or not ours): leave it
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def remove_stale(root: Dir, key: str) -> None:
    """Remove the work directories of dead conversions: marked as coretrain's work
    (app/data/cache/marker.py), no live process holding their ``.owner``, and not another
    data set's resumable ``.partial-<key>`` (a stopped conversion keeps its finished files
    for its own data's next run, which converts only the rest). Nothing else."""
    for name in root.names():
        if not (name.startswith(".") and root.is_dir(name)):
            continue
        resumable = name.startswith(PARTIAL) and name != f"{PARTIAL}{key}"
        if not resumable and marker.owned(root, name) == "work" and not _in_use(root, name):
            root.remove(name)


def claim(root: Dir, key: str) -> tuple[Dir, IO[bytes]]:
    """The work directory of ``key`` and its held ``.owner`` lock: ``.partial-<key>``
    (resumable: the temporaries of atomic writes a killed run left, ``.<name>.<hex>.tmp``,
    removed) unless another live run converts the same data there; then a private one.
    Raises OSError, StorageError (a symlink or another owner's directory)."""
    partial = root.sub(f"{PARTIAL}{key}", "cache work directory")
    owner = open(partial.open(OWNER, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")  # noqa: SIM115
    try:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        marker.write(partial, marker.WORK, key)  # held first, then marked
        for name in partial.names():  # an atomic write a killed run left half done
            if name.startswith(".") and name.endswith(".tmp"):
                partial.remove(name)
        return partial, owner
    except BlockingIOError:
        owner.close()
        partial.close()
    private = root.temp_dir(f".{key}.{os.getpid()}.")
    owner = open(private.create(OWNER, "cache owner lock"), "wb")  # noqa: SIM115 - held
    fcntl.flock(owner, fcntl.LOCK_EX)
    marker.write(private, marker.WORK, key)
    return private, owner


def leave(root: Dir, work: Dir, keep: str) -> None:
    """After a conversion that did not finish: keep everything in ``work`` ("all"), only
    its finished files ("finished": ``.part`` files go), or nothing ("")."""
    if keep == "all":
        return
    if keep == "finished":
        for name in work.names():
            if name.endswith(".part"):
                work.remove(name)
        return
    root.remove(work.path.name)


def swap_in(root: Dir, work: Dir, key: str) -> None:
    """Rename the finished ``work`` to ``key``; when another run sharing the directory
    finished the same data set first (ENOTEMPTY/EEXIST), its complete, identical cache is
    used. The work's marker becomes the cache's first. Raises OSError, StorageError."""
    marker.write(work, marker.CACHE, key)
    try:
        root.publish(work, key)
    except OSError:
        if not root.is_file(f"{key}/{MANIFEST}"):
            raise
        logs.event(
            "cache", f"using the same cache built by another run: {root.path / key}",
            path=str(root.path / key),
        )  # fmt: skip
        return
    os.unlink(OWNER, dir_fd=work.fd)
