"""The thread plan is a pure function of the budget, topology and overrides."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.budget.cgroups.detect import CpuBudget
from app.budget.cpulist import parse_cpulist
from app.budget.plan import Overrides, PlanOptions, make_plan, overrides_from, round_threads
from app.budget.topology import CpuModel, Topology, detect_cpu
from app.errors import ConfigError
from tests.conftest import FIXTURES, run_cli


def budget(quota: float | None, cpus: int, memory: int | None = None) -> CpuBudget:
    return CpuBudget(
        cpu_quota=quota, cpuset=tuple(range(cpus)), memory_limit=memory, quota_source="test"
    )


@pytest.mark.parametrize(
    "quota, cpus, rule, threads",
    [
        (1.5, 64, "ceil", 2),
        (1.5, 64, "floor", 1),
        (1.5, 64, "tf-default", 64),
        (0.5, 8, "ceil", 1),
        (0.5, 8, "floor", 1),  # never below one thread
        (None, 4, "ceil", 4),
        (8.0, 2, "ceil", 2),  # never above the cpuset
        (2.0, 4, "floor", 2),
        (2.0, 4, "ceil", 2),
    ],
)
def test_intra_op_threads_follow_the_rounding_rule(quota, cpus, rule, threads) -> None:
    plan = make_plan(budget(quota, cpus), overrides=Overrides(rounding=rule))
    assert plan.intra_op_threads == threads
    assert plan.tfdata_threads == threads
    assert any(f"intra-op threads {threads} = {rule}" in r for r in plan.reasons)


def test_a_request_without_a_quota_is_reported_and_the_pools_use_the_cpuset() -> None:
    burstable = CpuBudget(
        cpu_quota=None, cpuset=tuple(range(16)), memory_limit=None, quota_source="none",
        cpu_request=1.0,
    )  # fmt: skip
    plan = make_plan(burstable, overrides=Overrides())
    assert (plan.cpu_budget, plan.intra_op_threads) == (16.0, 16)
    assert (plan.budget_source, plan.cpu_request) == ("cpuset", 1.0)
    (why,) = [r for r in plan.reasons if r.startswith("cpu budget")]
    assert "the CPU request 1 is a weight under contention" in why and "Requests without" in why
    assert plan.to_json()["budget_source"] == "cpuset"


@pytest.mark.parametrize(
    "quota, cpus, source",
    [(1.5, 16, "cpu quota (test)"), (None, 4, "cpuset"), (2.0, 1, "cpu quota (test)")],
)
def test_the_plan_names_what_set_its_budget(quota, cpus, source) -> None:
    plan = make_plan(budget(quota, cpus), overrides=Overrides())
    assert plan.budget_source == source and plan.cpu_request is None
    assert not any("CPU request" in r for r in plan.reasons)
    forced = make_plan(budget(quota, cpus), overrides=Overrides(cpus=3.0))
    assert (forced.budget_source, forced.cpu_budget) == ("--cpus", 3.0)


def test_unknown_rounding_rule_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        round_threads(2.0, "nearest", 4)


def test_explicit_settings_win_and_say_so() -> None:
    ov = Overrides(
        cpus=3.0,
        intra_op_threads=5,
        inter_op_threads=2,
        sources={"intra_op_threads": "TF_NUM_INTRAOP_THREADS env"},
    )
    plan = make_plan(budget(1.0, 8), overrides=ov)
    assert plan.cpu_budget == 3.0
    assert (plan.intra_op_threads, plan.inter_op_threads) == (5, 2)
    assert "intra-op threads 5 from TF_NUM_INTRAOP_THREADS env (explicit setting wins)" in (
        plan.reasons
    )
    assert any("cpu budget 3 from --cpus (detected 1)" in r for r in plan.reasons)


def test_memory_limit_sets_tfdata_ram_budget() -> None:
    plan = make_plan(budget(2.0, 4, memory=8 << 30))
    assert plan.tfdata_ram_budget == 2 << 30


def test_pin_modes_pick_inside_the_allowed_set() -> None:
    b = CpuBudget(cpu_quota=2.0, cpuset=(2, 3, 4, 5, 6, 7), memory_limit=None, quota_source="t")
    topo = Topology(
        cores=((2, 6), (3, 7), (4,), (5,)), numa_nodes=((2, 3, 4), (5, 6, 7)), inputs={}
    )
    assert make_plan(b, topo).pin_cpus is None  # auto: no pinning
    assert make_plan(b, topo, Overrides(pin="cores")).pin_cpus == (2, 3)
    assert make_plan(b, topo, Overrides(pin="physical")).pin_cpus == (2, 3)
    assert make_plan(b, topo, Overrides(pin="numa")).pin_cpus == (2, 3, 4)


def test_plan_command_reads_a_fixture_tree_without_importing_tensorflow() -> None:
    case = FIXTURES / "cgroup" / "docker-v1-cpus-1.5"
    code = (
        "import sys\n"
        "from app.cli import main\n"
        f"sys.argv = ['coretrain', 'plan', '--root', {str(case)!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'tensorflow' not in sys.modules, 'plan imported TensorFlow'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    expected = json.loads((case / "expected.json").read_text())
    assert plan["cpu_quota"] == expected["cpu_quota"]
    assert plan["cpuset"] == list(parse_cpulist(expected["cpuset"]))
    assert plan["cpu_budget"] == min(expected["cpu_quota"], len(plan["cpuset"]))
    assert plan["intra_op_threads"] == 2
    assert {"inter_op_threads", "tfdata_threads", "pin_cpus", "reasons", "inputs"} <= plan.keys()


def test_plan_text_names_each_number_and_its_inputs() -> None:
    case = FIXTURES / "cgroup" / "docker-v1-cpus-1.5"
    proc = run_cli("plan", "--format", "text", "--root", str(case))
    assert proc.returncode == 0, proc.stderr
    assert "cpu_quota         1.5" in proc.stdout
    assert "budget_source     cpu quota (cgroup v1)" in proc.stdout
    assert "cpu_request       none" in proc.stdout
    assert "cpu.cfs_quota_us = 150000" in proc.stdout


def test_tf_num_env_overrides_detection() -> None:
    proc = run_cli(
        "plan",
        "--root",
        str(FIXTURES / "cgroup" / "docker-v1-cpus-1.5"),
        env={"TF_NUM_INTRAOP_THREADS": "7"},
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["intra_op_threads"] == 7
    assert any("TF_NUM_INTRAOP_THREADS env" in r for r in plan["reasons"])


def test_bad_tf_num_env_exits_2() -> None:
    proc = run_cli("plan", env={"TF_NUM_INTRAOP_THREADS": "lots"})
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()  # one line: no log event printed beside it
    assert line.startswith("coretrain: TF_NUM_INTRAOP_THREADS='lots'")


# --- oneDNN: TensorFlow's own default, made explicit; the user's variable wins -------------


def _cpu(case: str) -> CpuModel:
    return detect_cpu(FIXTURES / "cpuinfo" / case)


@pytest.mark.parametrize(
    "case, onednn",
    [("amd-epyc-zen3-milan", False), ("intel-xeon-sapphire-rapids", True)],
)
def test_onednn_follows_tensorflows_rule_for_the_cpu(case: str, onednn: bool) -> None:
    plan = make_plan(budget(None, 2), cpu=_cpu(case))
    assert plan.onednn is onednn
    assert plan.cpu_model == _cpu(case).name
    (reason,) = [r for r in plan.reasons if r.startswith("oneDNN")]
    assert f"TF_ENABLE_ONEDNN_OPTS={int(onednn)}" in reason and "TensorFlow's default" in reason


@pytest.mark.parametrize(
    "raw, onednn", [("0", False), ("FALSE", False), ("1", True), ("true", True)]
)
def test_tf_enable_onednn_opts_in_the_environment_wins(raw: str, onednn: bool) -> None:
    ov = overrides_from({"TF_ENABLE_ONEDNN_OPTS": raw})
    plan = make_plan(budget(None, 2), overrides=ov, cpu=_cpu("intel-xeon-sapphire-rapids"))
    assert plan.onednn is onednn
    assert any(
        r.endswith("(explicit)") and f"TF_ENABLE_ONEDNN_OPTS={raw}" in r for r in plan.reasons
    )


@pytest.mark.parametrize(
    "case, bfloat16, onednn",
    [
        ("amd-epyc-zen4-build-machine", True, True),  # native bf16: oneDNN's kernels
        ("amd-epyc-zen3-milan", True, False),  # no bf16 on the CPU: TensorFlow's default
        ("amd-epyc-zen4-build-machine", False, True),  # float32: TensorFlow's default
    ],
)
def test_a_bfloat16_run_turns_onednn_on_where_the_cpu_has_bf16(
    case: str, bfloat16: bool, onednn: bool
) -> None:
    plan = make_plan(budget(None, 2), overrides=Overrides(bfloat16=bfloat16), cpu=_cpu(case))
    assert plan.onednn is onednn
    (reason,) = [r for r in plan.reasons if r.startswith("oneDNN")]
    assert ("may compute in bfloat16" in reason) == (bfloat16 and case.endswith("build-machine"))


def test_a_value_tensorflow_would_not_read_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="TF_ENABLE_ONEDNN_OPTS='yes'"):
        overrides_from({"TF_ENABLE_ONEDNN_OPTS": "yes"})


def test_unreadable_cpuinfo_leaves_onednn_to_tensorflow_with_a_warning(tmp_path: Path) -> None:
    plan = make_plan(budget(None, 2), cpu=detect_cpu(tmp_path))
    assert plan.onednn is None
    assert any(r.startswith("warning: oneDNN left to TensorFlow") for r in plan.reasons)


def test_thread_variables_count_only_without_the_flag() -> None:
    env = {"TF_NUM_INTRAOP_THREADS": "3", "TF_NUM_INTEROP_THREADS": "2"}
    ov = overrides_from(env, PlanOptions(intra_op_threads=5))
    assert (ov.intra_op_threads, ov.inter_op_threads) == (5, 2)
    assert ov.sources["inter_op_threads"] == "TF_NUM_INTEROP_THREADS env"
    with pytest.raises(ConfigError, match="not a whole number"):
        overrides_from({"TF_NUM_INTRAOP_THREADS": "two"})
