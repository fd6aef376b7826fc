"""The end of a run: the final export, ``metrics.json`` and the ``end`` event.

The export takes raw features in and gives raw-scale labels out.

``model/model.keras`` (Keras 3 format; load it with ``app.model`` imported so
its layers are registered) and ``model/saved_model/`` (TensorFlow SavedModel,
signature ``serve``: float32 (n, H·W) → (n, K)). The training-set statistics
are baked in as Normalization layers, so callers pass a data-file line as is.
The directory is built under a temporary name and swapped in by rename:
``renameat2(RENAME_EXCHANGE)`` where the kernel and file system have it (Linux
3.15+, glibc 2.28+; ext4, xfs, btrfs, tmpfs, overlayfs), so a reader always
finds a complete ``model/``; elsewhere two renames, with a moment without one.
What a killed export leaves (``.model.*`` directories) is removed by the next.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from app import __version__, logs
from app.atomic import temp_dir, write_json
from app.data.cache import DataCache
from app.errors import ModelRejected, Preempted, Replan, StorageError
from app.training.controller import Outcome
from app.training.workspace import Workspace

KERAS_FILE = "model.keras"
SAVED_MODEL_DIR = "saved_model"
_AT_FDCWD = -100  # <fcntl.h>
_RENAME_EXCHANGE = 2  # <linux/fs.h>


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (``renameat2(..., RENAME_EXCHANGE)``).

    Returns False where that is not available (no ``renameat2`` in libc, a kernel
    or file system answering ENOSYS/EINVAL/EOPNOTSUPP); raises OSError for any
    other failure (e.g. ENOENT, EXDEV).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    done = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if done == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def remove_partial(directory: Path) -> list[str]:
    """Remove ``.<name>.*`` siblings of ``directory`` left by killed exports; return them.

    The caller must hold the output lock (app.lock): a running export's temporary
    directory looks the same. Errors are ignored (the names are retried next time).
    """
    final = Path(directory)
    if not final.parent.is_dir():
        return []
    removed = sorted(p.name for p in final.parent.glob(f".{final.name}.*") if p.is_dir())
    for name in removed:
        shutil.rmtree(final.parent / name, ignore_errors=True)
    return removed


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
    any, stays in place until the new one is complete. Removes what killed
    exports left first (:func:`remove_partial`).
    """
    final = Path(directory)
    remove_partial(final)
    try:
        tmp = temp_dir(final.parent, f".{final.name}.")
    except OSError as exc:
        raise StorageError(f"{final.parent}: cannot write the export: {exc.strerror}") from exc
    try:
        wrapped = wrap(model, cache, standardize)
        wrapped.save(tmp / KERAS_FILE)
        wrapped.export(str(tmp / SAVED_MODEL_DIR), format="tf_saved_model", verbose=False)
        if not final.exists():
            os.replace(tmp, final)
        elif not exchange(tmp, final):  # exchanged: tmp holds the old export, removed below
            old = final.with_name(f".{final.name}.old.{os.getpid()}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise StorageError(f"{final}: cannot write the export: {exc.strerror}") from exc
    except tf.errors.OpError as exc:  # SavedModel writing, e.g. no space left on device
        raise StorageError(f"{final}: cannot write the export: {exc.message}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def summarize(outcome: Outcome, data: DataCache, samples_per_step: int) -> dict[str, Any]:
    """The run's summary (``metrics.json`` and the ``end`` event): status, steps, RMSEs in
    raw label units, samples/s over the training loop."""
    trained = outcome.step - outcome.start_step
    return {
        "status": outcome.status,
        "final_step": outcome.step,
        "start_step": outcome.start_step,
        "steps_trained": trained,
        "test_rmse": outcome.test_rmse,
        "baseline_rmse": data.baseline_rmse,
        "examples_per_sec": round(trained * samples_per_step / max(outcome.loop_seconds, 1e-9), 1),
        "train_size": data.train_size,
        "test_size": data.test_size,
        "version": __version__,
    }


def finish(
    ws: Workspace,
    summary: dict[str, Any],
    model: keras.Model,
    data: DataCache,
    standardize: bool,
    publish: Callable[[Path], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Export (chief), publish if asked, write ``metrics.json`` (chief), log ``end``.

    ``publish(export_dir)`` returns the gate's decision (app/training/publish.py); it goes
    into the summary as ``publish``. Returns the summary. A preempted run exports nothing
    and raises Preempted (exit 143) after the ``end`` event; a candidate the gate rejected
    raises ModelRejected (exit 7) after everything was written. Raises StorageError when
    the export or metrics can't be written.
    """
    status, step = summary["status"], summary["final_step"]
    if status == "replan":
        logs.event("replan", f"checkpoint saved at step {step}; restarting with the new plan")
        raise Replan(f"the CPU budget changed at step {step}", at=time.time())
    if status == "preempted":
        logs.event("end", f"preempted at step {step}; rerun to resume", **summary)
        raise Preempted(f"stopped by signal at step {step}; checkpoint saved, rerun to resume")
    message = f"{status} at step {step}: test RMSE {summary['test_rmse']:.4g}"
    if not ws.is_chief:  # the chief exports and writes metrics.json
        logs.event("end", message, **summary)
        return summary
    t_export = time.perf_counter()
    export_dir = export(model, data, standardize, ws.model)
    logs.event(
        "export",
        f"exported the model to {export_dir}",
        path=str(export_dir),
        seconds=round(time.perf_counter() - t_export, 2),
    )
    summary["export"] = str(export_dir)
    decision = publish(export_dir) if publish is not None else None
    if decision is not None:
        summary["publish"] = decision
        if not decision["published"]:
            logs.event(
                "publish_rejected",
                f"not published: {decision['reason']}",
                level=logging.WARNING,
                **decision,
            )
    write_json(ws.metrics, summary)
    logs.event("end", f"{message} (mean predictor {data.baseline_rmse:.4g})", **summary)
    if decision is not None and not decision["published"]:
        raise ModelRejected(f"model not published: {decision['reason']}")
    return summary
