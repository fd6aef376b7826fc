"""Prediction with an exported model, on the CPUs planned for this process (``coretrain predict``).

The model is a run's ``model/`` (its ``saved_model/``), one published version (a
directory with ``saved_model.pb``) or a publish directory (its newest version). The
features file is read in any of the training formats, recognised by its content (text
plain or gzip with the same ``file:line`` errors, .npy, or an array of a .npz or HDF5
file: app/data/formats/detect.py), ``--batch-size`` rows at a time, so memory is bounded
by a batch, not the file; each batch goes through the SavedModel's ``serve`` signature
(raw features in, raw-scale labels out). The output is written to a temporary name and
renamed when complete. Import it after :func:`app.budget.apply.apply` (it imports TensorFlow).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from app import logs
from app.config import PredictConfig
from app.data.formats.base import Shape
from app.data.formats.detect import features_array
from app.errors import StorageError
from app.release.layout import entries, input_hw, resolve_model


def predict(config: PredictConfig) -> dict[str, Any]:
    """Predict every line of ``config.features`` into ``config.out``; return a summary.

    Raises ConfigError (no model), DataError (bad features: file:line), StorageError
    (the output can't be written).
    """
    path = resolve_model(config.model)
    _passed_over(config.model, path)
    t0 = time.perf_counter()
    served = tf.saved_model.load(str(path)).signatures["serve"]
    width = int(next(iter(served.structured_input_signature[1].values())).shape[-1])
    npy = config.out.suffix == ".npy"
    rows = outputs = 0
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{config.out.name}.", dir=config.out.parent)
    except OSError as exc:
        raise StorageError(f"{config.out}: cannot write: {exc.strerror}") from exc
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as sink:
            hw = input_hw(path)  # None: an export that does not record it (any H·W a row)
            hint = f"the model takes H×W = {hw[0]}×{hw[1]}" if hw else f"the model takes {width}"
            shape = Shape(width, f"{hint} features", hw)
            for chunk in features_array(config.features).chunks(
                shape, config.allow_nonfinite, chunk_rows=config.batch_size
            ):
                out = next(iter(served(tf.constant(chunk)).values())).numpy().astype(np.float32)
                rows, outputs = rows + len(out), out.shape[1]
                if npy:
                    sink.write(out.tobytes())
                else:
                    np.savetxt(sink, out, fmt="%.9g")
        if npy:
            _raw_to_npy(tmp, rows, outputs)
        os.replace(tmp, config.out)
    except OSError as exc:
        raise StorageError(f"{config.out}: cannot write: {exc.strerror}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    seconds = round(time.perf_counter() - t0, 2)
    logs.event(
        "predicted",
        f"{rows} predictions of {outputs} values from {path} in {config.out}",
        model=str(path),
        rows=rows,
        outputs=outputs,
        out=str(config.out),
        seconds=seconds,
    )
    return {"model": str(path), "rows": rows, "outputs": outputs, "seconds": seconds}


def _raw_to_npy(raw: Path, rows: int, outputs: int) -> None:
    """Turn a file of float32 rows into a .npy file in place (header + the same bytes)."""
    data = np.fromfile(raw, np.float32).reshape(rows, outputs)
    np.save(raw, data, allow_pickle=False)
    raw.with_name(raw.name + ".npy").replace(raw)  # np.save appends .npy to a name without it


def _passed_over(directory: Path, used: Path) -> None:
    """A ``version_passed_over`` warning when ``directory`` is a publish directory whose
    newest entry (the one TF Serving tries first) is not the model ``used``: not a model,
    so the newest that is one serves the predictions."""
    found = entries(directory)
    if not found or found[-1].path == used or found[-1].is_model:
        return
    newest = found[-1]
    logs.event(
        "version_passed_over",
        f"{newest.path} is version {newest.number} to TF Serving but not a model "
        f"({newest.what}): predicting with {used}",
        level=logging.WARNING,
        version=newest.number,
        used=str(used),
    )
