"""The CPUs outside cgroups: the affinity mask and the online CPUs, and the CPU set they make
with the cgroup cpuset (their intersection).

Sources: sched_getaffinity(2) on the live root, else ``Cpus_allowed_list`` in
``/proc/self/status`` (proc_pid_status(5)); ``/sys/devices/system/cpu/online``
(Documentation/ABI/testing/sysfs-devices-system-cpu).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from app.budget.cpulist import format_cpulist, parse_cpulist
from app.budget.rootfiles import RootFiles


def read_affinity(
    affinity: Iterable[int] | None, probe: RootFiles
) -> tuple[tuple[int, ...] | None, str]:
    """``(CPU ids, source name)`` of the affinity mask: ``affinity`` when given, else
    sched_getaffinity(2) on the live root, else ``Cpus_allowed_list`` in ``/proc/self/status``
    (ids None when it is missing or not a CPU list, warned)."""
    if affinity is not None:
        return tuple(sorted(set(affinity))), "affinity"
    if probe.is_live:
        return tuple(sorted(os.sched_getaffinity(0))), "sched_getaffinity"
    raw = probe.read("/proc/self/status")
    if raw is not None:
        del probe.inputs["/proc/self/status"]  # only the one line below is an input
    for line in (raw or "").splitlines():
        key, _, value = line.partition(":")
        if key == "Cpus_allowed_list":
            probe.inputs["/proc/self/status Cpus_allowed_list"] = value.strip()
            try:
                return parse_cpulist(value), "Cpus_allowed_list"
            except ValueError:
                probe.warn(f"Cpus_allowed_list {value.strip()!r} is not a CPU list: ignored")
    return None, "Cpus_allowed_list"


def online_cpus(probe: RootFiles) -> tuple[int, ...] | None:
    """CPU ids in ``/sys/devices/system/cpu/online``; None when unreadable, empty or not a CPU
    list (noted or warned)."""
    path = "/sys/devices/system/cpu/online"
    raw = probe.read(path)
    if raw is None:
        probe.note(f"{path} {probe.status(path)}: not used")
        return None
    try:
        return parse_cpulist(raw) or None
    except ValueError:
        probe.warn(f"{path} holds {raw.strip()!r}, not a CPU list: ignored")
        return None


def combine_cpusets(
    sources: list[tuple[str, tuple[int, ...] | None]], probe: RootFiles
) -> tuple[int, ...]:
    """Intersect the known CPU sets; never returns an empty set (fallbacks are warned)."""
    known = [(name, cpus) for name, cpus in sources if cpus]
    if not known:
        probe.warn("no CPU set could be read (affinity, cpuset, online): assuming 1 CPU, id 0")
        return (0,)
    result = set(known[0][1])
    for _, cpus in known[1:]:
        result &= set(cpus)
    shown = " ∩ ".join(f"{name} {format_cpulist(cpus)}" for name, cpus in known)
    if not result:
        probe.warn(f"cpuset: {shown} is empty (inconsistent inputs): using {known[0][0]} only")
        return known[0][1]
    probe.note(f"cpuset: {shown} = {format_cpulist(result)} ({len(result)} CPUs)")
    return tuple(sorted(result))
