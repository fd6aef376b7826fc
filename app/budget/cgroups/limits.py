"""The limits along a hierarchy's chain of cgroups: CFS quota and period (v1, v2), memory
limit, cpuset.

Limits are hierarchical: the kernel enforces every ancestor's CFS quota and memory limit
(Documentation/scheduler/sched-bwc.rst, "Hierarchical considerations"), so the **tightest**
value from the process's cgroup up to the mount root is the limit. Ancestors above the mount
root are invisible and cannot be checked. docs/cpu-budget.md lists every rule and fallback.
"""

from __future__ import annotations

from app.budget.cgroups.hierarchy import Hierarchy
from app.budget.cpulist import parse_cpulist
from app.budget.rootfiles import RootFiles

#: Period the kernel uses when ``cpu.max`` holds only a quota (sched-bwc.rst: default 100 ms).
DEFAULT_CFS_PERIOD_US = 100_000

#: cgroup v1 shows "no memory limit" as PAGE_COUNTER_MAX * page size, 9223372036854771712 with
#: 4 KiB pages (9223372036854710272 with 64 KiB pages); anything at or above 2**62 bytes
#: (4 EiB) is treated as unlimited.
UNLIMITED_MEMORY_THRESHOLD = 1 << 62


def _parse_int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _read_level(path: str, version: int, what: str, probe: RootFiles) -> str | None:
    """Text of one level's interface file, or None.

    Missing is normal on v2 (the controller is not enabled at that level, cgroup-v2.rst
    "Controlling Controllers"; the root cgroup has no ``cpu.max``/``memory.max``) and is not
    warned; on v1 every cgroup of the hierarchy has the file, so missing is a warning.
    Unreadable is always a warning: a limit may be hidden there.
    """
    return probe.read_or_warn(path, f": no {what} from this level", missing_is_normal=version == 2)


def _v1_period(directory: str, quota_path: str, quota: int, probe: RootFiles) -> int | None:
    """``cpu.cfs_period_us`` in µs; the kernel's default 100000 µs when the file is absent.

    A present quota is never dropped for a missing period (sched-bwc.rst: the period
    defaults to 100 ms); a period that is there but not a positive integer voids the level.
    """
    path = f"{directory}/cpu.cfs_period_us"
    assumed = f": assuming the default period {DEFAULT_CFS_PERIOD_US} us"
    raw = probe.read_or_warn(path, f" next to {quota_path}={quota}{assumed}")
    if raw is None:
        return DEFAULT_CFS_PERIOD_US
    period = _parse_int(raw)
    if period is None or period <= 0:
        probe.warn(f"{quota_path}={quota} with {path} {raw.strip()!r}: level ignored")
        return None
    return period


def _v1_quota(directory: str, probe: RootFiles) -> float | None:
    """CPUs from ``cpu.cfs_quota_us / cpu.cfs_period_us``; None = unlimited or unusable."""
    quota_path = f"{directory}/cpu.cfs_quota_us"
    raw = _read_level(quota_path, 1, "CFS quota", probe)
    if raw is None:
        return None
    quota = _parse_int(raw)
    if quota is None or quota == 0:
        probe.warn(f"{quota_path} holds {raw.strip()!r}, not a usable quota: level ignored")
        return None
    if quota < 0:
        return None
    period = _v1_period(directory, quota_path, quota, probe)
    return None if period is None else quota / period


def _v2_quota(directory: str, probe: RootFiles) -> float | None:
    """CPUs from ``cpu.max`` ("max 100000" or "150000 100000"); None = unlimited or unusable."""
    path = f"{directory}/cpu.max"
    raw = _read_level(path, 2, "CFS quota", probe)
    if raw is None:
        return None
    fields = raw.split()
    if not fields:
        probe.warn(f"{path} is empty: level ignored")
        return None
    if len(fields) > 2:
        probe.warn(f"{path} holds {raw.strip()!r}, expected 'QUOTA PERIOD': level ignored")
        return None
    if fields[0] == "max":
        if len(fields) == 1:
            probe.warn(f"{path} holds 'max' without a period: treated as unlimited")
        return None
    quota = _parse_int(fields[0])
    period = _parse_int(fields[1]) if len(fields) == 2 else DEFAULT_CFS_PERIOD_US
    if quota is None or period is None or quota <= 0 or period <= 0:
        probe.warn(f"{path} holds {raw.strip()!r}: no usable quota/period, level ignored")
        return None
    if len(fields) == 1:
        probe.warn(f"{path} holds only a quota ({quota}): assuming the default period {period} us")
    return quota / period


