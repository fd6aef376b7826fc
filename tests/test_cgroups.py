"""CPU budget detection: table-driven over tests/fixtures/cgroup/<case>/, plus the live machine.

Each fixture folder is a mini root (proc/self/..., sys/...) of a real-world layout with an
expected.json: cpu_quota (CPUs), cpuset (CPU list string), memory_limit (bytes), quota_source,
warnings (exact number of "warning: " reasons), reasons_include (substrings), optional env.
A file the process may not read is a directory of that name (git keeps no permissions; an
UNREADABLE note inside says so): opening it fails, as EACCES does on the real host.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.budget.cgroups.affinity import read_affinity
from app.budget.cgroups.detect import CpuBudget, detect_budget
from app.budget.cgroups.hierarchy import Hierarchy, relative_to_mount_root
from app.budget.cgroups.hints import parse_cpu_hint
from app.budget.cgroups.locate import cgroup_mounts, locate, read_proc_files
from app.budget.cgroups.proc_cgroup import parse_proc_cgroup
from app.budget.cpulist import parse_cpulist
from app.budget.rootfiles import RootFiles
from app.mountinfo import parse_mountinfo

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
CASES = sorted(os.listdir(FIXTURES))
REPO = Path(__file__).resolve().parents[1]


def load(case: str) -> dict:
    return json.loads((FIXTURES / case / "expected.json").read_text())


def test_there_are_enough_layouts() -> None:
    assert len(CASES) >= 30
    for case in CASES:
        assert (FIXTURES / case / "expected.json").is_file(), case
        assert (FIXTURES / case / "proc" / "self" / "mountinfo").is_file(), case


@pytest.mark.parametrize("case", CASES)
def test_fixture_layout(case: str) -> None:
    expected = load(case)
    budget = detect_budget(FIXTURES / case, env=expected.get("env", {}))

    if expected["cpu_quota"] is None:
        assert budget.cpu_quota is None, budget.reasons
    else:
        assert budget.cpu_quota == pytest.approx(expected["cpu_quota"]), budget.reasons
    assert budget.cpuset == parse_cpulist(expected["cpuset"]), budget.reasons
    assert budget.memory_limit == expected["memory_limit"], budget.reasons
    assert budget.quota_source == expected["quota_source"]
    assert budget.cpu_request == expected.get("cpu_request")
    warnings = [r for r in budget.reasons if r.startswith("warning: ")]
    assert len(warnings) == expected["warnings"], budget.reasons
    for fragment in expected["reasons_include"]:
        assert any(fragment in reason for reason in budget.reasons), (fragment, budget.reasons)


@pytest.mark.parametrize("case", CASES)
def test_fixture_inputs_match_the_files(case: str) -> None:
    """Every recorded input is the stripped content of the file under the fixture root."""
    expected = load(case)
    budget = detect_budget(FIXTURES / case, env=expected.get("env", {}))
    assert "/proc/self/mountinfo" in budget.inputs
    for key, value in budget.inputs.items():
        if key.startswith("env "):
            assert expected["env"][key[4:]] == value
            continue
        if key == "/proc/self/status Cpus_allowed_list":
            status = (FIXTURES / case / "proc/self/status").read_text()
            assert f"Cpus_allowed_list:\t{value}\n" in status
            continue
        path = FIXTURES / case / key.lstrip("/")
        if key == "/proc/self/mountinfo":  # only the cgroup and cgroup2 mount lines
            lines = path.read_text().splitlines()
            kept = [line for line in lines if " - cgroup " in line or " - cgroup2 " in line]
            assert value.splitlines() == kept, key
            continue
        if value == "<missing>":
            assert not path.exists(), key
        elif value.startswith("<unreadable: "):
            assert (path / "UNREADABLE").is_file(), key
        else:
            assert path.read_text().strip() == value, key


def test_cpu_budget_property() -> None:
    capped = CpuBudget(cpu_quota=1.5, cpuset=(0, 1, 2, 3), memory_limit=None, quota_source="x")
    assert capped.cpu_budget == 1.5
    wide = CpuBudget(cpu_quota=8.0, cpuset=(0, 1), memory_limit=None, quota_source="x")
    assert wide.cpu_budget == 2.0
    unlimited = CpuBudget(cpu_quota=None, cpuset=(3, 5, 7), memory_limit=None, quota_source="none")
    assert unlimited.cpu_budget == 3.0


def test_given_affinity_is_intersected() -> None:
    budget = detect_budget(FIXTURES / "docker-v1-cpus-1.5", env={}, affinity=[6, 7, 9])
    assert budget.cpuset == (6, 7)
    assert any("affinity 6-7,9 ∩ cpuset 0-7 ∩ online 0-7 = 6-7" in r for r in budget.reasons)


def test_disjoint_sets_fall_back_to_affinity_with_a_warning() -> None:
    budget = detect_budget(FIXTURES / "docker-v1-cpuset-cpus-1", env={}, affinity=[5])
    assert budget.cpuset == (5,)
    (warning,) = [r for r in budget.reasons if r.startswith("warning: cpuset:")]
    assert "empty" in warning and warning.endswith("using affinity only")


def test_env_hint_ignored_when_cgroups_give_a_quota() -> None:
    budget = detect_budget(FIXTURES / "docker-v1-cpus-1.5", env={"CPU_LIMIT": "4000"})
    assert budget.cpu_quota == 1.5
    assert budget.quota_source == "cgroup v1"
    assert "env CPU_LIMIT" not in budget.inputs


def test_env_hint_used_when_cgroups_say_unlimited() -> None:
    budget = detect_budget(FIXTURES / "docker-v1-cpuset-cpus-1", env={"CPU_LIMIT": "750m"})
    assert budget.cpu_quota == 0.75
    assert budget.quota_source == "CPU_LIMIT env"
    assert budget.inputs["env CPU_LIMIT"] == "750m"
    assert budget.cpu_budget == 0.75


@pytest.mark.parametrize(("value", "cpus"), [("2", 2.0), ("99", 99.0), ("100", 0.1)])
def test_a_plain_integer_too_small_for_millicores_is_whole_cpus_with_a_warning(
    value: str, cpus: float
) -> None:
    # Kubernetes' default divisor 1 gives "2" for limits.cpu 1.5: not 0.002 CPUs.
    budget = detect_budget(FIXTURES / "docker-v1-cpuset-cpus-1", env={"CPU_LIMIT": value})
    assert budget.cpu_quota == pytest.approx(cpus)
    warned = [r for r in budget.reasons if f"CPU_LIMIT={value} read as" in r]
    assert len(warned) == (1 if cpus >= 1 else 0)
    if warned:
        assert warned[0].endswith("set divisor: 1m in the manifest for the exact value")


def test_bad_env_hint_is_warned_and_ignored() -> None:
    budget = detect_budget(FIXTURES / "docker-v1-cpuset-cpus-1", env={"CPU_LIMIT": "lots"})
    assert budget.cpu_quota is None
    assert budget.quota_source == "none"
    assert any("CPU_LIMIT='lots'" in r for r in budget.reasons)


@pytest.mark.parametrize(
    ("value", "cpus"),
    [
        ("1500", 1.5),
        ("1500m", 1.5),
        ("1.5", 1.5),
        ("250", 0.25),
        (" 2000\n", 2.0),
        ("2.0", 2.0),
        ("2e0", 2.0),  # cores in exponent notation, either case
        ("2E0", 2.0),
    ],
)
def test_parse_cpu_hint(value: str, cpus: float) -> None:
    assert parse_cpu_hint(value) == pytest.approx(cpus)


@pytest.mark.parametrize("value", ["", "abc", "0", "-500", "1.5x", "nan", "inf", "m"])
def test_parse_cpu_hint_rejects(value: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_hint(value)


def test_only_the_cgroup_mounts_are_kept_from_mountinfo() -> None:
    text = (
        "612 28 0:4 net:[4026532570] /run/netns/cni-1 rw shared:290 - nsfs nsfs rw\n"
        "31 23 0:28 /docker/ab /sys/fs/cgroup/cpu,cpuacct ro,nosuid master:16 shared:3 - "
        "cgroup cgroup rw,cpu,cpuacct\n"
        "40 23 0:41 /a\\040b /mnt/with\\040space\\011tab rw - cgroup2 cgroup2 rw,nsdelegate\n"
        "41 23 0:41 / /broken\n"
    )
    all_mounts, problems = parse_mountinfo(text)
    mounts = cgroup_mounts(all_mounts)
    assert [(m.root, m.mount_point, m.fs_type) for m in mounts] == [
        ("/docker/ab", "/sys/fs/cgroup/cpu,cpuacct", "cgroup"),
        ("/a b", "/mnt/with space\ttab", "cgroup2"),
    ]
    assert mounts[0].super_options == frozenset({"rw", "cpu", "cpuacct"})
    assert len(problems) == 1 and "line 4" in problems[0]


def test_proc_cgroup_parsing_keeps_colons_in_paths() -> None:
    entries, problems = parse_proc_cgroup("3:cpu,cpuacct:/a:b:c\n1:name=systemd:/x\n0::/\nbad\n")
    assert [(e.hierarchy_id, sorted(e.controllers), e.path) for e in entries] == [
        ("3", ["cpu", "cpuacct"], "/a:b:c"),
        ("1", ["name=systemd"], "/x"),
        ("0", [], "/"),
    ]
    assert problems == ["/proc/self/cgroup line is malformed and was skipped: 'bad'"]


@pytest.mark.parametrize(
    ("root", "path", "relative"),
    [
        ("/", "/", ""),
        ("/", "/kubepods/burstable/pod1/c1", "kubepods/burstable/pod1/c1"),
        ("/docker/abc", "/docker/abc", ""),
        ("/docker/abc", "/docker/abc/child", "child"),
        ("/docker/abc", "/docker/abcdef", None),
        ("/system.slice/docker-1.scope", "/nomad/shared", None),
        ("/", "/../../outside", None),
        ("/../../..", "/", None),
        ("/..", "/child", None),
        ("/", "/Xen/vmX", "Xen/vmX"),
    ],
)
def test_relative_to_mount_root(root: str, path: str, relative: str | None) -> None:
    assert relative_to_mount_root(root, path) == relative


def copy_of(case: str, tmp_path: Path) -> Path:
    """A writable copy of a fixture tree, for variations no real layout has as such."""
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / case, root)
    return root


def warnings_of(budget: CpuBudget) -> list[str]:
    return [r for r in budget.reasons if r.startswith("warning: ")]


def test_unreadable_file_is_a_warned_fallback(tmp_path: Path) -> None:
    """A cgroup file that cannot be read (here a directory in its place) never crashes.

    Unreadable is not missing: even at the top of the chain, where v2 has no cpu.max when the
    top is the root cgroup, an unreadable file may hide a limit and is warned.
    """
    root = copy_of("docker-v2-cgroupns-private", tmp_path)
    (root / "sys/fs/cgroup/cpu.max").unlink()
    (root / "sys/fs/cgroup/cpu.max").mkdir()
    budget = detect_budget(root, env={})
    assert budget.cpu_quota is None
    assert budget.inputs["/sys/fs/cgroup/cpu.max"].startswith("<unreadable: ")
    assert budget.memory_limit == 1073741824
    assert [w for w in warnings_of(budget) if "/sys/fs/cgroup/cpu.max unreadable" in w]


def test_quota_without_its_period_uses_the_default_period(tmp_path: Path) -> None:
    """A present cpu.cfs_quota_us is not dropped for a missing period (sched-bwc.rst: 100 ms)."""
    root = copy_of("docker-v1-cpus-1.5", tmp_path)
    (root / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us").unlink()
    budget = detect_budget(root, env={})
    assert budget.cpu_quota == 1.5
    assert budget.quota_source == "cgroup v1"
    (warning,) = warnings_of(budget)
    assert "cpu.cfs_period_us missing next to" in warning and "100000 us" in warning


@pytest.mark.parametrize("proc_cgroup", ["0::/system.slice/containerd.service\n", None])
def test_mounted_v1_hierarchy_without_a_cgroup_line_is_read_at_its_mount_point(
    tmp_path: Path, proc_cgroup: str | None
) -> None:
    """Only the 0:: line (or no /proc/self/cgroup at all) next to docker's v1 bind mounts."""
    root = copy_of("docker-v1-cpus-1.5", tmp_path)
    if proc_cgroup is None:
        (root / "proc/self/cgroup").unlink()
    else:
        (root / "proc/self/cgroup").write_text(proc_cgroup)
    budget = detect_budget(root, env={})
    assert budget.cpu_quota == 1.5
    assert budget.quota_source == "cgroup v1"
    assert budget.memory_limit == load("docker-v1-cpus-1.5")["memory_limit"]
    assert any(
        "has no line for the cgroup v1 hierarchy mounted at" in w for w in warnings_of(budget)
    )


