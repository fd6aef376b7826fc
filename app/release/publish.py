"""Published model versions behind a quality gate, in TensorFlow Serving's layout.

``--publish-dir DIR`` is TF Serving's base path: numbered versions ``DIR/<N>/``
(``saved_model.pb``, ``variables/``, … as TF Serving loads them; also ``model.keras`` and
``coretrain.json`` with the run's metrics, weights digest, data fingerprint, config, plan
and versions). TF Serving counts every child whose name parses as a number and serves the
largest (app/release/layout.py), so a new version is numbered above every such child.
TF Serving has loaded half-copied versions (tensorflow/serving#1086), so a version is built
under a temporary name in DIR and renamed into place whole, under an ``fcntl`` lock on
``DIR/.lock`` so that two runs can't take the same number; a stop request ends the wait
for that lock. DIR is opened once (app/atomic.py): the lock without following a symlink,
the version built in a private temporary directory reached through its descriptor, renamed
relative to DIR's descriptor, never over an entry (another program's N: the next number).
Its ``coretrain.json`` records the number (``publish.version``), written just before the
rename. The temporary directory's name is written into the held lock file before the
directory is made, so whatever moment a publish is killed at, the next one (under the lock)
knows what it left.

The gate (as TFX's Evaluator "blesses" a candidate only when it is at least as good as
the current one): the champion is the newest version that loads (a newer one that does
not is named in a ``champion_unloadable`` warning and passed over, as TF Serving keeps
serving the last version it could load); the candidate and the champion are both
evaluated, as exported, on this run's test set, row by row, and app/release/gate.py
judges the paired difference against the noise. A candidate whose serving signature
(input width, number of outputs) differs from the champion's is not published unless
``--publish-allow-signature-change`` (its clients would break: docs/deploy.md). Weights
already published (the digest in ``coretrain.json``) are not published again.
``--publish-keep N`` prunes the oldest versions beyond N, never the champion. Rolling back
is deleting (or moving away) the newest version: TF Serving falls back to the next largest.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import tensorflow as tf

from app import logs
from app.atomic import RECORD_BYTES, Dir, open_dir, probe_writable
from app.data.cache import DataCache
from app.errors import Preempted, StorageError
from app.release import gate, layout
from app.release.export import Exported
from app.release.gate import Decision
from app.release.layout import KERAS_FILE, META_FILE, SAVED_MODEL_DIR, Signature

LOCK_NAME = ".lock"
#: A version's temporary directory ``.N.<hex>`` is named after this in the lock file before
#: it is made, and holds a file of this name until it is renamed into place: either is
#: what a killed publish left (removed under the lock).
BUILDING = ".coretrain-building"
_BUILDING_TEXT = b"a model version coretrain is building\n"
#: A pruned version's name while it is removed (no longer a version to TF Serving).
PRUNING = ".pruned."
#: How long a run waits for another run's publishing to finish (seconds).
LOCK_WAIT_S = 600.0
#: Renames tried when other programs take the version numbers meanwhile.
RENAME_TRIES = 10
#: The names coretrain works under in DIR, hidden from TF Serving, exactly: a version built
#: as ``.N.<8 hex digits>`` (app/atomic.py ``temp_dir``), one pruned as ``.pruned.N.<pid>``.
_BUILT_NAME = re.compile(r"\.[0-9]+\.[0-9a-f]{8}")
_PRUNED_NAME = re.compile(rf"{re.escape(PRUNING)}(-?[0-9]+)\.[0-9]+")
#: The lock file's content while a version is built: ``.coretrain-building .N.<hex>``.
_INTENT = re.compile(rf"\.coretrain-building ({_BUILT_NAME.pattern})\n")
_INTENT_BYTES = 100


@dataclass(frozen=True)
class Loaded:
    """A SavedModel loaded for evaluation: its ``serve`` function and signature."""

    number: int | None
    serve: Any
    signature: Signature


def load(saved_model: Path, number: int | None = None) -> Loaded:
    """The SavedModel at ``saved_model`` with its ``serve`` signature. Raises StorageError
    naming it when it can't be loaded, whatever the damage (TensorFlow raises many kinds)."""
    try:
        serve = tf.saved_model.load(str(saved_model)).signatures["serve"]
        (spec,) = serve.structured_input_signature[1].values()
        (out,) = serve.structured_outputs.values()
        signature = Signature(int(spec.shape[-1]), int(out.shape[-1]))
    except Exception as exc:  # a damaged model: IndexError, DecodeError, OpError, ValueError…
        raise StorageError(f"{saved_model}: cannot load the model: {exc!r}"[:400]) from exc
    return Loaded(number, serve, signature)


