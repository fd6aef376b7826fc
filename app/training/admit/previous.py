"""The previous run in the output directory: a fresh start, a resume, or this very run,
finished (a rerun with nothing to do). No TensorFlow here.

:func:`read` reads once what an earlier run left: the checkpoints' record
(app/training/state/identity.py), whether checkpoints are there, and ``metrics.json`` of a
run finished where this one would end (:func:`over`). A retried Job or a CronJob run twice
reruns finished work: :func:`finished_unchanged` knows it from the sources' cache key
before the data are read, :func:`finished` from the data's fingerprints once the cache is
there. Either needs all the evidence: ``metrics.json`` of a run finished at ``--max-steps``
(or its target reached) with the exported weights' digest, the export as written, the
record's identity equal to this run's and, with ``--publish-dir``, a version holding those
weights (or, published by this run and removed since, a rollback to respect: a
``publish_withdrawn`` warning). Then the run ends with exit 0 and ``already_finished``,
writing nothing but the log. Anything missing or different, or several workers (they would
wait for a chief that ended): the run goes on as a resume.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from app import logs
from app.atomic import read_record
from app.config import PublishConfig, ScheduleConfig
from app.errors import ConfigError
from app.release import layout
from app.release.gate import Decision
from app.training.admit.facts import Previous
from app.training.loop.outcome import Completed, Outcome, Result, TargetReached, results
from app.training.state import identity
from app.training.state.workspace import Workspace

_OUTCOMES = {"completed": Completed, "target_reached": TargetReached}
#: The reason of a recorded decision whose version was removed from the publish directory.
WITHDRAWN = "withdrawn from the publish directory since: not published again"


def read(ws: Workspace, schedule: ScheduleConfig, workers: int) -> Previous:
    """What the output holds of an earlier run (module docstring), on the chief; nothing on
    a worker. Raises StorageError (exit 4) for a record that can't be read beside
    checkpoints."""
    if not ws.is_chief:
        return Previous()
    steps = identity.checkpoint_steps(ws.checkpoints)
    return Previous(
        identity.read(ws.checkpoints),
        identity.has_checkpoints(ws.checkpoints),
        over(ws, schedule, workers),
        max(steps) if steps else None,
    )


def refuse_past_end(ws: Workspace, previous: Previous, schedule: ScheduleConfig) -> None:
    """ConfigError (exit 2) when the checkpoints are already past ``--max-steps`` (the
    largest ``ckpt-N``): resumed, such a run trains nothing and would export its later
    weights as this run's and record a schedule they were never trained with."""
    last, end = previous.last_step, schedule.max_steps
    if last is not None and last > end:
        raise ConfigError(
            f"{ws.checkpoints}: this run is already at step {last}, past --max-steps "
            f"{end}: nothing to train, and its model and records stay as they are. To train "
            f"a model of {end} steps, train into a new --output; to go on, raise --max-steps"
        )


def over(ws: Workspace, schedule: ScheduleConfig, workers: int) -> dict[str, Any] | None:
    """The summary of a run finished where this one would end, its export in place; None
    otherwise, and for a multi-worker run (its workers would wait for a chief that ended:
    resume and dedupe instead). With one, only the data (:func:`finished_unchanged`,
    :func:`finished`) can still make this run something to do: a check that could refuse
    it waits until they are known."""
    if workers > 1:
        return None
    summary = _summary(ws.metrics)
    if summary is None or not _at_end(summary, schedule) or not _exported(ws.model, summary):
        return None
    return summary


def finished_unchanged(
    ws: Workspace, previous: Previous, key: str, mine: dict[str, Any], publishing: PublishConfig
) -> Result | None:
    """:func:`finished`, before the data are converted or read: when ``metrics.json``
    records the data's key (app/data/cache/entry.py ``source_key``) and it is ``key``, the
    sources the run finished on, unchanged, so the record's data fingerprints hold; the
    identity options and worker count ``mine`` (``Identity.to_json()`` without the data)
    are compared with the record. A cache evicted, or never kept (a temporary cache
    directory), is then not converted again to learn that there is nothing to do. None
    otherwise (an older ``metrics.json``: :func:`finished` decides)."""
    summary, record = previous.summary, previous.record or {}
    if summary is None or summary.get("data_key") != key or "data" not in record:
        return None
    return finished(ws, previous, {**mine, "data": record["data"]}, publishing)


