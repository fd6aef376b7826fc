"""CPU topology from sysfs and the CPU model from /proc/cpuinfo (app/budget/topology.py):
fixture trees, TensorFlow's oneDNN rule on the fixture CPUs, and the live machine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.budget.cgroups.detect import detect_budget
from app.budget.cpulist import parse_cpulist
from app.budget.topology import CpuModel, detect_cpu, detect_topology

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
WITH_TOPOLOGY = sorted(
    case
    for case in os.listdir(FIXTURES)
    if "topology" in json.loads((FIXTURES / case / "expected.json").read_text())
)


def _as_tuples(groups: list[list[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(group) for group in groups)


def test_some_fixtures_describe_topology() -> None:
    assert len(WITH_TOPOLOGY) >= 3


@pytest.mark.parametrize("case", WITH_TOPOLOGY)
def test_fixture_topology_of_the_budget_cpuset(case: str) -> None:
    expected = json.loads((FIXTURES / case / "expected.json").read_text())["topology"]
    budget = detect_budget(FIXTURES / case, env={})
    topology = detect_topology(FIXTURES / case, cpus=budget.cpuset)
    assert topology.cores == _as_tuples(expected["cores"])
    assert topology.numa_nodes == _as_tuples(expected["numa_nodes"])
    assert topology.reasons == ()


def test_restriction_to_some_cpus_splits_siblings() -> None:
    root = FIXTURES / "bare-metal-v2"
    topology = detect_topology(root, cpus=[0, 8, 1, 4])
    assert topology.cores == ((0, 8), (1,), (4,))
    assert topology.numa_nodes == ((0, 1, 8), (4,))
    listed = "/sys/devices/system/cpu/cpu4/topology/thread_siblings_list"
    assert topology.inputs[listed] == "4,12"


def test_default_cpus_are_the_online_ones() -> None:
    topology = detect_topology(FIXTURES / "bare-metal-v2")
    assert sum(len(core) for core in topology.cores) == 16
    assert len(topology.cores) == 8
    assert topology.inputs["/sys/devices/system/cpu/online"] == "0-15"


def test_missing_files_mean_one_core_per_cpu_and_one_node(tmp_path: Path) -> None:
    topology = detect_topology(tmp_path, cpus=[3, 1, 2])
    assert topology.cores == ((1,), (2,), (3,))
    assert topology.numa_nodes == ((1, 2, 3),)
    assert "no thread_siblings_list for CPUs [1, 2, 3]: each counted as its own core" in (
        topology.reasons
    )
    assert any("one node" in reason for reason in topology.reasons)


def test_cpus_from_directories_when_online_is_missing(tmp_path: Path) -> None:
    for cpu, siblings in ((0, "0-1"), (1, "0-1"), (2, "2-3"), (3, "2-3")):
        directory = tmp_path / f"sys/devices/system/cpu/cpu{cpu}/topology"
        directory.mkdir(parents=True)
        (directory / "thread_siblings_list").write_text(siblings + "\n")
    (tmp_path / "sys/devices/system/cpu/cpufreq").mkdir()
    node = tmp_path / "sys/devices/system/node/node0"
    node.mkdir(parents=True)
    (node / "cpulist").write_text("0-1\n")
    topology = detect_topology(tmp_path)
    assert topology.cores == ((0, 1), (2, 3))
    assert topology.numa_nodes == ((0, 1), (2, 3))
    assert any("cpuN directories" in reason for reason in topology.reasons)
    assert any("in no node cpulist" in reason for reason in topology.reasons)


def test_malformed_siblings_file_is_a_fallback(tmp_path: Path) -> None:
    directory = tmp_path / "sys/devices/system/cpu/cpu0/topology"
    directory.mkdir(parents=True)
    (directory / "thread_siblings_list").write_text("zero\n")
    topology = detect_topology(tmp_path, cpus=[0])
    assert topology.cores == ((0,),)
    assert topology.inputs["/sys/devices/system/cpu/cpu0/topology/thread_siblings_list"].startswith(
        "<unparsable"
    )


def test_live_machine_topology_covers_the_affinity() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    topology = detect_topology(cpus=cpus)
    assert sorted(c for core in topology.cores for c in core) == cpus
    assert sorted(c for node in topology.numa_nodes for c in node) == cpus
    for core in topology.cores:
        path = Path(f"/sys/devices/system/cpu/cpu{core[0]}/topology/thread_siblings_list")
        if path.exists():
            siblings = set(parse_cpulist(path.read_text()))
            assert set(core) == siblings & set(cpus)


# --- The CPU model and flags from /proc/cpuinfo, and TensorFlow's oneDNN rule on them ---

CPUINFO = Path(__file__).parent / "fixtures" / "cpuinfo"


@pytest.mark.parametrize("case", sorted(p.name for p in CPUINFO.iterdir()))
def test_model_name_and_onednn_default(case: str) -> None:
    expected = json.loads((CPUINFO / case / "expected.json").read_text())
    cpu = detect_cpu(CPUINFO / case)
    assert cpu.readable
    assert cpu.name == expected["name"]
    on, evidence = cpu.onednn_default()
    assert on is expected["onednn"]
    assert expected["why"] in evidence
    # Only the first processor's lines that matter are recorded, never the whole file.
    recorded = cpu.inputs["/proc/cpuinfo"]
    assert "bogomips" not in recorded.lower() and recorded.count("\n") <= 3


def test_flags_are_tokens_not_substrings(tmp_path: Path) -> None:
    # "avx512_vnni" must not be found inside a longer, different flag.
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(
        "processor\t: 0\nmodel name\t: X\nflags\t\t: avx2 avx512_vnnix xavx_vnni\n"
    )
    cpu = detect_cpu(tmp_path)
    assert cpu.onednn_default()[0] is False
    assert "avx2" in cpu.flags


def test_unreadable_cpuinfo_is_unknown_not_an_error(tmp_path: Path) -> None:
    cpu = detect_cpu(tmp_path)
    assert (cpu.readable, cpu.name, cpu.flags) == (False, "unknown", frozenset())
    assert cpu.inputs == {"/proc/cpuinfo": "<missing>"}


def test_the_live_machine_has_a_model_and_flags() -> None:
    cpu = detect_cpu()  # the live /proc/cpuinfo by default
    assert cpu.readable and cpu.name != "unknown" and cpu.flags
    assert cpu == detect_cpu("/")


def test_the_live_system_is_the_default_root() -> None:
    online = Path("/sys/devices/system/cpu/online").read_text().strip()
    assert detect_topology().inputs["/sys/devices/system/cpu/online"] == online


def _first_value(case: str, key: str) -> str:
    """``key``'s value in the first processor of a fixture's cpuinfo (plain string handling)."""
    for line in (CPUINFO / case / "proc" / "cpuinfo").read_text().splitlines():
        if line.split(":")[0].strip() == key:
            return line.split(":", 1)[1].strip()
    raise KeyError(key)


def test_x86_the_model_name_and_flags_are_read_and_recorded() -> None:
    case = "intel-xeon-sapphire-rapids"
    cpu, flags = detect_cpu(CPUINFO / case), _first_value(case, "flags")
    assert (cpu.name, cpu.part, cpu.flags) == (
        "Intel(R) Xeon(R) Platinum 8480+",
        None,
        frozenset(flags.split()),
    )
    assert (
        cpu.inputs["/proc/cpuinfo"]
        == f"model name: Intel(R) Xeon(R) Platinum 8480+\nflags: {flags}"
    )


def test_arm_the_cpu_part_and_features_are_read_and_recorded() -> None:
    case = "arm-graviton3-neoverse-v1"
    cpu, features = detect_cpu(CPUINFO / case), _first_value(case, "Features")
    assert (cpu.name, cpu.part) == ("Arm CPU part 0xd40", "0xd40")
    assert cpu.flags == frozenset(features.split()) and "bf16" in cpu.flags
    assert cpu.inputs["/proc/cpuinfo"] == f"CPU part: 0xd40\nFeatures: {features}"


def _cpuinfo(root: Path, text: str) -> CpuModel:
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cpuinfo").write_text(text)
    return detect_cpu(root)


def test_only_the_first_processor_counts_even_after_blank_lines(tmp_path: Path) -> None:
    cpu = _cpuinfo(tmp_path, "\nprocessor\t: 0\nmodel name\t: X\n\nprocessor\t: 1\nflags\t: avx\n")
    assert (cpu.name, cpu.flags) == ("X", frozenset())


def test_a_value_is_everything_after_the_first_colon(tmp_path: Path) -> None:
    cpu = _cpuinfo(tmp_path, "processor\t: 0\nmodel name\t: Virtual CPU: 8 cores\n")
    assert cpu.name == "Virtual CPU: 8 cores"


def test_a_cpu_without_a_name_or_part_is_unknown_without_flags(tmp_path: Path) -> None:
    cpu = _cpuinfo(tmp_path, "processor\t: 0\nBogoMIPS\t: 50.00\n")
    assert (cpu.name, cpu.part, cpu.flags, cpu.readable) == ("unknown", None, frozenset(), True)
