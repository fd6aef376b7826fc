"""Several data sets side by side in one cache directory, and which of them go.

The rule (README, "The data cache"; docs/architecture.md): after a run has its cache, the
marked caches of the directory (app/data/cache/marker.py) are taken newest first by last
use (the marker's modification time, set whenever a run uses the cache), the run's own
first; they are kept while they fit within ``--cache-keep`` caches and
``--cache-keep-bytes`` bytes; once one does not fit, it and every older one are removed,
except those a live run holds (its shared lock on the marker): those stay, and count. What
coretrain can't prove it made is never removed; a cache an earlier coretrain made without
a marker is named in a ``cache_unmarked`` warning and left alone. Never imports TensorFlow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app import logs
from app.atomic import Dir
from app.data.cache import marker
from app.data.cache.store import MANIFEST

#: Default of ``--cache-keep``: the data sets a cache directory keeps.
KEEP = 4


@dataclass(frozen=True)
class Keep:
    """The bound of a cache directory: at most ``count`` caches (≥ 1) of at most ``bytes``
    bytes together (None: no byte bound). The run's own cache is always kept."""

    count: int = KEEP
    bytes: int | None = None


@dataclass(frozen=True)
class Entry:
    """A marked cache: its name (the key), last use (ns since the epoch) and size (bytes)."""

    name: str
    last_used: int
    size: int


def _entry(root: Dir, name: str) -> Entry | None:
    """The marked cache ``name`` of ``root``, or None when it is not one."""
    if marker.owned(root, name) != "cache":
        return None
    try:
        with root.sub(name, create=False) as d:
            sizes = [st.st_size for n in d.names() if (st := d.lstat(n)) is not None]
            mark = d.lstat(marker.MARKER)
    except OSError:
        return None
    if mark is None:
        return None
    return Entry(name, mark.st_mtime_ns, sum(sizes))


def _unmarked(root: Dir, name: str) -> bool:
    """Whether ``name`` looks like a cache of an earlier coretrain: a directory named as a
    key, with a manifest, and no marker."""
    return (
        marker.KEY.fullmatch(name) is not None
        and root.is_file(f"{name}/{MANIFEST}")
        and marker.owned(root, name) is None
    )


def evict(root: Dir, current: str, keep: Keep) -> list[Entry]:
    """Apply the rule (module docstring) to ``root``, where the run uses the cache
    ``current``; return the caches removed (each logged as ``cache_evicted``)."""
    names = [n for n in root.names() if root.is_dir(n)]
    found = [e for n in names if n != current and (e := _entry(root, n)) is not None]
    own = _entry(root, current)
    count, total = 1, own.size if own is not None else 0
    full, removed = False, []
    for entry in sorted(found, key=lambda e: (e.last_used, e.name), reverse=True):
        fits = count < keep.count and (keep.bytes is None or total + entry.size <= keep.bytes)
        full = full or not fits
        if full and marker.remove_if_unused(root, entry.name):
            removed.append(entry)
            logs.event(
                "cache_evicted",
                f"removed the data cache {root.path / entry.name} ({entry.size:,} bytes), "
                f"least recently used beyond {keep.count} caches"
                + (f" or {keep.bytes:,} bytes" if keep.bytes is not None else ""),
                path=str(root.path / entry.name),
                bytes=entry.size,
                last_used_ns=entry.last_used,
            )
            continue
        count, total = count + 1, total + entry.size  # kept, or in use by a live run
    old = [n for n in names if _unmarked(root, n)]
    if old:
        logs.event(
            "cache_unmarked",
            f"{root.path}: left alone, without coretrain's marker (an earlier version's "
            f"caches?): {', '.join(old)}; remove them by hand when no run uses them",
            level=logging.WARNING,
            path=str(root.path),
            names=old,
        )
    return removed
