"""The training entry point, ``train(ws, config, plan) -> Result``: the recipe, phase by phase.

1. **open**: the JSON log file in the workspace (app/training/state/workspace.py) and the
   ``start`` event (versions, config, plan, cluster).
2. **inputs**, before TensorFlow: first what can refuse the run from the options, the
   output and publish directories and the data's shape alone (app/release/preflight.py,
   app/training/state/precheck.py, app/training/inputs/shape_checks.py) or end it as
   finished already (app/training/state/rerun.py); then the binary cache, the memory check,
   the validation split and the baselines (app/training/inputs/load.py), so bad input fails
   in a fraction of a second with one line.
3. **session**, TensorFlow from here on: the replicas (one process, or a worker of N:
   app/training/loop/replicas.py), the run's identity, the formulation and precision, the
   trainer, the restored checkpoint, the input pipeline (app/training/session.py).
4. **loop**: the controller trains to the absolute step ``--max-steps`` (or the target
   loss, a stop, a budget change) and returns how it ended (app/training/loop/controller.py,
   app/training/loop/outcome.py); a restarted job continues and ends at the same total.
5. **finish**: the exported step, the summary, the export and publishing, the ``end``
   event (app/training/finish.py).

The command (app/commands/train.py) builds the workspace, takes the output lock and
applies the thread plan before calling :func:`train`; tests and benchmarks call it the
same way.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app import __version__, logs
from app.atomic import write_json
from app.budget.apply import import_tensorflow, tensorflow_version
from app.budget.plan import ThreadPlan
from app.cluster.spec import Cluster
from app.config import TrainConfig
from app.data.cache import DataCache, measured, source_key
from app.data.formats.sources import ROLES
from app.errors import DataError, Preempted
from app.release import preflight
from app.signals import StopRequest
from app.training import phases
from app.training.inputs import shape_checks
from app.training.inputs.load import complete, load_data, sources
from app.training.loop.outcome import FINISHED, STARTED_AT_ENV, Outcome, Replan, Result
from app.training.state import precheck, rerun, workspace

if TYPE_CHECKING:
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
    ClusterError (a lost or failing peer, or workers that disagree).
    """
    stop = stop or StopRequest()
    t_start = time.perf_counter()
    t_first = t_start - _since_first_start()  # a run restarted for a new plan: its first start
    _open(ws, config, plan, cluster)
    workers = cluster.count if cluster else 1
    if config.publishing.publish_dir is not None and ws.is_chief:
        preflight.check(config.publishing.publish_dir)  # before anything is converted or fitted
    precheck.before_data(ws, config, workers)  # another run's checkpoints: before converting
    found = sources(config)
    key = source_key(found)
    over = rerun.over(ws, config, workers)  # this run, finished here: its data decide
    if over is None:
        shape_checks.check(config, found, plan, chief=ws.is_chief)  # rows, memory, signature
    elif done := rerun.finished_unchanged(ws, config, key, workers, over):
        return done  # the same sources, unchanged: the cache is not needed to know
    data = load_data(config, ws.cache, plan, stop, below=ws.cache_top, found=found, key=key)
    if over is not None and (done := rerun.finished(ws, config, data, workers, over)):
        return done
    precheck.with_data(ws, config, data, workers)  # before the baselines and TensorFlow
    inputs = complete(config, plan, data, measured.Store(ws.cache, ws.cache_top))
    if stop():
        raise Preempted("stopped by signal before training started")
    phases.tensorflow(plan.intra_op_threads)
    import_tensorflow()
    from app.training import session
    from app.training.loop import replicas

    reps = replicas.create(cluster)
    try:
        ready = session.start(ws, config, plan, inputs, reps, stop)
        startup = time.perf_counter() - t_start  # what a run costs before its first step
        outcome = ready.controller().run(ready.start)
        if isinstance(outcome, Replan):
            inputs.data.hand_over()  # the restart's exec keeps the cache held
        return _finish(ready, outcome, t_first, startup)
    except Exception as exc:
        reps.report_failure(exc)  # the other workers stop instead of waiting for this one
        raise


