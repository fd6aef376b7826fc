"""CPU topology from sysfs and the CPU model from procfs: cores, NUMA nodes, ISA flags.

Sources (Documentation/ABI/stable/sysfs-devices-system-cpu, .../sysfs-devices-node):
``/sys/devices/system/cpu/cpuN/topology/thread_siblings_list`` lists the logical CPUs that
share cpuN's physical core; ``/sys/devices/system/node/nodeN/cpulist`` lists node N's CPUs;
``/proc/cpuinfo`` (proc(5)) names the CPU model and its instruction-set flags (``flags`` on
x86, ``Features`` on Arm).
Read-only, under a ``root`` directory like :mod:`app.budget.cgroups`; missing or malformed files
degrade to "each CPU its own core" / "one node", never to an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from app.budget.cpulist import parse_cpulist
from app.budget.rootfiles import RootFiles

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


def _numbered_dirs(files: RootFiles, path: str, pattern: re.Pattern[str]) -> list[int]:
    return sorted(int(m.group(1)) for name in files.listdir(path) if (m := pattern.match(name)))


def _cpu_list(files: RootFiles, path: str) -> tuple[int, ...] | None:
    raw = files.read(path)
    if raw is None:
        return None
    try:
        return parse_cpulist(raw)
    except ValueError:
        files.inputs[path] = f"<unparsable: {raw.strip()!r}>"
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
    files = RootFiles(root)
    wanted = _online_cpus(files) if cpus is None else tuple(sorted(set(cpus)))
    cores = _cores(files, wanted)
    numa_nodes = _numa_nodes(files, wanted)
    return Topology(cores, numa_nodes, inputs=files.inputs, reasons=tuple(files.reasons))


def _online_cpus(files: RootFiles) -> tuple[int, ...]:
    """``/sys/devices/system/cpu/online``, else the CPU ids of the ``cpuN`` directories."""
    online = _cpu_list(files, "/sys/devices/system/cpu/online")
    if online is not None:
        return online
    files.reasons.append("online CPU list unreadable: using the cpuN directories")
    return tuple(_numbered_dirs(files, "/sys/devices/system/cpu", _CPU_DIR))


def _cores(files: RootFiles, wanted: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Sibling groups of ``wanted`` (``thread_siblings_list``); a CPU without one is alone."""
    wanted_set = set(wanted)
    cores: set[tuple[int, ...]] = set()
    alone: list[int] = []
    for cpu in wanted:
        path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
        siblings = _cpu_list(files, path)
        if not siblings or cpu not in siblings:
            alone.append(cpu)
            cores.add((cpu,))
        else:
            cores.add(tuple(c for c in siblings if c in wanted_set))
    if alone:
        files.reasons.append(
            f"no thread_siblings_list for CPUs {alone}: each counted as its own core"
        )
    return tuple(sorted(cores))


def _numa_nodes(files: RootFiles, wanted: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """CPUs of ``wanted`` per ``nodeN/cpulist``; the CPUs no node lists form one more node."""
    wanted_set = set(wanted)
    nodes: list[tuple[int, ...]] = []
    for node in _numbered_dirs(files, "/sys/devices/system/node", _NODE_DIR):
        listed = _cpu_list(files, f"/sys/devices/system/node/node{node}/cpulist")
        members = tuple(c for c in listed or () if c in wanted_set)
        if members:
            nodes.append(members)
    unplaced = tuple(sorted(wanted_set.difference(*nodes)))
    if unplaced:
        if nodes:
            files.reasons.append(
                f"CPUs {list(unplaced)} are in no node cpulist: grouped as one node"
            )
        else:
            files.reasons.append("no NUMA node cpulist readable: all CPUs form one node")
        nodes.append(unplaced)
    return tuple(nodes)


#: CPU flags (``/proc/cpuinfo`` names) for which TensorFlow turns oneDNN on by default on
#: Linux x86: AVX512_VNNI, AVX512_BF16, AVX_VNNI, AMX_TILE, AMX_INT8, AMX_BF16
#: (``DefaultOneDnnPolicy`` in tensorflow/core/util/port.cc, TF 2.21).
ONEDNN_DEFAULT_FLAGS = (
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)
#: ``CPU part`` of Arm Neoverse V1, the one Arm CPU with oneDNN on by default (same source).
NEOVERSE_V1_PART = "0xd40"


@dataclass(frozen=True)
class CpuModel:
    """The CPU's model name and instruction-set flags, from the first ``/proc/cpuinfo`` entry.

    Attributes:
        name: ``model name`` (x86), else ``CPU part`` (Arm) or ``"unknown"``.
        flags: ``flags`` (x86) or ``Features`` (Arm) tokens; empty when unreadable.
        part: Arm ``CPU part`` (e.g. ``"0xd40"``), ``None`` elsewhere.
        readable: False when ``/proc/cpuinfo`` could not be read (then nothing is known).
        inputs: the lines read (``"<missing>"`` when absent).
    """

    name: str
    flags: frozenset[str]
    part: str | None = None
    readable: bool = True
    inputs: dict[str, str] = field(default_factory=dict)

    def onednn_default(self) -> tuple[bool, str]:
        """Whether TensorFlow 2.21 turns oneDNN on by itself on this CPU, and the evidence."""
        present = [f for f in ONEDNN_DEFAULT_FLAGS if f in self.flags]
        if present:
            return True, f"the CPU has {', '.join(present)}"
        if self.part == NEOVERSE_V1_PART:
            return True, f"the CPU is an Arm Neoverse V1 (CPU part {self.part})"
        return False, f"the CPU has none of {', '.join(ONEDNN_DEFAULT_FLAGS)}"


def detect_cpu(root: str | os.PathLike[str] = "/") -> CpuModel:
    """Read the CPU model and flags of the first processor in ``<root>/proc/cpuinfo``.

    Never raises: an unreadable file gives ``CpuModel("unknown", frozenset(), readable=False)``.
    """
    files = RootFiles(root)
    inputs = files.inputs
    text = files.read("/proc/cpuinfo")
    if text is None:
        return CpuModel("unknown", frozenset(), readable=False, inputs=inputs)
    first: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if first:
                break
            continue
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    keep = ("model name", "CPU part", "flags", "Features")
    inputs["/proc/cpuinfo"] = "\n".join(f"{k}: {first[k]}" for k in keep if k in first)
    flags = frozenset((first.get("flags") or first.get("Features") or "").split())
    part = first.get("CPU part")
    name = first.get("model name") or (f"Arm CPU part {part}" if part else "unknown")
    return CpuModel(name, flags, part=part, inputs=inputs)
