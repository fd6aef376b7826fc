"""The Controller owns *when*: the loop to an absolute step, and nothing of what a step is.

As orbit's ``Controller``: it trains to ``max_steps`` from wherever the restore left the
run, in calls of up to K steps (``--steps-per-loop``), and after each call decides:

* **evaluate** when the step is a multiple of ``eval_every``, the last step, or a stop
  was requested (a ``progress`` event: loss, the validation RMSE, or the test RMSE in a
  run without a validation split, rate, CPU use, ETA), and give the record to the hooks
  (app/training/loop/hooks.py: the best validated step, exported at the end, among them);
  the hooks also run after every call (a per-step boundary with K = 1);
* **checkpoint** when the step is a multiple of ``checkpoint_every``, the last step, the
  target was reached, or a stop was requested (the only place a checkpoint is decided);
* **stop** on an agreed stop request (:class:`~app.training.loop.outcome.Stopped`), when the
  evaluated RMSE is below ``target_loss`` (``TargetReached``), at ``max_steps``
  (``Completed``), or when the CPU budget changed so that the thread plan must change
  (a hook says so: ``Replan``, after a checkpoint: the caller restarts TensorFlow with
  the new plan); a
  non-finite loss or evaluated RMSE raises TrainingDiverged (exit 5) before anything is
  saved. The outcome is returned as its type (app/training/loop/outcome.py).

A call never crosses an evaluation or checkpoint step or the last step: K is cut to the
next boundary, so every interval is honoured at the step the user asked for. With K = 0
(auto) the first call runs one step (it traces the step function), the second a few,
timed, and K is chosen so that a call does about :data:`TARGET_CALL_SECONDS` of work
(agreed between workers, which must make the same calls). No TensorFlow here: the
trainer and checkpointer are passed in, so the rules are tested with stand-ins.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from app import logs
from app.errors import TrainingDiverged
from app.training.loop.hooks import Hook, StepResult
from app.training.loop.outcome import Completed, Outcome, Replan, Stopped, TargetReached

#: Warn when the evaluated RMSE is not below the mean predictor from this evaluation on.
NOT_LEARNING_AFTER_EVALS = 2
#: Work per call that K = auto aims at (seconds): the host wakes about twice a second,
#: and a stop request waits at most this long for the call in flight.
TARGET_CALL_SECONDS = 0.5
#: Steps the timed calibration call runs (K = auto).
CALIBRATION_STEPS = 3
MAX_STEPS_PER_LOOP = 1000
_NAMES = {"val_rmse": "validation RMSE", "test_rmse": "test RMSE"}


class TrainerLike(Protocol):
    def train(self, steps: int, stop: Callable[[], bool]) -> StepResult: ...

    def evaluate(self) -> float: ...

    def learning_rate(self, step: int) -> float: ...


class CheckpointsLike(Protocol):
    def save(self, step: int) -> str: ...

    def kept(self) -> str: ...

    def remedy(self) -> str: ...


@dataclass(frozen=True)
class Schedule:
    """The intervals, in steps; ``target_loss`` in raw label units (the evaluated RMSE)."""

    max_steps: int
    eval_every: int
    checkpoint_every: int
    steps_per_loop: int = 0
    target_loss: float = 0.0

    def call_length(self, step: int, k: int) -> int:
        """Steps of the next call from ``step``: ``k``, cut at the next boundary."""
        boundaries = (
            self.max_steps,
            _next_multiple(step, self.eval_every),
            _next_multiple(step, self.checkpoint_every),
        )
        return max(1, min(step + k, *boundaries) - step)


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every


@dataclass
class Meter:
    """Rate, CPU use and ETA between two progress events (wall and process CPU time).

    ``cpu_budget`` in CPUs; the window starts after the first call, which traces the
    step function, so start-up does not count against the first interval's rate.
    ``evaluating``: seconds of the window spent evaluating (the controller adds them), so
    the training rate without them is known too: a large validation set evaluated often
    weighs on the rate as much as the input does.
    """

    cpu_budget: float
    samples_per_step: int
    clock: Callable[[], float] = time.perf_counter
    cpu_clock: Callable[[], float] = time.process_time
    throttling: Callable[[], dict[str, float | None]] | None = None  # per interval
    step: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    evaluating: float = 0.0

    def mark(self, step: int) -> None:
        self.step, self.wall, self.cpu = step, self.clock(), self.cpu_clock()
        self.evaluating = 0.0

    def read(self, step: int, max_steps: int) -> dict[str, float | None]:
        """examples_per_sec (wall), train_examples_per_sec (the wall less ``evaluating``),
        eval_s, cpu_util (share of the budget), eta_s since the last mark."""
        wall = max(self.clock() - self.wall, 1e-9)
        steps = max(step - self.step, 1)
        training = max(wall - self.evaluating, 1e-9)
        fields: dict[str, float | None] = {
            "examples_per_sec": round(steps * self.samples_per_step / wall, 1),
            "train_examples_per_sec": round(steps * self.samples_per_step / training, 1),
            "eval_s": round(self.evaluating, 3),
            "cpu_util": round((self.cpu_clock() - self.cpu) / (wall * self.cpu_budget), 3),
            "eta_s": round((max_steps - step) * wall / steps, 1),
        }
        if self.throttling is not None:
            fields.update(self.throttling())
        self.mark(step)
        return fields


@dataclass
class Controller:
    """Runs the loop of the module docstring. ``stop`` is this process's stop request;
    ``agree`` turns a per-worker number into the one all workers use (the mean; the
    identity for one process); ``hooks`` are the extras run at the loop's boundaries
    (app/training/loop/hooks.py: after each call, after each evaluation, asked whether to
    re-plan). ``metric`` names the evaluated RMSE in the record (``val_rmse`` or
    ``test_rmse``), ``baseline_rmse`` is the mean predictor's on the same rows, and
    ``references`` are fields every record carries (the test set's mean-predictor and
    linear-baseline RMSEs)."""

    trainer: TrainerLike
    checkpoints: CheckpointsLike
    schedule: Schedule
    meter: Meter
    stop: Callable[[], bool]
    baseline_rmse: float
    agree: Callable[[float], float] = lambda value: value
    hooks: Sequence[Hook] = ()
    metric: str = "test_rmse"
    references: dict[str, float | None] = field(default_factory=dict)
    evaluations: int = 0

    def run(self, start: int) -> Outcome:
        """Train from ``start`` to the schedule's end; return how it ended."""
        s = self.schedule
        step, rmse, k, calls = start, None, s.steps_per_loop, 0
        ending: type[Outcome] = Completed
        clock = self.meter.clock
        t_loop = clock()
        self.meter.mark(step)
        while step < s.max_steps and ending is Completed:
            n = s.call_length(step, k or (1 if calls == 0 else CALIBRATION_STEPS))
            t_call = clock()
            result = self.trainer.train(n, self.stop)
            step, calls = step + len(result.losses), calls + 1
            if result.diverged:
                raise TrainingDiverged(
                    f"loss became {result.loss} at step {step}; {self.checkpoints.kept()}; "
                    f"{self.checkpoints.remedy()}"
                )
            for hook in self.hooks:
                hook.after_steps(step, result)
            last, stopping = step >= s.max_steps, result.stop
            evaluate = step % s.eval_every == 0 or last or stopping
            if calls == 1 and not evaluate:
                self.meter.mark(step)  # the first call traced the step function: not a rate
            elif calls == 2 and k == 0:
                k = self._choose_steps_per_loop((clock() - t_call) / n)
            if evaluate:
                rmse = self._evaluate(step, result)
                ending = self._ending(rmse, last or stopping)
            if stopping:
                ending = Stopped
            if step % s.checkpoint_every == 0 or last or ending is not Completed:
                self.checkpoints.save(step)
        return ending(start, step, rmse, clock() - t_loop, k)

    def _ending(self, rmse: float, final: bool) -> type[Outcome]:
        """After an evaluation: the target reached, a budget that needs a new plan (asked
        only when the loop would go on), or going on (:class:`Completed` at the end)."""
        if rmse < self.schedule.target_loss:
            return TargetReached
        if not final and any([hook.replan() for hook in self.hooks]):  # every hook asked
            return Replan
        return Completed

    def _choose_steps_per_loop(self, step_seconds: float) -> int:
        """K for about :data:`TARGET_CALL_SECONDS` per call, the same on every worker."""
        wanted = min(
            max(round(TARGET_CALL_SECONDS / max(step_seconds, 1e-6)), 1), MAX_STEPS_PER_LOOP
        )
        k = max(1, int(self.agree(float(wanted))))
        logs.event(
            "steps_per_loop",
            f"{k} steps per call into TensorFlow ({step_seconds * 1e3:.1f} ms per step, "
            f"about {TARGET_CALL_SECONDS:g} s per call; --steps-per-loop 0 = auto)",
            steps_per_loop=k,
            step_ms=round(step_seconds * 1e3, 2),
        )
        return k

    def _evaluate(self, step: int, result: StepResult) -> float:
        """The evaluated RMSE at ``step``, logged as a ``progress`` event and given to the
        hooks."""
        t0 = self.meter.clock()
        rmse = self.trainer.evaluate()
        self.meter.evaluating += self.meter.clock() - t0
        if not math.isfinite(rmse):  # the weights to be checkpointed are broken
            raise TrainingDiverged(
                f"{_NAMES.get(self.metric, self.metric)} became {rmse} at step {step} "
                f"(loss {result.loss:.4g}); "
                f"{self.checkpoints.kept()}; {self.checkpoints.remedy()}"
            )
        self.evaluations += 1
        record: dict[str, Any] = {
            "step": step,
            "loss": result.loss,
            "train_rmse": result.train_rmse,
            self.metric: rmse,
            **self.references,
            "lr": self.trainer.learning_rate(step),
            **self.meter.read(step, self.schedule.max_steps),
        }
        logs.event(
            "progress",
            f"step {step}/{self.schedule.max_steps} loss {result.loss:.4f} "
            f"{self.metric} {rmse:.4f}",
            **record,
        )
        for hook in self.hooks:
            hook.after_evaluation(record)
        if self.evaluations >= NOT_LEARNING_AFTER_EVALS and rmse >= self.baseline_rmse:
            logs.event(
                "not_learning",
                f"{_NAMES.get(self.metric, self.metric)} {rmse:.4g} is not below the mean "
                "predictor's "
                f"{self.baseline_rmse:.4g}",
                level=logging.WARNING,
                step=step,
                **{self.metric: rmse},
                baseline_rmse=self.baseline_rmse,
            )
        return rmse
