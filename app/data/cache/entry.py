"""The binary data cache: the text files parsed once into raw float32 arrays.

:func:`prepare` is the entry: it reuses the verified cache of the sources when there is
one, else checks the bounds (app/data/cache/bounds.py: the label columns and the cache's
estimated size) and converts. The cache's ``key`` hashes what the source files are (size,
modification time and a sample of their bytes: app/data/formats/sources.py), not where they are,
plus the parse settings: an unchanged data set is reused wherever it is mounted, a
changed one is converted again.

The parts, each in its module:

* app/data/cache/store.py -- the layout on disk, :class:`DataCache`, the digests and
  reading a cache back verified;
* app/data/cache/workdir.py -- the work directory a conversion is built in: claimed, renamed
  into place, kept for resuming, removed when dead;
* app/data/cache/marker.py -- what proves an entry is coretrain's, and the lock a run holds
  on the cache it uses;
* app/data/cache/evict.py -- several data sets side by side: which caches go, and when;
* app/data/cache/convert.py -- the conversion itself: each file, the statistics, the
  manifest, progress.

Never imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

from app import logs
from app.atomic import Dir, open_dir
from app.data.cache import bounds, convert, marker
from app.data.cache.evict import Keep, evict
from app.data.cache.store import (
    FORMAT_VERSION,
    HELD_FD_ENV,
    Corrupt,
    DataCache,
    corrupt_event,
    load,
)
from app.data.cache.workdir import OWNER, PARTIAL, claim, leave, remove_stale, swap_in
from app.data.formats.sources import ROLES, Sources
from app.errors import Preempted, StorageError

__all__ = ["OWNER", "PARTIAL", "DataCache", "Keep", "prepare", "source_key"]


def prepare(
    sources: Sources,
    cache_dir: Path,
    stop: Callable[[], bool] = lambda: False,
    threads: int = 1,
    below: Path | None = None,
    max_bytes: int | None = None,
    keep: Keep | None = None,
    key: str | None = None,
) -> DataCache:
    """Return the cache of ``sources`` in ``cache_dir``, converting the data if needed.
    ``key``: their :func:`source_key`, when the caller has it already.

    ``threads``: threads that parse a large plain-text file, each a byte range of it at
    a time (:mod:`app.data.formats.textfile.parallel`); the caller sizes it from the CPU budget. 1
    reads
    each file in one pass. ``below``: the directory the operator named that ``cache_dir``
    lies in (app/atomic.py's ``open_dir``; default ``cache_dir`` itself). ``max_bytes``:
    ``--max-cache-bytes`` (app/data/cache/bounds.py; None: the free space alone bounds it).

    ``stop`` is polled between chunks; when it returns True the files already converted
    are kept for the next run (in ``.partial-<key>``) and Preempted is raised. Raises
    DataError for bad input (file:line: problem), InputTooLarge (exit 3) when the cache
    would pass its bound, StorageError when the cache can't be written (or a name in it is
    a symlink or another owner's). A cache whose files don't match their digests is
    logged (``cache_corrupt``) and converted again.

    The returned cache holds a shared lock on its marker (``DataCache.hold``) until it is
    released or the process ends: no other run evicts it meanwhile. Then the directory is
    tidied: work directories of dead conversions are removed, and the caches of other
    data sets beyond ``keep`` (``--cache-keep``, ``--cache-keep-bytes``; None: the
    defaults) by the rule of app/data/cache/evict.py; only entries with coretrain's
    marker, never anything else.
    Two runs converting the same data into a shared cache directory at once both succeed:
    the second works in a private directory, and its rename finds the first one's complete
    cache.
    """
    key = key or source_key(sources)
    with open_dir(Path(cache_dir), "cache directory", below=below) as root:
        cache = _reuse(root, key)
        if cache is None:
            k = bounds.label_width(sources)
            _check_size(root, key, sources, k, max_bytes)
            cache = _build(root, key, sources, k, stop, threads, max_bytes)
        _drop_inherited(cache)
        remove_stale(root, key)
        evict(root, key, keep or Keep())
        return cache


def _drop_inherited(cache: DataCache) -> None:
    """Close the lock on this cache that the previous image of this process handed over
    (``DataCache.hand_over``), now that ``cache`` holds it; a descriptor that is not that
    lock is left alone (a lock on another cache then lasts until the process ends)."""
    raw = os.environ.pop(HELD_FD_ENV, "")
    if not raw.isdigit() or cache.hold is None:
        return
    try:
        same = os.path.samestat(os.fstat(int(raw)), os.fstat(cache.hold.fileno()))
    except OSError:
        return
    if same:
        os.close(int(raw))


def _reuse(root: Dir, key: str) -> DataCache | None:
    """The complete, verified cache ``key`` in ``root``, held; None when there is none, or
    it did not verify (logged, removed). Raises StorageError when ``key`` is there but
    can't be proven coretrain's, or did not verify and another run holds it."""
    root.check(key, "data cache")
    final = root.path / key
    if not root.is_dir(key):
        return None
    held, adopted = marker.hold(root, key), False
    if held is None:
        held = _adopt(root, key)
        adopted = held is not None
    if held is None:
        return None
    try:
        cache = load(root, key, verify=not adopted)  # an adopted cache was verified just now
    except Corrupt as exc:
        held.close()
        corrupt_event(final / str(exc.args[0]), "the cached file")
        if marker.remove_if_unused(root, key):
            return None
        raise StorageError(
            f"{final}: data cache does not match its digests and another run is using it; "
            "rerun when that run has ended"
        ) from None
    logs.event("cache", f"reusing data cache {final}", path=str(final), reused=True)
    return dataclasses.replace(cache, hold=held)


def _adopt(root: Dir, key: str) -> IO[bytes] | None:
    """The cache ``key`` made by an earlier coretrain, without a marker: marked and held
    when its manifest's digests verify (the key names exactly these data and settings);
    None when it is gone. Raises StorageError when it is something else: not coretrain's
    to remove, and in the way of the cache."""
    if marker.owned(root, key) is not None or not root.is_dir(key):
        return None  # marked (removed while waiting for the lock), or gone
    with root.sub(key, "data cache", create=False) as d:
        if not d.names():
            return None  # the moment an eviction has unlinked the marker, before rmdir
    try:
        load(root, key)
    except Corrupt:
        raise StorageError(
            f"{root.path / key}: in the way of the data cache and not coretrain's (no "
            f"{marker.MARKER} marker, no verified cache): move it away"
        ) from None
    with root.sub(key, "data cache", create=False) as d:
        marker.write(d, marker.CACHE, key)
    logs.event(
        "cache", f"{root.path / key}: an earlier coretrain's cache, verified and marked",
        path=str(root.path / key), adopted=True,
    )  # fmt: skip
    return marker.hold(root, key)


def _check_size(root: Dir, key: str, sources: Sources, k: int, max_bytes: int | None) -> None:
    """Refuse, before converting, a data set whose estimated cache passes the bound; the
    files a stopped conversion finished count as done."""
    partial = f"{PARTIAL}{key}"
    todo = tuple(r for r in ROLES if not root.is_file(f"{partial}/{r}.json"))
    estimates = bounds.estimate(sources, k, todo)
    bounds.check(sources, estimates, bounds.bound(root.path, max_bytes))


def _build(
    root: Dir, key: str, sources: Sources, k: int, stop: Callable[[], bool], threads: int,
    max_bytes: int | None,
) -> DataCache:  # fmt: skip
    """Convert ``sources`` into ``root/key`` (see :func:`prepare`)."""
    final = root.path / key
    try:
        work, owner = claim(root, key)
    except OSError as exc:
        raise StorageError(f"{root.path}: cannot create the data cache: {exc.strerror}") from exc
    resumed = [role for role in ROLES if work.is_file(f"{role}.json")]
    logs.event(
        "cache",
        f"converting the data into {final}"
        + (f" (resuming: {', '.join(resumed)} already done)" if resumed else ""),
        path=str(final),
        reused=False,
        resumed=resumed,
    )
    keep = ""  # what is kept of a resumable work directory: "finished" files, or "all"
    progress = convert.Progress(sum(sources.array(role).size for role in ROLES))
    guard = bounds.Guard(bounds.bound(root.path, max_bytes))
    resumable = work.path.name.startswith(PARTIAL)
    try:
        run = convert.Run(sources, work, k, threads, stop, progress, guard)
        manifest = convert.convert(run)
        swap_in(root, work, key)
    except Preempted:
        keep = "finished" if resumable else ""  # the finished files wait for the next run
        raise
    except StorageError:
        keep = "all" if resumable else ""  # e.g. a planted symlink in it: touch nothing
        raise
    except OSError as exc:
        raise StorageError(f"{root.path}: cannot write the data cache: {exc.strerror}") from exc
    finally:
        leave(root, work, keep)
        work.close()
        owner.close()
    held = marker.hold(root, key)
    if held is None:
        raise StorageError(f"{final}: the data cache was removed as soon as it was made")
    logs.event(
        "cache",
        f"data cache ready: {manifest['train_size']} train, {manifest['test_size']} test samples",
        path=str(final),
        train_size=manifest["train_size"],
        test_size=manifest["test_size"],
        num_outputs=manifest["num_outputs"],
    )
    return dataclasses.replace(load(root, key, verify=False), hold=held)


def source_key(sources: Sources) -> str:
    """Hash of what the sources are (:func:`app.data.formats.sources.fingerprint` of each file)
    and the parse settings. Raises DataError naming a missing or unreadable file."""
    parts: list[object] = [FORMAT_VERSION, sources.height, sources.width, sources.allow_nonfinite]
    found = sources.fingerprints()
    parts += [found[role] for role in ROLES]
    if sources.members:  # the arrays of a container (a text data set's key is unchanged)
        parts.append([sources.members.get(role) for role in ROLES])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
