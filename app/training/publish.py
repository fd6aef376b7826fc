"""Published model versions behind a quality gate, in TensorFlow Serving's layout.

``--publish-dir DIR`` holds numbered versions ``DIR/<N>/`` (``saved_model.pb``,
``variables/``, … as TF Serving loads them; also ``model.keras`` and ``coretrain.json``
with the run's metrics, data fingerprint, config, plan and versions). TF Serving serves
the largest number and polls the directory; it has loaded half-copied versions
(tensorflow/serving#1086), so a version is built under a temporary name in DIR and
renamed into place whole, under an ``fcntl`` lock on ``DIR/.lock`` so that two runs can't
take the same number. DIR is opened once (app/atomic.py): the lock without following a
symlink, the version built in a private temporary directory reached through its
descriptor, renamed relative to DIR's descriptor.

The gate (as TFX's Evaluator "blesses" a candidate only when it is at least as good as
the current one): the candidate and the champion (the highest version) are both
evaluated, as exported, on this run's test set, row by row, and app/training/gate.py
judges the paired difference against the noise. A champion that can't be evaluated on
these data (other input or output size) is no comparison, and says so.
``--publish-keep N`` prunes the oldest versions beyond N, never the champion. Rolling back
is deleting (or moving away) the newest version: TF Serving falls back to the next largest.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from app import logs
from app.atomic import Dir, open_dir, probe_writable
from app.data.cache import DataCache
from app.errors import StorageError
from app.serving.layout import KERAS_FILE, META_FILE, SAVED_MODEL_DIR, newest, versions
from app.training import gate
from app.training.gate import Decision

LOCK_NAME = ".lock"
#: How long a run waits for another run's publishing to finish (seconds).
LOCK_WAIT_S = 600.0


def evaluate_export(saved_model: Path, data: DataCache, batch: int = 4096) -> np.ndarray | None:
    """Per-row mean squared errors (n,) (raw label units) of the SavedModel at
    ``saved_model`` on ``data``'s test split, fed raw lines as a server would; None when
    its input or output size doesn't fit these data. Raises StorageError when it can't be
    loaded."""
    try:
        served = tf.saved_model.load(str(saved_model)).signatures["serve"]
    except (OSError, KeyError, ValueError, tf.errors.OpError) as exc:
        raise StorageError(f"{saved_model}: cannot load the model: {exc}") from exc
    spec = next(iter(served.structured_input_signature[1].values()))
    if spec.shape[-1] != data.height * data.width:
        return None
    x = np.asarray(data.features("test")).reshape(data.test_size, -1)
    y = np.asarray(data.labels("test"), np.float64)
    errors = np.empty(data.test_size)
    for start in range(0, data.test_size, batch):
        out = next(iter(served(tf.constant(x[start : start + batch])).values())).numpy()
        if out.shape[-1] != data.num_outputs:
            return None
        err = out.astype(np.float64) - y[start : start + batch]
        errors[start : start + batch] = np.mean(np.square(err), axis=1)
    return errors


def publish(
    export_dir: Path, directory: Path, data: DataCache, meta: dict[str, Any],
    tolerance: float | None = None, keep: int = 0,
) -> Decision:  # fmt: skip
    """Evaluate the candidate in ``export_dir`` against the champion in ``directory`` and
    publish it as the next version if the gate lets it through; prune to ``keep``.

    Raises StorageError when the directory, the lock or a version can't be written (also a
    symlink or another owner's directory where the job writes: app/atomic.py).
    """
    with open_dir(directory, "publish directory") as pub:
        probe_writable(pub, "publish directory")
        candidate = evaluate_export(export_dir / SAVED_MODEL_DIR, data)
        with _locked(pub):
            champion = newest(directory)
            champion_version = int(champion.name) if champion else None
            champion_errors = evaluate_export(champion, data) if champion else None
            decision = gate.judge(
                candidate, champion_errors, champion_version, data.baseline_rmse, tolerance
            )
            if not decision.published:
                return decision
            number = (champion_version or 0) + 1
            _write_version(export_dir, pub, number, {**meta, "publish": decision.to_json()})
            decision = dataclasses.replace(decision, version=number)
            _prune(pub, keep)
    return decision


@contextmanager
def _locked(directory: Dir) -> Iterator[None]:
    """An exclusive ``fcntl`` lock on ``directory/.lock``, waited for up to LOCK_WAIT_S."""
    path = directory.path / LOCK_NAME
    with os.fdopen(directory.open(LOCK_NAME, os.O_RDWR | os.O_CREAT, "publish lock")) as handle:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StorageError(
                        f"{path}: another run kept publishing for {LOCK_WAIT_S:g} s"
                    ) from None
                time.sleep(0.2)
        yield


def _write_version(export_dir: Path, directory: Dir, number: int, meta: dict[str, Any]) -> None:
    """Copy the export into a private temporary directory in ``directory``, then rename it
    to N (never over an existing version, nor a symlink)."""
    final = directory.path / str(number)
    try:
        with directory.temp_dir(f".{number}.") as tmp:
            try:
                shutil.copytree(export_dir / SAVED_MODEL_DIR, tmp.via, dirs_exist_ok=True)
                shutil.copy2(export_dir / KERAS_FILE, f"{tmp.via}/{KERAS_FILE}")
                tmp.write_json(META_FILE, meta)
                directory.publish(tmp, str(number))  # whole or not at all
            finally:
                directory.remove(tmp.path.name)
    except OSError as exc:
        raise StorageError(f"{final}: cannot publish: {exc.strerror or exc}") from exc
    logs.event("published", f"published model version {number} in {directory.path}", version=number)


def _prune(directory: Dir, keep: int) -> None:
    """Remove the oldest versions beyond ``keep`` (0 = keep all); never the newest."""
    found = versions(directory.path)
    if keep < 1 or len(found) <= keep:
        return
    for number in found[: len(found) - keep]:
        if directory.is_dir(str(number)):
            directory.remove(str(number))
        logs.event("pruned", f"removed model version {number} (--publish-keep {keep})")
