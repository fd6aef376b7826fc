"""The extras the loop runs at its boundaries, one per module, each made of hooks
(app/training/loop/hooks.py): the best validated step, the TensorBoard summaries, the budget
watch and its throttling warning.

Every module here defines ``hooks(run: Run) -> list[Hook]``: the hooks it adds to a run
(none when it does not apply, e.g. summaries on a worker that is not the chief).
:func:`hooks` collects them from every module of this package, in the order of the modules'
names, so a new extra is one new module and no edit elsewhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.training.loop.hooks import Hook

if TYPE_CHECKING:  # an extra's own module imports TensorFlow if it needs it
    from app.budget.plan import ThreadPlan
    from app.config import TrainConfig
    from app.training.loop.replicas import Replicas
    from app.training.state.best import Best
    from app.training.state.choose import Choice
    from app.training.state.workspace import Workspace


@dataclass(frozen=True)
class Run:
    """What an extra may know of the run it joins: the workspace, the options as asked and
    the formulation and precision decided, the thread plan, the replicas, the best validated
    step, the step the loop starts at, and whether a validation split is evaluated (else the
    test set)."""

    ws: Workspace
    config: TrainConfig
    choice: Choice
    plan: ThreadPlan
    reps: Replicas
    best: Best
    start: int
    validating: bool


def hooks(run: Run) -> list[Hook]:
    """The hooks of every extra of this package for ``run`` (module docstring)."""
    found: list[Hook] = []
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        make: Callable[[Run], list[Hook]] = importlib.import_module(f"{__name__}.{module}").hooks
        found.extend(make(run))
    return found
