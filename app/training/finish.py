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

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from app import __version__, logs
from app.atomic import Dir, open_dir, write_json
from app.data.cache import DataCache
from app.errors import ModelRejected, Preempted, Replan, StorageError
from app.training.controller import Outcome
from app.training.workspace import Workspace

KERAS_FILE = "model.keras"
SAVED_MODEL_DIR = "saved_model"


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
        with tmp:
            try:
                _write_export(wrap(model, cache, standardize), tmp)
                _swap_in(parent, tmp, final.name)
            except OSError as exc:
                raise StorageError(f"{final}: cannot write the export: {exc.strerror}") from exc
            except tf.errors.OpError as exc:  # SavedModel writing, e.g. no space left on device
                raise StorageError(f"{final}: cannot write the export: {exc.message}") from exc
            finally:
                parent.remove(tmp.path.name)
    return final


def _write_export(wrapped: keras.Model, tmp: Dir) -> None:
    """``model.keras`` and ``saved_model/`` into ``tmp``, through its descriptor."""
    wrapped.save(f"{tmp.via}/{KERAS_FILE}")
    wrapped.export(f"{tmp.via}/{SAVED_MODEL_DIR}", format="tf_saved_model", verbose=False)


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


def summarize(outcome: Outcome, data: DataCache, samples_per_step: int) -> dict[str, Any]:
    """The run's summary (``metrics.json`` and the ``end`` event): status, steps, RMSEs in
    raw label units, samples/s over the training loop."""
    trained = outcome.step - outcome.start_step
    return {
        "status": outcome.status,
        "final_step": outcome.step,
        "start_step": outcome.start_step,
        "steps_trained": trained,
        "test_rmse": None,  # of the exported model (app/training/run.py)
        "last_eval_rmse": outcome.eval_rmse,
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
    write_json(ws.metrics, summary, "output directory")
    logs.event("end", f"{message} (mean predictor {data.baseline_rmse:.4g})", **summary)
    if decision is not None and not decision["published"]:
        raise ModelRejected(f"model not published: {decision['reason']}")
    return summary
