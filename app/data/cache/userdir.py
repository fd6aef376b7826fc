"""The per-user cache directory: where the data cache lies when ``--cache-dir`` is not given.

The rule (README, "The data cache"), from the XDG Base Directory Specification:
``$XDG_CACHE_HOME/coretrain``, else ``$HOME/.cache/coretrain``. An empty
``XDG_CACHE_HOME`` counts as unset and a relative one is ignored (the specification: "If an
implementation encounters a relative path in any of these variables it should consider the
path invalid and ignore it"); ``HOME`` must be an absolute path to a directory (a home is
never made). Every run of the user shares it, whatever its ``--output``, under the rules of
a shared ``--cache-dir`` (app/data/cache/entry.py: markers, locks, eviction): it is the
directory named, followed as given up to it; it must be the user's own, not a symlink.

It is used when it is there and writable, or can be made (the base directory a missing
``XDG_CACHE_HOME`` or ``~/.cache`` names is made 0700, as the specification says).
Otherwise -- no ``HOME``, a ``HOME`` that can't be written (an arbitrary UID in a
container), a symlink, a file or another user's directory in its place -- :func:`locate`
says why, and the caller keeps the cache in the run's own output directory. Never imports
TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from app.atomic import open_dir, probe_writable
from app.errors import StorageError

NAME = "coretrain"
WHAT = "per-user cache directory"


def locate(environ: Mapping[str, str]) -> tuple[Path | None, str]:
    """The per-user cache directory of ``environ`` (os.environ's shape), made if missing and
    checked writable, and what to tell the user about it: ``(directory, "")``; or
    ``(directory, note)`` when a relative ``XDG_CACHE_HOME`` was ignored; or ``(None, why)``
    when there is none that can be used. Never raises."""
    notes = []
    xdg = environ.get("XDG_CACHE_HOME", "")
    if xdg and not os.path.isabs(xdg):
        notes.append(f"XDG_CACHE_HOME={xdg!r} is not an absolute path: ignored, as the XDG "
                     "Base Directory Specification says")  # fmt: skip
    if xdg and os.path.isabs(xdg):
        base = Path(xdg)
    else:
        home = environ.get("HOME", "")
        problem = _unusable_home(home)
        if problem:
            return None, "; ".join([*notes, problem])
        base = Path(home) / ".cache"
    directory = base / NAME
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open_dir(directory, WHAT) as made:
            probe_writable(made, WHAT)
    except OSError as exc:
        return None, "; ".join([*notes, f"{base}: {WHAT} cannot be made: {exc.strerror}"])
    except StorageError as exc:
        return None, "; ".join([*notes, str(exc)])
    return directory, "; ".join(notes)


def _unusable_home(home: str) -> str:
    """Why ``home`` (``$HOME``) gives no per-user cache directory; "" when it may."""
    if not home:
        return "HOME is not set"
    if not os.path.isabs(home):
        return f"HOME={home!r} is not an absolute path"
    if not os.path.isdir(home):
        return f"HOME={home!r} is not a directory"
    return ""