#: The entries a ``champion_unloadable`` warning named in this process: once each (the
#: champion is looked for before training and again at the gate).
_WARNED: set[str] = set()


def champion(directory: Path) -> Loaded | None:
    """The newest version in ``directory`` that loads; each newer entry that does not (not a
    model, or damaged) is named in a ``champion_unloadable`` warning, once a process. None
    when none loads."""
    for entry in reversed(layout.entries(directory)):
        try:
            if not entry.is_model:
                raise StorageError(f"{entry.path}: not a model ({entry.what})")
            return load(entry.path, entry.number)
        except StorageError as exc:
            if str(exc) in _WARNED:
                continue
            _WARNED.add(str(exc))
            logs.event(
                "champion_unloadable",
                f"version {entry.number} is passed over as the champion: {exc}; TF Serving "
                "can't serve it either (remove it, or publish a model above it)",
                level=logging.WARNING,
                version=entry.number,
                path=str(entry.path),
            )
    return None


def evaluate(model: Loaded, data: DataCache, batch: int = 4096) -> np.ndarray:
    """Per-row mean squared errors (n,) (raw label units) of ``model`` on ``data``'s test
    split, fed raw lines as a server would; its signature must fit the data."""
    x = np.asarray(data.features("test")).reshape(data.test_size, -1)
    y = np.asarray(data.labels("test"), np.float64)
    errors = np.empty(data.test_size)
    for start in range(0, data.test_size, batch):
        out = next(iter(model.serve(tf.constant(x[start : start + batch])).values())).numpy()
        err = out.astype(np.float64) - y[start : start + batch]
        errors[start : start + batch] = np.mean(np.square(err), axis=1)
    return errors


def signature_of(data: DataCache) -> Signature:
    """The serving signature of a model trained on ``data``."""
    return Signature(data.height * data.width, data.num_outputs)


def signature_change(served: Loaded | None, mine: Signature) -> str | None:
    """Why a model of signature ``mine`` can't replace ``served`` (the signatures differ);
    None when they are the same or there is no champion."""
    if served is None or served.signature == mine:
        return None
    return (
        f"the serving signature changes: version {served.number} takes {served.signature}, "
        f"this model {mine}; clients of the served model would break (to roll out the "
        "change, see docs/deploy.md: --publish-allow-signature-change)"
    )


def publish(
    exported: Exported, directory: Path, data: DataCache, meta: dict[str, Any],
    tolerance: float | None = None, keep: int = 0, allow_signature_change: bool = False,
    stop: Callable[[], bool] | None = None,
) -> Decision:  # fmt: skip
    """Evaluate the candidate ``exported`` against the champion in ``directory`` and publish
    it above every version TF Serving counts if the gate lets it through; prune to ``keep``.

    Raises StorageError when the directory, the lock or a version can't be written (also a
    symlink or another owner's directory where the job writes: app/atomic.py), or the
    candidate can't be loaded; Preempted when ``stop`` asks while waiting for the lock.
    """
    with open_dir(directory, "publish directory", create=False) as pub:
        probe_writable(pub, "publish directory")
        candidate = load(exported.path / SAVED_MODEL_DIR)
        errors = evaluate(candidate, data)
        with _locked(pub, stop) as lock:
            twin = layout.published_as(directory, exported.weights)
            if twin is not None:
                return _duplicate(twin, gate.rmse(errors), directory)
            decision = _judge(errors, champion(directory), data, tolerance, allow_signature_change)
            decision = dataclasses.replace(decision, directory=os.path.abspath(directory))
            if not decision.published:
                return decision
            _remove_leftovers(pub, lock)
            number = _write_version(exported.path, pub, lock, {**meta, "weights": exported.weights},
                                    decision)  # fmt: skip
            decision = dataclasses.replace(decision, version=number)
            _prune(pub, keep)
    return decision