def _hybrid_with_cpu_max_on_v2(tmp_path: Path, cpu_max: str) -> Path:
    root = copy_of("hybrid-build-machine", tmp_path)
    (root / "sys/fs/cgroup/unified/cpu.max").write_text(cpu_max)
    return root


def test_controller_bound_to_v1_is_not_looked_up_on_v2(tmp_path: Path) -> None:
    """cpu is on a mounted v1 hierarchy: a cpu.max on the unified mount is not its limit."""
    budget = detect_budget(_hybrid_with_cpu_max_on_v2(tmp_path, "50000 100000\n"), env={})
    assert budget.cpu_quota is None
    assert "/sys/fs/cgroup/unified/cpu.max" not in budget.inputs
    assert not warnings_of(budget)


def test_v1_controller_with_no_v1_mount_is_read_on_v2_when_the_file_is_there(
    tmp_path: Path,
) -> None:
    """The v1 cpu hierarchy is not mounted in the container; the v2 chain has cpu.max."""
    root = _hybrid_with_cpu_max_on_v2(tmp_path, "250000 100000\n")
    mountinfo = root / "proc/self/mountinfo"
    lines = mountinfo.read_text().splitlines(keepends=True)
    mountinfo.write_text("".join(line for line in lines if " /sys/fs/cgroup/cpu " not in line))
    shutil.rmtree(root / "sys/fs/cgroup/cpu")
    budget = detect_budget(root, env={})
    assert budget.cpu_quota == 2.5
    assert budget.quota_source == "cgroup v2"
    assert any("bound to cgroup v1" in w and "read there" in w for w in warnings_of(budget))


