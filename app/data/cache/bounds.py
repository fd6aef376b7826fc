"""How big a data set's cache and labels may get, decided before converting and held while
converting. No TensorFlow here.

Text expands when it becomes float32: a value written as ``1`` and a separator (2 bytes)
becomes 4, and gzip packs repetitive text a thousandfold, so a small compressed file can
fill a volume. Before converting, :func:`estimate` predicts each file's cache from its
first lines (bytes per line) and its size as far as that is known cheaply (a plain file's
size; for gzip the trailer's ISIZE, RFC 1952); :func:`check` refuses a data set whose
estimate passes the bound (exit 3, one line): the free space of the cache's file system
(``statvfs``) or ``--max-cache-bytes``, the smaller. As the trailer can understate (a
multi-member file, or 4 GiB and more: it holds the size modulo 2**32) and first lines can
be longer than the rest, a :class:`Guard` also counts the bytes written and stops the
conversion as soon as they pass the bound (exit 3; the file's partial array is removed).

Label columns are bounded too (:data:`MAX_OUTPUTS`), checked on the first line (or the
header) of the training labels before anything else is read. An array read in place
(app/data/formats/base.py, ``Place``) adds nothing to the cache: its estimate is 0.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from app.atomic import file_system
from app.data.formats.base import Shape
from app.data.formats.sources import Sources
from app.errors import InputTooLarge

#: Most label columns (K) a data set may have. The seed's task has K = 3; 10,000 keeps one
#: batch of 1000 labels at 40 MB and the last layer at 200,000 weights. A first line with
#: more is taken for a wrong file (a transposed matrix, features given as labels).
MAX_OUTPUTS = 10_000


def label_width(sources: Sources) -> int:
    """K >= 1: the values per row of the training labels, from the first line of a text
    file (counted without parsing more than :data:`MAX_OUTPUTS` fields) or an array's
    header. Raises DataError naming the file (and array or line) when there are more, when
    it can't be read, and when there is no first row."""
    return sources.array("train_labels").columns(MAX_OUTPUTS)


def shape(sources: Sources, role: str, k: int) -> Shape:
    """What a row of ``role`` holds: H×W features, or ``k`` labels."""
    if "features" in role:
        hw = (sources.height, sources.width)
        return Shape(hw[0] * hw[1], f"H×W = {hw[0]}×{hw[1]}", hw)
    return Shape(k, f"K = {k} labels", labels=True)


def estimate(sources: Sources, k: int, roles: tuple[str, ...]) -> dict[str, int]:
    """Estimated cache bytes of each of ``roles``' data (0 for an array read in place)."""
    return {role: sources.array(role).estimate(shape(sources, role, k)) for role in roles}


@dataclass(frozen=True)
class Bound:
    """The most bytes the cache may take: ``limit`` and why (``reason``, for messages)."""

    limit: int
    reason: str


def bound(root: Path, max_bytes: int | None) -> Bound:
    """The smaller of the free space of ``root``'s file system (``statvfs``: blocks free to
    unprivileged users) and ``max_bytes`` (``--max-cache-bytes``; None: no such bound)."""
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    space = Bound(free, f"the {_size(free)} free on the file system {file_system(root)}")
    if max_bytes is not None and max_bytes < free:
        return Bound(max_bytes, f"--max-cache-bytes {max_bytes}")
    return space


def check(sources: Sources, estimates: dict[str, int], limit: Bound) -> None:
    """Refuse a data set whose estimated cache passes ``limit``: InputTooLarge (exit 3)
    naming the largest file, before anything is converted."""
    total = sum(estimates.values())
    if total <= limit.limit:
        return
    role = max(estimates, key=lambda r: estimates[r])
    advice = (
        "raise --max-cache-bytes"
        if limit.reason.startswith("--max-cache-bytes")
        else "free space there, or name another file system with --cache-dir"
    )
    raise InputTooLarge(
        f"{sources.label(role)}: the data cache would take about {_size(total)} "
        f"(this file {_size(estimates[role])}), more than {limit.reason}; "
        f"refusing to convert ({advice})"
    )


class Guard:
    """Counts the cache bytes written (thread-safe) and stops past ``limit``.

    ``add(n)`` raises InputTooLarge (exit 3) naming ``path`` (set per file) once the
    total passes the limit; the converter then removes the file's partial array.
    """

    def __init__(self, limit: Bound, written: int = 0) -> None:
        self.limit, self.written, self.path = limit, written, Path()
        self._lock = threading.Lock()

    def add(self, count: int) -> None:
        with self._lock:
            self.written += count
            over = self.written > self.limit.limit
        if over:
            raise InputTooLarge(
                f"{self.path}: the data cache passed {_size(self.limit.limit)} while "
                f"converting, more than {self.limit.reason} (the file expands more than "
                "its size and first lines said); stopped"
            )


def _size(count: float) -> str:
    """Bytes for a message: 1.5 GiB, 300.0 MiB, 12 KiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count / 1024:.0f} KiB"
