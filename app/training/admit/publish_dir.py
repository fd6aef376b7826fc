"""The publish directory, checked before a run converts, fits or trains anything (no
TensorFlow): it exists (before the output directory is touched: :func:`exists`), it can be
written, and its entries are named as TF Serving will see them (:func:`check`). What the
champion in it serves: app/training/admit/signature.py."""

from __future__ import annotations

import logging
from pathlib import Path

from app import logs
from app.atomic import open_dir, probe_writable
from app.errors import ConfigError, StorageError
from app.release import layout


def exists(directory: Path) -> None:
    """Raise ConfigError (exit 2) when ``directory`` does not exist: checked before the
    output directory is made, so a mistyped ``--publish-dir`` writes nothing."""
    if not directory.is_dir():
        raise ConfigError(
            f"{directory}: the publish directory does not exist (create it, or check the "
            "path: TF Serving must read the same one)"
        )


def check(directory: Path) -> None:
    """Raise ConfigError (exit 2) when ``directory`` does not exist (a mistyped path must
    not publish where nothing serves), StorageError (exit 4) naming it when a version can't
    be written in it or numbered above its entries; log a ``publish_dir_entries`` warning
    naming each entry TF Serving counts as a version that is not a model, and the number
    this run would publish as."""
    exists(directory)
    with open_dir(directory, "publish directory", create=False) as pub:
        probe_writable(pub, "publish directory")
    full = layout.no_room(directory)
    if full is not None:
        raise StorageError(full)
    strange = [e for e in layout.entries(directory) if not e.is_model]
    if strange:
        names = ", ".join(f"{e.path.name!r} ({e.what})" for e in strange)
        number = layout.next_number(directory)
        logs.event(
            "publish_dir_entries",
            f"{directory}: TF Serving counts {names} as versions but can't load them; this "
            f"run publishes above them, as version {number}",
            level=logging.WARNING,
            entries=[str(e.path) for e in strange],
            next_version=number,
        )
