"""Real CFS quotas: detection, the plan and TensorFlow's pools inside real v1 cpu cgroups.

Each test creates cgroups under ``/sys/fs/cgroup/cpu`` with ``cpu.cfs_quota_us`` set
(``benchmarks.cgroup_run``), runs the real CLI or the real plan → apply → import path inside
them, and removes them afterwards. Skipped, with the reason, where that is impossible: not
root, no writable cgroup v1 ``cpu`` hierarchy (cgroup v2-only hosts, read-only mounts in
containers).

How the pool sizes are seen: TensorFlow's inter-op threads are named ``tf_Compute``; the
intra-op (Eigen) pool threads are not named and keep the process's ``comm``. With
``TF_NUM_INTRAOP_THREADS=n`` a process has n + c such threads after its first op (c = 2
here: the main thread and one more), so two quotas whose plans differ by k intra-op threads
must differ by exactly k unnamed threads.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from app.budget.cpulist import format_cpulist
from app.budget.plan import DEFAULT_ROUNDING, round_threads
from benchmarks.cgroup_run import CpuCgroup, cpu_cgroup, unavailable_reason
from tests.conftest import PINNED, REPO, events

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no real cgroup: {REASON}")

QUOTAS = (0.5, 1.5)
PLAN_FIELDS = (
    "cpu_quota",
    "cpu_budget",
    "cpuset",
    "intra_op_threads",
    "inter_op_threads",
    "tfdata_threads",
    "rounding",
)

# Runs the real plan → apply → import order of `coretrain train`, then one op, then
# reports each thread's comm (TF sizes its pools when the first op runs).
POOL_SNIPPET = r"""
import collections, json, os
from app.budget import apply, detect_plan
plan = detect_plan("/")
apply.apply(plan)
tf = apply.import_tensorflow()
x = tf.random.normal((128, 128))
float(tf.reduce_sum(tf.matmul(x, x)))
def comm(path):
    with open(path) as handle:
        return handle.read().strip()
