"""CPU topology from sysfs: physical cores (hyperthread siblings) and NUMA nodes.

Sources (Documentation/ABI/stable/sysfs-devices-system-cpu, .../sysfs-devices-node):
``/sys/devices/system/cpu/cpuN/topology/thread_siblings_list`` lists the logical CPUs that
share cpuN's physical core; ``/sys/devices/system/node/nodeN/cpulist`` lists node N's CPUs.
Read-only, under a ``root`` directory like :mod:`app.cgroups`; missing or malformed files
degrade to "each CPU its own core" / "one node", never to an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from app.cpulist import parse_cpulist

_CPU_DIR = re.compile(r"cpu(\d+)$")
_NODE_DIR = re.compile(r"node(\d+)$")


@dataclass(frozen=True)
class Topology:
    """Cores and NUMA nodes of a set of CPUs.

    Attributes:
        cores: physical cores, each a sorted tuple of hyperthread-sibling CPU ids, ordered by
            their lowest id; only CPUs of the requested set appear.
        numa_nodes: CPU ids per NUMA node (nodes without requested CPUs are left out).
        inputs: every file read → its stripped value (``"<missing>"`` when absent).
        reasons: one line per fallback taken.
    """

    cores: tuple[tuple[int, ...], ...]
    numa_nodes: tuple[tuple[int, ...], ...]
    inputs: dict[str, str] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()


def _read(root: str, path: str, inputs: dict[str, str]) -> str | None:
    try:
        with open(os.path.join(root, path.lstrip("/")), encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError):
        inputs[path] = "<missing>"
        return None
    inputs[path] = text.strip()
    return text


def _numbered_dirs(root: str, path: str, pattern: re.Pattern[str]) -> list[int]:
    try:
        names = os.listdir(os.path.join(root, path.lstrip("/")))
    except OSError:
        return []
    return sorted(int(m.group(1)) for name in names if (m := pattern.match(name)))


def _cpu_list(root: str, path: str, inputs: dict[str, str]) -> tuple[int, ...] | None:
    raw = _read(root, path, inputs)
    if raw is None:
        return None
    try:
        return parse_cpulist(raw)
    except ValueError:
        inputs[path] = f"<unparsable: {raw.strip()!r}>"
        return None


def detect_topology(
    root: str | os.PathLike[str] = "/", cpus: Iterable[int] | None = None
) -> Topology:
    """Group CPUs into physical cores and NUMA nodes.

    Args:
        root: directory holding ``sys/devices/system/...`` (default ``/``).
        cpus: CPU ids to describe (e.g. ``CpuBudget.cpuset``); default the online CPUs
            (``/sys/devices/system/cpu/online``, else every ``cpuN`` directory).

    Returns:
        A :class:`Topology`. A CPU without a readable ``thread_siblings_list`` is its own
        core; without readable node files all CPUs form one node; CPUs that no node lists
        form one extra node. Never raises for missing files.
    """
    base = os.fspath(root)
    inputs: dict[str, str] = {}
    reasons: list[str] = []
    if cpus is None:
        wanted = _cpu_list(base, "/sys/devices/system/cpu/online", inputs)
        if wanted is None:
            wanted = tuple(_numbered_dirs(base, "/sys/devices/system/cpu", _CPU_DIR))
            reasons.append("online CPU list unreadable: using the cpuN directories")
    else:
        wanted = tuple(sorted(set(cpus)))
    wanted_set = set(wanted)

    cores: set[tuple[int, ...]] = set()
    alone: list[int] = []
    for cpu in wanted:
        path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
        siblings = _cpu_list(base, path, inputs)
        if not siblings or cpu not in siblings:
            alone.append(cpu)
            cores.add((cpu,))
        else:
            cores.add(tuple(c for c in siblings if c in wanted_set))
    if alone:
        reasons.append(f"no thread_siblings_list for CPUs {alone}: each counted as its own core")

    nodes: list[tuple[int, ...]] = []
    for node in _numbered_dirs(base, "/sys/devices/system/node", _NODE_DIR):
        listed = _cpu_list(base, f"/sys/devices/system/node/node{node}/cpulist", inputs)
        members = tuple(c for c in listed or () if c in wanted_set)
        if members:
            nodes.append(members)
    unplaced = tuple(sorted(wanted_set.difference(*nodes)))
    if unplaced:
        if nodes:
            reasons.append(f"CPUs {list(unplaced)} are in no node cpulist: grouped as one node")
        else:
            reasons.append("no NUMA node cpulist readable: all CPUs form one node")
        nodes.append(unplaced)

    return Topology(
        cores=tuple(sorted(cores)),
        numa_nodes=tuple(nodes),
        inputs=inputs,
        reasons=tuple(reasons),
    )
