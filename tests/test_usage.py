"""Throttling from cpu.stat (v1 and v2 formats), and the budget watch's decisions."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import pytest

from app.budget.cgroups.detect import CpuBudget
from app.budget.plan import Overrides, make_plan
from app.budget.usage import CpuStat, Throttling, read_cpu_stat
from app.training.extras.budget_watch import BudgetWatch, warn_when_throttled
from tests.conftest import FIXTURES

V1 = "nr_periods 200\nnr_throttled 50\nthrottled_time 2500000000\n"
V2 = (
    "usage_usec 9000000\nuser_usec 8000000\nsystem_usec 1000000\n"
    "nr_periods 400\nnr_throttled 100\nthrottled_usec 1500000\n"
)


def _stat(tmp_path: Path, text: str) -> str:
    (tmp_path / "cg").mkdir(exist_ok=True)
    (tmp_path / "cg" / "cpu.stat").write_text(text)
    return "/cg/cpu.stat"


@pytest.mark.parametrize(("text", "seconds"), [(V1, 2.5), (V2, 1.5)])
def test_cpu_stat_counters_in_seconds(tmp_path: Path, text: str, seconds: float) -> None:
    stat = read_cpu_stat(_stat(tmp_path, text), str(tmp_path))
    assert stat is not None and stat.throttled_s == seconds
    assert stat.throttled / stat.periods == 0.25


def test_throttling_is_per_interval(tmp_path: Path) -> None:
    path = _stat(tmp_path, V1)
    meter = Throttling(path, str(tmp_path))
    (tmp_path / "cg" / "cpu.stat").write_text(
        "nr_periods 300\nnr_throttled 90\nthrottled_time 4500000000\n"
    )
    assert meter.read() == {"cpu_throttled_ratio": 0.4, "cpu_throttled_s": 2.0}
    # No period elapsed (no quota, or nothing ran): no ratio, no throttled time.
    assert meter.read() == {"cpu_throttled_ratio": None, "cpu_throttled_s": 0.0}


def test_unreadable_cpu_stat_gives_nulls(tmp_path: Path) -> None:
    assert read_cpu_stat("/nope/cpu.stat", str(tmp_path)) is None
    assert read_cpu_stat(_stat(tmp_path, "garbage\n"), str(tmp_path)) is None
    assert Throttling(None).read() == {"cpu_throttled_ratio": None, "cpu_throttled_s": None}


def test_the_live_budget_names_the_cpu_stat_of_its_cgroup() -> None:
    from app.budget.cgroups.detect import detect_budget

    case = FIXTURES / "cgroup" / "docker-v1-cpus-1.5"
    budget = detect_budget(case, env={})
    assert budget.cpu_quota == 1.5
    assert budget.cpu_stat == "/sys/fs/cgroup/cpu,cpuacct/cpu.stat"


NESTED_V1 = "jdk_internal.slice/jdk_internal-SystemdMemoryAwarenessTestHS.slice"
#: (fixture, the cgroup directories from the mount root down to the process's, the one
#: whose quota is the tightest): the quota is held above the process's own cgroup.
LEVELS = [
    (
        "v1-systemd-jdk-nested-slices",
        [
            "/sys/fs/cgroup/cpu,cpuacct",
            "/sys/fs/cgroup/cpu,cpuacct/jdk_internal.slice",
            f"/sys/fs/cgroup/cpu,cpuacct/{NESTED_V1}",
            f"/sys/fs/cgroup/cpu,cpuacct/{NESTED_V1}/jdk_internal-SystemdMemoryAwarenessTestHS-cpu.slice",
            f"/sys/fs/cgroup/cpu,cpuacct/{NESTED_V1}/jdk_internal-SystemdMemoryAwarenessTestHS-cpu.slice"
            "/run-r5f2a9c4e81d34b7f9e06c2d1a8b3f4e7.scope",
        ],
        3,
    ),
    ("go-v2-parent-quota-leaf-max-no-listing", ["/sys/fs/cgroup", "/sys/fs/cgroup/leaf"], 0),
]


@pytest.mark.parametrize(("case", "levels", "limiting"), LEVELS)
def test_throttling_is_read_from_the_level_that_holds_the_quota(
    tmp_path: Path, case: str, levels: list[str], limiting: int
) -> None:
    """Every level has its own cpu.stat with its own counters; the kernel throttles the
    level whose quota runs out, so only that level's counters say the job was held back."""
    from app.budget.cgroups.detect import detect_budget

    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "cgroup" / case, root)
    for i, level in enumerate(levels):
        (root / level.lstrip("/") / "cpu.stat").write_text(
            f"nr_periods {1000 * (i + 1)}\nnr_throttled {10 * i}\nthrottled_time {i}000000\n"
        )
    budget = detect_budget(root, env={})
    assert budget.cpu_stat == f"{levels[limiting]}/cpu.stat"
    meter = Throttling(budget.cpu_stat, str(root))
    for i, level in enumerate(levels):  # 100 more periods everywhere; throttled: 40 here
        throttled = 10 * i + (40 if i == limiting else 0)
        (root / level.lstrip("/") / "cpu.stat").write_text(
            f"nr_periods {1000 * (i + 1) + 100}\nnr_throttled {throttled}\n"
            f"throttled_time {i}000000\n"
        )
    assert meter.read()["cpu_throttled_ratio"] == 0.4


