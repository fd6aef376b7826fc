"""The run's data: the files ``--data`` names (:func:`find`), their binary cache
(:func:`convert`: text parsed once, a float32 ``.npy`` or HDF5 dataset read where it lies),
decided once a run; at its end, whether a file read where it lies changed while the run
trained on it (:func:`changed_in_place`). No TensorFlow here.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.config import CacheConfig, DataConfig
from app.data import cache as cache_lib
from app.data.formats.sources import ROLES, Sources, in_container
from app.data.formats.sources import find as find_role
from app.errors import ConfigError, DataError
from app.training.state.workspace import Workspace


def check_exists(path: Path) -> None:
    """Raise ConfigError (exit 2, a usage error) when ``path`` (--data: a directory, or one
    file holding the four arrays) does not resolve to anything: missing, below a file, or a
    symlink loop; other problems (permissions, what is in it) are the data's to report.
    Checked before the output directory is touched."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"--data {path}: no such file or directory") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"--data {path}: too many levels of symbolic links") from None


def find(given: DataConfig) -> Sources:
    """The data files (found in the directory ``given.data_dir``, or its four arrays when
    it is a .npz or HDF5 file: app/data/formats/sources.py) and the parse settings of
    ``given``. Raises DataError (a missing file), ConfigError (two candidates for one
    role)."""
    data, names = given.data_dir, {role: getattr(given, role) for role in ROLES}
    if data.is_file():
        paths, members = dict.fromkeys(ROLES, data), in_container(data, names)
    else:
        paths, members = {role: find_role(data, role, names[role]) for role in ROLES}, {}
    return Sources(paths, given.height, given.width, given.allow_nonfinite, members=members)


def convert(
    found: Sources, key: str, ws: Workspace, cache: CacheConfig, standardize: bool,
    threads: int, stop: Callable[[], bool],
) -> cache_lib.DataCache:  # fmt: skip
    """Parse ``found`` once into the binary cache in ``ws.cache`` under ``key`` (or reuse
    it) and check it; large files in ``threads`` threads (TensorFlow's intra-op threads).
    Raises DataError for bad input (InputTooLarge past the cache's bound:
    app/data/cache/bounds.py), and when NaN/Inf values (let in by --allow-nonfinite) make
    the ``standardize`` statistics non-finite."""
    keep = cache_lib.Keep(cache.cache_keep, cache.cache_keep_bytes)
    data = cache_lib.prepare(
        found, ws.cache, stop=stop, threads=threads, below=ws.cache_top,
        max_bytes=cache.max_cache_bytes, keep=keep, key=key,
    )  # fmt: skip
    if standardize:
        for role, stats in (
            ("train_features", (data.feature_mean, data.feature_std)),
            ("train_labels", (data.label_mean, data.label_std)),
        ):
            if not all(np.isfinite(s).all() for s in stats):
                raise DataError(
                    f"{found.label(role)}: NaN/Inf values (allowed by --allow-nonfinite) "
                    "make the standardisation statistics NaN/Inf; train with --no-standardize, "
                    "or remove them"
                )
    return data


def changed_in_place(found: Sources, data: cache_lib.DataCache) -> None:
    """Before a finished run exports: raise DataError (exit 3) when a source the run read
    where it lies (a float32 ``.npy`` or HDF5 dataset: no copy in the cache) changed while
    it trained (its size, modification or status change time or sampled bytes: the cache
    key). The model would have been trained on a mixture of the old and new values; the
    checkpoints stay, nothing is exported."""
    if not data.in_place or cache_lib.source_key(found) == data.path.name:
        return
    places = {str(path) for path, _ in data.in_place.values()}
    try:  # name the files that changed: the fingerprints the cache was keyed by
        was = json.loads((data.path / "manifest.json").read_text())["fingerprints"]
        now = found.fingerprints()
        changed = {str(found.path(r).resolve()) for r in ROLES if now[r] != was[r]}
    except (OSError, ValueError, KeyError, TypeError):
        changed = places
    raise DataError(
        f"{', '.join(sorted(changed & places or places))}: changed while this run trained on "
        "it where it lies (not a copy): the model is not exported and the checkpoints are "
        "kept; train on the new data into a new --output"
    )