def _judge(
    errors: np.ndarray, champ: Loaded | None, data: DataCache, tolerance: float | None,
    allow_signature_change: bool,
) -> Decision:  # fmt: skip
    """The gate on the candidate's per-row errors against ``champ`` (the signature first)."""
    number = champ.number if champ else None
    change = signature_change(champ, signature_of(data))
    if change is not None and not allow_signature_change:
        rmse = gate.rmse(errors)
        return Decision(False, change, rmse, None, number, *gate.rule_of(tolerance))
    champion_errors = evaluate(champ, data) if champ is not None and change is None else None
    return gate.judge(errors, champion_errors, number, data.baseline_rmse, tolerance)


def _duplicate(number: int, rmse: float, directory: Path) -> Decision:
    """The decision for weights that are version ``number`` already: nothing is written."""
    why = f"these weights are version {number} already: nothing published"
    logs.event("already_published", why, version=number)
    return Decision(
        True, why, rmse, None, number, version=number, directory=os.path.abspath(directory)
    )


@contextmanager
def _locked(directory: Dir, stop: Callable[[], bool] | None = None) -> Iterator[IO[bytes]]:
    """An exclusive ``fcntl`` lock on ``directory/.lock``, waited for up to LOCK_WAIT_S;
    Preempted when ``stop()`` asks meanwhile (the export stays; a rerun publishes it).
    Yields the lock file, where :func:`_write_version` names what it builds."""
    path = directory.path / LOCK_NAME
    with os.fdopen(
        directory.open(LOCK_NAME, os.O_RDWR | os.O_CREAT, "publish lock"), "r+b"
    ) as handle:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if stop is not None and stop():
                    raise Preempted(
                        f"stopped by signal while waiting for {path}: the model is exported, "
                        "not published; rerun to publish it"
                    ) from None
                if time.monotonic() > deadline:
                    raise StorageError(
                        f"{path}: another run kept publishing for {LOCK_WAIT_S:g} s"
                    ) from None
                time.sleep(0.2)
        yield handle


def _named(lock: IO[bytes]) -> str | None:
    """The temporary directory the lock file ``lock`` names (:func:`_name`): a run was
    building a version in it when it ended. None when it names none."""
    lock.seek(0)
    found = _INTENT.fullmatch(lock.read(_INTENT_BYTES).decode("latin-1"))
    return found.group(1) if found else None


def _name(lock: IO[bytes], building: str) -> None:
    """Write into the held lock file ``lock`` (fsynced) that the temporary directory
    ``building`` is being built ("": none)."""
    lock.seek(0)
    lock.truncate()
    lock.write(f"{BUILDING} {building}\n".encode() if building else b"")
    lock.flush()
    os.fsync(lock.fileno())


def _write_version(
    export_dir: Path, directory: Dir, lock: IO[bytes], meta: dict[str, Any], decision: Decision,
) -> int:  # fmt: skip
    """Copy the export into a private temporary directory ``.N.<hex>`` in ``directory``
    (named in the ``lock`` file before it is made, and holding :data:`BUILDING` until it is
    renamed), then rename it to the next version number N, never over an existing entry:
    when another program took N meanwhile, the next number, the record rewritten.
    ``meta`` + the ``decision`` with its version is the version's :data:`META_FILE`.
    Returns N. Raises StorageError."""
    number = layout.next_number(directory.path)
    final = directory.path / str(number)
    try:
        with directory.temp_dir(f".{number}.", lambda name: _name(lock, name)) as tmp:
            try:
                tmp.write_bytes(BUILDING, _BUILDING_TEXT)
                shutil.copytree(export_dir / SAVED_MODEL_DIR, tmp.via, dirs_exist_ok=True)
                shutil.copy2(export_dir / KERAS_FILE, f"{tmp.via}/{KERAS_FILE}")
                number = _rename_as_next(directory, tmp, meta, decision)
                final = directory.path / str(number)
            finally:
                directory.remove(tmp.path.name)
                _name(lock, "")
    except OSError as exc:
        raise StorageError(f"{final}: cannot publish: {exc.strerror or exc}") from exc
    logs.event("published", f"published model version {number} in {directory.path}", version=number)
    return number


