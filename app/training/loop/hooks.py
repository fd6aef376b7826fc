"""The extras the loop runs at its boundaries, behind one interface (as Keras' callbacks and
orbit's actions): the controller owns *when*, a hook only *what* happens then.

A hook overrides the boundaries it needs; the rest do nothing:

* :meth:`Hook.after_steps` after every call into TensorFlow: ``step`` is the absolute step
  reached, ``result`` the call's losses (one per step: with ``--steps-per-loop 1`` this is
  every step; by default a call is about half a second of steps);
* :meth:`Hook.after_evaluation` after every evaluation with the ``progress`` record (``step``,
  ``loss``, the evaluated RMSE under ``metric``, rate, CPU use, ETA, ...);
* :meth:`Hook.replan` after an evaluation the loop would go on from: True ends the loop in
  :class:`~app.training.loop.outcome.Replan` (after a checkpoint).

The run's hooks are made by the extras listed in app/training/extras/__init__.py (one
extra per module, given the run's context), so a new extra is a new module there and its
line in that list. No TensorFlow here.
"""

from __future__ import annotations

from typing import Any, Protocol


class StepResult(Protocol):
    """What one call into TensorFlow trained: ``losses`` per step, the last ``loss``,
    ``train_rmse``, whether a stop was agreed and whether the loss ``diverged``."""

    @property
    def losses(self) -> Any: ...  # a sequence of floats, one per step run

    @property
    def loss(self) -> float: ...

    @property
    def train_rmse(self) -> float: ...

    @property
    def stop(self) -> bool: ...

    @property
    def diverged(self) -> bool: ...


class Hook:
    """An extra at the loop's boundaries (module docstring). Subclass and override."""

    def after_steps(self, step: int, result: StepResult) -> None:
        """After a call into TensorFlow reached absolute step ``step``."""

    def after_evaluation(self, record: dict[str, Any]) -> None:
        """After an evaluation, with its ``progress`` record."""

    def replan(self) -> bool:
        """Whether the run must restart with a new thread plan (asked after an evaluation
        the loop would go on from)."""
        return False
