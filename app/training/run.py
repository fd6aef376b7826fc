"""The training entry point, ``train(config, plan) -> summary``: a short recipe.

workspace → data → trainer → controller → finish. The CLI, tests and benchmarks all
call it, after :func:`app.budget.apply.apply` has set the thread plan. The data are
read and checked before TensorFlow is imported, so bad input fails in a fraction of a
second with one line; TensorFlow (and with it the trainer, the checkpointer and the
replicas) comes after. Everything it writes lives in the workspace
(:mod:`app.training.workspace`): under ``config.output_dir`` and the cache directory.

The loop runs *to an absolute step*, restoring the newest valid checkpoint first, so a
restarted job continues and ends at the same total (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from app import __version__, logs
from app.budget import memory
from app.budget.apply import import_tensorflow
from app.budget.plan import ThreadPlan
from app.budget.usage import Throttling
from app.cluster.spec import Cluster
from app.config import TrainConfig
from app.data import cache as cache_lib
from app.data import split as split_lib
from app.data.sources import ROLES, Sources, find
from app.data.split import Split
from app.errors import DataError, Preempted
from app.signals import StopRequest
from app.training import baselines, identity
from app.training import workspace as workspace_lib
from app.training.budget_watch import BudgetWatch, warn_when_throttled
from app.training.controller import Controller, Meter, Schedule

WARNING = 30
#: Set in the environment of a run restarted for a new plan: when the change was noticed.
REPLAN_AT_ENV = "_CORETRAIN_REPLAN_AT"


def train(
    config: TrainConfig,
    plan: ThreadPlan,
    stop: Callable[[], bool] | None = None,
    cluster: Cluster | None = None,
) -> dict[str, Any]:
    """Train to ``config.max_steps`` (or the target loss) and export; return the summary.

    With ``cluster`` this process is one worker of a multi-worker run
    (docs/distributed.md): ``config.batch_size`` is per worker, only the chief (worker
    0) writes checkpoints/, model/ and metrics.json, and a lost or failing peer raises
    ClusterError (exit 6).

    The summary (also ``metrics.json``) has ``status`` ("completed",
    "target_reached"), ``final_step``, ``test_rmse`` and ``baseline_rmse`` (raw
    label units), ``examples_per_sec``, ``wall_seconds`` and ``plan``.
    Raises DataError (bad input), StorageError (output), Preempted (SIGTERM or
    SIGINT; a checkpoint was saved), TrainingDiverged (NaN/Inf loss).
    """
    stop = stop or StopRequest()
    t_start = time.perf_counter()
    ws = workspace_lib.for_run(config, cluster)
    workspace_lib.open_log(ws)
    _log_start(config, plan, cluster)
    try:  # before TensorFlow: bad data fail fast
        data = load_data(config, ws.cache, plan, stop, below=ws.cache_top)
    except Preempted as exc:  # during the conversion
        logs.event("end", str(exc), status="preempted")
        raise
    if stop():
        raise _preempted("before training started")
    _check_memory(config, data, plan)
    rows = split_lib.split(data.train_size, config.validation_fraction, config.seed)
    reference = baselines.measure(data, rows, config.seed, plan.intra_op_threads)
    import_tensorflow()
    # TensorFlow from here on.
    from app.training import replicas

    reps = replicas.create(cluster)
    try:
        return _train_on(ws, config, plan, data, rows, reference, reps, stop, t_start)
    except Exception as exc:
        reps.report_failure(exc)  # the other workers stop instead of waiting for this one
        raise


def _log_start(config: TrainConfig, plan: ThreadPlan, cluster: Cluster | None) -> None:
    """The ``start`` event: versions, the config, the plan and the cluster."""
    multi: dict[str, Any] = {}
    if cluster is not None:
        multi = {
            "cluster": cluster.to_json(),
            "global_batch_size": config.batch_size * cluster.count,
        }
    logs.event(
        "start",
        f"coretrain {__version__}: {plan.intra_op_threads} intra-op threads "
        f"for a budget of {plan.cpu_budget:g} CPUs",
        version=__version__,
        tensorflow=_tensorflow_version(),
        config=config.to_json(),
        plan=plan.to_json(),
        **multi,
    )


def _train_on(
    ws: workspace_lib.Workspace, config: TrainConfig, plan: ThreadPlan,
    data: cache_lib.DataCache, rows: Split, reference: baselines.Baselines, reps: Any,
    stop: Callable[[], bool], t_start: float,
) -> dict[str, Any]:  # fmt: skip
    """The part of :func:`train` with TensorFlow, on ``reps`` (app/training/replicas.py):
    the identity check, the choice, restore, the loop, the summary and the export."""
    from app.training import choose, finish
    from app.training.best import Best
    from app.training.checkpointer import Checkpointer
    from app.training.trainer import Trainer

    mine = _same_run(ws, config, data, reps)
    picked = choose.choose(config, plan, data, reps, ws.own, ws.checkpoints)
    logs.event(
        "choice",
        f"{picked.formulation} formulation in {picked.precision}: {picked.reason}",
        **picked.to_json(),
    )
    config = dataclasses.replace(config, formulation=picked.formulation, precision=picked.precision)
    trainer = Trainer(config, plan, data, reps, rows)
    held = ws.open(ws.checkpoints, "checkpoint directory")  # open for the whole run
    checkpoints = Checkpointer(trainer, held, config.keep_checkpoints, reps)
    start = checkpoints.restore()
    best = Best(trainer.model, held, reps)
    best.resume(start)
    identity.record(ws.checkpoints, picked.formulation, picked.precision, mine)
    _log_replanned(plan)
    if reps.sum([1.0 if stop() else 0.0], "restore")[0] > 0:  # agreed by all workers
        raise _preempted(f"before training resumed at step {start}")
    trainer.feed(_train_input(config, plan, data, reps, trainer.stats, start, rows))
    samples_per_step = config.batch_size * reps.count
    controller = _controller(ws, trainer, checkpoints, config, plan, reference, reps, stop, start)
    if rows.validating:
        controller.keep_best = best.offer
    outcome = controller.run(start)
    summary = finish.summarize(outcome, data, samples_per_step)
    if outcome.status in ("completed", "target_reached"):
        summary.update(_exported(outcome, trainer, best, reference))
    summary.update(
        wall_seconds=round(time.perf_counter() - t_start, 2),
        steps_per_loop=outcome.steps_per_loop,
        formulation=picked.formulation,
        precision=picked.precision,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        plan=plan.to_json(),
    )
    if reps.cluster is not None:
        summary.update(workers=reps.count, global_batch_size=samples_per_step)
    publisher = _publisher(config, plan, data, summary) if config.publish_dir else None
    return finish.finish(ws, summary, trainer.model, data, config.standardize, publisher)


def _train_input(
    config: TrainConfig, plan: ThreadPlan, data: cache_lib.DataCache, reps: Any, stats: Any,
    start: int, rows: Split,
) -> Any:  # fmt: skip
    """The batches of the training rows ``rows.train`` from ``start`` on, resident or
    streamed as measured (app/data/pipeline.py ``choose_input``): the ``input`` event."""
    from app.data import order, pipeline

    steps = config.max_steps - start
    choice = pipeline.choose_input(data, plan, config.batch_size, steps, rows=rows.train)
    logs.event(
        "input",
        ("training split held in memory: " if choice.resident else "training split streamed: ")
        + choice.why,
        resident=choice.resident,
        split_bytes=pipeline.split_bytes(data, rows=rows.train),
        resident_limit=pipeline.resident_limit(plan),
        training_rows=len(rows.train),
        load_s=choice.load_s,
        stream_s=choice.stream_s,
        block_rows=order.BLOCK_ROWS,
        window_steps=order.WINDOW_STEPS,
    )
    return pipeline.train_input(
        data, plan, seed=config.seed, batch_size=config.batch_size, start_step=start,
        end_step=config.max_steps, workers=reps.count, index=reps.index,
        resident=choice.resident, stats=stats, rows=rows.train,
    )  # fmt: skip


def _controller(
    ws: workspace_lib.Workspace, trainer: Any, checkpoints: Any, config: TrainConfig,
    plan: ThreadPlan, reference: baselines.Baselines, reps: Any, stop: Callable[[], bool],
    start: int,
) -> Controller:  # fmt: skip
    """The outer loop of the run: its schedule, meter, actions and budget watch."""
    single = reps.cluster is None
    return Controller(
        trainer,
        checkpoints,
        Schedule(
            config.max_steps,
            config.eval_every,
            config.checkpoint_every,
            config.steps_per_loop,
            config.target_loss,
        ),
        Meter(
            plan.cpu_budget,
            config.batch_size * reps.count,
            throttling=Throttling(plan.cpu_stat).read,
        ),
        stop,
        reference.eval_mean,
        agree=lambda k: float(reps.sum([k], "steps per loop")[0]) / reps.count,
        actions=[warn_when_throttled(plan), *_summaries(ws, config, plan, start)],
        replan=BudgetWatch(
            plan,
            enabled=config.replan == "on-change" and single,
            why_not="--replan never" if single else "a multi-worker run",
        ),
        metric="val_rmse" if trainer.rows.validating else "test_rmse",
        references=reference.fields(),
    )


def _exported(outcome: Any, trainer: Any, best: Any, reference: baselines.Baselines) -> dict:
    """Put the exported step's weights in the model (the best validated step, else the
    last) and evaluate them on the test set: the summary's ``exported_step``, ``val_rmse``
    (None without a validation split), ``test_rmse``, ``linear_rmse``, ``linear``. Logs
    ``not_learning`` when the model ends no better than the linear baseline."""
    step = best.restore() if trainer.rows.validating else None
    test_rmse = trainer.evaluate("test")
    lin = reference.linear
    fields: dict[str, Any] = {
        "exported_step": step if step is not None else outcome.step,
        "val_rmse": best.rmse if step is not None else None,
        "test_rmse": test_rmse,
        "linear_rmse": lin.test_rmse if lin else None,
        "linear": lin.to_json() if lin else None,
        "validation_size": len(trainer.rows.validation),
    }
    if lin is not None and test_rmse >= lin.test_rmse:
        logs.event(
            "not_learning",
            f"test RMSE {test_rmse:.4g} is not below the linear baseline's {lin.test_rmse:.4g}",
            level=WARNING,
            step=fields["exported_step"],
            test_rmse=test_rmse,
            linear_rmse=lin.test_rmse,
        )
    return fields


def _same_run(
    ws: workspace_lib.Workspace, config: TrainConfig, data: cache_lib.DataCache, reps: Any
) -> identity.Identity:
    """This run's identity, checked against the checkpoints it would resume (on the chief)
    and agreed by every worker (app/training/identity.py). Raises ConfigError (another
    run's checkpoints), StorageError (an unreadable record), ClusterError (workers differ)."""
    mine = identity.of_run(config, data, reps.count)
    if reps.is_chief:
        identity.check(ws.checkpoints, mine)
    identity.agree(mine, reps)
    return mine


def _publisher(
    config: TrainConfig, plan: ThreadPlan, data: cache_lib.DataCache, summary: dict[str, Any]
) -> Callable[[Path], dict[str, Any]]:
    """The publish step for finish(): the gate against --publish-dir's newest version."""
    import datetime

    from app.training import publish

    def run(export_dir: Path) -> dict[str, Any]:
        assert config.publish_dir is not None
        meta = {
            "published_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "metrics": {k: v for k, v in summary.items() if k != "plan"},
            "data_key": data.path.name,
            "config": config.to_json(),
            "plan": plan.to_json(),
            "versions": {"coretrain": __version__, "tensorflow": _tensorflow_version()},
        }
        decision = publish.publish(
            export_dir,
            config.publish_dir,
            data,
            meta,
            tolerance=config.publish_tolerance,
            keep=config.publish_keep,
        )
        return decision.to_json()

    return run


def _summaries(ws: Any, config: TrainConfig, plan: ThreadPlan, start: int) -> list[Any]:
    """The TensorBoard action (the chief only: one set of curves per run)."""
    if not ws.is_chief:
        return []
    from app.training.summaries import Summaries

    run = {"config": config.to_json(), "plan": plan.to_json(), "version": __version__}
    return [Summaries(ws.open(ws.output / "tensorboard", "TensorBoard directory"), run, start)]


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


def _preempted(when: str) -> Preempted:
    """A stop before the training loop: logged as the ``end`` event, then raised."""
    exc = Preempted(f"stopped by signal {when}")
    logs.event("end", str(exc), status="preempted")
    return exc


def sources(config: TrainConfig) -> Sources:
    """The data files (found in ``config.data_dir``: app/data/sources.py) and the parse
    settings of ``config``. Raises DataError (a missing file), ConfigError (two
    candidates for one role)."""
    return Sources(
        paths={role: find(config.data_dir, role, getattr(config, role)) for role in ROLES},
        height=config.height,
        width=config.width,
        allow_nonfinite=config.allow_nonfinite,
    )


def load_data(
    config: TrainConfig,
    cache_dir: Path,
    plan: ThreadPlan,
    stop: Callable[[], bool],
    below: Path | None = None,
) -> cache_lib.DataCache:
    """Parse the text files once into the binary cache (or reuse it) and check it.

    Large files are parsed in as many threads as TensorFlow gets intra-op threads.
    ``below``: the directory the operator named that ``cache_dir`` lies in (the
    workspace's ``cache_top``). Raises DataError for bad input (InputTooLarge past the
    cache's bound: app/data/bounds.py), and when NaN/Inf values (let in by
    --allow-nonfinite) make the standardisation statistics non-finite.
    """
    found = sources(config)
    data = cache_lib.prepare(
        found, cache_dir, stop=stop, threads=plan.intra_op_threads, below=below,
        max_bytes=config.max_cache_bytes,
    )  # fmt: skip
    if config.standardize:
        for role, stats in (
            ("train_features", (data.feature_mean, data.feature_std)),
            ("train_labels", (data.label_mean, data.label_std)),
        ):
            if not all(np.isfinite(s).all() for s in stats):
                raise DataError(
                    f"{found.path(role)}: NaN/Inf values (allowed by --allow-nonfinite) "
                    "make the standardisation statistics NaN/Inf; train with --no-standardize, "
                    "or remove them"
                )
    return data


def _check_memory(config: TrainConfig, data: cache_lib.DataCache, plan: ThreadPlan) -> None:
    """The expected peak memory against the memory limit (app/budget/memory.py), logged as
    the ``memory`` event. Raises MemoryBudgetExceeded (exit 8) when it can't fit."""
    found = memory.estimate(
        rows=data.train_size, height=data.height, width=data.width,
        outputs=data.num_outputs, batch_size=config.batch_size, memory_limit=plan.memory_limit,
    )  # fmt: skip
    logs.event(
        "memory",
        f"expected peak memory {found.total / memory.MIB:,.0f} MiB"
        + (f" of a {plan.memory_limit / memory.MIB:,.0f} MiB limit" if plan.memory_limit else ""),
        memory_limit=plan.memory_limit,
        **found.to_json(),
    )
    memory.check(found, plan.memory_limit, config.batch_size)


def _tensorflow_version() -> str:
    """TensorFlow's version without importing it (the wheel is tensorflow-cpu on x86)."""
    for name in ("tensorflow-cpu", "tensorflow"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"
