"""A finished run rerun with the same data and options: nothing to do (no TensorFlow).

A retried Job, or a CronJob that runs twice, reruns work that is done. Before the data are
read, :func:`finished_unchanged` takes the sources' cache key for the data (their files
unchanged since the run finished, as ``metrics.json``'s ``data_key`` records); else, once
the cache is there and before the baselines are fitted and TensorFlow starts,
:func:`finished` compares the data's fingerprints. Either looks for the evidence that this
very run is over in the output directory: ``metrics.json`` of a finished run at
``--max-steps`` (or its target reached) with the digest of the exported weights, the export
itself (``model/``, its files as written), the identity in ``checkpoints/run.json`` equal
to this run's (data fingerprints, identity options, workers: app/training/state/identity.py),
and, with
``--publish-dir``, a version there that holds those weights (or, when this run published
them there and the version has been removed since, a rollback to respect: a
``publish_withdrawn`` warning, and they are not published again). All present: the run ends
with exit 0 and one ``already_finished`` event; nothing is exported, published or written
but the log. Anything missing or different, or a multi-worker run (its workers would wait
for a chief that ended): the run goes on as usual (a resume, which exports and offers the
model to the gate again; weights already published are not published twice:
app/release/publish.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from app import logs
from app.config import TrainConfig
from app.data.cache import DataCache
from app.release import layout
from app.release.gate import Decision
from app.training.loop.outcome import Completed, Outcome, Result, TargetReached, results
from app.training.state import identity
from app.training.state.workspace import Workspace

_OUTCOMES = {"completed": Completed, "target_reached": TargetReached}
#: The reason of a recorded decision whose version was removed from the publish directory.
WITHDRAWN = "withdrawn from the publish directory since: not published again"


def finished(
    ws: Workspace, config: TrainConfig, data: DataCache, workers: int,
    summary: dict[str, Any] | None = None,
) -> Result | None:  # fmt: skip
    """The recorded result when this run (``config`` on ``data``) is already finished in
    ``ws`` (module docstring), after logging ``already_finished`` and ``end``; else None.
    ``summary``: what :func:`over` gave, when the caller read it already."""
    summary = summary or over(ws, config, workers)
    if summary is None:
        return None
    record = identity.read(ws.checkpoints) or {}
    mine = identity.of_run(config, data, workers).to_json()
    if {key: record.get(key) for key in mine} != mine:
        return None
    return _nothing_to_do(ws, config, summary)


def finished_unchanged(
    ws: Workspace, config: TrainConfig, key: str, workers: int,
    summary: dict[str, Any] | None = None,
) -> Result | None:  # fmt: skip
    """:func:`finished`, before the data are converted or read: when ``metrics.json``
    records the data's key (app/data/cache/entry.py ``source_key``) and it is ``key``, the
    sources the run finished on, unchanged, so the record's data fingerprints hold; the
    options and worker count are compared with the record. A cache evicted, or never kept
    (a temporary cache directory), is then not converted again to learn that there is
    nothing to do. None otherwise (an older ``metrics.json``: :func:`finished` decides).
    ``summary``: what :func:`over` gave, when the caller read it already."""
    summary = summary or over(ws, config, workers)
    if summary is None or summary.get("data_key") != key:
        return None
    record = identity.read(ws.checkpoints) or {}
    if "data" not in record:
        return None
    mine = identity.Identity(record["data"], identity.options_of(config), workers).to_json()
    if {k: record.get(k) for k in mine} != mine:
        return None
    return _nothing_to_do(ws, config, summary)


def over(ws: Workspace, config: TrainConfig, workers: int) -> dict[str, Any] | None:
    """The summary of a run finished where this one would end, its export in place; None
    otherwise, and for a multi-worker run (its workers would wait for a chief that ended:
    resume and dedupe instead). With one, only the data (:func:`finished_unchanged`,
    :func:`finished`) can still make this run something to do: a check that could refuse
    it waits until they are known."""
    if workers > 1:
        return None
    summary = _summary(ws.metrics)
    if summary is None or not _at_end(summary, config) or not _exported(ws.model, summary):
        return None
    return summary


def _nothing_to_do(ws: Workspace, config: TrainConfig, summary: dict[str, Any]) -> Result | None:
    """The recorded result after ``already_finished`` and ``end``, when the publish
    directory, if any, still agrees (:func:`_still_published`); else None."""
    decision = _still_published(config.publishing.publish_dir, summary)
    if config.publishing.publish_dir is not None and decision is None:
        return None
    step = int(summary["final_step"])
    where = f"; published as version {decision.version}" if decision else ""
    if decision is not None and decision.reason == WITHDRAWN:
        where = f"; version {decision.version} was withdrawn from {config.publishing.publish_dir}"
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
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("status") not in _OUTCOMES:
        return None
    if not isinstance(summary.get("final_step"), int) or not summary.get("weights"):
        return None
    return summary


def _at_end(summary: dict[str, Any], config: TrainConfig) -> bool:
    """Whether the recorded run ended where this one would: at ``--max-steps``, or at its
    target loss (the same ``--target-loss``) before it."""
    if summary["status"] == "target_reached":
        return summary.get("target_loss") == config.schedule.target_loss
    return bool(summary["final_step"] == config.schedule.max_steps)


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
    if decision.directory != str(directory) or decision.version is None:
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
