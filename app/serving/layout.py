"""What a trained model is on disk, read without TensorFlow.

A run's export is ``model/`` with :data:`KERAS_FILE` and :data:`SAVED_MODEL_DIR`
(app/training/export.py writes it). A publish directory holds numbered versions:
``DIR/<N>/`` with ``saved_model.pb`` is version N (TensorFlow Serving's layout), and its
:data:`META_FILE` holds what the run recorded (app/training/publish.py writes them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.errors import ConfigError

META_FILE = "coretrain.json"
KERAS_FILE = "model.keras"
SAVED_MODEL_DIR = "saved_model"


def versions(directory: Path) -> list[int]:
    """The published version numbers in ``directory`` (those with a saved_model.pb), sorted."""
    if not directory.is_dir():
        return []
    return sorted(
        int(p.name)
        for p in directory.iterdir()
        if p.name.isdigit() and (p / "saved_model.pb").is_file()
    )


def newest(directory: Path) -> Path | None:
    """The champion: the highest published version in ``directory``, None when there is none."""
    found = versions(directory)
    return directory / str(found[-1]) if found else None


def listing(directory: Path) -> list[dict[str, Any]]:
    """Every published version, oldest first: number, date, RMSEs and run facts."""
    rows = []
    found = versions(directory)
    for number in found:
        meta_path = directory / str(number) / META_FILE
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            meta = {}
        gate = meta.get("publish", {})
        rows.append(
            {
                "version": number,
                "champion": number == found[-1],
                "published_at": meta.get("published_at"),
                "test_rmse": gate.get("candidate_rmse"),
                "baseline_rmse": meta.get("metrics", {}).get("baseline_rmse"),
                "final_step": meta.get("metrics", {}).get("final_step"),
                "train_size": meta.get("metrics", {}).get("train_size"),
                "data": meta.get("data_key"),
                "path": str(directory / str(number)),
            }
        )
    return rows


def resolve_model(directory: Path) -> Path:
    """The SavedModel directory ``directory`` names (see the module docstring).

    Raises ConfigError (exit 2) when it holds no model.
    """
    if (directory / SAVED_MODEL_DIR / "saved_model.pb").is_file():
        return directory / SAVED_MODEL_DIR
    if (directory / "saved_model.pb").is_file():
        return directory
    version = newest(directory)
    if version is not None:
        return version
    raise ConfigError(
        f"{directory}: no model here (a run's model/ directory, a version directory with "
        "saved_model.pb, or a publish directory of numbered versions)"
    )
