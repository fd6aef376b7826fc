"""What a trained model is on disk, read without TensorFlow: the export and the versions.

A run's export is ``model/`` with :data:`KERAS_FILE` and :data:`SAVED_MODEL_DIR`
(app/release/export.py writes it). A publish directory is TensorFlow Serving's base path:
every child whose *name* TF Serving parses as a number is a version to it, file or
directory, model or not, and it serves the largest (its file-system storage path source,
``tensorflow_serving/sources/storage_path/file_system_storage_path_source.cc``:
``ParseVersionNumber`` is ``strings::safe_strto64`` on the child's name, so ``007`` and
`` 7`` are version 7 and ``-1`` is version -1; the latest-version policy aspires the
largest number). :func:`entries` lists the children by that rule, and coretrain publishes
above all of them (:func:`next_number`), so what it publishes is what TF Serving serves.
A version coretrain published holds :data:`META_FILE` (app/release/publish.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.atomic import read_record
from app.errors import ConfigError
from app.release.gate import Decision

META_FILE = "coretrain.json"
KERAS_FILE = "model.keras"
SAVED_MODEL_DIR = "saved_model"
SAVED_MODEL_FILE = "saved_model.pb"
#: In a SavedModel directory: the H×W its flat (n, H·W) input is and its K outputs,
#: ``{"height", "width", "outputs"}`` (``outputs`` since this release);
#: ``assets.extra/`` is where a SavedModel keeps files its graph does not use (TF Serving
#: reads its warm-up requests there and ignores the rest).
INPUT_FILE = "assets.extra/coretrain_input.json"

#: TF Serving's version name: C ``isspace`` around an optional ``-`` and decimal digits
#: (``strings::safe_strto64``: no ``+``, no other base), within int64.
_NUMBER = re.compile(r"[ \t\n\v\f\r]*(-?[0-9]+)[ \t\n\v\f\r]*", re.ASCII)
_INT64 = (-(2**63), 2**63 - 1)


def version_number(name: str) -> int | None:
    """The version TF Serving reads from a child named ``name``; None when it reads none."""
    found = _NUMBER.fullmatch(name)
    if found is None:
        return None
    number = int(found.group(1))
    return number if _INT64[0] <= number <= _INT64[1] else None


#: The largest version TF Serving can read (int64): nothing can be published above it.
MAX_VERSION = _INT64[1]


@dataclass(frozen=True)
class Entry:
    """A child of a publish directory that TF Serving counts as version ``number``;
    ``is_model`` when it is (or, as TF Serving follows symlinks, leads to) a directory with
    ``saved_model.pb``, a SavedModel to load; ``is_link`` when the child is a symlink
    (coretrain never removes one)."""

    number: int
    path: Path
    is_model: bool
    is_link: bool = False

    @property
    def what(self) -> str:
        """What the entry is, for a message."""
        if self.is_model:
            return "a model"
        try:
            if not self.path.is_dir():
                return "not a directory"
            (self.path / SAVED_MODEL_FILE).stat()
        except FileNotFoundError:
            return "a directory without saved_model.pb"
        except OSError as exc:
            return f"unreadable: {exc.strerror}"
        return unloadable(self.path) or "a directory without saved_model.pb"


def _is_model(child: Path) -> bool:
    """Whether ``child`` holds a readable ``saved_model.pb`` (symlinks followed, as TF
    Serving follows them) and nothing TensorFlow would open that is not a regular file
    (:func:`unloadable`); an entry that can't be read is not one."""
    try:
        return (child / SAVED_MODEL_FILE).is_file() and unloadable(child) is None
    except OSError:  # EACCES, ELOOP, … on Python 3.11
        return False


#: What TensorFlow opens to load a SavedModel directory: these files of its own, and every
#: file of ``variables/`` (the checkpoint's index and shards).
_LOADED = ("saved_model.pb", "saved_model.pbtxt", "fingerprint.pb")