def _tightest(
    found: list[tuple[float, str]], what: str, unit: str, levels: int, probe: RootFiles
) -> float | None:
    """The smallest value of the chain (the kernel enforces all of them), noted with where."""
    if not found:
        probe.note(f"{what}: none set on {levels} level(s) (unlimited)")
        return None
    value, where = min(found)
    probe.note(
        f"{what}: {_shown(value)} {unit} from {where}"
        + (" (tightest of the chain)" if levels > 1 else "")
    )
    if len(found) > 1:
        probe.note(f"{what} per level: " + "; ".join(f"{_shown(v)} at {d}" for v, d in found))
    return value


def _shown(value: float) -> str:
    """CPUs as ``1.5``, bytes as the full integer."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def read_cpu_quota(hierarchy: Hierarchy, probe: RootFiles) -> tuple[float | None, str]:
    """Tightest CFS quota in CPUs from the process's cgroup up to the mount root, and the
    directory of the limiting level (the process's own cgroup when no level sets one).

    Every level's quota is read where its file exists; the minimum is the limit because the
    kernel enforces every ancestor's quota (sched-bwc.rst, "Hierarchical considerations").
    """
    read = _v1_quota if hierarchy.version == 1 else _v2_quota
    directories = hierarchy.directories()
    found: list[tuple[float, str]] = []
    for directory in directories:
        quota = read(directory, probe)
        if quota is not None:
            found.append((quota, directory))
    quota = _tightest(found, "cpu quota", "CPUs", len(directories), probe)
    return quota, (min(found)[1] if found else directories[0])


def _memory_bytes(path: str, version: int, probe: RootFiles) -> int | None:
    """Bytes from one ``memory.max``/``memory.limit_in_bytes``; None = unlimited or unusable."""
    raw = _read_level(path, version, "memory limit", probe)
    if raw is None or raw.strip() == "max":
        return None
    value = _parse_int(raw)
    if value is None:
        probe.warn(f"{path} holds {raw.strip()!r}, not an integer: level ignored")
        return None
    return value if 0 <= value < UNLIMITED_MEMORY_THRESHOLD else None


def read_memory_limit(hierarchy: Hierarchy, probe: RootFiles) -> int | None:
    """Tightest memory limit in bytes from the process's cgroup up to the mount root."""
    directories = hierarchy.directories()
    found: list[tuple[float, str]] = []
    for directory in directories:
        path = f"{directory}/{hierarchy.interface_file}"
        value = _memory_bytes(path, hierarchy.version, probe)
        if value is not None:
            found.append((value, directory))
    limit = _tightest(found, "memory limit", "bytes", len(directories), probe)
    return None if limit is None else int(limit)


def read_cgroup_cpuset(hierarchy: Hierarchy, probe: RootFiles) -> tuple[int, ...] | None:
    """CPU ids from the nearest cpuset file that exists, walking up from the process's cgroup.

    The nearest is the tightest: a cpuset is always a subset of its parent's (v1 enforces
    it on write, v2's ``cpuset.cpus.effective`` is already the intersection). An unreadable
    or malformed file is warned and the walk goes on.
    """
    name = hierarchy.interface_file
    for directory in hierarchy.directories():
        path = f"{directory}/{name}"
        raw = probe.read_or_warn(path, ": trying the level above", missing_is_normal=True)
        if raw is None:
            continue
        try:
            cpus = parse_cpulist(raw)
        except ValueError:
            probe.warn(f"{path} holds {raw.strip()!r}, not a CPU list: ignored")
            continue
        if cpus:
            return cpus
        probe.warn(f"{path} is empty: ignored")
    where = hierarchy.directories()[0]
    if hierarchy.version == 1:
        probe.warn(f"no readable {name} from {where} up: cgroup cpuset ignored")
    else:
        probe.note(f"cpuset: no readable {name} from {where} up: cgroup cpuset not used")
    return None
