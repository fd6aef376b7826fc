"""The thread plan is a pure function of the budget, topology and overrides."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.budget import detect_plan
from app.budget.cgroups.detect import CpuBudget
from app.budget.cpulist import parse_cpulist
from app.budget.plan import (
    Overrides,
    PlanOptions,
    ThreadPlan,
    format_text,
    make_plan,
    overrides_from,
    round_threads,
)
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
    # quota 2 over a cpuset of 1 CPU: the cpuset sets the budget (1), not the quota
    [(1.5, 16, "cpu quota (test)"), (None, 4, "cpuset"), (2.0, 1, "cpuset")],
)
def test_the_plan_names_what_set_its_budget(quota, cpus, source) -> None:
    plan = make_plan(budget(quota, cpus), overrides=Overrides())
    assert plan.budget_source == source and plan.cpu_request is None
    assert not any("CPU request" in r for r in plan.reasons)
    forced = make_plan(budget(quota, cpus), overrides=Overrides(cpus=3.0))
    assert (forced.budget_source, forced.cpu_budget) == ("--cpus", 3.0)


def test_unknown_rounding_rule_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown rounding rule 'nearest'"):
        round_threads(2.0, "nearest", 4)


@pytest.mark.parametrize("rule", ["ceil", "floor", "tf-default"])
def test_threads_never_exceed_a_single_visible_cpu(rule: str) -> None:
    assert round_threads(3.0, rule, 1) == 1


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


def test_the_brief_plan_leaves_the_inputs_and_reasons_out_and_stays_short() -> None:
    cpus = tuple(range(256))
    b = CpuBudget(cpu_quota=250.0, cpuset=cpus, memory_limit=None, quota_source="t")
    topo = Topology(cores=tuple((c,) for c in cpus), numa_nodes=(cpus,), inputs={})
    plan = dataclasses.replace(
        make_plan(b, topo, Overrides(pin="cores")), inputs={"/proc/cpuinfo": "flags " * 2000}
    )
    brief = plan.brief()
    assert "inputs" not in brief and "reasons" not in brief
    assert brief["cpuset"] == "0-255" and brief["pin_cpus"] == "0-249"
    assert brief["intra_op_threads"] == plan.intra_op_threads == 250
    assert {k: v for k, v in plan.to_json().items() if k not in brief} == {
        "inputs": dict(plan.inputs),
        "reasons": list(plan.reasons),
    }
    assert len(json.dumps(brief)) < 1000  # with the config, one start line under 2,000


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
    state = "on" if onednn else "off"
    assert reason.startswith(f"oneDNN {state} (TF_ENABLE_ONEDNN_OPTS={int(onednn)}): TensorFlow's")


@pytest.mark.parametrize(
    "raw, onednn", [("0", False), ("FALSE", False), ("1", True), ("true", True)]
)
def test_tf_enable_onednn_opts_in_the_environment_wins(raw: str, onednn: bool) -> None:
    ov = overrides_from({"TF_ENABLE_ONEDNN_OPTS": raw})
    plan = make_plan(budget(None, 2), overrides=ov, cpu=_cpu("intel-xeon-sapphire-rapids"))
    assert plan.onednn is onednn
    state = "on" if onednn else "off"
    assert f"oneDNN {state} from TF_ENABLE_ONEDNN_OPTS={raw} env (explicit)" in plan.reasons


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


# --- The explicit settings and where each came from ------------------------------------------


def test_no_flag_and_no_variable_is_no_setting() -> None:
    """An empty or blank variable counts as unset, like a missing one."""
    assert overrides_from({}) == Overrides()
    blank = {
        "TF_NUM_INTRAOP_THREADS": "",
        "TF_NUM_INTEROP_THREADS": " ",
        "TF_ENABLE_ONEDNN_OPTS": "",
    }
    assert overrides_from(blank) == Overrides()


def test_every_setting_keeps_the_flag_or_variable_it_came_from() -> None:
    options = PlanOptions(
        cpus=2.5, intra_op_threads=5, inter_op_threads=3, pin="cores", rounding="floor"
    )
    assert overrides_from({"TF_ENABLE_ONEDNN_OPTS": " 1 "}, options, bfloat16=True) == Overrides(
        cpus=2.5,
        intra_op_threads=5,
        inter_op_threads=3,
        pin="cores",
        rounding="floor",
        onednn=True,
        bfloat16=True,
        sources={
            "cpus": "--cpus/CORETRAIN_CPUS",
            "intra_op_threads": "--intra-op-threads/CORETRAIN_INTRA_OP_THREADS",
            "inter_op_threads": "--inter-op-threads/CORETRAIN_INTER_OP_THREADS",
            "onednn": "TF_ENABLE_ONEDNN_OPTS=1 env",
        },
    )
    from_env = overrides_from({"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2"})
    assert (from_env.intra_op_threads, from_env.inter_op_threads) == (1, 2)
    assert from_env.sources == {
        "intra_op_threads": "TF_NUM_INTRAOP_THREADS env",
        "inter_op_threads": "TF_NUM_INTEROP_THREADS env",
    }


def test_a_thread_variable_below_one_names_itself_and_its_value() -> None:
    with pytest.raises(ConfigError, match=r"^TF_NUM_INTEROP_THREADS='0': must be at least 1$"):
        overrides_from({"TF_NUM_INTEROP_THREADS": "0"})


def test_the_reasons_name_where_each_explicit_setting_came_from() -> None:
    options = PlanOptions(cpus=2.5, intra_op_threads=5, inter_op_threads=3)
    plan = make_plan(budget(1.0, 8), overrides=overrides_from({}, options))
    assert (plan.cpu_budget, plan.intra_op_threads, plan.inter_op_threads) == (2.5, 5, 3)
    assert plan.budget_source == "--cpus/CORETRAIN_CPUS"
    assert {
        "cpu budget 2.5 from --cpus/CORETRAIN_CPUS (detected 1)",
        "intra-op threads 5 from --intra-op-threads/CORETRAIN_INTRA_OP_THREADS "
        "(explicit setting wins)",
        "inter-op threads 3 from --inter-op-threads/CORETRAIN_INTER_OP_THREADS "
        "(explicit setting wins)",
    } <= set(plan.reasons)
    # Overrides made without their sources (a caller's own) name the flag.
    bare = Overrides(cpus=2.5, intra_op_threads=5, inter_op_threads=3, onednn=False)
    assert {
        "cpu budget 2.5 from --cpus (detected 1)",
        "intra-op threads 5 from --intra-op-threads (explicit setting wins)",
        "inter-op threads 3 from --inter-op-threads (explicit setting wins)",
        "oneDNN off from TF_ENABLE_ONEDNN_OPTS (explicit)",
    } <= set(make_plan(budget(1.0, 8), overrides=bare).reasons)


@pytest.mark.parametrize("cpus", [0.0, -1.0, float("nan")])
def test_cpus_must_be_above_zero(cpus: float) -> None:
    with pytest.raises(ConfigError, match=rf"^--cpus must be > 0, got {cpus}$"):
        make_plan(budget(None, 4), overrides=Overrides(cpus=cpus))


def test_cpus_may_be_a_fraction_of_one() -> None:
    plan = make_plan(budget(None, 4), overrides=Overrides(cpus=0.5))
    assert (plan.cpu_budget, plan.intra_op_threads, plan.inter_op_threads) == (0.5, 1, 1)


@pytest.mark.parametrize(
    "overrides", [Overrides(intra_op_threads=0), Overrides(inter_op_threads=0)]
)
def test_an_explicit_thread_count_below_one_is_a_config_error(overrides: Overrides) -> None:
    with pytest.raises(ConfigError, match=r"^thread counts must be at least 1$"):
        make_plan(budget(2.0, 4), overrides=overrides)


# --- Budget, inter-op threads and pinning: the rule and the reason given -----------------------


def test_the_budget_reason_says_what_bounds_it() -> None:
    def why(plan: ThreadPlan) -> str:
        (reason,) = [r for r in plan.reasons if r.startswith("cpu budget")]
        return reason

    assert why(make_plan(budget(None, 4))) == "cpu budget 4: no CPU quota, 4 CPUs in cpuset"
    assert why(make_plan(budget(1.5, 16))) == "cpu budget 1.5 = min(quota 1.5, cpuset 16)"


@pytest.mark.parametrize(
    "cpus, inter, why",
    [
        (1.5, 1, "under 2 CPUs one op at a time"),
        (2.0, 2, "two ops at a time fill the intra-op pool where the backward pass branches"),
    ],
)
def test_one_inter_op_thread_under_two_cpus_else_two(cpus: float, inter: int, why: str) -> None:
    plan = make_plan(budget(cpus, 8))
    assert plan.inter_op_threads == inter
    (reason,) = [r for r in plan.reasons if r.startswith("inter-op threads")]
    assert reason.startswith(f"inter-op threads {inter} (budget {cpus:g}: {why}")


def test_pin_none_and_auto_leave_the_affinity_and_say_why() -> None:
    auto = make_plan(budget(2.0, 4))
    none = make_plan(budget(2.0, 4), overrides=Overrides(pin="none"))
    assert auto.pin_cpus is None and none.pin_cpus is None
    assert "pin: none (--pin none)" in none.reasons
    assert not any(r.startswith("pin: none (auto:") for r in none.reasons)
    assert any(r.startswith("pin: none (auto: other containers") for r in auto.reasons)


def test_unknown_pin_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown pin mode 'diagonal'"):
        make_plan(budget(2.0, 4), overrides=Overrides(pin="diagonal"))


def test_physical_pins_the_first_allowed_cpu_of_each_core() -> None:
    siblings = Topology(cores=((0, 1), (2, 3)), numa_nodes=((0, 1, 2, 3),))
    physical = Overrides(pin="physical")
    four = CpuBudget(cpu_quota=2.0, cpuset=(0, 1, 2, 3), memory_limit=None, quota_source="t")
    assert make_plan(four, siblings, physical).pin_cpus == (0, 2)
    three = dataclasses.replace(four, cpuset=(1, 2, 3))  # core (0, 1) only partly allowed
    assert make_plan(three, siblings, physical).pin_cpus == (1, 2)
    assert make_plan(four, None, physical).pin_cpus == (0, 1)  # unknown cores: one CPU each


@pytest.mark.parametrize(
    "quota, topology, pinned",
    [
        (2.0, ((0, 1), (2, 3)), (0, 1)),  # the largest node holds the threads exactly
        (3.0, ((0, 1), (2, 3)), (0, 1, 2, 3)),  # no node holds 3: every allowed CPU
        (2.0, ((0,), (1, 2, 3)), (1, 2, 3)),
        (2.0, None, (0, 1, 2, 3)),  # unknown nodes: one node
    ],
)
def test_numa_pins_the_largest_allowed_node_when_it_holds_the_threads(
    quota: float, topology: tuple | None, pinned: tuple[int, ...]
) -> None:
    four = CpuBudget(cpu_quota=quota, cpuset=(0, 1, 2, 3), memory_limit=None, quota_source="t")
    topo = None if topology is None else Topology(cores=(), numa_nodes=topology)
    assert make_plan(four, topo, Overrides(pin="numa")).pin_cpus == pinned


def test_the_plan_carries_the_budget_s_limits_inputs_and_the_cpu() -> None:
    detected = CpuBudget(
        cpu_quota=1.5, cpuset=(0, 1), memory_limit=8 << 30, quota_source="cgroup v2",
        inputs={"/sys/fs/cgroup/cpu.max": "150000 100000"}, cpu_stat="/sys/fs/cgroup/cpu.stat",
    )  # fmt: skip
    topo = Topology(cores=((0, 1),), numa_nodes=((0, 1),), inputs={"/sys/x/online": "0-1"})
    zen4, ov = _cpu("amd-epyc-zen4-build-machine"), Overrides(rounding="floor")
    plan = make_plan(detected, topo, ov, zen4)
    assert (plan.memory_limit, plan.tfdata_ram_budget) == (8 << 30, 2 << 30)
    assert (plan.rounding, plan.intra_op_threads) == ("floor", 1)
    assert plan.overrides is ov
    assert plan.cpu_stat == "/sys/fs/cgroup/cpu.stat"
    assert (plan.cpu_model, plan.native_bf16) == ("AMD EPYC", True)
    assert plan.inputs == {**detected.inputs, **topo.inputs, **zen4.inputs}
    assert make_plan(detected, cpu=_cpu("amd-epyc-zen3-milan")).native_bf16 is False
    unknown = make_plan(detected)
    assert (unknown.cpu_model, unknown.native_bf16, unknown.onednn) == ("unknown", False, None)


def test_to_json_is_the_plan_in_json_types_with_the_user_s_settings() -> None:
    detected = CpuBudget(
        cpu_quota=2.0, cpuset=(2, 3, 4, 5), memory_limit=None, quota_source="t",
        inputs={"/proc/self/cgroup": "0::/"},
    )  # fmt: skip
    ov = overrides_from({"TF_NUM_INTEROP_THREADS": "3"}, PlanOptions(pin="cores"))
    plan = make_plan(detected, overrides=ov)
    out = plan.to_json()
    assert set(out) == {f.name for f in dataclasses.fields(ThreadPlan)}
    assert json.loads(json.dumps(out)) == out  # lists, not tuples: JSON gives the same back
    assert (out["cpuset"], out["pin_cpus"]) == ([2, 3, 4, 5], [2, 3])
    assert out["reasons"] == list(plan.reasons) and out["inputs"] == {"/proc/self/cgroup": "0::/"}
    assert out["overrides"] == {  # the settings made, and where each came from
        "inter_op_threads": 3,
        "pin": "cores",
        "rounding": "ceil",
        "bfloat16": False,
        "sources": {"inter_op_threads": "TF_NUM_INTEROP_THREADS env"},
    }
    assert make_plan(detected).to_json()["pin_cpus"] is None


def test_plan_text_has_one_line_per_number_then_the_reasons_and_inputs() -> None:
    plan = ThreadPlan(
        cpu_quota=1.5, cpuset=(0, 1), cpu_budget=1.5, intra_op_threads=2, inter_op_threads=1,
        tfdata_threads=2, pin_cpus=(0, 1), memory_limit=1 << 30, tfdata_ram_budget=1 << 28,
        rounding="ceil", reasons=("first", "second"), inputs={"/a": "1", "/b": "x y"},
        onednn=True, cpu_model="AMD EPYC", budget_source="cpu quota (cgroup v2)", cpu_request=0.5,
    )  # fmt: skip
    assert format_text(plan) == "\n".join(
        [
            "cpu_quota         1.5",
            "cpuset            [0, 1]",
            "cpu_budget        1.5",
            "budget_source     cpu quota (cgroup v2)",
            "cpu_request       0.5",
            "intra_op_threads  2",
            "inter_op_threads  1",
            "tfdata_threads    2",
            "pin_cpus          [0, 1]",
            "memory_limit      1073741824",
            "onednn            on",
            "cpu_model         AMD EPYC",
            "reasons:",
            "  - first",
            "  - second",
            "inputs read:",
            "  /a = 1",
            "  /b = x y",
        ]
    )
    unset = dataclasses.replace(
        plan, cpu_quota=None, cpu_request=None, pin_cpus=None, memory_limit=None, onednn=None
    )
    lines = format_text(unset).splitlines()
    assert lines[0] == "cpu_quota         unlimited"
    assert lines[4] == "cpu_request       none"
    assert lines[8:11] == [
        "pin_cpus          none",
        "memory_limit      unlimited",
        "onednn            TensorFlow's choice",
    ]
    assert "onednn            off" in format_text(dataclasses.replace(plan, onednn=False))


# --- detect_plan: detection under a root, then the plan ---------------------------------------


def _static_cpu_manager_root(tmp_path: Path) -> Path:
    """The pinned 2-CPU pod (CPUs 2 and 10: one core's two hyperthreads of a 16-CPU node),
    with a /proc/cpuinfo."""
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "cgroup" / "k8s-v2-static-cpu-manager", root)
    shutil.copy(FIXTURES / "cpuinfo" / "amd-epyc-zen3-milan" / "proc" / "cpuinfo", root / "proc")
    return root


def test_detect_plan_reads_the_budget_the_cpus_topology_and_the_cpu_under_its_root(
    tmp_path: Path,
) -> None:
    root = _static_cpu_manager_root(tmp_path)
    plan = detect_plan(str(root), PlanOptions(pin="physical"), environ={})
    assert (plan.cpuset, plan.cpu_budget, plan.memory_limit) == ((2, 10), 2.0, 2147483648)
    assert plan.pin_cpus == (2,)  # one CPU of the one core
    assert plan.cpu_model == "AMD EPYC 7763 64-Core Processor" and plan.onednn is False
    siblings = sorted(k for k in plan.inputs if k.endswith("/thread_siblings_list"))
    assert siblings == [  # the topology of the budget's CPUs only
        "/sys/devices/system/cpu/cpu10/topology/thread_siblings_list",
        "/sys/devices/system/cpu/cpu2/topology/thread_siblings_list",
    ]
    assert plan.overrides == Overrides(pin="physical")


def test_detect_plan_takes_tensorflow_s_variables_from_the_given_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(_static_cpu_manager_root(tmp_path))
    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "3")
    assert detect_plan(root).inter_op_threads == 3  # os.environ by default
    given = detect_plan(root, environ={"TF_NUM_INTRAOP_THREADS": "1"})
    assert (given.intra_op_threads, given.inter_op_threads) == (1, 2)
    assert given.overrides.sources == {"intra_op_threads": "TF_NUM_INTRAOP_THREADS env"}
    assert given.overrides.bfloat16 is False
    assert detect_plan(root, environ={}, bfloat16=True).overrides.bfloat16 is True


def test_detect_plan_reads_the_live_system_by_default() -> None:
    plan = detect_plan(environ={})
    assert plan.inputs["/proc/self/cgroup"] == Path("/proc/self/cgroup").read_text().strip()
