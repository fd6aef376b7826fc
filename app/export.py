"""The final export: raw features in, raw-scale labels out.

``model/model.keras`` (Keras 3 format; load it with ``app.model`` imported so
its layers are registered) and ``model/saved_model/`` (TensorFlow SavedModel,
signature ``serve``: float32 (n, H·W) → (n, K)). The training-set statistics
are baked in as Normalization layers, so callers pass a data-file line as is.
The directory is built under a temporary name and swapped in by rename.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import keras
import numpy as np

from app.atomic import temp_dir
from app.data.cache import DataCache
from app.errors import StorageError

KERAS_FILE = "model.keras"
SAVED_MODEL_DIR = "saved_model"


def wrap(model: keras.Model, cache: DataCache, standardize: bool) -> keras.Model:
    """The inference model on raw inputs: (n, H·W) float32 → (n, K) raw units."""
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


def export(model: keras.Model, cache: DataCache, standardize: bool, directory: Path) -> Path:
    """Write ``directory`` (``model.keras`` + ``saved_model/``) atomically; return it.

    Raises StorageError when the files can't be written; the previous export, if
    any, stays in place until the new one is complete.
    """
    final = Path(directory)
    try:
        tmp = temp_dir(final.parent, f".{final.name}.")
    except OSError as exc:
        raise StorageError(f"{final.parent}: cannot write the export: {exc.strerror}") from exc
    try:
        wrapped = wrap(model, cache, standardize)
        wrapped.save(tmp / KERAS_FILE)
        wrapped.export(str(tmp / SAVED_MODEL_DIR), format="tf_saved_model", verbose=False)
        old = None
        if final.exists():
            old = final.with_name(f".{final.name}.old.{os.getpid()}")
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise StorageError(f"{final}: cannot write the export: {exc.strerror}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
