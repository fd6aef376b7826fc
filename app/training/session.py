"""The TensorFlow part of a run, set up: what the loop trains and what it hands to the end.

:func:`start` takes the run from its admitted facts (app/training/admit/) and inputs to the
first step: the workers agreed on the identity, the formulation and precision chosen (or the
checkpoints'), the trainer, the newest valid checkpoint and the best validated step
restored, the identity recorded beside them, the input pipeline fed from the restored step.
Nothing admitted is checked again. The :class:`Session` builds the loop and, once it ended,
the exported step's facts. Import it after :func:`app.budget.apply.import_tensorflow`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app import logs
from app.budget.plan import ThreadPlan
from app.budget.usage import Throttling
from app.config import CacheConfig, ComputeConfig, RecipeConfig, ScheduleConfig
from app.data.cache import measured
from app.errors import Preempted
from app.training import extras
from app.training.inputs.load import Inputs
from app.training.loop.controller import Controller, Meter, Schedule
from app.training.loop.outcome import REPLAN_AT_ENV, Outcome
from app.training.loop.replicas import Replicas
from app.training.loop.trainer import Trainer
from app.training.state import choose, identity
from app.training.state.best import Best
from app.training.state.checkpointer import Checkpointer
from app.training.state.workspace import Workspace

if TYPE_CHECKING:
    from app.training.admit.facts import Admitted


@dataclass(frozen=True)
class Session:
    """A run ready to train from ``start``: its workspace, ``choice``, the formulation and
    precision decided, plan, inputs, replicas, stop request, the TensorFlow parts (trainer,
    checkpoints, best validated step), the loop's ``schedule`` and what the extras are
    given (``replan``: ``--replan``; ``options``: the run's options as JSON, asked)."""

    ws: Workspace
    choice: choose.Choice
    plan: ThreadPlan
    inputs: Inputs
    reps: Replicas
    stop: Callable[[], bool]
    trainer: Trainer
    checkpoints: Checkpointer
    best: Best
    start: int
    schedule: ScheduleConfig
    replan: str
    options: dict[str, Any]

    @property
    def standardize(self) -> bool:
        """Whether the model sees standardised features and labels (``--standardize``)."""
        return self.trainer.standardize

    @property
    def samples_per_step(self) -> int:
        """Samples of one global step (every worker's batch)."""
        return self.trainer.batch_size * self.reps.count

    def controller(self) -> Controller:
        """The loop of the run (app/training/loop/controller.py): its schedule, meter and
        the hooks of the extras (app/training/extras/)."""
        s, plan = self.schedule, self.plan
        schedule = Schedule(
            s.max_steps, s.eval_every, s.checkpoint_every, s.steps_per_loop, s.target_loss
        )
        meter = Meter(
            plan.cpu_budget, self.samples_per_step, throttling=Throttling(plan.cpu_stat).read
        )
        validating = self.inputs.rows.validating
        given = extras.Context(
            self.ws, plan, self.reps.cluster is None, self.best, self.start, validating,
            s.max_steps, self.samples_per_step, self.replan, self.choice.options_json(self.options),
            self.trainer.model, self.trainer.learning_rate,
        )  # fmt: skip
        return Controller(
            self.trainer, self.checkpoints, schedule, meter, self.stop,
            self.inputs.reference.eval_mean,
            agree=lambda k: float(self.reps.sum([k], "steps per loop")[0]) / self.reps.count,
            hooks=extras.hooks(given),
            metric="val_rmse" if validating else "test_rmse",
            references=self.inputs.reference.fields(),
        )  # fmt: skip

    def exported(self, outcome: Outcome) -> dict[str, Any]:
        """Put the exported step's weights in the model (the best validated step, else the
        last) and evaluate them on the test set: ``exported_step``, ``val_rmse`` (None
        without a validation split), ``test_rmse``, ``linear_rmse``, ``linear``,
        ``validation_size``, ``validation_evaluated`` (the rows of it evaluated,
        ``--eval-rows``). Logs ``not_learning`` when the model ends no better than the
        linear baseline."""
        validating = self.inputs.rows.validating
        step = self.best.restore() if validating else None
        test_rmse = self.trainer.evaluate("test")
        lin = self.inputs.reference.linear
        fields: dict[str, Any] = {
            "exported_step": step if step is not None else outcome.step,
            "val_rmse": self.best.rmse if step is not None else None,
            "test_rmse": test_rmse,
            "linear_rmse": lin.test_rmse if lin else None,
            "linear": lin.to_json() if lin else None,
            "validation_size": len(self.inputs.rows.validation),
            "validation_evaluated": len(self.trainer.evaluated),
        }
        if lin is not None and test_rmse >= lin.test_rmse:
            logs.event(
                "not_learning",
                f"test RMSE {test_rmse:.4g} is not below the linear baseline's {lin.test_rmse:.4g}",
                level=logging.WARNING,
                step=fields["exported_step"],
                test_rmse=test_rmse,
                linear_rmse=lin.test_rmse,
            )
        return fields


def start(
    ws: Workspace, admitted: Admitted, inputs: Inputs, plan: ThreadPlan, reps: Replicas,
    stop: Callable[[], bool], *, recipe: RecipeConfig, schedule: ScheduleConfig,
    compute: ComputeConfig, cache: CacheConfig, options: dict[str, Any],
) -> Session:  # fmt: skip
    """The run set up to train (module docstring) as ``recipe``, ``schedule`` and
    ``compute`` ask, the rows a bfloat16 step makes within ``cache``'s bound. Raises
    StorageError (no readable checkpoint), ClusterError (workers differ), Preempted (a stop
    agreed before the loop)."""
    identity.agree(admitted.identity, reps)
    store = measured.Store(ws.cache, ws.cache_top)  # beside the data cache: it outlives runs
    kept = admitted.previous.kept_choice()
    end, data = schedule.max_steps, inputs.data
    picked = choose.choose(compute, recipe, end, plan, data, reps, store, kept)
    logs.event(
        "choice",
        f"{picked.formulation} formulation in {picked.precision}: {picked.reason}",
        **picked.to_json(),
    )
    trainer = Trainer(
        recipe, schedule.max_steps, picked, inputs.data, reps, inputs.rows, plan.tfdata_threads,
        eval_rows=schedule.eval_rows,
    )  # fmt: skip
    held = ws.open(ws.checkpoints, "checkpoint directory")  # open for the whole run
    checkpoints = Checkpointer(
        trainer.train_step, held, schedule.keep_checkpoints, reps,
        nonfinite_data=admitted.sources.allow_nonfinite,
    )  # fmt: skip
    step = checkpoints.restore()
    best = Best(trainer.model, held, reps)
    best.resume(step)
    identity.record(
        ws.checkpoints, picked.formulation, picked.precision, admitted.identity, picked.evaluation
    )
    _log_replanned(plan)
    if reps.sum([1.0 if stop() else 0.0], "restore")[0] > 0:  # agreed by all workers
        raise Preempted(f"stopped by signal before training resumed at step {step}")
    validation = len(trainer.evaluated) if trainer.rows.validating else 0
    batches, hold = _train_input(
        recipe, schedule.max_steps, cache.max_cache_bytes, plan, inputs, reps, trainer.stats,
        step, picked.precision, validation,
    )  # fmt: skip
    trainer.feed(batches, hold_validation=hold)
    return Session(
        ws, picked, plan, inputs, reps, stop, trainer, checkpoints, best, step, schedule,
        compute.replan, options,
    )  # fmt: skip


def _train_input(
    recipe: RecipeConfig, end: int, max_cache_bytes: int | None, plan: ThreadPlan,
    inputs: Inputs, reps: Replicas, stats: Any, start: int, precision: str,
    validation_rows: int = 0,
) -> tuple[Any, bool]:  # fmt: skip
    """The batches of the training rows from ``start`` to ``end``, resident or streamed as
    measured (app/data/input/pipeline.py ``choose_input``), from the rows a step computing in
    ``precision`` computes on where the cache keeps them or making them pays, and whether the
    ``validation_rows`` evaluated are held apart from a streamed split: the ``input`` event."""
    from app.data.input import order, pipeline

    data, rows = inputs.data, inputs.rows.train
    steps, batch_size = end - start, recipe.batch_size
    kept = pipeline.kept_rounded(data, precision, recipe.standardize)
    choice = pipeline.choose_input(data, plan.memory_limit, batch_size, steps, rows=rows, held=kept)
    make = pipeline.makes_rounded(data, choice.resident, plan.memory_limit, steps * batch_size)
    source = kept or pipeline.made_rounded(
        data, precision, recipe.standardize, make, max_cache_bytes, plan.intra_op_threads
    )
    gathered = choice.resident and source is None  # the validation rows from the split
    hold = not gathered and validation_rows > 0
    hold = hold and pipeline.holds_validation(data, validation_rows, plan.memory_limit)
    logs.event(
        "input",
        ("training split held in memory: " if choice.resident else "training split streamed: ")
        + choice.why,
        resident=choice.resident,
        page_cached=choice.cached,
        split_bytes=pipeline.split_bytes(data, rows=rows),
        resident_limit=pipeline.resident_limit(plan.memory_limit),
        training_rows=len(rows),
        load_s=choice.load_s,
        stream_s=choice.stream_s,
        block_rows=order.BLOCK_ROWS,
        window_steps=order.WINDOW_STEPS,
        feature_rows=str(source.dtype) if source else "float32",
        validation_held=(gathered or hold) if validation_rows else None,
    )
    return pipeline.train_input(
        data, plan.tfdata_threads, seed=recipe.seed, batch_size=batch_size, start_step=start,
        end_step=end, workers=reps.count, index=reps.index, resident=choice.resident,
        stats=stats, rows=rows, source=source,
    ), hold  # fmt: skip


def _log_replanned(plan: ThreadPlan) -> None:
    """After a restart for a new plan: how long from noticing the change to training again."""
    at = os.environ.pop(REPLAN_AT_ENV, "")
    if at:
        seconds = round(time.time() - float(at), 2)
        logs.event(
            "replanned",
            f"training again {seconds} s after the CPU budget change was noticed, with "
            f"{plan.intra_op_threads} intra-op threads",
            seconds=seconds,
            intra_op_threads=plan.intra_op_threads,
        )
