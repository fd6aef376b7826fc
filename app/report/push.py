"""The run's outcome pushed to a Prometheus Pushgateway (``--metrics-push URL``).

A batch job lives shorter than a scrape interval, so Prometheus' documented route for it is
the Pushgateway: at the end of the run, also when it fails, the job pushes one group of
gauges (prometheus-client's ``push_to_gateway``: the group is replaced as a whole) with
the grouping key ``job="coretrain"``, ``run=<the output directory's name>`` (the nightly
CronJob's Job name: a retried pod resumes the same run and replaces its group). The
gauges (docs/deploy.md, "Metrics"):

``coretrain_run_status{status}`` (1 for the run's status: completed, target_reached,
preempted, failed), ``coretrain_run_exit_code``, ``coretrain_test_rmse``,
``coretrain_val_rmse``, ``coretrain_linear_rmse``, ``coretrain_mean_predictor_rmse`` (raw
label units), ``coretrain_published_version``, ``coretrain_steps`` (the final step),
``coretrain_samples_per_second``, ``coretrain_wall_seconds``,
``coretrain_startup_seconds`` (start to the first training step), ``coretrain_cpu_util``
(mean share of the CPU budget over the progress events), ``coretrain_cpu_throttled_seconds``
(their sum), ``coretrain_run_end_timestamp_seconds``. A value the run never reached (a test
RMSE of a failed run, the version of a model not published) is left out.

The figures come from the run's own events, collected by :class:`Recorder` (a logging
handler), so the push says what the log says. A push that fails is a
``metrics_push_failed`` warning, never a failed run. No TensorFlow here.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

from app import logs

JOB = "coretrain"
TIMEOUT_S = 10.0
#: Gauge name → (help, the ``end`` event's field).
FROM_END = {
    "coretrain_test_rmse": ("Test RMSE of the exported model (raw label units)", "test_rmse"),
    "coretrain_val_rmse": ("Validation RMSE of the exported step", "val_rmse"),
    "coretrain_linear_rmse": ("Test RMSE of the linear baseline (ridge)", "linear_rmse"),
    "coretrain_mean_predictor_rmse": ("Test RMSE of the mean predictor", "baseline_rmse"),
    "coretrain_steps": ("Final step of the run", "final_step"),
    "coretrain_samples_per_second": ("Training samples per second", "examples_per_sec"),
    "coretrain_wall_seconds": ("Wall time of the run", "wall_seconds"),
    "coretrain_startup_seconds": ("Seconds from start to the first step", "startup_seconds"),
}


class Recorder(logging.Handler):
    """Keeps what the push needs from the run's records: the ``end`` event's fields (before
    it, the last ``progress`` event's step and references), the ``progress`` events' CPU
    use and throttling, the ``published`` version."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.known: dict[str, Any] = {}  # the end event's fields, else the latest seen
        self.cpu_util: list[float] = []
        self.throttled_s = 0.0
        self.version: int | None = None
        self.t0 = time.perf_counter()

    def emit(self, record: logging.LogRecord) -> None:
        fields, event = record.__dict__, getattr(record, "event", None)
        if event == "end":
            self.known.update(fields)
        elif event == "progress":
            self.known["final_step"] = fields.get("step")
            for key in ("baseline_rmse", "linear_rmse"):
                self.known[key] = fields.get(key)
            if fields.get("cpu_util") is not None:
                self.cpu_util.append(float(fields["cpu_util"]))
            self.throttled_s += float(fields.get("cpu_throttled_s") or 0.0)
        elif event == "published":
            self.version = fields.get("version")

    def gauges(self, status: str, exit_code: int) -> dict[str, tuple[str, float]]:
        """name → (help, value) of every gauge with a value (module docstring)."""
        values: dict[str, tuple[str, float]] = {
            "coretrain_run_exit_code": ("Exit code of the run", exit_code),
            "coretrain_run_end_timestamp_seconds": ("When the run ended", time.time()),
        }
        for name, (help_text, key) in FROM_END.items():
            if isinstance(self.known.get(key), int | float):
                values[name] = (help_text, float(self.known[key]))
        if "coretrain_wall_seconds" not in values:  # a failure: the time until it
            values["coretrain_wall_seconds"] = (
                FROM_END["coretrain_wall_seconds"][0],
                time.perf_counter() - self.t0,
            )
        publish = self.known.get("publish") or {}
        version = self.version or (publish.get("version") if publish.get("published") else None)
        if version is not None:
            values["coretrain_published_version"] = ("Version published", float(version))
        if self.cpu_util:
            cpu = statistics.fmean(self.cpu_util)
            values["coretrain_cpu_util"] = ("Mean share of the CPU budget used", cpu)
        values["coretrain_cpu_throttled_seconds"] = ("Seconds throttled", self.throttled_s)
        return values


def push(url: str, output: Path, recorder: Recorder, status: str, exit_code: int) -> bool:
    """Push the run's gauges to the Pushgateway at ``url`` (module docstring); False, with
    a ``metrics_push_failed`` warning, when it can't."""
    registry = CollectorRegistry()
    state = Gauge("coretrain_run_status", "Status of the run", ["status"], registry=registry)
    state.labels(status=status).set(1)
    for name, (help_text, value) in recorder.gauges(status, exit_code).items():
        Gauge(name, help_text, registry=registry).set(value)
    run = Path(output).resolve().name or "output"
    try:
        push_to_gateway(
            url, job=JOB, registry=registry, grouping_key={"run": run}, timeout=TIMEOUT_S
        )
    except Exception as exc:  # any failure of the push (URL, network, HTTP) is a warning
        why = f"metrics not pushed to {url}: {exc}"
        logs.event("metrics_push_failed", why, level=logging.WARNING, url=url, error=str(exc))
        return False
    logs.event("metrics_pushed", f"metrics pushed to {url} (run {run})", url=url, run=run)
    return True