names = collections.Counter(
    comm(f"/proc/self/task/{t}/comm") for t in os.listdir("/proc/self/task")
)
print(json.dumps({"plan": plan.to_json(), "main": comm("/proc/self/comm"), "threads": names}))
"""


def coretrain() -> list[str]:
    """The installed ``coretrain`` script next to this interpreter, else ``python -m app``."""
    script = Path(sys.executable).with_name("coretrain")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "app"]


def clean_env() -> dict[str, str]:
    drop = ("CORETRAIN_", "TF_NUM_", "CPU_LIMIT", "CPU_REQUEST")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return {**env, **PINNED}


def run_in(group: CpuCgroup, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        group.command(argv),
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def group() -> Iterator[Callable[[float], CpuCgroup]]:
    """``group(cpus)``: a cgroup with that quota, created once per module, always removed."""
    with contextlib.ExitStack() as stack:
        made: dict[float, CpuCgroup] = {}

        def get(cpus: float) -> CpuCgroup:
            if cpus not in made:
                made[cpus] = stack.enter_context(cpu_cgroup(cpus, prefix="coretrain-test"))
            return made[cpus]

        yield get
        paths = [g.path for g in made.values()]
    assert not any(p.exists() for p in paths), "cgroups were not removed"


@pytest.fixture(scope="module")
def plans(group: Callable[[float], CpuCgroup]) -> dict[float, dict[str, Any]]:
    """``coretrain plan --format json`` run inside each quota's cgroup."""
    out = {}
    for cpus in QUOTAS:
        proc = run_in(group(cpus), [*coretrain(), "plan", "--format", "json"], timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[cpus] = json.loads(proc.stdout)
    return out


def expected_intra(cpus: float, visible: int) -> int:
    return round_threads(min(cpus, visible), DEFAULT_ROUNDING, visible)


@pytest.mark.parametrize("cpus", QUOTAS)
def test_plan_reads_the_real_cfs_quota(cpus: float, group, plans) -> None:
    plan, grp = plans[cpus], group(cpus)
    quota_us = round(cpus * 100_000)
    assert grp.quota_us() == quota_us
    assert plan["cpu_quota"] == cpus  # exactly: quota_us / 100000
    assert plan["cpuset"] == sorted(os.sched_getaffinity(0))
    visible = len(plan["cpuset"])
    assert plan["cpu_budget"] == min(cpus, visible)
    assert plan["rounding"] == DEFAULT_ROUNDING
    assert plan["intra_op_threads"] == expected_intra(cpus, visible)
    assert plan["inter_op_threads"] == 1  # budget ≤ 2 CPUs
    # The quota came from this group's own file, found through /proc/self/cgroup.
    quota_files = {k: v for k, v in plan["inputs"].items() if k.endswith("/cpu.cfs_quota_us")}
    assert quota_files[f"{grp.path}/cpu.cfs_quota_us"] == str(quota_us)
    cgroup_lines = plan["inputs"]["/proc/self/cgroup"].splitlines()
    assert any(
        "cpu" in line.split(":")[1].split(",") and line.split(":", 2)[2] == f"/{grp.name}"
        for line in cgroup_lines
    ), cgroup_lines


def _pool(grp: CpuCgroup) -> dict[str, Any]:
    proc = run_in(grp, [sys.executable, "-c", POOL_SNIPPET])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_tensorflow_pools_have_the_planned_sizes(group, plans) -> None:
    visible = len(plans[1.5]["cpuset"])
    target = expected_intra(1.5, visible)
    # A second quota whose plan has a different intra-op count under the default rule.
    other = next((q for q in (1.0, 2.0, 0.5) if expected_intra(q, visible) != target), None)
    if other is None:
        pytest.skip(f"rule {DEFAULT_ROUNDING!r} gives {target} threads for every quota here")
    a, b = _pool(group(1.5)), _pool(group(other))
    for measured, cpus in ((a, 1.5), (b, other)):
        assert measured["plan"]["cpu_quota"] == cpus
        assert measured["plan"]["intra_op_threads"] == expected_intra(cpus, visible)
        threads = collections.Counter(measured["threads"])
        assert threads["tf_Compute"] == measured["plan"]["inter_op_threads"]
    unnamed_a = a["threads"][a["main"]]
    unnamed_b = b["threads"][b["main"]]
    planned = a["plan"]["intra_op_threads"] - b["plan"]["intra_op_threads"]
    assert unnamed_a - unnamed_b == planned, (a, b)


def _wait_until_stopped(pid: int) -> None:
    """Until the kernel reports ``pid`` stopped (state T in /proc/PID/stat)."""
    while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
        os.sched_yield()


def _thread_names(pid: int) -> collections.Counter[str]:
    names: collections.Counter[str] = collections.Counter()
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread may end meanwhile
            names[Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()] += 1
    return names


@pytest.mark.slow
def test_training_runs_under_the_quota_with_the_detected_plan(
    group, plans, tiny_data: Path, tmp_path: Path
) -> None:
    grp = group(1.5)
    before = grp.stat()
    args = ["--data", str(tiny_data), "--output", str(tmp_path / "out")]
    args += ["--batch-size", "50", "--max-steps", "2", "--eval-every", "1"]
    args += ["--checkpoint-every", "2"]
    records, names_at_progress = [], []
    with open(tmp_path / "stderr.txt", "w+") as err:
        proc = subprocess.Popen(
            grp.command([*coretrain(), "train", *args]),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=clean_env(),
            cwd=REPO,
        )
        assert proc.stdout is not None
        for line in proc.stdout:  # the pid is coretrain's: sh exec'd it
            records.append(json.loads(line))
            if records[-1]["event"] == "progress":
                names_at_progress.append(_thread_names(proc.pid))
        returncode = proc.wait(timeout=180)
        err.seek(0)
        assert returncode == 0, err.read()[-3000:]
    after = grp.stat()
    brief = events(records, "start")[0]["plan"]
    assert brief["cpuset"] == format_cpulist(plans[1.5]["cpuset"])  # in brief, the kernel's form
    start = json.loads((tmp_path / "out" / "logs" / "plan.json").read_text())  # the whole plan
    assert events(records, "start")[0]["plan_file"] == str(tmp_path / "out" / "logs" / "plan.json")
    assert start["cpu_quota"] == brief["cpu_quota"] == 1.5
    assert {k: start[k] for k in PLAN_FIELDS} == {k: plans[1.5][k] for k in PLAN_FIELDS}
    assert start["intra_op_threads"] == expected_intra(1.5, len(start["cpuset"]))
    assert [p["step"] for p in events(records, "progress")] == [1, 2]
    # No pool is created again while it trains: the thread counts stay put from one
    # progress event to the next. (The pools' sizes are pinned exactly by the test above;
    # here the names can't separate them: the threads tf.data starts from inside the step
    # function inherit the name of the inter-op thread that starts them, "tf_Compute".)
    first, second = names_at_progress
    assert first["tf_Compute"] >= start["inter_op_threads"]
    assert (second["tf_Compute"], sum(second.values())) == (
        first["tf_Compute"],
        sum(first.values()),
    )
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["final_step"] == 2
    assert metrics["plan"]["intra_op_threads"] == start["intra_op_threads"]
    # The run was scheduled under this group's CFS bandwidth control.
    assert after["nr_periods"] > before["nr_periods"]
    assert grp.pids() == []


@pytest.mark.slow
def test_a_quota_raised_mid_run_replans_and_finishes_at_the_same_step(
    tiny_data: Path, tmp_path: Path
) -> None:
    """Quota 1.0 → 2.0 CPUs while training: budget_changed, a checkpoint, a fresh
    TensorFlow with 2 intra-op threads in the same process, the requested end, exit 0."""
    args = ["--data", str(tiny_data), "--output", str(tmp_path / "out"), "--max-steps", "16"]
    args += ["--batch-size", "40", "--eval-every", "4", "--checkpoint-every", "100"]
    records: list[dict[str, Any]] = []
    with cpu_cgroup(1.0, prefix="coretrain-test-replan") as grp:
        proc = subprocess.Popen(
            grp.command([*coretrain(), "train", *args]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
            cwd=REPO,
        )
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            records.append(json.loads(line))
            if records[-1]["event"] == "start":
                # The plan (in `start`) is made; the first re-read of the budget is at the
                # first progress event, after the data, TensorFlow's import and a step.
                # The quota is raised while the run is stopped here, so that re-read sees
                # it whatever the two processes' speeds.
                os.kill(proc.pid, signal.SIGSTOP)
                _wait_until_stopped(proc.pid)
                grp.set_quota(2.0)  # as an in-place pod resize or docker update --cpus
                os.kill(proc.pid, signal.SIGCONT)
        returncode = proc.wait(timeout=300)
        assert returncode == 0, proc.stderr.read()[-3000:]
    starts = events(records, "start")
    assert [s["plan"]["intra_op_threads"] for s in starts] == [1, expected_intra(2.0, 2)]
    (changed,) = events(records, "budget_changed")
    assert changed["replan"] is True
    assert (changed["old"]["cpu_quota"], changed["new"]["cpu_quota"]) == (1.0, 2.0)
    first, last = events(records, "progress")[0], events(records, "progress")[-1]
    assert events(records, "checkpoint")[0]["step"] == first["step"]
    assert events(records, "resume")[0]["step"] == first["step"]
    assert events(records, "replanned")[0]["seconds"] > 0
    end = events(records, "end")[-1]
    assert (end["status"], end["final_step"]) == ("completed", 16)
    # Its wall time spans both processes: from the first start, not from the restart.
    at = [datetime.fromisoformat(r["timestamp"]).timestamp() for r in records]
    first_start, last_progress = at[records.index(starts[0])], at[records.index(last)]
    assert end["wall_seconds"] >= last_progress - first_start
    # Under the 1-CPU quota the kernel's counters are in the progress event.
    assert first["cpu_throttled_ratio"] is not None and first["cpu_throttled_s"] is not None


# Inside a cgroup without a quota of its own, below one with a small quota: burns one CPU
# until the budget's cpu.stat shows a throttled period (an event of the kernel's, so no
# timing), at most ~10 s; prints the file read and the last interval's figures.
THROTTLED_SNIPPET = r"""
import json, time
from app.budget.cgroups.detect import detect_budget
from app.budget.usage import Throttling
budget = detect_budget("/")
meter = Throttling(budget.cpu_stat)
seen = {}
for _ in range(200):
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    seen = meter.read()
    if seen["cpu_throttled_ratio"]:
        break
print(json.dumps({"quota": budget.cpu_quota, "cpu_stat": budget.cpu_stat, **seen}))
"""


def test_a_nested_cgroup_reads_throttling_from_its_parent_s_quota() -> None:
    """Parent: 0.2 CPUs; child: no quota (as a pod's container below the pod's limit). The
    kernel throttles the parent; the child's own cpu.stat never counts a period."""
    with cpu_cgroup(0.2, prefix="coretrain-test-nested") as parent:
        child = CpuCgroup(path=parent.path / "job", name=f"{parent.name}/job")
        child.path.mkdir()
        try:
            proc = run_in(child, [sys.executable, "-c", THROTTLED_SNIPPET], timeout=60)
            leaf = child.stat()
        finally:
            child.path.rmdir()
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout)
    assert seen["quota"] == 0.2
    assert seen["cpu_stat"] == f"{parent.path}/cpu.stat"
    assert seen["cpu_throttled_ratio"] > 0 and seen["cpu_throttled_s"] > 0
    assert leaf["nr_periods"] == 0  # the leaf's counters would have said nothing
