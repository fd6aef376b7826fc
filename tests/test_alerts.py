"""k8s/alerts.yaml: the alert rules checked and unit-tested by Prometheus' own promtool.

promtool is Debian's ``prometheus`` package (installed by .ci/run); without it these tests
are skipped, saying so. The rules file is the ConfigMap's ``coretrain.rules.yaml``, written
beside the unit tests of tests/fixtures/alerts_test.yaml (a failed night then a good one,
no success in 26 hours with the groups of an earlier grouping key in the gateway, a run in
progress, no success ever recorded).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import FIXTURES, REPO

PROMTOOL = shutil.which("promtool")
RULES = "coretrain.rules.yaml"


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    """A directory with the ConfigMap's rules file and the unit tests of the fixture."""
    if PROMTOOL is None:
        pytest.skip("no promtool (apt-get install prometheus; .ci/run does)")
    configmap = yaml.safe_load((REPO / "k8s" / "alerts.yaml").read_text(encoding="utf-8"))
    (tmp_path / RULES).write_text(configmap["data"][RULES], encoding="utf-8")
    shutil.copy(FIXTURES / "alerts_test.yaml", tmp_path / "alerts_test.yaml")
    return tmp_path


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_promtool_checks_the_rules(rules_dir: Path) -> None:
    done = promtool("check", "rules", RULES, cwd=rules_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 3 rules found" in done.stdout


def test_the_rules_pass_their_unit_tests(rules_dir: Path) -> None:
    done = promtool("test", "rules", "alerts_test.yaml", cwd=rules_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_unit_tests_fail_on_the_rules_documented_before(rules_dir: Path) -> None:
    """The unit tests can fail: with the alert on the end of every group's last run (the
    example the documentation gave before), the old groups fire one alert each."""
    rules = (rules_dir / RULES).read_text(encoding="utf-8")
    shipped = "time() - max by (job) (coretrain_last_success_timestamp_seconds)"
    assert shipped in rules
    (rules_dir / RULES).write_text(
        rules.replace(shipped, "time() - coretrain_run_end_timestamp_seconds"), encoding="utf-8"
    )
    done = promtool("test", "rules", "alerts_test.yaml", cwd=rules_dir)
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'run="coretrain-nightly-1"' in done.stdout + done.stderr


def test_the_shipped_job_pushes_under_the_job_the_rules_name() -> None:
    """The nightly pods' --metrics-job (k8s/job.yaml, the CronJob's spec) is the job whose
    absence of any success CoretrainNoSuccessRecorded watches."""
    job = yaml.safe_load((REPO / "k8s" / "job.yaml").read_text(encoding="utf-8"))
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    configmap = yaml.safe_load((REPO / "k8s" / "alerts.yaml").read_text(encoding="utf-8"))
    absent = (
        f'absent(coretrain_last_success_timestamp_seconds{{job="{env["CORETRAIN_METRICS_JOB"]}"}})'
    )
    assert absent in configmap["data"][RULES]
