"""The published model versions of a publish directory, read without TensorFlow.

``DIR/<N>/`` with ``saved_model.pb`` is version N (TensorFlow Serving's layout); its
``coretrain.json`` holds what the run recorded (app/training/publish.py writes them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

META_FILE = "coretrain.json"


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
