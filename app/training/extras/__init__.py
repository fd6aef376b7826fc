"""The extras the loop runs at its boundaries, each made of hooks (app/training/loop/hooks.py),
in the order of :data:`EXTRAS`. Every extra is a module here with
``hooks(context: Context) -> list[Hook]`` (none where it does not apply). As Keras gives a
callback the model and the batch's logs, the :class:`Context` gives an extra the model, the
learning rate of a step and what it may need of the run; its hooks get each call's losses
and each evaluation's record. A new extra is one new module and its line in
:data:`EXTRAS`. Import it once TensorFlow is up (the summaries write with it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.training.extras import best_step, budget_watch, progress_view, summaries
from app.training.loop.hooks import Hook

if TYPE_CHECKING:
    from app.budget.plan import ThreadPlan
    from app.training.state.best import Best
    from app.training.state.workspace import Workspace


@dataclass(frozen=True)
class Context:
    """What an extra may know of the run it joins: the workspace, the thread plan, whether
    it is one process (``single``; else a worker of several), the best validated step, the
    step the loop starts at and the one it ends at, whether a validation split is evaluated
    (else the test set), the samples of one global step, ``--replan``, the run's
    ``options`` as JSON (with the formulation and precision decided), the Keras ``model``
    being trained and ``learning_rate(step)``, the optimizer's rate at a step."""

    ws: Workspace
    plan: ThreadPlan
    single: bool
    best: Best
    start: int
    validating: bool
    max_steps: int
    samples_per_step: int
    replan: str
    options: dict[str, Any]
    model: Any
    learning_rate: Callable[[int], float]


#: The extras, in the order their hooks run at each boundary.
EXTRAS: tuple[Callable[[Context], list[Hook]], ...] = (
    best_step.hooks,
    budget_watch.hooks,
    progress_view.hooks,
    summaries.hooks,
)


def hooks(context: Context) -> list[Hook]:
    """The hooks of every extra of :data:`EXTRAS` for the run of ``context``."""
    return [hook for make in EXTRAS for hook in make(context)]
