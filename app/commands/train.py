"""``coretrain train``: one run of the job, and the one place its outcome becomes an exit.

In order: the JSON log on stdout, the umask, the stop request (SIGTERM/SIGINT), the
cluster (a multi-worker run, if any), the workspace; then, with the outcome pushed to the
Pushgateway when one is named, what the arguments alone refuse (--data, --height/--width,
--publish-dir: app/training/admit/, nothing written yet), the output lock, the thread plan
(detected and applied before TensorFlow starts), then :func:`app.training.run.train`.
Its outcome (app/training/loop/outcome.py) is mapped here, by :func:`conclude`, to the exit
code: 0, 7 when the gate kept the model out of ``--publish-dir``, 143 after a stop, or to
a restart of the process with a new thread plan. Failures are raised
(:class:`app.errors.AppError`) and mapped by the command line.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from app import lock, logs
from app.atomic import restrict_umask
from app.budget import apply, detect_plan
from app.budget.plan import PlanOptions
from app.cluster import spec
from app.cluster.spec import ClusterOptions
from app.commands import Exit
from app.config import TrainConfig
from app.errors import ConfigError, NotPublished, Preempted
from app.report import ReportOptions, push
from app.signals import StopRequest
from app.training.admit import check_arguments
from app.training.loop.outcome import REPLAN_AT_ENV, STARTED_AT_ENV, Replan, Result, Stopped
from app.training.state import workspace

#: Exit code of a completed run whose model the gate kept out of --publish-dir (README).
NOT_PUBLISHED = NotPublished.exit_code


def run(
    config: TrainConfig,
    options: PlanOptions,
    cluster_options: ClusterOptions,
    report: ReportOptions | None = None,
) -> Exit:
    """Train as configured (module docstring); return how the process ends. Raises
    AppError for every expected failure (its exit code: README, "Exit codes")."""
    text = report is not None and report.text(sys.stdout)
    logs.setup(text=text)
    restrict_umask()
    stop = StopRequest().install()
    cluster = spec.resolve(os.environ, cluster_options)
    if cluster is not None:
        logs.setup(worker=cluster.index, text=text)  # every record carries the worker index
    ws = workspace.for_run(config, cluster)

    def body() -> Exit:  # its refusals are pushed too (a night that never started)
        check_arguments(config, ws.is_chief)  # a mistyped argument writes nothing in --output
        held = lock.acquire(ws.own, below=ws.output)
        bfloat16 = "bfloat16" in config.compute.precisions(native_bf16=True)
        plan = detect_plan("/", options, bfloat16=bfloat16)
        apply.apply(plan)
        from app.training.run import train

        return conclude(train(ws, config, plan, stop, cluster), held)

    url = report.metrics_push if report is not None and ws.is_chief else None
    return body() if url is None or report is None else pushed(report, ws.output, body)


def refused(values: dict[str, Any], code: int) -> None:
    """A run the command line refused (a value, or a variable, click or its checks did not
    take), pushed as the night's failure with exit ``code`` when ``values`` (the options
    read before it: app/cli/options.py ``EAGER``) name a Pushgateway; a push that can't be made is
    the warning it always is."""
    if not values.get("metrics_push"):
        return
    try:
        report = ReportOptions(
            metrics_push=values["metrics_push"],
            metrics_job=values.get("metrics_job") or ReportOptions.metrics_job,
        )
    except ConfigError:
        return  # the push's own options are refused: nothing to push to
    push.push(report, Path(values.get("output_dir") or "."), push.Recorder(), "failed", code)


def pushed(report: ReportOptions, output: Path, body: Callable[[], Exit]) -> Exit:
    """``body()``, with the run's outcome pushed to ``report``'s Pushgateway when it ends,
    returned or raised (app/report/push.py); a restart for a new plan pushes in the new
    process."""
    return push.reported(report, output, body, lambda result: result.code)


def conclude(result: Result, held: IO[str]) -> Exit:
    """The exit of a run that ended with ``result``, or its restart with a new thread plan
    (same PID, same output lock: :func:`app.budget.apply.restart`, never returns)."""
    outcome = result.outcome
    if isinstance(outcome, Replan):
        started = time.time() - float(result.summary.get("wall_seconds") or 0.0)
        env = {REPLAN_AT_ENV: str(outcome.at), lock.HELD_FD_ENV: str(held.fileno()),
               STARTED_AT_ENV: str(started)}  # fmt: skip
        logs.clear_view()  # the new process draws its own bar
        apply.restart(env, keep_fds=(held.fileno(),))
    held.close()
    if isinstance(outcome, Stopped):
        why = f"stopped by signal at step {outcome.step}; checkpoint saved, rerun to resume"
        return Exit(Preempted.exit_code, why)
    if result.refused is not None:
        return Exit(NOT_PUBLISHED, f"model not published: {result.refused}")
    return Exit()