def _open(ws: workspace.Workspace, config: TrainConfig, plan: ThreadPlan,
          cluster: Cluster | None) -> None:  # fmt: skip
    """The JSON log file in ``ws``, the plan in ``logs/plan.json``, the ``start`` event, then
    the ``cache_default`` warning if there is one."""
    workspace.open_log(ws)
    write_json(ws.plan_file, plan.to_json(), "output directory")
    _log_start(config, plan, cluster, ws.plan_file)
    workspace.log_cache_note(ws)


def _log_start(
    config: TrainConfig, plan: ThreadPlan, cluster: Cluster | None, plan_file: Path
) -> None:
    """The ``start`` event: versions, the config, the plan in brief (the whole plan, with the
    files read and the reasons, is ``plan_file``) and the cluster."""
    multi: dict[str, Any] = {}
    if cluster is not None:
        multi = {
            "cluster": cluster.to_json(),
            "global_batch_size": config.recipe.batch_size * cluster.count,
        }
    logs.event(
        "start",
        f"coretrain {__version__}: {plan.intra_op_threads} intra-op threads "
        f"for a budget of {plan.cpu_budget:g} CPUs",
        version=__version__,
        tensorflow=tensorflow_version(),
        config=config.to_json(),
        plan=plan.brief(),
        plan_file=str(plan_file),
        **multi,
    )


def _since_first_start() -> float:
    """Seconds since the first process of a run restarted for a new thread plan started
    (:data:`STARTED_AT_ENV`, taken from the environment); 0 for a first process."""
    first = os.environ.pop(STARTED_AT_ENV, None)
    try:
        return max(0.0, time.time() - float(first)) if first else 0.0
    except ValueError:
        return 0.0


def _unchanged_in_place(config: TrainConfig, data: DataCache) -> None:
    """Before a finished run exports: raise DataError (exit 3) when a source the run read
    where it lies (a float32 ``.npy`` or HDF5 dataset: no copy in the cache) changed while
    it trained (its size, modification or status change time or sampled bytes: the cache
    key, app/data/cache/entry.py ``source_key``). The model would have been trained on a
    mixture of the old and new values; the checkpoints stay, nothing is exported."""
    if not data.in_place:
        return
    found = sources(config)
    if source_key(found) == data.path.name:
        return
    places = {str(path) for path, _ in data.in_place.values()}
    try:  # name the files that changed: the fingerprints the cache was keyed by
        was = json.loads((data.path / "manifest.json").read_text())["fingerprints"]
        now = found.fingerprints()
        changed = {str(found.path(r).resolve()) for r in ROLES if now[r] != was[r]}
    except (OSError, ValueError, KeyError, TypeError):
        changed = places
    raise DataError(
        f"{', '.join(sorted(changed & places or places))}: changed while this run trained on "
        "it where it lies (not a copy): the model is not exported and the checkpoints are "
        "kept; train on the new data into a new --output"
    )


def _finish(ready: Session, outcome: Outcome, t_start: float, startup: float) -> Result:
    """The summary of ``outcome`` (the exported step's facts when the run finished), then
    the end of the run (app/training/finish.py)."""
    from app.training import finish

    config, reps = ready.config, ready.reps
    if isinstance(outcome, FINISHED) and ready.ws.is_chief:
        _unchanged_in_place(config, ready.inputs.data)
    facts = ready.exported(outcome) if isinstance(outcome, FINISHED) else {}
    facts.update(
        wall_seconds=round(time.perf_counter() - t_start, 2),
        startup_seconds=round(startup, 2),
        steps_per_loop=outcome.steps_per_loop,
        formulation=ready.choice.formulation,
        precision=ready.choice.precision,
        target_loss=config.schedule.target_loss,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        plan=ready.plan.to_json(),
    )
    if reps.cluster is not None:
        facts.update(workers=reps.count, global_batch_size=ready.samples_per_step)
    data = ready.inputs.data
    summary = finish.summarize(outcome, data, ready.samples_per_step, **facts)
    model, publisher = ready.trainer.model, ready.publisher(summary)
    return finish.finish(
        ready.ws, outcome, summary, model, data, config.data.standardize, publisher
    )
