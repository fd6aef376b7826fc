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

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import ConfigError
from app.release.gate import Decision

META_FILE = "coretrain.json"
KERAS_FILE = "model.keras"
SAVED_MODEL_DIR = "saved_model"
SAVED_MODEL_FILE = "saved_model.pb"

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


@dataclass(frozen=True)
class Entry:
    """A child of a publish directory that TF Serving counts as version ``number``;
    ``is_model`` when it is a directory with ``saved_model.pb`` (a SavedModel to load)."""

    number: int
    path: Path
    is_model: bool

    @property
    def what(self) -> str:
        """What the entry is, for a message."""
        if self.is_model:
            return "a model"
        if self.path.is_symlink() or not self.path.is_dir():
            return "not a directory"
        return "a directory without saved_model.pb"


def entries(directory: Path) -> list[Entry]:
    """Every child of ``directory`` TF Serving counts as a version, in the order it ranks
    them: by number, then by name (of two names of one number it loads the later one)."""
    if not directory.is_dir():
        return []
    found = []
    for child in sorted(directory.iterdir(), key=lambda p: p.name):
        number = version_number(child.name)
        if number is not None:
            model = not child.is_symlink() and (child / SAVED_MODEL_FILE).is_file()
            found.append(Entry(number, child, model))
    return sorted(found, key=lambda e: (e.number, e.path.name))


def served(directory: Path) -> Entry | None:
    """The entry TF Serving serves from ``directory`` (the largest number), None when none."""
    found = entries(directory)
    return found[-1] if found else None


def next_number(directory: Path) -> int:
    """The version to publish next: above every entry TF Serving counts (at least 1)."""
    found = entries(directory)
    return max(found[-1].number, 0) + 1 if found else 1


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
    try:
        meta = json.loads((version / META_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


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
        metrics = self.meta.get("metrics", {})
        decision = self.decision
        return {
            "version": self.entry.number,
            "served": self.served,
            "model": self.entry.is_model,
            "what": self.entry.what,
            "published_at": self.meta.get("published_at"),
            "test_rmse": decision.candidate_rmse if decision else None,
            "baseline_rmse": metrics.get("baseline_rmse"),
            "final_step": metrics.get("final_step"),
            "train_size": metrics.get("train_size"),
            "data": self.meta.get("data_key"),
            "weights": self.meta.get("weights"),
            "path": str(self.entry.path),
        }


def listing(directory: Path) -> list[Listed]:
    """Every entry TF Serving counts in ``directory``, in its order, the served one marked."""
    found = entries(directory)
    return [
        Listed(e, i == len(found) - 1, read_meta(e.path) if e.is_model else {})
        for i, e in enumerate(found)
    ]


def resolve_model(directory: Path) -> Path:
    """The SavedModel directory ``directory`` names (see the module docstring).

    Raises ConfigError (exit 2) when it holds no model.
    """
    if (directory / SAVED_MODEL_DIR / SAVED_MODEL_FILE).is_file():
        return directory / SAVED_MODEL_DIR
    if (directory / SAVED_MODEL_FILE).is_file():
        return directory
    version = newest(directory)
    if version is not None:
        return version
    raise ConfigError(
        f"{directory}: no model here (a run's model/ directory, a version directory with "
        "saved_model.pb, or a publish directory of numbered versions)"
    )
