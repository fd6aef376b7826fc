"""The run's outcome pushed to a Prometheus Pushgateway (``--metrics-push URL``).

A batch job lives shorter than a scrape interval, so Prometheus' documented route for it is
the Pushgateway. At the end of the run, also when it fails, :func:`reported` pushes the
run's figures under the grouping key ``job=<--metrics-job>`` alone (default ``coretrain``):
the same every night, so each night's push replaces the last one's and a nightly CronJob
leaves one group, not one per night (Prometheus' advice for batch jobs: no per-run label in
the grouping key). The run's identity is the labels of ``coretrain_run_info``.

The push is a POST (``pushadd_to_gateway``: it replaces the group's families of the names
it sends and keeps the others), as the Prometheus client libraries' documentation for batch
jobs does it: ``coretrain_last_success_timestamp_seconds`` is sent by a successful run
(exit 0) only, so a failed night leaves the last success as it was. A PUT would replace the
whole group and lose it; reading the old value back first would add a second request that
can fail and race another run. Every other family is in every push, NaN where the run never
reached the figure (the test RMSE of a failed run, the version of a model not published),
so no figure of an earlier night stays beside a later night's. A run refused because another
holds its output directory (exit 75) pushes nothing: the holder pushes its own outcome.

The families (docs/deploy.md, "Metrics"): ``coretrain_run_status{status}`` (1 for the run's
status, 0 for the others of :data:`STATUSES`), ``coretrain_run_exit_code``,
``coretrain_run_info{output,data_key,version,formulation,precision,cpu_model}`` (1; a label
the run never learned is empty), ``coretrain_test_rmse``, ``coretrain_val_rmse``,
``coretrain_linear_rmse``, ``coretrain_mean_predictor_rmse`` (raw label units),
``coretrain_published_version``, ``coretrain_steps`` (the final step),
``coretrain_samples_per_second``, ``coretrain_wall_seconds``, ``coretrain_startup_seconds``
(start to the first training step), ``coretrain_cpu_util_ratio`` (mean share of the CPU
budget over the progress events), ``coretrain_cpu_throttled_seconds`` (their sum),
``coretrain_run_end_timestamp_seconds`` and ``coretrain_last_success_timestamp_seconds``.

The figures come from the run's own events, collected by :class:`Recorder` (a logging
handler), so the push says what the log says. A push that fails in any way (the URL, the
network, an HTTP status, a garbage answer, no answer within the deadline, a signal:
app/report/gateway.py) is a ``metrics_push_failed`` warning, never the run's failure.
No TensorFlow here.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Gauge, Info

from app import __version__, logs
from app.errors import OutputLocked, Preempted, exit_code_of
from app.report import ReportOptions, gateway_url
from app.report.gateway import failure, send

T = TypeVar("T")
#: The ``end`` event's statuses (app/training/loop/outcome.py, and ``failed``).
STATUSES = ("completed", "target_reached", "preempted", "failed")
#: ``coretrain_run_info``'s labels (module docstring).
INFO_LABELS = ("output", "data_key", "version", "formulation", "precision", "cpu_model")
#: Gauge → (help, the ``end`` event's field).
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
    use and throttling, the ``published`` version, and the labels of the run's identity
    (``start``: the CPU model; ``choice``, ``end``: formulation, precision, data key)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.known: dict[str, Any] = {}  # the end event's fields, else the latest seen
        self.cpu_util: list[float] = []
        self.throttled_s = 0.0
        self.version: int | None = None
        self.info = dict.fromkeys(INFO_LABELS, "") | {"version": __version__}
        self.t0 = time.perf_counter()

    def emit(self, record: logging.LogRecord) -> None:
        """Keep what ``record`` holds for the push; never raises (a field that is not a
        number is no figure)."""
        fields, event = record.__dict__, getattr(record, "event", None)
        if event == "end":
            self.known.update(fields)
        elif event == "progress":
            self.known["final_step"] = fields.get("step")
            for key in ("baseline_rmse", "linear_rmse"):
                self.known[key] = fields.get(key)
            util = _number(fields.get("cpu_util"))
            throttled = _number(fields.get("cpu_throttled_s"))
            if not math.isnan(util):
                self.cpu_util.append(util)
            if not math.isnan(throttled):
                self.throttled_s += throttled
        elif event == "published":
            self.version = fields.get("version")
        elif event == "start" and isinstance(fields.get("plan"), dict):
            self.info["cpu_model"] = str(fields["plan"].get("cpu_model") or "")
        if event in ("choice", "end"):
            for key in ("data_key", "formulation", "precision"):
                if isinstance(fields.get(key), str):
                    self.info[key] = fields[key]

    def gauges(self) -> dict[str, tuple[str, float]]:
        """name → (help, value) of the run's figures (module docstring), NaN for one it
        never reached."""
        values = {
            name: (help_text, _number(self.known.get(key)))
            for name, (help_text, key) in FROM_END.items()
        }
        if math.isnan(values["coretrain_wall_seconds"][1]):  # a failure: the time until it
            values["coretrain_wall_seconds"] = (
                FROM_END["coretrain_wall_seconds"][0],
                time.perf_counter() - self.t0,
            )
        publish = self.known.get("publish") or {}
        version = self.version or (publish.get("version") if publish.get("published") else None)
        values["coretrain_published_version"] = ("Version published", _number(version))
        cpu = statistics.fmean(self.cpu_util) if self.cpu_util else math.nan
        values["coretrain_cpu_util_ratio"] = ("Mean share of the CPU budget used", cpu)
        values["coretrain_cpu_throttled_seconds"] = ("Seconds throttled", self.throttled_s)
        return values


def _number(value: Any) -> float:
    """``value`` as a gauge's value: NaN unless it is a number."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if number else math.nan


