"""The final export: the trained model wrapped to take raw features and give raw labels.

``model/model.keras`` (Keras 3 format, stock Keras layers only: the plain formulation of
the same function and weights, app/model/cnn.py ``stock``, so ``keras.saving.load_model``
loads it anywhere, without this package) and ``model/saved_model/`` (TensorFlow
SavedModel of the model as trained, signature ``serve``: float32 (n, H·W) → (n, K)); the
names are app/release/layout.py's. :func:`weights_digest` names the exported weights (the
trained ones with the statistics baked in), so a version is never published twice.
The training-set statistics are baked in as Normalization layers, so callers pass a
data-file line as is. The directory is built under a temporary name and swapped in by
rename: ``renameat2(RENAME_EXCHANGE)`` where the kernel and file system have it (Linux
3.15+, glibc 2.28+; ext4, xfs, btrfs, tmpfs, overlayfs), so a reader always finds a
complete ``model/``; elsewhere two renames, with a moment without one. What a killed
export leaves (``.model.*`` directories) is removed by the next.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from app.atomic import Dir, open_dir
from app.data.cache import DataCache
from app.errors import StorageError
from app.model import stock
from app.release.layout import INPUT_FILE, KERAS_FILE, SAVED_MODEL_DIR, files_digest


@dataclass(frozen=True)
class Exported:
    """A written export: its directory, :func:`weights_digest` of its weights and
    app/release/layout.py ``files_digest`` of its files (a rerun checks them unchanged)."""

    path: Path
    weights: str
    files: str = ""


def weights_digest(model: keras.Model) -> str:
    """sha256 (hex, first 32 digits) of ``model``'s weights in order: dtype, shape, bytes."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        array = np.ascontiguousarray(weight)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:32]


def remove_partial(directory: Dir, name: str) -> list[str]:
    """Remove ``.<name>.*`` directories in ``directory`` left by killed exports; return them.

    The caller must hold the output lock (app.lock): a running export's temporary
    directory looks the same. Symlinks of that name are left alone; errors are ignored
    (the names are retried next time).
    """
    removed = [n for n in directory.names() if n.startswith(f".{name}.") and directory.is_dir(n)]
    for leftover in removed:
        directory.remove(leftover)
    return removed


def wrap(model: keras.Model, cache: DataCache, standardize: bool) -> keras.Model:
    """The inference model on raw inputs: (n, H·W) float32 → (n, K) raw units, around
    ``model`` ((n, H, W, 1) → (n, K) standardised units)."""
    h, w = cache.height, cache.width
    inputs = keras.Input((h * w,), name="features")
    x = inputs
    if standardize:
        x = keras.layers.Normalization(
            axis=-1,
            mean=cache.feature_mean.reshape(-1),
            variance=np.square(cache.feature_std.reshape(-1)),
            name="standardize_features",
        )(x)
    x = keras.layers.Reshape((h, w, 1), name="to_image")(x)
    x = model(x)
    if standardize:
        x = keras.layers.Normalization(
            axis=-1,
            mean=cache.label_mean,
            variance=np.square(cache.label_std),
            invert=True,
            name="unstandardize_labels",
        )(x)
    return keras.Model(inputs, x, name="coretrain_export")


def export(model: keras.Model, cache: DataCache, standardize: bool, directory: Path) -> Exported:
    """Write ``directory`` (``model.keras`` + ``saved_model/``) atomically; return it with
    the digest of its weights.

    Built in a private (0700) temporary directory of the parent, which Keras and
    TensorFlow reach through ``/proc/self/fd`` (app/atomic.py): a planted symlink or a
    renamed parent can't redirect their writes. Raises StorageError when the files can't be
    written, or ``directory`` is a symlink; the previous export, if any, stays in place
    until the new one is complete. Removes what killed exports left first
    (:func:`remove_partial`).
    """
    final = Path(directory)
    with open_dir(final.parent) as parent:
        parent.check(final.name, "model directory")
        remove_partial(parent, final.name)
        try:
            tmp = parent.temp_dir(f".{final.name}.")
        except OSError as exc:
            raise StorageError(f"{final.parent}: cannot write the export: {exc.strerror}") from exc
        served = wrap(model, cache, standardize)
        with tmp:
            try:
                _write_export(served, wrap(stock(model), cache, standardize), tmp)
                _record_input(tmp, cache.height, cache.width, cache.num_outputs)
                files = files_digest(Path(tmp.via))
                _swap_in(parent, tmp, final.name)
            except OSError as exc:
                raise StorageError(f"{final}: cannot write the export: {exc.strerror}") from exc
            except tf.errors.OpError as exc:  # SavedModel writing, e.g. no space left on device
                raise StorageError(
                    f"{final}: cannot write the export: {tmp.named(exc.message)}"
                ) from exc
            finally:
                parent.remove(tmp.path.name)
    return Exported(final, weights_digest(served), files)


def _write_export(served: keras.Model, portable: keras.Model, tmp: Dir) -> None:
    """``model.keras`` (of ``portable``) and ``saved_model/`` (of ``served``) into ``tmp``,
    through its descriptor."""
    portable.save(f"{tmp.via}/{KERAS_FILE}")
    served.export(f"{tmp.via}/{SAVED_MODEL_DIR}", format="tf_saved_model", verbose=False)


def _record_input(tmp: Dir, height: int, width: int, outputs: int) -> None:
    """The H×W of the SavedModel's flat input and its K outputs
    (:data:`app.release.layout.INPUT_FILE`), so ``predict`` takes (n, H, W) arrays only in
    this order (a (n, W, H) array has as many values a row, and gave other predictions,
    silently), and a later run sees a signature change before it converts its data
    (app/training/admit/signature.py)."""
    where = Path(tmp.via) / SAVED_MODEL_DIR / INPUT_FILE
    where.parent.mkdir(exist_ok=True)
    record = {"height": height, "width": width, "outputs": outputs}
    where.write_text(json.dumps(record) + "\n")


def _swap_in(parent: Dir, tmp: Dir, name: str) -> None:
    """Put the built ``tmp`` in place as ``name``: a rename when there is none yet, else an
    exchange (``tmp``'s name then holds the old export, removed by the caller), else two
    renames with a moment without one."""
    if parent.lstat(name) is None:
        parent.publish(tmp, name)
    elif not parent.publish(tmp, name, exchange=True):
        old = f".{name}.old.{os.getpid()}"
        parent.rename(name, old)
        parent.rename(tmp.path.name, name)
        parent.remove(old)
