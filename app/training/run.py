"""The training entry point, ``train(ws, config, plan) -> Result``: the recipe, phase by phase.

**open** the log, ``logs/plan.json`` and the ``start`` event; **admit** every fact the run
needs, each decided once, cheapest first, before TensorFlow (app/training/admit/), or end
as this very run finished already; **load** the split and the baselines
(app/training/inputs/load.py); **session**, TensorFlow from here on: the replicas, the
formulation and precision, the trainer, the restored checkpoint, the input pipeline
(app/training/session.py); **loop** to the absolute step ``--max-steps`` (or the target, a
stop, a budget change: app/training/loop/); **finish**: the exported step, the summary, the
export and publishing, the ``end`` event (app/training/finish.py). The command
(app/commands/train.py) builds the workspace, takes the output lock and applies the thread
plan before calling :func:`train`; tests and benchmarks call it the same way.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app import __version__, logs
from app.atomic import write_json
from app.budget.apply import import_tensorflow, tensorflow_version
from app.budget.plan import ThreadPlan
from app.cluster.spec import Cluster
from app.config import PublishConfig, TrainConfig
from app.data.cache import measured
from app.errors import DataError, Preempted, TrainingDiverged
from app.signals import StopRequest
from app.training import phases
from app.training.admit import admit, sources
from app.training.inputs.load import load
from app.training.loop.outcome import FINISHED, STARTED_AT_ENV, Outcome, Replan, Result
from app.training.state import workspace

if TYPE_CHECKING:
    from app.training.admit.facts import Admitted
    from app.training.session import Session


def train(
    ws: workspace.Workspace,
    config: TrainConfig,
    plan: ThreadPlan,
    stop: Callable[[], bool] | None = None,
    cluster: Cluster | None = None,
) -> Result:
    """Train to ``config.schedule.max_steps`` (or the target loss) and export; return the outcome
    (app/training/loop/outcome.py) with the summary (also ``metrics.json``: ``status``,
    ``final_step``, ``exported_step``, ``test_rmse``, ``baseline_rmse`` in raw label
    units, ``examples_per_sec``, ``wall_seconds``, ``startup_seconds`` (to the first
    step), ``plan``, …).

    ``ws`` is this process's workspace (:func:`app.training.state.workspace.for_run` of
    ``config`` and ``cluster``). With ``cluster`` this process is one worker of a
    multi-worker run (docs/distributed.md): ``config.recipe.batch_size`` is per worker, only the
    chief (worker 0) writes checkpoints/, model/ and metrics.json. Raises DataError (bad
    input), StorageError (output), ConfigError (another run's checkpoints), Preempted (a
    stop before the first step), TrainingDiverged (NaN/Inf), MemoryBudgetExceeded,
    NotPublished (a serving signature refused), ClusterError (a lost or failing peer, or
    workers that disagree).
    """
    stop = stop or StopRequest()
    t_start = time.perf_counter()
    t_first = t_start - _since_first_start()  # a run restarted for a new plan: its first start
    _open(ws, config, plan, cluster)
    admitted = admit(ws, config, plan, stop)
    if isinstance(admitted, Result):
        return admitted  # this very run, finished already
    r, s = config.recipe, config.schedule
    store = measured.Store(ws.cache, ws.cache_top)  # beside the data cache: it outlives runs
    fraction = config.data.validation_fraction
    inputs = load(admitted.data, fraction, r.seed, s.eval_rows, plan.intra_op_threads, store)
    if stop():
        raise Preempted("stopped by signal before training started")
    phases.tensorflow(plan.intra_op_threads)
    import_tensorflow()
    from app.training import session
    from app.training.loop import replicas

    reps = replicas.create(cluster)
    try:
        ready = session.start(
            ws, admitted, inputs, plan, reps, stop, recipe=r, schedule=s,
            compute=config.compute, cache=config.cache, options=config.to_json(),
        )  # fmt: skip
        startup = time.perf_counter() - t_start  # what a run costs before its first step
        outcome = ready.controller().run(ready.start)
        if isinstance(outcome, Replan):
            inputs.data.hand_over()  # the restart's exec keeps the cache held
        return _finish(ready, admitted, outcome, t_first, startup, config.publishing)
    except Exception as exc:
        cause = _changed_under(exc, admitted) if ws.is_chief else None
        reps.report_failure(cause or exc)  # the other workers stop instead of waiting
        if cause is not None:
            raise cause from exc
        raise


def _open(
    ws: workspace.Workspace, config: TrainConfig, plan: ThreadPlan, cluster: Cluster | None
) -> None:
    """The JSON log file in ``ws``, the plan in ``logs/plan.json``, the ``start`` event
    (versions, the config, the plan in brief: the whole plan, with the files read and the
    reasons, is ``logs/plan.json``; the cluster), then the ``cache_default`` warning if any."""
    workspace.open_log(ws)
    write_json(ws.plan_file, plan.to_json(), "output directory")
    multi: dict[str, Any] = {}
    if cluster is not None:
        global_batch = config.recipe.batch_size * cluster.count
        multi = {"cluster": cluster.to_json(), "global_batch_size": global_batch}
    logs.event(
        "start",
        f"coretrain {__version__}: {plan.intra_op_threads} intra-op threads "
        f"for a budget of {plan.cpu_budget:g} CPUs",
        version=__version__,
        tensorflow=tensorflow_version(),
        config=config.to_json(),
        plan=plan.brief(),
        plan_file=str(ws.plan_file),
        **multi,
    )
    workspace.log_cache_note(ws)


def _changed_under(exc: Exception, admitted: Admitted) -> DataError | None:
    """For a run that diverged: the DataError (exit 3) of a source it read where it lies
    that changed while it trained (NaN written into a ``.npy`` in place), which no learning
    rate helps; else None."""
    if not isinstance(exc, TrainingDiverged):
        return None
    try:
        sources.changed_in_place(admitted.sources, admitted.data)
    except DataError as changed:
        return changed
    return None


def _since_first_start() -> float:
    """Seconds since the first process of a run restarted for a new thread plan started
    (:data:`STARTED_AT_ENV`, taken from the environment); 0 for a first process."""
    first = os.environ.pop(STARTED_AT_ENV, None)
    try:
        return max(0.0, time.time() - float(first)) if first else 0.0
    except ValueError:
        return 0.0


def _finish(
    ready: Session, admitted: Admitted, outcome: Outcome, t_start: float, startup: float,
    publishing: PublishConfig,
) -> Result:  # fmt: skip
    """The summary of ``outcome`` (the exported step's facts when the run finished, on
    sources unchanged where they lie), then the end of the run (app/training/finish.py),
    publishing as ``publishing`` asks."""
    from app.training import finish

    reps, data = ready.reps, ready.inputs.data
    if isinstance(outcome, FINISHED) and ready.ws.is_chief:
        sources.changed_in_place(admitted.sources, data)
    facts = ready.exported(outcome) if isinstance(outcome, FINISHED) else {}
    facts.update(
        wall_seconds=round(time.perf_counter() - t_start, 2),
        startup_seconds=round(startup, 2),
        steps_per_loop=outcome.steps_per_loop,
        formulation=ready.choice.formulation,
        precision=ready.choice.precision,
        target_loss=ready.schedule.target_loss,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        plan=ready.plan.to_json(),
    )
    if reps.cluster is not None:
        facts.update(workers=reps.count, global_batch_size=ready.samples_per_step)
    summary = finish.summarize(outcome, data, ready.samples_per_step, **facts)
    options = ready.choice.options_json(ready.options)
    publisher = finish.publisher(publishing, summary, data, options, ready.plan, ready.stop)
    return finish.finish(
        ready.ws, outcome, summary, ready.trainer.model, data, ready.standardize, publisher
    )