def unloadable(saved_model: Path) -> str | None:
    """Why TensorFlow must not be asked to load the SavedModel directory ``saved_model``: a
    file it opens to load it (:data:`_LOADED`, symlinks followed) is a FIFO, a device or a
    socket, whose open or read waits for a writer or never ends (a FIFO made TF's loader
    block with the publish lock held). None when each is a regular file or missing."""
    try:
        shards = [f"variables/{name}" for name in sorted(os.listdir(saved_model / "variables"))]
    except OSError:
        shards = []
    for name in (*_LOADED, *shards):
        try:
            mode = os.stat(saved_model / name).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            return f"{name} is not a regular file"
    return None


def entries(directory: Path) -> list[Entry]:
    """Every child of ``directory`` TF Serving counts as a version, in the order it ranks
    them: by number, then by name (of two names of one number it loads the later one)."""
    if not directory.is_dir():
        return []
    found = []
    for child in sorted(directory.iterdir(), key=lambda p: p.name):
        number = version_number(child.name)
        if number is not None:
            found.append(Entry(number, child, _is_model(child), child.is_symlink()))
    return sorted(found, key=lambda e: (e.number, e.path.name))


def served(directory: Path) -> Entry | None:
    """The entry TF Serving serves from ``directory`` (the largest number), None when none."""
    found = entries(directory)
    return found[-1] if found else None


def next_number(directory: Path) -> int:
    """The version to publish next: above every entry TF Serving counts (at least 1; above
    :data:`MAX_VERSION` when an entry holds it, which nothing can be published above)."""
    found = entries(directory)
    return max(found[-1].number, 0) + 1 if found else 1


def no_room(directory: Path) -> str | None:
    """Why nothing can be published in ``directory`` (an entry holds the largest version TF
    Serving reads); None when a version can be."""
    if next_number(directory) <= MAX_VERSION:
        return None
    top = entries(directory)[-1]
    return (
        f"{top.path}: TF Serving reads this name as version {MAX_VERSION}, the largest it "
        "can serve, so no version can be published above it (rename or remove it)"
    )


def models(directory: Path) -> list[Entry]:
    """The entries that are models, newest first: the champion candidates."""
    return [e for e in reversed(entries(directory)) if e.is_model]


def versions(directory: Path) -> list[int]:
    """The numbers of the entries that are models, sorted."""
    return sorted(e.number for e in entries(directory) if e.is_model)


def newest(directory: Path) -> Path | None:
    """The newest entry that is a model, None when there is none."""
    found = models(directory)
    return found[0].path if found else None


def read_meta(version: Path) -> dict[str, Any]:
    """What coretrain recorded in a version it published (:data:`META_FILE`); {} for a
    version it did not publish or whose record can't be read."""
    meta = _small_json(version / META_FILE)
    return meta if isinstance(meta, dict) else {}


def _field(meta: dict[str, Any], group: str, name: str) -> Any:
    """``meta[group][name]`` of a record another program may have written: None unless both
    levels are what coretrain writes (an object, then a plain value)."""
    part = meta.get(group)
    value = part.get(name) if isinstance(part, dict) else None
    return value if isinstance(value, (str, int, float)) or value is None else None


