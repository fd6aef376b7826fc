"""How a training loop ended, as types: returned by the loop, mapped to an exit code once.

The loop (:class:`app.training.loop.controller.Controller`) returns one of these; failures (bad
data, storage, a diverging loss, a lost worker) are raised instead, as the
:class:`app.errors.AppError` of their exit code. A stop that comes before any step could
be trained (during the cache conversion, before the loop) is raised too
(:class:`app.errors.Preempted`): there is no step to report. ``app/commands/train.py``
is the one place that turns an outcome into the process's exit code or its restart
(docs/architecture.md, "Outcomes"). No TensorFlow here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from app.release.gate import Decision


def results(summary: dict[str, Any]) -> dict[str, Any]:
    """The ``end`` event's fields: the summary (``metrics.json``) without the thread plan,
    which the ``start`` event points to (``plan_file``)."""
    return {key: value for key, value in summary.items() if key != "plan"}


@dataclass(frozen=True)
class Outcome:
    """The loop's end at ``step`` (it started at ``start_step``); ``eval_rmse`` is the last
    evaluated RMSE in raw label units (None when nothing was trained), ``loop_seconds``
    the loop's wall time, ``steps_per_loop`` the K it used (0 when it ended before K =
    auto was chosen). ``status`` is the ``end`` event's and ``metrics.json``'s word."""

    status: ClassVar[str]
    start_step: int
    step: int
    eval_rmse: float | None
    loop_seconds: float
    steps_per_loop: int


@dataclass(frozen=True)
class Completed(Outcome):
    """``--max-steps`` was reached: export (and publish). Exit 0 (7 if the gate refused)."""

    status = "completed"


@dataclass(frozen=True)
class TargetReached(Outcome):
    """The evaluated RMSE went below ``--target-loss``: a checkpoint of that step, then as
    :class:`Completed`."""

    status = "target_reached"


@dataclass(frozen=True)
class Stopped(Outcome):
    """A stop request (SIGTERM/SIGINT) all workers agreed on: a checkpoint of ``step`` was
    saved, nothing is exported. Exit 143; a rerun resumes."""

    status = "preempted"


@dataclass(frozen=True)
class Replan(Outcome):
    """The CPU budget changed so that the thread plan must change: a checkpoint of ``step``
    was saved; the process restarts itself with the new plan (``at``: when the change was
    noticed, seconds since the epoch)."""

    status = "replan"
    at: float = field(default_factory=time.time)


#: Set in the environment of a run restarted after :class:`Replan`: its ``at``.
REPLAN_AT_ENV = "_CORETRAIN_REPLAN_AT"
#: Set in the environment of a run restarted after :class:`Replan`: the wall-clock time
#: (``time.time()``) its first process started, so ``wall_seconds`` spans the whole run.
STARTED_AT_ENV = "_CORETRAIN_STARTED_AT"

#: The outcomes after which the model is exported.
FINISHED = (Completed, TargetReached)


@dataclass(frozen=True)
class Result:
    """A run's outcome, its summary (``metrics.json``'s content: app/training/finish.py) and
    the publish gate's decision (None when publishing was not asked for)."""

    outcome: Outcome
    summary: dict[str, Any]
    decision: Decision | None = None

    @property
    def refused(self) -> str | None:
        """Why the publish gate kept the model out of ``--publish-dir``; None when it was
        published or publishing was not asked for."""
        if self.decision is None or self.decision.published:
            return None
        return self.decision.reason
