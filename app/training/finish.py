"""The end of a run: its summary (``metrics.json``), the export and publishing, the ``end``
event, for each outcome of the loop (app/training/outcome.py).

A finished run (completed, target reached) is exported by the chief
(app/training/export.py), offered to the publish gate when ``--publish-dir`` is set, and
summarised in ``metrics.json``; a stopped run logs its ``end`` and exports nothing; a run
that must re-plan logs ``replan``. Nothing here raises to say how the run ended: the
outcome is returned with the summary, and app/commands/train.py maps it to the exit code.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras

from app import __version__, logs
from app.atomic import write_json
from app.data.cache import DataCache
from app.training.export import export
from app.training.outcome import Outcome, Replan, Result, Stopped
from app.training.workspace import Workspace


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
        "version": __version__,
        **facts,
    }


def finish(
    ws: Workspace,
    outcome: Outcome,
    summary: dict[str, Any],
    model: keras.Model,
    data: DataCache,
    standardize: bool,
    publish: Callable[[Path], dict[str, Any]] | None = None,
) -> Result:
    """The end of the run for ``outcome`` (module docstring); returns it with the summary.

    A finished run: export (chief), ``publish(export_dir)`` if given (the gate's decision,
    app/training/publish.py, goes into the summary as ``publish``), ``metrics.json``
    (chief), the ``end`` event. A stopped run: the ``end`` event only; a re-plan: the
    ``replan`` event. Raises StorageError when the export or metrics can't be written.
    """
    step = outcome.step
    match outcome:
        case Replan():
            logs.event("replan", f"checkpoint saved at step {step}; restarting with the new plan")
        case Stopped():
            logs.event("end", f"preempted at step {step}; rerun to resume", **summary)
        case _ if not ws.is_chief:  # the chief exports and writes metrics.json
            logs.event("end", _finished(summary), **summary)
        case _:
            export_dir = _export(ws, model, data, standardize)
            summary["export"] = str(export_dir)
            if publish is not None:
                summary["publish"] = _published(publish(export_dir))
            write_json(ws.metrics, summary, "output directory")
            message = f"{_finished(summary)} (mean predictor {data.baseline_rmse:.4g})"
            logs.event("end", message, **summary)
    return Result(outcome, summary)


def _finished(summary: dict[str, Any]) -> str:
    return (
        f"{summary['status']} at step {summary['final_step']}: test RMSE {summary['test_rmse']:.4g}"
    )


def _export(ws: Workspace, model: keras.Model, data: DataCache, standardize: bool) -> Path:
    """The export (app/training/export.py) and its ``export`` event."""
    t_export = time.perf_counter()
    export_dir = export(model, data, standardize, ws.model)
    logs.event(
        "export",
        f"exported the model to {export_dir}",
        path=str(export_dir),
        seconds=round(time.perf_counter() - t_export, 2),
    )
    return export_dir


def _published(decision: dict[str, Any]) -> dict[str, Any]:
    """The gate's decision, with a ``publish_rejected`` warning when it refused."""
    if not decision["published"]:
        logs.event(
            "publish_rejected",
            f"not published: {decision['reason']}",
            level=logging.WARNING,
            **decision,
        )
    return decision