def registry(recorder: Recorder, output: Path, status: str, exit_code: int) -> CollectorRegistry:
    """The families of one push (module docstring): the run's ``status`` and ``exit_code``,
    ``output`` (the output directory) in the info labels, the last success when
    ``exit_code`` is 0."""
    families = CollectorRegistry()
    state = Gauge("coretrain_run_status", "Status of the run", ["status"], registry=families)
    for name in dict.fromkeys((*STATUSES, status)):
        state.labels(status=name).set(1 if name == status else 0)
    Gauge("coretrain_run_exit_code", "Exit code of the run", registry=families).set(exit_code)
    labels = recorder.info | {"output": str(Path(output).resolve())}
    Info("coretrain_run", "The run's identity", registry=families).info(labels)
    for name, (help_text, value) in recorder.gauges().items():
        Gauge(name, help_text, registry=families).set(value)
    now = time.time()
    Gauge("coretrain_run_end_timestamp_seconds", "When the run ended", registry=families).set(now)
    if exit_code == 0:
        help_text = "When the job last succeeded (exit 0)"
        Gauge("coretrain_last_success_timestamp_seconds", help_text, registry=families).set(now)
    return families


def push(options: ReportOptions, output: Path, recorder: Recorder, status: str, code: int) -> bool:
    """Push the run's families to ``options``' Pushgateway under its job (module
    docstring); False, with a ``metrics_push_failed`` warning, when it can't, whatever
    the failure."""
    url, job = str(options.metrics_push), options.metrics_job
    try:
        url = gateway_url(url)
        error = send(url, job, registry(recorder, output, status, code))
    except Exception as exc:  # a figure no gauge takes, say: a warning too, never the run's end
        error = failure(exc)
    if error:
        why = f"metrics not pushed to {url} (job {job}): {error}"
        logs.event("metrics_push_failed", why, level=logging.WARNING, url=url, job=job, error=error)
        return False
    logs.event("metrics_pushed", f"metrics pushed to {url} (job {job})", url=url, job=job)
    return True


def reported(
    options: ReportOptions, output: Path, body: Callable[[], T], code: Callable[[T], int]
) -> T:
    """``body()``, with its outcome pushed (:func:`push`) when it returns (exit
    ``code(result)``) or raises (its exception's exit code), except a refusal of the
    output lock (module docstring); what ``body`` returned or raised is kept as it was."""
    recorder = Recorder()
    logs.add_handler(recorder)
    try:
        result = body()
    except OutputLocked:
        raise
    except Exception as exc:
        status = "preempted" if isinstance(exc, Preempted) else "failed"
        push(options, output, recorder, status, exit_code_of(exc))
        raise
    exit_code = code(result)
    status = str(recorder.known.get("status") or ("completed" if exit_code == 0 else "failed"))
    push(options, output, recorder, status, exit_code)
    return result