def _rename_as_next(directory: Dir, tmp: Dir, meta: dict[str, Any], decision: Decision) -> int:
    """Rename the built ``tmp`` to the next version number, its record naming it; the
    number again when another program took it first. Returns it. Raises StorageError,
    OSError."""
    for _ in range(RENAME_TRIES):
        full = layout.no_room(directory.path)
        if full is not None:
            raise StorageError(full)
        number = layout.next_number(directory.path)
        record = {**meta, "publish": dataclasses.replace(decision, version=number).to_json()}
        tmp.write_json(META_FILE, record)
        os.unlink(BUILDING, dir_fd=tmp.fd)  # the name is in the lock file until renamed
        try:
            directory.publish(tmp, str(number), replace=False)  # whole or not at all
            return number
        except FileExistsError:
            tmp.write_bytes(BUILDING, _BUILDING_TEXT)
    raise StorageError(
        f"{directory.path}: version numbers taken while publishing, {RENAME_TRIES} times"
    )


def _remove_leftovers(directory: Dir, lock: IO[bytes]) -> None:
    """Under the lock, no other run builds or prunes: remove what killed ones left, only
    what carries coretrain's own evidence under exactly the name coretrain gave it (the
    version being built that the lock file names; :func:`_marked`). A directory of such a
    name without the evidence is named in a ``publish_leftover_kept`` warning and kept;
    any other name is not coretrain's. Both names are hidden from TF Serving."""
    named = _named(lock)
    for name in directory.names():
        shaped = _BUILT_NAME.fullmatch(name) or _PRUNED_NAME.fullmatch(name)
        if not shaped or not directory.is_dir(name):
            continue
        if name == named or _marked(directory, name):
            directory.remove(name)
            logs.event("publish_cleanup", f"removed {directory.path / name}, left by a killed run")
            continue
        logs.event(
            "publish_leftover_kept",
            f"{directory.path / name}: kept: named as coretrain names a version it builds or "
            "prunes, without the mark it leaves there (remove it if a killed run left it)",
            level=logging.WARNING,
            path=str(directory.path / name),
        )


def _marked(directory: Dir, name: str) -> bool:
    """Whether the directory ``name`` (of this UID, not a symlink) holds what coretrain
    writes there: a version built as ``.N.<hex>``, :data:`BUILDING` with its text; one
    pruned as ``.pruned.N.<pid>``, its :data:`META_FILE` with the gate's decision to
    publish it (as version N, where the record names the number)."""
    pruned = _PRUNED_NAME.fullmatch(name)
    try:
        with directory.sub(name, "temporary directory", create=False) as d:
            if pruned is None:
                return d.read_bytes(BUILDING, len(_BUILDING_TEXT)) == _BUILDING_TEXT
            record = json.loads(d.read_bytes(META_FILE, RECORD_BYTES))
    except (OSError, StorageError, ValueError):
        return False
    decision = Decision.from_json(record.get("publish") if isinstance(record, dict) else None)
    if decision is None or not decision.published:
        return False
    return decision.version in (None, int(pruned.group(1)))


def _prune(directory: Dir, keep: int) -> None:
    """Remove the oldest versions coretrain published (with :data:`META_FILE`, not a
    symlink) beyond ``keep`` (0 = keep all); never the newest, never an entry it did not
    publish. A version is first renamed to a hidden name (no longer a version to TF
    Serving), then removed; one that can't be renamed stays whole, with a warning."""
    found = [
        e for e in layout.entries(directory.path)
        if e.is_model and not e.is_link and layout.read_meta(e.path)
    ]  # fmt: skip
    if keep < 1 or len(found) <= keep:
        return
    for entry in found[: len(found) - keep]:
        hidden = f"{PRUNING}{entry.number}.{os.getpid()}"
        try:
            directory.rename(entry.path.name, hidden)
        except OSError as exc:
            logs.event(
                "prune_failed",
                f"could not remove model version {entry.number} ({entry.path}): {exc.strerror}",
                level=logging.WARNING,
                version=entry.number,
            )
            continue
        directory.remove(hidden)
        logs.event("pruned", f"removed model version {entry.number} (--publish-keep {keep})")
