"""What the choice's timings depend on: the key they are kept by.

They are kept beside the data cache (app/data/cache/measured.py) and reused only while all of it
is the same (app/training/state/choose.py): the CPU's model and flags (``/proc/cpuinfo``),
TensorFlow's and coretrain's versions, the thread plan (intra-op, inter-op threads, oneDNN,
pinning), the batch size, H×W and the labels per sample, the options that shape the step
(optimizer, dropout, weight decay), the candidates timed and how they are timed. (The
ridge's key: app/training/inputs/baselines.py ``ridge_depends``.) No TensorFlow here.
"""

from __future__ import annotations

from typing import Any

from app import __version__
from app.budget.plan import ThreadPlan
from app.config import RecipeConfig
from app.data.cache import DataCache


def cpu_flags(plan: ThreadPlan) -> list[str]:
    """The flags of the CPU the plan read (``flags`` or Arm's ``Features``), sorted."""
    for line in plan.inputs.get("/proc/cpuinfo", "").splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return sorted(set(value.split()))
    return []


def choice_depends(
    plan: ThreadPlan, recipe: RecipeConfig, data: DataCache, candidates: list[tuple[str, str]],
    tensorflow: str, timing: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """What the choice among ``candidates`` for a step of ``recipe`` depends on (module
    docstring); ``timing``: how they are timed (steps, rounds, margin)."""
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
        "batch_size": recipe.batch_size,
        "shape": [data.height, data.width, data.num_outputs],
        "step": {
            "optimizer": recipe.optimizer,
            "keep_prob": recipe.keep_prob,
            "weight_decay": recipe.weight_decay,
        },
        "candidates": [f"{f}/{p}" for f, p in candidates],
        "timing": timing,
    }