def files_digest(export: Path) -> str:
    """sha256 (hex, first 32 digits) of every regular file under ``export`` (a run's
    ``model/``): relative paths and contents, in sorted order. Raises OSError."""
    digest = hashlib.sha256()
    for path in sorted(p for p in export.rglob("*") if p.is_file() and not p.is_symlink()):
        digest.update(str(path.relative_to(export)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:32]


def published_as(directory: Path, weights: str) -> int | None:
    """The version in ``directory`` whose record holds the weights digest ``weights``
    (app/release/export.py ``weights_digest``); None when no version does."""
    for entry in models(directory):
        if read_meta(entry.path).get("weights") == weights:
            return entry.number
    return None


@dataclass(frozen=True)
class Listed:
    """One version of a publish directory as ``coretrain models`` shows it: the entry,
    whether TF Serving serves it (the largest number, model or not), and what the run that
    published it recorded (the gate's decision; empty for a version coretrain did not
    publish)."""

    entry: Entry
    served: bool
    meta: dict[str, Any]

    @property
    def decision(self) -> Decision | None:
        return Decision.from_json(self.meta.get("publish"))

    def to_json(self) -> dict[str, Any]:
        meta, decision = self.meta, self.decision
        plain = {k: v for k, v in meta.items() if isinstance(v, (str, int, float))}
        return {
            "version": self.entry.number,
            "served": self.served,
            "model": self.entry.is_model,
            "what": self.entry.what,
            "published_at": plain.get("published_at"),
            "test_rmse": decision.candidate_rmse if decision else None,
            "baseline_rmse": _field(meta, "metrics", "baseline_rmse"),
            "final_step": _field(meta, "metrics", "final_step"),
            "train_size": _field(meta, "metrics", "train_size"),
            "data": plain.get("data_key"),
            "weights": plain.get("weights"),
            "path": str(self.entry.path),
        }


def listing(directory: Path) -> list[Listed]:
    """Every entry TF Serving counts in ``directory``, in its order, the served one marked."""
    found = entries(directory)
    return [
        Listed(e, i == len(found) - 1, read_meta(e.path) if e.is_model else {})
        for i, e in enumerate(found)
    ]


@dataclass(frozen=True)
class Signature:
    """A served model's interface: float32 (n, ``inputs``) → (n, ``outputs``)."""

    inputs: int
    outputs: int

    def __str__(self) -> str:
        return f"(n, {self.inputs}) → (n, {self.outputs})"


def input_hw(saved_model: Path) -> tuple[int, int] | None:
    """The (H, W) the SavedModel ``saved_model`` was trained on (:data:`INPUT_FILE`); None
    for an export that does not record it (an earlier coretrain's) or an unreadable one."""
    hw = _recorded(saved_model, "height", "width")
    return (hw[0], hw[1]) if hw is not None else None


def recorded_signature(saved_model: Path) -> Signature | None:
    """The signature :data:`INPUT_FILE` records for the SavedModel ``saved_model``; None
    when it records no K (an earlier coretrain's export), is unreadable or missing (another
    program's model). A hint only: the signature is the model's own (app/release/publish.py
    ``load``)."""
    found = _recorded(saved_model, "height", "width", "outputs")
    return Signature(found[0] * found[1], found[2]) if found is not None else None


def _recorded(saved_model: Path, *names: str) -> tuple[int, ...] | None:
    """The positive integers ``names`` of :data:`INPUT_FILE`; None unless all are there."""
    record = _small_json(saved_model / INPUT_FILE)
    try:
        values = tuple(record[name] for name in names)
    except (KeyError, TypeError):
        return None
    ok = all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in values)
    return tuple(int(n) for n in values) if ok else None


def resolve_model(directory: Path) -> Path:
    """The SavedModel directory ``directory`` names (see the module docstring).

    Raises ConfigError (exit 2) when it holds no model.
    """
    for found in (directory / SAVED_MODEL_DIR, directory):
        if (found / SAVED_MODEL_FILE).is_file():
            why = unloadable(found)
            if why is not None:
                raise ConfigError(f"{found}: not a model TensorFlow can load: {why}")
            return found
    version = newest(directory)
    if version is not None:
        return version
    raise ConfigError(
        f"{directory}: no model here (a run's model/ directory, a version directory with "
        "saved_model.pb, or a publish directory of numbered versions)"
    )


def _small_json(path: Path) -> Any:
    """The JSON value in the record ``path`` (:func:`app.atomic.read_record`); None when it
    is not one (missing, a FIFO, whose open would wait for a writer, a device, too big,
    not JSON). A record sits in a directory others may write to: it must not stop or swamp
    the run that reads it."""
    try:
        return read_record(path)
    except (OSError, ValueError):
        return None
