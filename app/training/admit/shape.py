"""What the data's shape alone refuses, before the data are converted: an H×W the CNN can't
take (app/geometry.py; ConfigError, exit 2, before the output directory is touched), and
each file's first row parsed as the conversion will (a header line, a comma-separated file
or a ``--width`` the lines don't have: the conversion's own DataError, exit 3), which gives
K, a count of numbers (app/data/cache/bounds.py ``label_width``). No TensorFlow here.
"""

from __future__ import annotations

from app.data.cache import bounds
from app.data.formats.sources import ROLES, Sources
from app.errors import ConfigError
from app.geometry import geometry


def check_geometry(height: int, width: int) -> None:
    """Raise ConfigError (exit 2) naming the options when the CNN can't take H×W."""
    try:
        geometry(height, width)
    except ConfigError as exc:
        raise ConfigError(f"--height {height} --width {width}: {exc}") from None


def first_rows(found: Sources) -> int:
    """K, the labels per sample, once each file's first row parses as the conversion will
    parse it. Raises DataError (exit 3) naming the file (and line, field)."""
    k = bounds.label_width(found)
    for role in ROLES:
        rows(found, role, k, first_only=True)
    return k


def rows(found: Sources, role: str, k: int, first_only: bool) -> None:
    """Parse ``role``'s first row (``first_only``: its reader's first read) or all of its
    rows, as the conversion will. Raises DataError naming the file (and line, field): the
    conversion's message."""
    shape = bounds.shape(found, role, k)
    chunks = found.array(role).chunks(shape, found.allow_nonfinite, *((1,) if first_only else ()))
    try:
        for _ in chunks:
            if first_only:
                break
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
