"""Prediction with an exported model, on the CPUs planned for this process (``coretrain predict``).

The model is a run's ``model/`` (its ``saved_model/``), one published version (a
directory with ``saved_model.pb``) or a publish directory (its newest version). The
features file is read in any of the training formats, recognised by its content (text
plain or gzip with the same ``file:line`` errors, .npy, or an array of a .npz or HDF5
file, named by ``--array`` as train's ``--test-features`` names one:
app/data/formats/detect.py), ``--batch-size`` rows at a time, so memory is bounded by a
batch, not the file; each batch goes through the SavedModel's ``serve`` signature (raw
features in, raw-scale labels out). A features path that is not a regular file (a FIFO, a
device) is refused before it is opened, as train refuses one (app/data/formats/sources.py).

The output is written by app/output.py's rule: a file is replaced whole when complete, a
FIFO, a pipe or a device is written through (text batch by batch; a .npy array, whose
header holds the row count, once all rows are predicted, from an unnamed spool file).
A stop request (SIGTERM/SIGINT) is honoured between batches and while waiting for a
reader: Preempted, exit 143, nothing replaced. Import it after
:func:`app.budget.apply.apply` (it imports TensorFlow).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np
import tensorflow as tf

from app import logs
from app.config import PredictConfig
from app.data.formats.base import Array, Shape
from app.data.formats.detect import features_array, open_array
from app.data.formats.files import checked
from app.errors import DataError, Preempted
from app.output import Output
from app.release.layout import entries, input_hw, resolve_model


def predict(config: PredictConfig, stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Predict every row of ``config.features`` into ``config.out``; return a summary.

    Raises ConfigError (no model; an --out that is a directory or in none), DataError (bad
    features: file:line), StorageError (the output can't be written), Preempted (``stop``,
    also when the signal interrupted a call that failed for it: EINTR in TensorFlow).
    """
    try:
        return _predict(config, stop)
    except Preempted:
        raise
    except Exception as exc:
        if stop is None or not stop():
            raise
        raise Preempted(f"stopped by signal while predicting into {config.out}") from exc


def _predict(config: PredictConfig, stop: Callable[[], bool] | None) -> dict[str, Any]:
    """:func:`predict`, without the translation of an interrupted call."""
    path = resolve_model(config.model)
    _passed_over(config.model, path)
    features = _features(config)
    t0 = time.perf_counter()
    served = tf.saved_model.load(str(path)).signatures["serve"]
    width = int(next(iter(served.structured_input_signature[1].values())).shape[-1])
    hw = input_hw(path)  # None: an export that does not record it (any H·W a row)
    hint = f"the model takes H×W = {hw[0]}×{hw[1]}" if hw else f"the model takes {width}"
    shape = Shape(width, f"{hint} features", hw)
    rows = outputs = 0
    with Output(config.out, "--out", stop) as sink, _spool(config.out) as spool:
        for chunk in features.chunks(shape, config.allow_nonfinite, chunk_rows=config.batch_size):
            if stop is not None and stop():
                raise Preempted(f"stopped by signal after {rows} rows; a file --out is as it was")
            out = next(iter(served(tf.constant(chunk)).values())).numpy().astype(np.float32)
            rows, outputs = rows + len(out), out.shape[1]
            if spool is not None:
                spool.write(out.tobytes())
            else:
                text = io.BytesIO()
                np.savetxt(text, out, fmt="%.9g")
                sink.write(text.getvalue())
        if spool is not None:
            _write_npy(sink, spool, rows, outputs)
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


def _features(config: PredictConfig) -> Array:
    """The features to predict on: ``--array`` of a container when given (as train reads
    one), else the file's own (app/data/formats/detect.py ``features_array``). Raises
    DataError: not a regular file, missing (``FILE:NAME``, the way messages name an array,
    with how to read it), not a container with ``--array``."""
    checked(config.features)  # a FIFO, a device, a kernel's file: refused unopened
    file, _, member = str(config.features).rpartition(":")
    if member and os.path.isfile(file) and not os.path.lexists(config.features):
        raise DataError(
            f"{config.features}: missing data file (the array {member} of {file} is read "
            f"with --features {file} --array {member})"
        )
    if config.array is not None:
        return open_array(config.features, config.array)
    return features_array(config.features)


def _spool(out: Path) -> contextlib.AbstractContextManager[IO[bytes] | None]:
    """An unnamed temporary file (in TMPDIR) for a .npy output's rows, whose header needs
    their count; None (a null context) for text, written batch by batch."""
    return tempfile.TemporaryFile() if out.suffix == ".npy" else contextlib.nullcontext()


def _write_npy(sink: Output, spool: IO[bytes], rows: int, outputs: int) -> None:
    """The .npy file of the float32 rows in ``spool``: its header, then the rows."""
    header = io.BytesIO()
    meta = {"descr": np.dtype(np.float32).str, "fortran_order": False, "shape": (rows, outputs)}
    np.lib.format.write_array_header_1_0(header, meta)
    sink.write(header.getvalue())
    spool.seek(0)
    shutil.copyfileobj(spool, sink)


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