def test_malformed_cgroup2_mount_line_falls_back_to_the_usual_mount_point(tmp_path: Path) -> None:
    root = copy_of("docker-v2-cgroupns-private", tmp_path)
    mountinfo = root / "proc/self/mountinfo"
    text = mountinfo.read_text()
    line = next(line for line in text.splitlines() if " - cgroup2 " in line)
    mountinfo.write_text(text.replace(line, line.split(" - ")[0]))
    budget = detect_budget(root, env={})
    assert budget.cpu_quota == 1.5
    assert budget.memory_limit == 1073741824
    assert any("is malformed and was skipped" in w for w in warnings_of(budget))
    assert any("usual mount point /sys/fs/cgroup" in w for w in warnings_of(budget))


def test_empty_root_never_crashes(tmp_path: Path) -> None:
    budget = detect_budget(tmp_path, env={})
    assert budget.cpu_quota is None
    assert budget.cpuset == (0,)
    assert budget.memory_limit is None
    assert budget.quota_source == "none"
    assert budget.cpu_stat is None  # no cpu hierarchy: no throttling counters
    assert any("assuming 1 CPU" in r for r in budget.reasons)


def test_detection_does_not_import_tensorflow() -> None:
    code = (
        "import sys; from app.budget.cgroups.detect import detect_budget;"
        "from app.budget.topology import detect_topology;"
        "b = detect_budget(); detect_topology(cpus=b.cpuset);"
        "print('tensorflow' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def _live_cpu_dir() -> tuple[int, str, str] | None:
    """The process's cpu cgroup (version, directory, mount point), found with plain string
    handling (a cross-check of app.budget.cgroups.locate)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    mounts = [line.split(" - ") for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy != "0" and "cpu" in controllers.split(","):
            for before, after in mounts:
                fields, fs = before.split(), after.split()
                if fs[0] == "cgroup" and "cpu" in fs[2].split(","):
                    rel = path[len(fields[3]) :] if fields[3] != "/" else path
                    return 1, fields[4] + rel.rstrip("/"), fields[4]
    for line in lines:
        if line.startswith("0::"):
            for before, after in mounts:
                fields, fs = before.split(), after.split()
                if fs[0] == "cgroup2":
                    rel = line[3:][len(fields[3]) :] if fields[3] != "/" else line[3:]
                    return 2, fields[4] + rel.rstrip("/"), fields[4]
    return None


def test_live_machine_matches_the_files() -> None:
    """The budget of this process, against its own files read with plain string handling:
    the tightest CFS quota from its cpu cgroup up to the mount root (None without one)."""
    budget = detect_budget(env={})
    online = parse_cpulist(Path("/sys/devices/system/cpu/online").read_text())
    assert budget.cpuset == tuple(sorted(os.sched_getaffinity(0) & set(online)))
    assert budget.cpu_budget <= len(os.sched_getaffinity(0))
    expected = _live_quota(_live_cpu_dir())
    assert budget.cpu_quota == expected
    assert budget.quota_source.startswith("cgroup") == (expected is not None)


def _live_quota(found: tuple[int, str, str] | None) -> float | None:
    """The smallest quota/period from ``directory`` up to ``mount`` (v1 or v2 files)."""
    if found is None:
        return None
    version, directory, mount = found
    quotas = []
    level = Path(directory)
    while True:
        if version == 1 and (level / "cpu.cfs_quota_us").is_file():
            quota = int((level / "cpu.cfs_quota_us").read_text())
            if quota > 0:
                quotas.append(quota / int((level / "cpu.cfs_period_us").read_text()))
        elif version == 2 and (level / "cpu.max").is_file():
            fields = (level / "cpu.max").read_text().split()
            if fields[0] != "max":
                quotas.append(int(fields[0]) / int(fields[1]))
        if level == Path(mount) or level == level.parent:
            break
        level = level.parent
    return min(quotas) if quotas else None


CHILD = """
import json, os, sys
sys.path.insert(0, {repo!r})
with open({procs!r}, "w") as handle:
    handle.write(str(os.getpid()))
from app.budget.cgroups.detect import detect_budget
budget = detect_budget(env={{}})
print(json.dumps({{"quota": budget.cpu_quota, "source": budget.quota_source,
                  "reasons": budget.reasons}}))
"""


def test_real_v1_cgroup_parent_quota_is_found(tmp_path: Path) -> None:
    """A real kernel cgroup: quota on the parent, none on the child the process runs in."""
    base = Path("/sys/fs/cgroup/cpu")
    if not (base / "cpu.cfs_quota_us").is_file() or not os.access(base, os.W_OK):
        pytest.skip("needs a writable cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu (root)")
    own = _live_cpu_dir()
    if own is None or own[0] != 1:
        pytest.skip("this process's cpu controller is not on cgroup v1")
    parent = Path(own[1]) / f"coretrain-test-{os.getpid()}"
    child = parent / "job"
    try:
        child.mkdir(parents=True)
        (parent / "cpu.cfs_quota_us").write_text("150000")
    except OSError as error:
        for directory in (child, parent):
            if directory.exists():
                directory.rmdir()
        pytest.skip(f"cannot create a cgroup here: {error}")
    try:
        code = CHILD.format(repo=str(REPO), procs=str(child / "cgroup.procs"))
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        report = json.loads(result.stdout)
        assert (child / "cpu.cfs_quota_us").read_text().strip() == "-1"
        assert report["source"] == "cgroup v1"
        assert math.isclose(report["quota"], 1.5), report["reasons"]
        assert any(str(parent) in r and "tightest" in r for r in report["reasons"])
    finally:
        child.rmdir()
        parent.rmdir()


def test_docs_table_matches_the_fixtures() -> None:
    """docs/cpu-budget.md has one row per fixture, and its coretrain column is what we detect."""
    rows = {}
    for line in (REPO / "docs" / "cpu-budget.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[0] in CASES:
            rows[cells[0]] = cells
    assert sorted(rows) == CASES
    for case, cells in rows.items():
        expected = load(case)
        budget = detect_budget(FIXTURES / case, env=expected.get("env", {}))
        documented = float(cells[3].split()[0].strip("*"))
        assert documented == pytest.approx(budget.cpu_budget), case
        assert int(cells[2]) == len(budget.cpuset), case
        assert ("⚠" in cells[3]) == any(r.startswith("warning: ") for r in budget.reasons), case


# --- Small trees for one rule each -----------------------------------------------------------

V2_PRIVATE = "docker-v2-cgroupns-private"  # cpu.max, memory.max, cpuset at /sys/fs/cgroup
PROC_MOUNT = "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
V2_MOUNT = "34 24 0:28 / /sys/fs/cgroup rw,nosuid,relatime shared:9 - cgroup2 cgroup2 rw\n"
V1_CPU_MOUNT = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
UNIFIED_MOUNT = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"


def tree(root: Path, files: dict[str, str | None]) -> Path:
    """``files`` (path → text) under ``root``; None puts a directory in the file's place,
    which can't be read as a file (as EACCES on the real host)."""
    for path, text in files.items():
        target = root / path
        if text is None:
            target.mkdir(parents=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    return root


def test_proc_cgroup_lines_after_a_blank_or_malformed_line_are_read() -> None:
    entries, problems = parse_proc_cgroup("\nbad\n4:cpu:/a\n\n0::/b\n")
    assert [(e.hierarchy_id, e.path) for e in entries] == [("4", "/a"), ("0", "/b")]
    assert problems == ["/proc/self/cgroup line is malformed and was skipped: 'bad'"]


@pytest.mark.parametrize("line", ["x:cpu:/a", "3:cpu:a", "3:cpu", "bad"])
def test_a_proc_cgroup_line_needs_a_numeric_id_and_an_absolute_path(line: str) -> None:
    message = f"/proc/self/cgroup line is malformed and was skipped: {line!r}"
    assert parse_proc_cgroup(line + "\n") == ([], [message])


UNKNOWN_PATHS = "the process's cgroup paths are unknown"
USUAL_ONLY = "only the usual cgroup mount points are tried"


@pytest.mark.parametrize(
    ("files", "warning"),
    [
        ({}, f"/proc/self/cgroup missing: {UNKNOWN_PATHS}"),
        ({"proc/self/cgroup": "bad\n"}, f"/proc/self/cgroup has no usable line: {UNKNOWN_PATHS}"),
        (
            {"proc/self/cgroup": None},
            f"/proc/self/cgroup unreadable: Is a directory: {UNKNOWN_PATHS}",
        ),
        ({"proc/self/cgroup": "0::/\n"}, f"/proc/self/mountinfo missing: {USUAL_ONLY}"),
        (
            {"proc/self/cgroup": "0::/\n", "proc/self/mountinfo": None},
            f"/proc/self/mountinfo unreadable: Is a directory: {USUAL_ONLY}",
        ),
    ],
)
def test_a_missing_or_unusable_proc_file_is_warned_with_its_cause(
    tmp_path: Path, files: dict[str, str | None], warning: str
) -> None:
    probe = RootFiles(tree(tmp_path, files))
    read_proc_files(probe)
    assert f"warning: {warning}" in probe.reasons
    malformed = [r for r in probe.reasons if "is malformed" in r]
    assert len(malformed) == (files.get("proc/self/cgroup") == "bad\n")  # none for no file


def test_the_live_affinity_is_this_process_s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def getaffinity(pid: int) -> set[int]:
        asked.append(pid)
        return {3, 1}

    monkeypatch.setattr(os, "sched_getaffinity", getaffinity)
    assert read_affinity(None, RootFiles("/")) == ((1, 3), "sched_getaffinity")
    assert asked == [0]


def test_of_proc_self_status_only_the_cpus_allowed_list_is_an_input(tmp_path: Path) -> None:
    budget = detect_budget(FIXTURES / "docker-v1-cpus-1.5", env={})
    assert "/proc/self/status" not in budget.inputs
    assert budget.inputs["/proc/self/status Cpus_allowed_list"] == "0-7"
    assert detect_budget(tmp_path, env={}).inputs["/proc/self/status"] == "<missing>"


def test_unusable_cpu_lists_outside_cgroups_are_named_with_their_content(tmp_path: Path) -> None:
    bad = tree(
        tmp_path / "bad",
        {
            "proc/self/status": "Name:\tx\nCpus_allowed_list:\tzero\n",
            "sys/devices/system/cpu/online": "0-\n",
        },
    )
    reasons = detect_budget(bad, env={}).reasons
    assert "warning: Cpus_allowed_list 'zero' is not a CPU list: ignored" in reasons
    assert "warning: /sys/devices/system/cpu/online holds '0-', not a CPU list: ignored" in reasons
    unreadable = tree(tmp_path / "unreadable", {"sys/devices/system/cpu/online": None})
    assert "/sys/devices/system/cpu/online unreadable: Is a directory: not used" in (
        detect_budget(unreadable, env={}).reasons
    )


def test_a_cpus_allowed_list_in_the_stride_form_is_named_and_ignored(tmp_path: Path) -> None:
    """The value is all of the line after its first colon: ``0-7:2`` is not a CPU list."""
    probe = RootFiles(tree(tmp_path, {"proc/self/status": "Cpus_allowed_list:\t0-7:2\n"}))
    assert read_affinity(None, probe) == (None, "Cpus_allowed_list")
    assert probe.inputs["/proc/self/status Cpus_allowed_list"] == "0-7:2"
    assert probe.reasons == ["warning: Cpus_allowed_list '0-7:2' is not a CPU list: ignored"]


def test_the_hints_come_from_this_process_s_environment_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CPU_LIMIT", "750m")
    monkeypatch.delenv("CPU_REQUEST", raising=False)
    budget = detect_budget(FIXTURES / "docker-v1-cpuset-cpus-1")
    assert (budget.cpu_quota, budget.quota_source) == (0.75, "CPU_LIMIT env")


@pytest.mark.parametrize(
    ("cpu_max", "quota"),
    [
        ("150000 50000", 3.0),  # the quota over the period given
        ("0 100000", None),
        ("-1 100000", None),
        ("abc 100000", None),
        ("150000 0", None),
        ("150000 abc", None),
        ("150000 100000 1", None),
    ],
)
def test_cpu_max_needs_a_positive_quota_and_period(
    tmp_path: Path, cpu_max: str, quota: float | None
) -> None:
    root = copy_of(V2_PRIVATE, tmp_path)
    (root / "sys/fs/cgroup/cpu.max").write_text(cpu_max + "\n")
    budget = detect_budget(root, env={})
    assert budget.cpu_quota == quota
    if quota is None:  # the level is ignored, and the warning shows what it holds
        (warning,) = warnings_of(budget)
        assert warning.startswith(f"warning: /sys/fs/cgroup/cpu.max holds {cpu_max!r}")
        assert warning.endswith("level ignored")
    else:
        assert warnings_of(budget) == []


def test_a_quota_from_a_chain_of_one_level_is_not_called_the_tightest() -> None:
    """Only a chain of several levels has a tightest one to name."""
    reasons = detect_budget(FIXTURES / "docker-v1-cpus-1.5", env={}).reasons
    assert "cpu quota: 1.5 CPUs from /sys/fs/cgroup/cpu,cpuacct" in reasons


@pytest.mark.parametrize("quota_us", ["0", "abc"])
def test_a_v1_quota_of_zero_or_not_a_number_is_ignored_with_a_warning(
    tmp_path: Path, quota_us: str
) -> None:
    root = copy_of("docker-v1-cpus-1.5", tmp_path)
    path = "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"
    (root / path.lstrip("/")).write_text(quota_us + "\n")
    budget = detect_budget(root, env={})
    assert (budget.cpu_quota, budget.quota_source) == (None, "none")
    assert warnings_of(budget) == [
        f"warning: {path} holds {quota_us!r}, not a usable quota: level ignored"
    ]


@pytest.mark.parametrize(
    ("value", "limit"),
    [("0", 0), (str((1 << 62) - 4096), (1 << 62) - 4096), (str(1 << 62), None)],
)
def test_a_memory_limit_is_from_zero_up_to_but_not_including_2_to_the_62(
    tmp_path: Path, value: str, limit: int | None
) -> None:
    root = copy_of("docker-v1-cpus-1.5", tmp_path)
    (root / "sys/fs/cgroup/memory/memory.limit_in_bytes").write_text(value + "\n")
    assert detect_budget(root, env={}).memory_limit == limit


@pytest.mark.parametrize(
    ("name", "text", "warning"),
    [
        ("memory.max", "lots", "holds 'lots', not an integer: level ignored"),
        ("cpuset.cpus.effective", "zero", "holds 'zero', not a CPU list: ignored"),
        ("cpuset.cpus.effective", "", "is empty: ignored"),
    ],
)
def test_an_unusable_limit_file_is_warned_with_its_content(
    tmp_path: Path, name: str, text: str, warning: str
) -> None:
    root = copy_of(V2_PRIVATE, tmp_path)
    (root / "sys/fs/cgroup" / name).write_text(text + "\n")
    assert f"warning: /sys/fs/cgroup/{name} {warning}" in detect_budget(root, env={}).reasons


@pytest.mark.parametrize(
    ("case", "path", "lost"),
    [
        (V2_PRIVATE, "/sys/fs/cgroup/cpu.max", "no CFS quota from this level"),
        (
            "docker-v1-cpus-1.5",
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us",
            "no CFS quota from this level",
        ),
        (V2_PRIVATE, "/sys/fs/cgroup/memory.max", "no memory limit from this level"),
        (V2_PRIVATE, "/sys/fs/cgroup/cpuset.cpus.effective", "trying the level above"),
    ],
)
def test_an_unreadable_limit_file_is_warned_with_what_is_lost(
    tmp_path: Path, case: str, path: str, lost: str
) -> None:
    root = copy_of(case, tmp_path)
    (root / path.lstrip("/")).unlink()
    (root / path.lstrip("/")).mkdir()
    warning = f"warning: {path} unreadable: Is a directory: {lost}"
    assert warning in detect_budget(root, env={}).reasons


def test_each_level_s_quota_is_listed_when_several_set_one(tmp_path: Path) -> None:
    root = copy_of("bare-metal-v2", tmp_path)
    slice_ = root / "sys/fs/cgroup/user.slice"
    (slice_ / "cpu.max").write_text("200000 100000\n")
    (slice_ / "user-1000.slice/session-3.scope/cpu.max").write_text("150000 100000\n")
    budget = detect_budget(root, env={})
    assert budget.cpu_quota == 1.5
    assert (
        "cpu quota per level: 1.5 at /sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope; "
        "2 at /sys/fs/cgroup/user.slice"
    ) in budget.reasons
    (slice_ / "cpu.max").write_text("max 100000\n")  # one level sets one
    assert not any("per level" in r for r in detect_budget(root, env={}).reasons)


def test_a_malformed_cpuset_file_is_skipped_for_the_level_above(tmp_path: Path) -> None:
    root = copy_of("bare-metal-v2", tmp_path)
    cgroup = root / "sys/fs/cgroup"
    (cgroup / "cpuset.cpus.effective").write_text("0-3\n")
    scope = cgroup / "user.slice/user-1000.slice/session-3.scope"
    (scope / "cpuset.cpus.effective").write_text("zero\n")
    assert detect_budget(root, env={}).cpuset == (0, 1, 2, 3)


def test_a_v2_listing_without_the_controller_is_noted_and_its_files_read_anyway(
    tmp_path: Path,
) -> None:
    root = copy_of(V2_PRIVATE, tmp_path)
    assert not any("does not list it" in r for r in detect_budget(root, env={}).reasons)
    (root / "sys/fs/cgroup/cgroup.controllers").write_text("memory pids\n")
    budget = detect_budget(root, env={})
    assert budget.cpu_quota == 1.5
    listing = "cpu: /sys/fs/cgroup/cgroup.controllers does not list it ('memory pids')"
    assert any(r.startswith(listing) for r in budget.reasons)


def test_a_controller_with_no_v1_line_is_read_on_v2_where_its_file_is_even_beside_a_v1_mount(
    tmp_path: Path,
) -> None:
    root = tree(
        tmp_path,
        {
            "proc/self/cgroup": "0::/\n",
            "proc/self/mountinfo": V1_CPU_MOUNT + UNIFIED_MOUNT,
            "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n",
            "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
            "sys/fs/cgroup/unified/cgroup.controllers": "cpu\n",
            "sys/fs/cgroup/unified/cpu.max": "50000 100000\n",
        },
    )
    budget = detect_budget(root, env={})
    assert (budget.cpu_quota, budget.quota_source) == (0.5, "cgroup v2")


def test_a_v1_controller_mounted_nowhere_is_warned_and_not_read(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {"proc/self/cgroup": "4:cpu,cpuacct:/docker/abc\n", "proc/self/mountinfo": PROC_MOUNT},
    )
    budget = detect_budget(root, env={})
    assert budget.cpu_quota is None
    assert "cpu: no cgroup hierarchy with this controller is visible" in budget.reasons
    assert "warning: cpu: cgroup v1 path /docker/abc but no such hierarchy is mounted" in (
        budget.reasons
    )


def test_a_mounted_v2_hierarchy_without_a_cgroup_line_is_read_at_its_mount_point(
    tmp_path: Path,
) -> None:
    root = copy_of(V2_PRIVATE, tmp_path)
    (root / "proc/self/cgroup").unlink()
    budget = detect_budget(root, env={})
    assert (budget.cpu_quota, budget.memory_limit) == (1.5, 1073741824)
    assert any(
        "has no line for the cgroup v2 hierarchy mounted at /sys/fs/cgroup" in w
        for w in warnings_of(budget)
    )


def test_at_the_usual_mount_point_the_process_s_own_cgroup_is_read_first(tmp_path: Path) -> None:
    root = copy_of("bare-metal-v2", tmp_path)
    mountinfo = root / "proc/self/mountinfo"
    lines = mountinfo.read_text().splitlines(keepends=True)
    mountinfo.write_text("".join(line for line in lines if " - cgroup2 " not in line))
    scope = root / "sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope"
    (scope / "cpu.max").write_text("150000 100000\n")
    assert detect_budget(root, env={}).cpu_quota == 1.5


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (  # v1 at the usual mount point named after the controller alone
            {
                "proc/self/cgroup": "4:cpu,cpuacct:/docker/abc\n",
                "sys/fs/cgroup/cpu/docker/abc/cpu.cfs_quota_us": "-1\n",
            },
            Hierarchy("cpu", 1, "/sys/fs/cgroup/cpu", "unknown", "/docker/abc", "docker/abc"),
        ),
        (  # v2 at systemd's hybrid mount point; ".." (outside the namespace) is skipped
            {
                "proc/self/cgroup": "0::/../../outside/job\n",
                "sys/fs/cgroup/unified/outside/job/cpu.max": "max\n",
            },
            Hierarchy(
                "cpu", 2, "/sys/fs/cgroup/unified", "unknown", "/../../outside/job", "outside/job"
            ),
        ),
        (  # the deepest directory of the cgroup path that exists
            {"proc/self/cgroup": "0::/a/b/gone\n", "sys/fs/cgroup/a/b/cpu.max": "max\n"},
            Hierarchy("cpu", 2, "/sys/fs/cgroup", "unknown", "/a/b/gone", "a/b"),
        ),
        (  # no /proc/self/cgroup: the mount point itself
            {"sys/fs/cgroup/cpu.max": "max\n"},
            Hierarchy("cpu", 2, "/sys/fs/cgroup", "unknown", "/", ""),
        ),
        (  # mountinfo's mount: the cgroup path below the mount root
            {"proc/self/cgroup": "0::/a\n", "proc/self/mountinfo": V2_MOUNT},
            Hierarchy("cpu", 2, "/sys/fs/cgroup", "/", "/a", "a"),
        ),
        (  # a mounted hierarchy without a line in /proc/self/cgroup: its mount point
            {"proc/self/mountinfo": V2_MOUNT},
            Hierarchy("cpu", 2, "/sys/fs/cgroup", "/", "/", ""),
        ),
    ],
)
def test_where_the_cpu_controller_s_files_are_found(
    tmp_path: Path, files: dict[str, str | None], expected: Hierarchy
) -> None:
    probe = RootFiles(tree(tmp_path, files))
    entries, mounts = read_proc_files(probe)
    assert locate("cpu", entries, mounts, probe) == expected
