"""app/report/push.py: the run's outcome read back from a real Pushgateway.

The Pushgateway is Debian's ``prometheus-pushgateway`` (installed by .ci/run), started here
on a loopback port; without it these tests are skipped, saying so. Each test pushes under a
job of its own (``--metrics-job``), the grouping key.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app import __version__
from app.report import ReportOptions
from app.report.push import Recorder, push
from tests.conftest import events, json_lines, run_cli
from tests.runs import train_args

BINARY = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
#: Every family a push holds (app/report/push.py); the last success only after exit 0.
FAMILIES = {
    "coretrain_run_status", "coretrain_run_exit_code", "coretrain_run_info",
    "coretrain_test_rmse", "coretrain_val_rmse", "coretrain_linear_rmse",
    "coretrain_mean_predictor_rmse", "coretrain_published_version", "coretrain_steps",
    "coretrain_samples_per_second", "coretrain_wall_seconds", "coretrain_startup_seconds",
    "coretrain_cpu_util_ratio", "coretrain_cpu_throttled_seconds",
    "coretrain_run_end_timestamp_seconds", "coretrain_last_success_timestamp_seconds",
}  # fmt: skip
Series = dict[str, dict[tuple[tuple[str, str], ...], float]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a Pushgateway of its own, on a loopback port, empty: its own persistence
    file (Debian's build persists to /var/lib/prometheus by default, shared by every run)."""
    if BINARY is None:
        pytest.skip("no Pushgateway binary (apt-get install prometheus-pushgateway; .ci/run does)")
    address = f"127.0.0.1:{free_port()}"
    state = tmp_path_factory.mktemp("pushgateway") / "pushgateway.data"
    proc = subprocess.Popen(
        [BINARY, f"--web.listen-address={address}", f"--persistence.file={state}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://{address}"
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("the Pushgateway did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def groups(url: str, job: str) -> list[dict[str, str]]:
    """The grouping labels of every group the Pushgateway holds for ``job`` (its API)."""
    with urllib.request.urlopen(f"{url}/api/v1/metrics", timeout=5) as r:
        data = json.load(r)["data"]
    return [g["labels"] for g in data if g["labels"].get("job") == job]


def pushed(url: str, job: str) -> Series:
    """name → {labels other than job/instance: value} of the job's series, as the
    Pushgateway serves them to Prometheus."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if labels.pop("job", None) != job:
                continue
            labels.pop("instance", None)
            out.setdefault(sample.name, {})[tuple(sorted(labels.items()))] = sample.value
    return out


def value(series: Series, name: str) -> float:
    """The value of ``name``'s one series without labels."""
    return series[name][()]


def statuses(series: Series) -> dict[str, float]:
    return {dict(k)["status"]: v for k, v in series["coretrain_run_status"].items()}


def info(series: Series) -> dict[str, str]:
    ((labels, one),) = series["coretrain_run_info"].items()
    assert one == 1
    return dict(labels)


@pytest.mark.slow
def test_a_published_run_pushes_every_metric(gateway: str, tmp_path: Path) -> None:
    from app.data import synthetic

    data, out, models = tmp_path / "data", tmp_path / "nightly-1", tmp_path / "models"
    models.mkdir()
    assert pushed(gateway, "published") == {}  # nothing before the run
    synthetic.generate(data, train=1200, test=300, seed=1)  # enough to beat the mean
    proc = run_cli(
        "train", "--data", str(data), "--output", str(out), "--batch-size", "100",
        "--eval-every", "20", "--max-steps", "40", "--publish-dir", str(models),
        "--metrics-push", gateway, "--metrics-job", "published",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    got = pushed(gateway, "published")
    assert set(got) == FAMILIES | {"push_time_seconds", "push_failure_time_seconds"}
    assert statuses(got) == {"completed": 1, "target_reached": 0, "preempted": 0, "failed": 0}
    assert value(got, "coretrain_run_exit_code") == 0
    for name, key in (
        ("coretrain_test_rmse", "test_rmse"), ("coretrain_val_rmse", "val_rmse"),
        ("coretrain_linear_rmse", "linear_rmse"),
        ("coretrain_mean_predictor_rmse", "baseline_rmse"), ("coretrain_steps", "final_step"),
        ("coretrain_samples_per_second", "examples_per_sec"),
        ("coretrain_wall_seconds", "wall_seconds"),
        ("coretrain_startup_seconds", "startup_seconds"),
    ):  # fmt: skip
        assert value(got, name) == pytest.approx(metrics[key]), name
    assert value(got, "coretrain_published_version") == metrics["publish"]["version"] == 1
    assert 0 < metrics["startup_seconds"] < metrics["wall_seconds"]
    records = json_lines(proc.stdout)
    progress = events(records, "progress")
    mean_util = sum(p["cpu_util"] for p in progress) / len(progress)
    assert value(got, "coretrain_cpu_util_ratio") == pytest.approx(mean_util)
    throttled = sum(p.get("cpu_throttled_s") or 0.0 for p in progress)
    assert value(got, "coretrain_cpu_throttled_seconds") == pytest.approx(throttled)
    (start,) = events(records, "start")
    assert info(got) == {
        "output": str(out), "data_key": metrics["data_key"], "version": __version__,
        "formulation": metrics["formulation"], "precision": metrics["precision"],
        "cpu_model": start["plan"]["cpu_model"],
    }  # fmt: skip
    ended = value(got, "coretrain_run_end_timestamp_seconds")
    assert value(got, "coretrain_last_success_timestamp_seconds") == ended
    (done,) = events(records, "metrics_pushed")
    assert done["job"] == "published" and done["url"] == gateway


@pytest.mark.slow
def test_three_nights_leave_one_group_and_the_last_success(
    gateway: str, tmp_path: Path, tiny_data: Path
) -> None:
    """Three runs into three new output directories, as the CronJob makes them, the second
    failing on bad data: one group for the job, replaced by each push; the failed night's
    status gone after the third; the last success the third's, kept through the failure."""
    bad = shutil.copytree(tiny_data, tmp_path / "bad-data")
    (bad / "train_labels.txt").write_text("0.5 0.1 not-a-number\n" * 240)
    env = {"CORETRAIN_METRICS_PUSH": gateway, "CORETRAIN_METRICS_JOB": "nightly"}

    def night(data: Path, name: str) -> Series:
        out = tmp_path / name
        proc = run_cli("train", *train_args(data, out, 2), env=env)
        assert proc.returncode == (3 if data == bad else 0), proc.stderr[-3000:]
        assert len(events(json_lines(proc.stdout), "metrics_pushed")) == 1
        got = pushed(gateway, "nightly")
        assert info(got)["output"] == str(out)
        return got

    first = night(tiny_data, "coretrain-nightly-1")
    succeeded = value(first, "coretrain_last_success_timestamp_seconds")
    assert succeeded == value(first, "coretrain_run_end_timestamp_seconds")

    second = night(bad, "coretrain-nightly-2")
    assert statuses(second)["failed"] == 1 and value(second, "coretrain_run_exit_code") == 3
    assert value(second, "coretrain_last_success_timestamp_seconds") == succeeded
    assert value(second, "coretrain_run_end_timestamp_seconds") > succeeded
    assert math.isnan(value(second, "coretrain_test_rmse"))  # not the first night's
    assert math.isnan(value(second, "coretrain_steps"))

    third = night(tiny_data, "coretrain-nightly-3")
    assert groups(gateway, "nightly") == [{"job": "nightly"}]
    assert statuses(third) == {"completed": 1, "target_reached": 0, "preempted": 0, "failed": 0}
    ended = value(third, "coretrain_run_end_timestamp_seconds")
    assert value(third, "coretrain_last_success_timestamp_seconds") == ended > succeeded
    assert value(third, "coretrain_steps") == 2


def test_a_failed_push_keeps_the_last_success(gateway: str, tmp_path: Path) -> None:
    """The push itself, in this process: a success, then a failure under the same job."""
    options = ReportOptions(metrics_push=gateway, metrics_job="in-process")
    assert push(options, tmp_path / "one", Recorder(), "completed", 0)
    before = pushed(gateway, "in-process")
    assert push(options, tmp_path / "two", Recorder(), "failed", 4)
    after = pushed(gateway, "in-process")
    assert statuses(after) == {"completed": 0, "target_reached": 0, "preempted": 0, "failed": 1}
    assert value(after, "coretrain_run_exit_code") == 4
    assert info(after)["output"] == str(tmp_path / "two")
    success = "coretrain_last_success_timestamp_seconds"
    assert value(after, success) == value(before, success)
    assert value(after, "coretrain_run_end_timestamp_seconds") > value(before, success)
    assert len(groups(gateway, "in-process")) == 1


def test_a_failed_run_pushes_its_status_and_exit_code(gateway: str, tmp_path: Path) -> None:
    empty = tmp_path / "data"
    empty.mkdir()
    assert pushed(gateway, "failing") == {}  # nothing before the run
    proc = run_cli(
        "train", "--data", str(empty), "--output", str(tmp_path / "failing"),
        env={"CORETRAIN_METRICS_PUSH": gateway, "CORETRAIN_METRICS_JOB": "failing"},
    )  # fmt: skip
    assert proc.returncode == 3
    got = pushed(gateway, "failing")
    assert statuses(got)["failed"] == 1
    assert value(got, "coretrain_run_exit_code") == 3
    assert math.isnan(value(got, "coretrain_test_rmse"))  # never reached
    assert value(got, "coretrain_wall_seconds") > 0
    assert "coretrain_last_success_timestamp_seconds" not in got
    (start,) = events(json_lines(proc.stdout), "start")  # the plan is made before the data
    assert info(got) == {
        "output": str(tmp_path / "failing"), "data_key": "", "version": __version__,
        "formulation": "", "precision": "", "cpu_model": start["plan"]["cpu_model"],
    }  # fmt: skip


def test_a_night_refused_before_its_output_is_made_is_pushed_too(
    gateway: str, tmp_path: Path, tiny_data: Path
) -> None:
    """An --height the CNN can't take (a bad CORETRAIN_HEIGHT in the CronJob): exit 2,
    nothing written, and the dashboard still sees the failed night. The gateway's URL
    without its scheme, as prometheus-client takes it."""
    out = tmp_path / "too-small"
    proc = run_cli(
        "train", "--data", str(tiny_data), "--output", str(out), "--metrics-job", "refused",
        env={"CORETRAIN_METRICS_PUSH": gateway.removeprefix("http://"), "CORETRAIN_HEIGHT": "4"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert not out.exists()
    got = pushed(gateway, "refused")
    assert statuses(got)["failed"] == 1
    assert value(got, "coretrain_run_exit_code") == 2


@pytest.mark.parametrize(
    ("case", "env", "args"),
    [
        ("an empty variable", {"CORETRAIN_MAX_STEPS": ""}, []),
        ("a value out of range", {}, ["--max-steps", "0"]),
        ("no such choice", {}, ["--optimizer", "adamx"]),
    ],
)
def test_a_night_the_command_line_refuses_is_pushed_too(
    gateway: str, tmp_path: Path, tiny_data: Path, case: str, env: dict, args: list
) -> None:
    """A value the command line itself refuses (a manifest's slip: an empty
    CORETRAIN_MAX_STEPS) is a failed night on the dashboard too: --metrics-push and
    --metrics-job are read before the other options."""
    job = "cli-" + case.replace(" ", "-")
    proc = run_cli(
        "train", "--data", str(tiny_data), "--output", str(tmp_path / "out"), *args,
        env={"CORETRAIN_METRICS_PUSH": gateway, "CORETRAIN_METRICS_JOB": job, **env},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    got = pushed(gateway, job)
    assert statuses(got)["failed"] == 1 and value(got, "coretrain_run_exit_code") == 2


def test_a_run_refused_by_the_output_lock_pushes_nothing(
    gateway: str, tmp_path: Path, tiny_data: Path
) -> None:
    """Exit 75: another run holds the output directory, and pushes its own outcome."""
    out = tmp_path / "held"
    out.mkdir()
    with (out / ".lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = run_cli(
            "train", "--data", str(tiny_data), "--output", str(out),
            "--metrics-push", gateway, "--metrics-job", "locked",
        )  # fmt: skip
    assert proc.returncode == 75, proc.stderr
    assert groups(gateway, "locked") == []
    assert not events(json_lines(proc.stdout), "metrics_pushed")


def test_the_recorder_takes_numbers_only(logged: list) -> None:
    """Progress fields that are no number (none yet, a string, a boolean) are no figure,
    and never an error in the log handler, which would end the run."""
    from app import logs

    recorder = Recorder()
    logs.add_handler(recorder)
    try:
        for util, throttled in ((None, None), (0.5, 1.5), ("n/a", "n/a"), (True, True), (0.7, 0)):
            logs.event("progress", "step", step=3, cpu_util=util, cpu_throttled_s=throttled)
        logs.event("end", "done", status="completed", final_step=3, test_rmse="n/a")
    finally:
        logging.getLogger(logs.LOGGER_NAME).removeHandler(recorder)
    gauges = recorder.gauges()
    assert gauges["coretrain_cpu_util_ratio"][1] == pytest.approx(0.6)
    assert gauges["coretrain_cpu_throttled_seconds"][1] == 1.5
    assert gauges["coretrain_steps"][1] == 3
    assert math.isnan(gauges["coretrain_test_rmse"][1])