def _plan(quota: float | None, cpus: int = 4) -> object:
    budget = CpuBudget(
        cpu_quota=quota, cpuset=tuple(range(cpus)), memory_limit=None, quota_source="t"
    )
    return make_plan(budget, overrides=Overrides())


def test_budget_watch_replans_only_when_the_threads_change(logged: list) -> None:
    now = {"plan": _plan(1.5)}
    watch = BudgetWatch(_plan(1.5), detect=lambda plan: now["plan"])  # type: ignore[arg-type]
    assert watch.replan() is False and logged == []  # nothing changed
    now["plan"] = _plan(1.2)  # 2 intra-op threads and 1 inter-op thread, as before
    assert watch.replan() is False
    assert [r.event for r in logged] == ["budget_changed"] and logged[0].replan is False
    now["plan"] = _plan(2.0)  # the same intra-op threads, but 2 inter-op threads
    assert watch.replan() is True
    assert (logged[-1].old["inter_op_threads"], logged[-1].new["inter_op_threads"]) == (1, 2)
    assert "inter-op 1 → 2" in logged[-1].getMessage()
    now["plan"] = _plan(3.0)
    assert watch.replan() is True
    assert logged[-1].old["intra_op_threads"] == 2 and logged[-1].new["intra_op_threads"] == 3
    assert watch.replan() is False  # the change is now the watch's plan


def test_budget_watch_disabled_logs_why_and_never_replans(logged: list) -> None:
    watch = BudgetWatch(
        _plan(1.0),  # type: ignore[arg-type]
        enabled=False,
        why_not="--replan never",
        detect=lambda plan: _plan(4.0),  # type: ignore[arg-type, return-value]
    )
    assert watch.replan() is False
    assert logged[-1].levelno == logging.WARNING and "--replan never" in logged[-1].getMessage()


def test_a_throttled_interval_warns_with_what_to_change(logged: list) -> None:
    plan = dataclasses.replace(_plan(1.5), intra_op_threads=2)  # type: ignore[type-var]
    action = warn_when_throttled(plan)  # type: ignore[arg-type]
    action({"step": 10, "cpu_throttled_ratio": 0.2, "cpu_throttled_s": 0.1})
    assert logged == []
    action({"step": 20, "cpu_throttled_ratio": 0.6, "cpu_throttled_s": 3.0})
    (warning,) = logged
    assert warning.event == "cpu_throttled" and warning.levelno == logging.WARNING
    assert "60%" in warning.getMessage() and "--rounding floor" in warning.getMessage()
    json.dumps(warning.cpu_throttled_ratio)


def test_a_throttled_single_thread_is_told_only_to_raise_the_limit(logged: list) -> None:
    action = warn_when_throttled(_plan(0.3))  # type: ignore[arg-type]
    action({"step": 20, "cpu_throttled_ratio": 0.9, "cpu_throttled_s": 5.0})
    message = logged[-1].getMessage()
    assert "1 intra-op thread run into a quota of 0.3 CPUs; raise the CPU limit" in message
    assert "--rounding" not in message and "fewer threads" not in message


NULLS = {"cpu_throttled_ratio": None, "cpu_throttled_s": None}


def test_a_path_is_read_as_it_is_by_default(tmp_path: Path) -> None:
    path = str(tmp_path) + _stat(tmp_path, V2)  # the default root is /
    assert read_cpu_stat(path) == CpuStat(periods=400, throttled=100, throttled_s=1.5)


@pytest.mark.parametrize(
    "text", ["nr_periods 200\n", "nr_throttled 50\n", "nr_periods 200\nnr_throttled x\n"]
)
def test_a_cpu_stat_without_both_period_counters_gives_nothing(tmp_path: Path, text: str) -> None:
    assert read_cpu_stat(_stat(tmp_path, text), str(tmp_path)) is None


def test_a_cpu_stat_without_a_time_counter_has_zero_throttled_seconds(tmp_path: Path) -> None:
    stat = read_cpu_stat(_stat(tmp_path, "nr_periods 200\nnr_throttled 50\n"), str(tmp_path))
    assert stat == CpuStat(periods=200, throttled=50, throttled_s=0.0)


def test_one_period_makes_a_ratio_and_the_figures_keep_three_decimals(tmp_path: Path) -> None:
    path = _stat(tmp_path, "nr_periods 3\nnr_throttled 0\nthrottled_time 0\n")
    meter = Throttling(path, str(tmp_path))
    stat = tmp_path / "cg" / "cpu.stat"
    stat.write_text("nr_periods 4\nnr_throttled 1\nthrottled_time 1234567\n")
    assert meter.read() == {"cpu_throttled_ratio": 1.0, "cpu_throttled_s": 0.001}
    stat.write_text("nr_periods 7\nnr_throttled 2\nthrottled_time 1234567\n")
    assert meter.read() == {"cpu_throttled_ratio": 0.333, "cpu_throttled_s": 0.0}


def test_a_cpu_stat_that_appears_or_goes_between_reads_gives_nulls(tmp_path: Path) -> None:
    meter = Throttling("/cg/cpu.stat", str(tmp_path))  # not there yet
    _stat(tmp_path, V1)
    assert meter.read() == NULLS
    (tmp_path / "cg" / "cpu.stat").unlink()  # the cgroup is gone
    assert meter.read() == NULLS
