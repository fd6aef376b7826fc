"""The best validated step: every evaluation of the validation split is offered to the run's
:class:`~app.training.state.best.Best`, which keeps the step with the lowest RMSE beside the
checkpoints (exported at the end). A run without a validation split exports its last step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.training.loop.hooks import Hook

if TYPE_CHECKING:
    from app.training.extras import Context
    from app.training.state.best import Best


class BestStep(Hook):
    """Offers ``best`` each evaluated step with its ``val_rmse``."""

    def __init__(self, best: Best) -> None:
        self.best = best

    def after_evaluation(self, record: dict[str, Any]) -> None:
        self.best.offer(int(record["step"]), float(record["val_rmse"]))


def hooks(context: Context) -> list[Hook]:
    """The best step's hook, when the run evaluates a validation split."""
    return [BestStep(context.best)] if context.validating else []
