"""app/report/push.py: the run's outcome read back from a real Pushgateway.

The Pushgateway is Debian's ``prometheus-pushgateway`` (installed by .ci/run), started here
on a loopback port; without it these tests are skipped, saying so.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import events, json_lines, run_cli

BINARY = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
#: Every gauge a finished, published run pushes (app/report/push.py).
GAUGES = {
    "coretrain_run_status", "coretrain_run_exit_code", "coretrain_test_rmse",
    "coretrain_val_rmse", "coretrain_linear_rmse", "coretrain_mean_predictor_rmse",
    "coretrain_published_version", "coretrain_steps", "coretrain_samples_per_second",
    "coretrain_wall_seconds", "coretrain_startup_seconds", "coretrain_cpu_util",
    "coretrain_cpu_throttled_seconds", "coretrain_run_end_timestamp_seconds",
}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a Pushgateway of its own, on a loopback port, empty: its own persistence
    file (Debian's build persists to /var/lib/prometheus by default, shared by every run)."""
    if BINARY is None:
        pytest.skip("no Pushgateway binary (apt-get install prometheus-pushgateway; .ci/run does)")
    address = f"127.0.0.1:{_free_port()}"
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


def pushed(url: str, run: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name → {labels other than job/run/instance: value} of the group job=coretrain,
    run=``run``, as the Pushgateway serves it to Prometheus."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if labels.pop("job", None) != "coretrain" or labels.pop("run", None) != run:
                continue
            labels.pop("instance", None)
            out.setdefault(sample.name, {})[tuple(sorted(labels.items()))] = sample.value
    return out


@pytest.mark.slow
def test_a_published_run_pushes_every_metric(gateway: str, tmp_path: Path) -> None:
    from app.data import synthetic

    data, out, models = tmp_path / "data", tmp_path / "nightly-1", tmp_path / "models"
    models.mkdir()
    assert pushed(gateway, "nightly-1") == {}  # nothing before the run
    synthetic.generate(data, train=1200, test=300, seed=1)  # enough to beat the mean
    proc = run_cli(
        "train", "--data", str(data), "--output", str(out), "--batch-size", "100",
        "--eval-every", "20", "--max-steps", "40", "--publish-dir", str(models),
        "--metrics-push", gateway,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    got = pushed(gateway, "nightly-1")
    assert set(got) >= GAUGES, GAUGES - set(got)
    assert got["coretrain_run_status"] == {(("status", "completed"),): 1.0}
    value = {name: values[()] for name, values in got.items() if () in values}
    assert value["coretrain_run_exit_code"] == 0
    for name, key in (
        ("coretrain_test_rmse", "test_rmse"), ("coretrain_val_rmse", "val_rmse"),
        ("coretrain_linear_rmse", "linear_rmse"),
        ("coretrain_mean_predictor_rmse", "baseline_rmse"), ("coretrain_steps", "final_step"),
        ("coretrain_samples_per_second", "examples_per_sec"),
        ("coretrain_wall_seconds", "wall_seconds"),
        ("coretrain_startup_seconds", "startup_seconds"),
    ):  # fmt: skip
        assert value[name] == pytest.approx(metrics[key]), name
    assert value["coretrain_published_version"] == metrics["publish"]["version"] == 1
    assert 0 < metrics["startup_seconds"] < metrics["wall_seconds"]
    progress = events(json_lines(proc.stdout), "progress")
    mean_util = sum(p["cpu_util"] for p in progress) / len(progress)
    assert value["coretrain_cpu_util"] == pytest.approx(mean_util)
    throttled = sum(p.get("cpu_throttled_s") or 0.0 for p in progress)
    assert value["coretrain_cpu_throttled_seconds"] == pytest.approx(throttled)
    (done,) = events(json_lines(proc.stdout), "metrics_pushed")
    assert done["run"] == "nightly-1"


def test_a_failed_run_pushes_its_status_and_exit_code(gateway: str, tmp_path: Path) -> None:
    empty = tmp_path / "data"
    empty.mkdir()
    assert pushed(gateway, "failing") == {}  # nothing before the run
    proc = run_cli(
        "train", "--data", str(empty), "--output", str(tmp_path / "failing"),
        env={"CORETRAIN_METRICS_PUSH": gateway},
    )  # fmt: skip
    assert proc.returncode == 3
    got = pushed(gateway, "failing")
    assert got["coretrain_run_status"] == {(("status", "failed"),): 1.0}
    assert got["coretrain_run_exit_code"] == {(): 3.0}
    assert "coretrain_test_rmse" not in got  # never reached
    assert got["coretrain_wall_seconds"][()] > 0


def test_a_night_refused_before_its_output_is_made_is_pushed_too(
    gateway: str, tmp_path: Path, tiny_data: Path
) -> None:
    """An --height the CNN can't take (a bad CORETRAIN_HEIGHT in the CronJob): exit 2,
    nothing written, and the dashboard still sees the failed night."""
    out = tmp_path / "too-small"
    proc = run_cli(
        "train", "--data", str(tiny_data), "--output", str(out),
        env={"CORETRAIN_METRICS_PUSH": gateway, "CORETRAIN_HEIGHT": "4"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert not out.exists()
    got = pushed(gateway, "too-small")
    assert got["coretrain_run_status"] == {(("status", "failed"),): 1.0}
    assert got["coretrain_run_exit_code"] == {(): 2.0}


def test_a_failed_push_is_a_warning_not_a_failed_run(tmp_path: Path) -> None:
    empty = tmp_path / "data"
    empty.mkdir()
    closed = f"http://127.0.0.1:{_free_port()}"
    proc = run_cli(
        "train", "--data", str(empty), "--output", str(tmp_path / "out"),
        "--metrics-push", closed,
    )  # fmt: skip
    assert proc.returncode == 3  # the run's own code, not the push's
    (warning,) = events(json_lines(proc.stdout), "metrics_push_failed")
    assert warning["level"] == "WARNING" and warning["url"] == closed
    assert len(proc.stderr.splitlines()) == 1
