"""The end of a run: its summary (``metrics.json``), the export and publishing, the ``end``
event, for each outcome of the loop (app/training/loop/outcome.py).

A finished run (completed, target reached) is exported by the chief
(app/release/export.py), offered to the publish gate when ``--publish-dir`` is set, and
summarised in ``metrics.json``; a stopped run logs its ``end`` and exports nothing; a run
that must re-plan logs ``replan``. Nothing here raises to say how the run ended: the
outcome is returned with the summary, and app/commands/train.py maps it to the exit code.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

import keras

from app import __version__, jsonvalues, logs
from app.atomic import write_json
from app.budget.apply import tensorflow_version
from app.budget.plan import ThreadPlan
from app.config import PublishConfig
from app.data.cache import DataCache
from app.errors import NotPublished
from app.release.export import Exported, export
from app.release.gate import Decision
from app.training.loop.outcome import Outcome, Replan, Result, Stopped, results
from app.training.state.workspace import Workspace


def summarize(
    outcome: Outcome, data: DataCache, samples_per_step: int, **facts: Any
) -> dict[str, Any]:
    """The run's summary (``metrics.json`` and the ``end`` event): the outcome's status and
    steps, the data's sizes and mean predictor (raw label units), samples/s over the
    training loop, then ``facts`` (the exported step and its RMSEs, times, the choice and
    the plan: app/training/run.py) in their order."""
    trained = outcome.step - outcome.start_step
    return {
        "status": outcome.status,
        "final_step": outcome.step,
        "start_step": outcome.start_step,
        "steps_trained": trained,
        "test_rmse": None,  # of the exported model, in facts
        "last_eval_rmse": outcome.eval_rmse,
        "baseline_rmse": data.baseline_rmse,
        "examples_per_sec": round(trained * samples_per_step / max(outcome.loop_seconds, 1e-9), 1),
        "train_size": data.train_size,
        "test_size": data.test_size,
        "data_key": data.path.name,  # the sources' key: a rerun knows them without the cache
        "version": __version__,
        **facts,
    }


def publisher(
    publishing: PublishConfig, summary: dict[str, Any], data: DataCache,
    options: dict[str, Any], plan: ThreadPlan, stop: Callable[[], bool],
) -> Callable[[Exported], Decision] | None:  # fmt: skip
    """The publish step for the end of the run: the gate against ``--publish-dir``'s
    champion (app/release/publish.py), the version recording the run's ``summary``, its
    data's key, its ``options`` (as decided) and ``plan``; None without ``--publish-dir``."""
    target = publishing.publish_dir
    if target is None:
        return None
    from app.release import publish

    def run(exported: Exported) -> Decision:
        meta = {
            "published_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "metrics": results(summary),
            "data_key": data.path.name,
            "config": options,
            "plan": plan.to_json(),
            "versions": {"coretrain": __version__, "tensorflow": tensorflow_version()},
        }
        return publish.publish(
            exported, target, data, meta, tolerance=publishing.publish_tolerance,
            keep=publishing.publish_keep,
            allow_signature_change=publishing.publish_allow_signature_change, stop=stop,
        )  # fmt: skip

    return run


def finish(
    ws: Workspace,
    outcome: Outcome,
    summary: dict[str, Any],
    model: keras.Model,
    data: DataCache,
    standardize: bool,
    publish: Callable[[Exported], Decision] | None = None,
) -> Result:
    """The end of the run for ``outcome`` (module docstring); returns it with the summary.

    A finished run: export (chief), ``publish(exported)`` if given (the gate's decision,
    app/release/publish.py, goes into the summary as ``publish``), ``metrics.json``
    (chief), the ``end`` event. A stopped run: the ``end`` event only; a re-plan: the
    ``replan`` event. Raises StorageError when the export or metrics can't be written.
    """
    step, decision = outcome.step, None
    match outcome:
        case Replan():
            logs.event("replan", f"checkpoint saved at step {step}; restarting with the new plan")
        case Stopped():
            logs.event("end", f"preempted at step {step}; rerun to resume", **results(summary))
        case _ if not ws.is_chief:  # the chief exports and writes metrics.json
            logs.event("end", _finished(summary), **results(summary))
        case _:
            exported = _export(ws, model, data, standardize)
            summary.update(
                export=str(exported.path), weights=exported.weights, export_files=exported.files
            )
            if publish is not None:
                decision = _published(publish(exported))
                summary["publish"] = decision.to_json()
            write_json(ws.metrics, jsonvalues.finite(summary), "output directory")  # NaN: null
            message = f"{_finished(summary)} (mean predictor {data.baseline_rmse:.4g})"
            if decision is not None and not decision.published:  # the run's exit is 7
                message += f"; not published: {decision.reason}"
                code = {"exit_code": NotPublished.exit_code}
                logs.event("end", message, level=logging.WARNING, **results(summary), **code)
            else:
                logs.event("end", message, **results(summary))
    return Result(outcome, summary, decision)


def _finished(summary: dict[str, Any]) -> str:
    return (
        f"{summary['status']} at step {summary['final_step']}: test RMSE {summary['test_rmse']:.4g}"
    )


def _export(ws: Workspace, model: keras.Model, data: DataCache, standardize: bool) -> Exported:
    """The export (app/release/export.py) and its ``export`` event."""
    t_export = time.perf_counter()
    exported = export(model, data, standardize, ws.model)
    logs.event(
        "export",
        f"exported the model to {exported.path}",
        path=str(exported.path),
        weights=exported.weights,
        seconds=round(time.perf_counter() - t_export, 2),
    )
    return exported


def _published(decision: Decision) -> Decision:
    """The gate's decision, with a ``publish_rejected`` warning when it refused."""
    if not decision.published:
        logs.event(
            "publish_rejected",
            f"not published: {decision.reason}",
            level=logging.WARNING,
            **decision.to_json(),
        )
    return decision
