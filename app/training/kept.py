"""What the choice's timings and the linear baseline depend on: the keys they are kept by.

Both are kept beside the data cache (app/data/measured.py) and reused only while everything
here is the same:

* the **choice** (app/training/choose.py): the CPU's model and flags (``/proc/cpuinfo``),
  TensorFlow's and coretrain's versions, the thread plan (intra-op, inter-op threads,
  oneDNN, pinning), the batch size, H×W and the labels per sample, the options that shape
  the step (optimizer, dropout, weight decay), the candidates timed and how they are timed;
* the **ridge** (app/training/linear.py): the data (the fingerprints of the training and
  test arrays and of their statistics), the rows it may use (the training and validation
  rows, by digest), the seed and the fit's settings (bounds, penalties, chunking), and
  coretrain's version. BLAS threads are not part of it: they change at most the last bits
  of the same fit.

No TensorFlow here.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from app import __version__
from app.budget.plan import ThreadPlan
from app.config import TrainConfig
from app.data.cache import DataCache
from app.training import linear


def cpu_flags(plan: ThreadPlan) -> list[str]:
    """The flags of the CPU the plan read (``flags`` or Arm's ``Features``), sorted."""
    for line in plan.inputs.get("/proc/cpuinfo", "").splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return sorted(set(value.split()))
    return []


def choice_depends(
    plan: ThreadPlan, config: TrainConfig, data: DataCache, candidates: list[tuple[str, str]],
    tensorflow: str, timing: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """What the choice among ``candidates`` depends on (module docstring); ``timing``: how
    they are timed (steps, rounds, margin)."""
    return {
        "cpu_model": plan.cpu_model,
        "cpu_flags": cpu_flags(plan),
        "tensorflow": tensorflow,
        "coretrain": __version__,
        "threads": {
            "intra_op": plan.intra_op_threads,
            "inter_op": plan.inter_op_threads,
            "onednn": plan.onednn,
            "pin_cpus": None if plan.pin_cpus is None else list(plan.pin_cpus),
        },
        "batch_size": config.batch_size,
        "shape": [data.height, data.width, data.num_outputs],
        "step": {
            "optimizer": config.optimizer,
            "keep_prob": config.keep_prob,
            "weight_decay": config.weight_decay,
        },
        "candidates": [f"{f}/{p}" for f, p in candidates],
        "timing": timing,
    }


def _digest(rows: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(rows, np.int64).tobytes()).hexdigest()[:16]


def ridge_depends(
    data: DataCache, train_rows: np.ndarray, val_rows: np.ndarray, seed: int
) -> dict[str, Any]:
    """What the ridge fitted on ``train_rows`` and scored on ``val_rows`` and the test set
    depends on (module docstring)."""
    return {
        "train": data.fingerprint("train"),
        "test": data.fingerprint("test"),
        "stats": data.checksums.get("stats.npz", ""),
        "rows": {"train": _digest(train_rows), "validation": _digest(val_rows)},
        "seed": seed,
        "settings": {
            "max_rows": linear.MAX_ROWS,
            "max_work": linear.MAX_WORK,
            "max_gram": linear.MAX_GRAM,
            "max_sample_bytes": linear.MAX_SAMPLE_BYTES,
            "alphas": list(linear.ALPHAS),
            "chunk_rows": linear.CHUNK_ROWS,
        },
        "coretrain": __version__,
    }