def finished(
    ws: Workspace, previous: Previous, mine: dict[str, Any], publishing: PublishConfig
) -> Result | None:
    """The recorded result when this run, of identity ``mine`` (``Identity.to_json()``), is
    already finished in ``ws`` (module docstring), after logging ``already_finished`` and
    ``end``; else None."""
    summary, record = previous.summary, previous.record or {}
    if summary is None or {key: record.get(key) for key in mine} != mine:
        return None
    decision = _still_published(publishing.publish_dir, summary)
    if publishing.publish_dir is not None and decision is None:
        return None
    step = int(summary["final_step"])
    where = f"; published as version {decision.version}" if decision else ""
    if decision is not None and decision.reason == WITHDRAWN:
        where = f"; version {decision.version} was withdrawn from {publishing.publish_dir}"
    logs.event(
        "already_finished",
        f"{ws.output}: this run finished at step {step} with these data and options (model "
        f"in {ws.model}{where}): nothing to do",
        step=step,
        weights=summary["weights"],
    )
    logs.event("end", f"{summary['status']} at step {step} (already)", **results(summary))
    outcome: Outcome = _OUTCOMES[summary["status"]](
        step, step, summary.get("last_eval_rmse"), 0.0, int(summary.get("steps_per_loop") or 0)
    )
    return Result(outcome, summary, decision)


def _summary(path: Path) -> dict[str, Any] | None:
    """``metrics.json`` of a finished run with a weights digest; None otherwise."""
    try:
        summary = read_record(path)  # a FIFO or a device there is not waited for nor read
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("status") not in _OUTCOMES:
        return None
    if not isinstance(summary.get("final_step"), int) or not summary.get("weights"):
        return None
    return summary


def _at_end(summary: dict[str, Any], schedule: ScheduleConfig) -> bool:
    """Whether the recorded run ended where this one would: at ``--max-steps``, or at its
    target loss (the same ``--target-loss``) before it."""
    if summary["status"] == "target_reached":
        return summary.get("target_loss") == schedule.target_loss
    return bool(summary["final_step"] == schedule.max_steps)


def _exported(model: Path, summary: dict[str, Any]) -> bool:
    """Whether the export is in place as it was written (its files' digest)."""
    try:
        return layout.files_digest(model) == summary.get("export_files")
    except OSError:
        return False


def _still_published(directory: Path | None, summary: dict[str, Any]) -> Decision | None:
    """The recorded publish decision when ``directory`` still holds the weights as a
    version, or when this run published them there and the version has been removed since
    (a rollback: not published again, with a ``publish_withdrawn`` warning); None without
    a directory, a published decision in it or such a version."""
    decision = Decision.from_json(summary.get("publish"))
    if directory is None or decision is None or not decision.published:
        return None
    number = layout.published_as(directory, str(summary["weights"]))
    if number is not None:
        return dataclasses.replace(decision, version=number)
    if decision.directory is None or decision.version is None:
        return None
    if not _same_directory(Path(decision.directory), directory):
        return None
    logs.event(
        "publish_withdrawn",
        f"version {decision.version} of these weights, published in {directory} by this run, "
        "is no longer there (rolled back?): not published again; to publish them again, "
        "train into a new --output",
        level=logging.WARNING,
        version=decision.version,
    )
    return dataclasses.replace(decision, reason=WITHDRAWN)


def _same_directory(recorded: Path, directory: Path) -> bool:
    """Whether ``recorded`` (the publish directory as a run named it) is ``directory``
    however it is spelled now (relative, through a symlink): the same file, else the same
    path."""
    try:
        return os.path.samefile(recorded, directory)
    except OSError:
        return recorded == directory
