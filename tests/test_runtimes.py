"""Each runtime's thread variables follow the plan; the user's own are kept; the table in
docs/cpu-budget.md is the code's table."""

from __future__ import annotations

import re

import pytest

from app.budget.cgroups.detect import CpuBudget
from app.budget.plan import Overrides, PlanOptions, make_plan, overrides_from
from app.budget.runtimes import JAVA_TOOL_OPTIONS, RUNTIME_VARIABLES, runtime_env
from tests.conftest import REPO

DOC = REPO / "docs" / "cpu-budget.md"
HEADER = "| variable | read by | documented in |"
#: The variables every BLAS/OpenMP/Go pool reads: all get the intra-op thread count.
POOLS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMEXPR_MAX_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "GOMAXPROCS",
)


def plan_for(quota: float | None, cpus: int, environ: dict[str, str] | None = None, **options):
    budget = CpuBudget(
        cpu_quota=quota, cpuset=tuple(range(cpus)), memory_limit=None, quota_source="test"
    )
    overrides = overrides_from(environ or {}, PlanOptions(**options))
    return make_plan(budget, overrides=overrides)


def doc_rows() -> list[tuple[str, str, str]]:
    text = DOC.read_text(encoding="utf-8")
    assert HEADER in text, f"docs/cpu-budget.md has no table starting {HEADER!r}"
    table = text.split(HEADER, 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.strip().splitlines()[1:]:  # [0] is the |---| line
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 3, line
        name = re.fullmatch(r"`([A-Z_]+)`", cells[0])
        assert name, line
        rows.append((name.group(1), cells[1], cells[2]))
    return rows


def test_the_docs_table_is_the_codes_table() -> None:
    code = [(v.name, v.runtimes, v.source) for v in RUNTIME_VARIABLES]
    assert doc_rows() == code


@pytest.mark.parametrize("quota, cpus, threads", [(1.5, 64, 2), (0.5, 8, 1), (None, 4, 4)])
def test_every_pool_gets_the_planned_threads(quota, cpus, threads) -> None:
    plan = plan_for(quota, cpus)
    env = runtime_env(plan, {})
    assert plan.intra_op_threads == threads
    for name in POOLS:
        assert env.set[name] == str(threads), name
    assert env.set["TF_NUM_INTRAOP_THREADS"] == str(threads)
    assert env.set["TF_NUM_INTEROP_THREADS"] == str(plan.inter_op_threads)
    assert env.set[JAVA_TOOL_OPTIONS] == f"-XX:ActiveProcessorCount={threads}"
    assert env.kept == {}
    assert "TF_ENABLE_ONEDNN_OPTS" not in env.set  # no CPU model read: TensorFlow decides
    assert set(env.set) | {"TF_ENABLE_ONEDNN_OPTS"} == {v.name for v in RUNTIME_VARIABLES}
    assert len(env.reasons) == len(RUNTIME_VARIABLES)


def test_the_onednn_switch_is_set_when_planned() -> None:
    budget = CpuBudget(cpu_quota=2.0, cpuset=(0, 1), memory_limit=None, quota_source="t")
    for onednn, value in ((True, "1"), (False, "0")):
        plan = make_plan(budget, overrides=Overrides(onednn=onednn))
        assert runtime_env(plan, {}).set["TF_ENABLE_ONEDNN_OPTS"] == value


def test_a_users_variable_is_kept_and_named() -> None:
    plan = plan_for(1.5, 8)
    env = runtime_env(plan, {"OMP_NUM_THREADS": "6", "GOMAXPROCS": "3", "MKL_NUM_THREADS": ""})
    assert env.kept == {"OMP_NUM_THREADS": "6", "GOMAXPROCS": "3"}
    assert "OMP_NUM_THREADS" not in env.set and "GOMAXPROCS" not in env.set
    assert env.set["MKL_NUM_THREADS"] == "2"  # empty counts as unset
    assert "OMP_NUM_THREADS=6 kept (set by the user; planned 2)" in env.reasons
    final = env.environ({"OMP_NUM_THREADS": "6", "PATH": "/bin"})
    assert final["OMP_NUM_THREADS"] == "6" and final["PATH"] == "/bin"


def test_tensorflows_own_variables_are_the_plans_settings() -> None:
    user = {"TF_NUM_INTRAOP_THREADS": "5"}
    taken = runtime_env(plan_for(1.5, 8, user), user)
    assert taken.kept == {"TF_NUM_INTRAOP_THREADS": "5"}
    assert taken.set["OMP_NUM_THREADS"] == "5"  # the plan's intra-op count, from the user
    flag_wins = runtime_env(plan_for(1.5, 8, user, intra_op_threads=3), user)
    assert flag_wins.set["TF_NUM_INTRAOP_THREADS"] == "3"
    assert any("--intra-op-threads" in r and "over the user's 5" in r for r in flag_wins.reasons)


@pytest.mark.parametrize(
    "user, expected, kept",
    [
        ("-Xmx1g", "-Xmx1g -XX:ActiveProcessorCount=2", False),
        ("  ", "-XX:ActiveProcessorCount=2", False),
        ("-XX:ActiveProcessorCount=7 -Xmx1g", None, True),
        (
            "-Dmsg=-XX:ActiveProcessorCount=9",
            "-Dmsg=-XX:ActiveProcessorCount=9 -XX:ActiveProcessorCount=2",
            False,
        ),  # part of another option's value: not one
    ],
)
def test_the_jvm_count_is_appended_to_the_users_options(user, expected, kept) -> None:
    env = runtime_env(plan_for(1.5, 8), {JAVA_TOOL_OPTIONS: user})
    assert env.set.get(JAVA_TOOL_OPTIONS) == expected
    assert (JAVA_TOOL_OPTIONS in env.kept) == kept
