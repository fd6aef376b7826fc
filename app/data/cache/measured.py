"""Measurements kept beside the data caches: measured once, reused while they hold.

A run measures things that cost seconds and outlive its output directory: which formulation
and precision step fastest on this CPU (app/training/state/choose.py) and the linear baseline of
a data set (app/training/inputs/baselines.py). Each is kept in the cache directory (``--cache-dir``,
or the output's ``cache/``) as an entry ``<what>-<key>/`` that holds the marker of
app/data/cache/marker.py (kind ``measured``) and ``entry.json``::

    {"format": 1, "what": "choice", "depends": {...}, "value": {...}, "digest": "<sha256>"}

``depends`` is everything the measurement depends on, spelled out by its user (the CPU
model and flags, TensorFlow's version, the thread plan, the shapes...; the data's
fingerprint, the seed, the settings...); ``key`` is a SHA-256 (16 hex digits) of ``what``
and ``depends``; ``digest`` a SHA-256 of ``what``, ``depends`` and ``value``.

**When it is measured again** (the rule, docs/architecture.md "Kept measurements"): an
entry is reused only when its format is :data:`FORMAT`, its digest matches its content and
its ``depends`` equals this run's exactly. Anything that changes a dependency gives another
key (no entry: measured); a damaged, truncated or foreign entry (or one of another format)
is logged as a ``measured_invalid`` warning, measured again and replaced; so is an entry
a run killed while keeping it left before it was marked (its directory empty, or holding
only the marker's temporary). The newest
:data:`KEEP` entries by last use (the marker's modification time, set by every reuse) are
kept, older ones removed when a new one is written (only under the marker's exclusive
lock: app/data/cache/marker.py). They are not data caches: ``--cache-keep`` does not count
them. Keeping is best effort: a cache directory that can't be written is a
``measured_not_kept`` warning, never a failed run. Never imports TensorFlow.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import logs
from app.atomic import Dir, open_dir
from app.data.cache import marker as cache_marker
from app.errors import StorageError

FORMAT = 1
ENTRY = "entry.json"
#: Kept entries of a cache directory (each a few hundred bytes).
KEEP = 32
#: The largest entry read: a few hundred bytes are written; anything much bigger is not one.
ENTRY_BYTES = 1 << 20
#: The name of a kept measurement: ``<what>-<key>``.
NAME = re.compile(r"[a-z]+-[0-9a-f]{16}")
#: The temporary name the marker is written under before its rename (app/atomic.py
#: ``Dir.write_bytes``).
_MARKER_TEMP = re.compile(rf"\.{re.escape(cache_marker.MARKER)}\.[0-9a-f]{{12}}\.tmp")


@dataclass(frozen=True)
class Store:
    """Where measurements are kept: the cache ``directory`` and the directory the operator
    named that it lies in (``below``: app/atomic.py ``open_dir``; None: itself)."""

    directory: Path
    below: Path | None = None

    def open(self, create: bool) -> Dir:
        """The cache directory. Raises StorageError, FileNotFoundError (``create`` False)."""
        return open_dir(self.directory, "cache directory", below=self.below, create=create)


def key_of(what: str, depends: dict[str, Any]) -> str:
    """The key of a measurement of ``what`` with ``depends`` (16 hex digits)."""
    return _sha256([what, depends])[:16]


def _sha256(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def lookup(store: Store | None, what: str, depends: dict[str, Any]) -> dict[str, Any] | None:
    """The kept value of ``what`` measured with exactly ``depends``; None when there is none
    or it is not valid (logged: module docstring). Its last use is set to now."""
    if store is None:
        return None
    name = f"{what}-{key_of(what, depends)}"
    try:
        with store.open(create=False) as root:
            if root.lstat(name) is None:
                return None
            if cache_marker.owned(root, name) != "measured":
                why = "left unmarked by a killed run" if _killed(root, name) else "not coretrain's"
                return _invalid(root.path / name, f"not a kept measurement: {why}")
            with root.sub(name, "kept measurement", create=False) as d:
                raw = d.read_bytes(ENTRY, ENTRY_BYTES)
                os.utime(cache_marker.MARKER, dir_fd=d.fd, follow_symlinks=False)
    except FileNotFoundError:
        return _invalid(store.directory / name, f"no {ENTRY}") if _exists(store, name) else None
    except (OSError, StorageError) as exc:
        return _invalid(store.directory / name, str(exc))
    problem, value = _check(raw, what, depends)
    if problem:
        return _invalid(store.directory / name / ENTRY, problem)
    return value


def _exists(store: Store, name: str) -> bool:
    return (store.directory / name).is_dir()


def _check(raw: bytes, what: str, depends: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """(what is wrong with the entry ``raw``, or "", its value)."""
    try:
        entry = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "not JSON", None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        return f"not format {FORMAT}", None
    if entry.get("what") != what or entry.get("depends") != depends:
        return "measured for something else", None
    value = entry.get("value")
    if not isinstance(value, dict) or entry.get("digest") != _sha256([what, depends, value]):
        return "does not match its digest", None
    return "", value


def _invalid(path: Path, problem: str) -> dict[str, Any] | None:
    """Log the ``measured_invalid`` warning; None (nothing to reuse)."""
    logs.event(
        "measured_invalid",
        f"{path}: kept measurement not used ({problem}); measuring again",
        level=logging.WARNING,
        path=str(path),
        problem=problem,
    )
    return None


def keep(store: Store | None, what: str, depends: dict[str, Any], value: dict[str, Any]) -> None:
    """Keep ``value``, the measurement of ``what`` with ``depends`` (module docstring);
    a failure is logged (``measured_not_kept``), never raised."""
    if store is None:
        return
    key = key_of(what, depends)
    name = f"{what}-{key}"
    entry = {"format": FORMAT, "what": what, "depends": depends, "value": value}
    entry["digest"] = _sha256([what, depends, value])
    try:
        with store.open(create=True) as root:
            if root.lstat(name) is not None and cache_marker.owned(root, name) != "measured":
                if not _killed(root, name):
                    raise StorageError(f"{root.path / name}: in the way, and not coretrain's")
                root.remove(name)  # a keep killed before its marker: replaced
            with root.sub(name, "kept measurement") as d:
                cache_marker.write(d, cache_marker.MEASURED, key)  # first: provably ours
                if d.is_dir(ENTRY):  # damaged: a rename can't replace a directory
                    d.remove(ENTRY)
                d.write_json(ENTRY, entry)
            tidy(root, KEEP)
    except (OSError, StorageError) as exc:
        logs.event(
            "measured_not_kept",
            f"{store.directory}: the {what} measurement was not kept ({exc})",
            level=logging.WARNING,
            path=str(store.directory),
        )


def _killed(root: Dir, name: str) -> bool:
    """Whether the unmarked entry ``name`` is what a :func:`keep` killed between making its
    directory and marking it left: a real directory of ours that is empty or holds only
    the temporary of the marker's atomic write (:data:`_MARKER_TEMP`), so nothing of
    anyone's is lost by replacing it."""
    try:
        with root.sub(name, "kept measurement", create=False) as d:
            return all(_MARKER_TEMP.fullmatch(found) for found in d.names())
    except (OSError, StorageError):
        return False


def tidy(root: Dir, keep_count: int) -> list[str]:
    """Remove the kept measurements of ``root`` beyond the newest ``keep_count`` by last
    use; return the names removed."""
    found = []
    for name in root.names():
        st = root.lstat(f"{name}/{cache_marker.MARKER}") if NAME.fullmatch(name) else None
        if st is not None and cache_marker.owned(root, name) == "measured":
            found.append((st.st_mtime_ns, name))
    removed = [
        name
        for _, name in sorted(found, reverse=True)[keep_count:]
        if cache_marker.remove_if_unused(root, name)
    ]
    return removed
