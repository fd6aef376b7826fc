"""The CPU budget of this process: CFS quota, CPU set and memory limit, from cgroups first.

Ties the parts together: the hierarchies of ``cpu``, ``cpuset`` and ``memory``
(:mod:`~app.budget.cgroups.locate`), the limits along their chains
(:mod:`~app.budget.cgroups.limits`), the ``CPU_LIMIT``/``CPU_REQUEST`` hints when cgroups set
no quota (:mod:`~app.budget.cgroups.hints`) and the affinity and online CPUs
(:mod:`~app.budget.cgroups.affinity`). docs/cpu-budget.md lists every rule and fallback.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from app.budget.cgroups.affinity import combine_cpusets, online_cpus, read_affinity
from app.budget.cgroups.hints import CPU_LIMIT_ENV, read_hints
from app.budget.cgroups.limits import read_cgroup_cpuset, read_cpu_quota, read_memory_limit
from app.budget.cgroups.locate import locate, read_proc_files
from app.budget.rootfiles import RootFiles


@dataclass(frozen=True)
class CpuBudget:
    """What the process may use, with every input read and every decision taken.

    Attributes:
        cpu_quota: CPUs (quota / period) of the tightest CFS quota along the cgroup chain, or
            from ``CPU_LIMIT`` when cgroups give none; ``None`` = unlimited.
        cpuset: CPU ids the process may run on, sorted: affinity ∩ cgroup cpuset ∩ online.
        memory_limit: bytes, tightest along the chain; ``None`` = unlimited.
        quota_source: ``"cgroup v1"``, ``"cgroup v2"``, ``"CPU_LIMIT env"`` or ``"none"``.
        inputs: every file or environment variable read → its raw value (stripped), keyed by
            the path as seen from ``root`` (``"<missing>"`` / ``"<unreadable: ...>"`` when a
            file could not be read).
        reasons: one human-readable line per decision; fallbacks start with ``"warning: "``.
        cpu_request: CPUs from the ``CPU_REQUEST`` hint (read only when no quota was found);
            informational, not part of :attr:`cpu_budget`.
        cpu_stat: path (as seen from root) of ``cpu.stat`` in the cgroup whose quota is the
            limit (the process's own cgroup when none is set): its throttling counters.
    """

    cpu_quota: float | None
    cpuset: tuple[int, ...]
    memory_limit: int | None
    quota_source: str
    inputs: dict[str, str] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    cpu_request: float | None = None
    cpu_stat: str | None = None

    @property
    def cpu_budget(self) -> float:
        """CPUs usable at once: ``min(cpu_quota, len(cpuset))``, ``len(cpuset)`` if unlimited."""
        if self.cpu_quota is None:
            return float(len(self.cpuset))
        return min(self.cpu_quota, float(len(self.cpuset)))


def detect_budget(
    root: str | os.PathLike[str] = "/",
    env: Mapping[str, str] | None = None,
    affinity: Iterable[int] | None = None,
) -> CpuBudget:
    """Detect the CPU quota, CPU set and memory limit of this process from cgroups.

    Args:
        root: directory holding ``proc/self/...`` and ``sys/...`` (default ``/``, the live
            system). With another root nothing is read from the live process.
        env: environment for the Downward API hints ``CPU_LIMIT``/``CPU_REQUEST`` (default
            ``os.environ``); read only when cgroups give no quota, and the reasons say so.
        affinity: allowed CPU ids; default ``os.sched_getaffinity(0)`` when ``root`` is ``/``,
            else ``Cpus_allowed_list`` from ``<root>/proc/self/status`` if present.

    Returns:
        A :class:`CpuBudget` (CPUs, CPU ids, bytes) with the raw inputs and the reasons.

    Never raises for missing, unreadable or malformed files: each becomes a documented
    fallback with a ``"warning: "`` line in ``reasons`` (docs/cpu-budget.md, "Fallbacks").
    """
    probe = RootFiles(root)
    entries, mounts = read_proc_files(probe)

    cpu = locate("cpu", entries, mounts, probe)
    cpu_quota, cpu_dir = read_cpu_quota(cpu, probe) if cpu else (None, None)
    quota_source = f"cgroup v{cpu.version}" if cpu and cpu_quota is not None else "none"
    cpu_request = None
    if cpu_quota is None:
        cpu_quota, cpu_request = read_hints(os.environ if env is None else env, probe)
        if cpu_quota is not None:
            quota_source = f"{CPU_LIMIT_ENV} env"

    allowed, allowed_name = read_affinity(affinity, probe)
    cpuset_hierarchy = locate("cpuset", entries, mounts, probe)
    cgroup_cpus = read_cgroup_cpuset(cpuset_hierarchy, probe) if cpuset_hierarchy else None
    cpuset = combine_cpusets(
        [(allowed_name, allowed), ("cpuset", cgroup_cpus), ("online", online_cpus(probe))], probe
    )

    memory = locate("memory", entries, mounts, probe)
    memory_limit = read_memory_limit(memory, probe) if memory else None

    return CpuBudget(
        cpu_stat=f"{cpu_dir}/cpu.stat" if cpu_dir else None,
        cpu_quota=cpu_quota,
        cpuset=cpuset,
        memory_limit=memory_limit,
        quota_source=quota_source,
        inputs=probe.inputs,
        reasons=tuple(probe.reasons),
        cpu_request=cpu_request,
    )
