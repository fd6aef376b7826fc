"""Read-only detection of the CPU budget a process was given: CFS quota, cpuset, memory limit.

Works on cgroup v1, v2 and hybrid layouts, inside or outside containers, with or without a
cgroup namespace. Every file is read under a ``root`` directory (default ``/``) so tests can
point it at fake ``/proc`` + ``/sys`` trees; nothing here imports TensorFlow or changes the
process (the apply step in ``app.budget.apply`` does that).

How a controller's directory is found (proc_pid_cgroup(7), proc_pid_mountinfo(5)):

1. ``/proc/self/cgroup`` gives the process's cgroup path per hierarchy: ``ID:ctrl,ctrl:/path``
   for v1 (named hierarchies appear as ``name=systemd``), ``0::/path`` for the v2 hierarchy.
2. ``/proc/self/mountinfo`` gives, for each cgroup mount, its mount point (field 5), the
   path of the mount's root inside the hierarchy (field 4) and, for v1, the controllers in
   the super options. Paths there escape space, tab, newline and backslash as ``\\ooo``.
3. The process's directory is ``mount point + (cgroup path - mount root)``. Without a cgroup
   namespace, docker on v1 bind-mounts ``/docker/<id>`` and the process's path is the same,
   so the directory is the mount point itself; with a namespace both are usually ``/``.
   A path that is not under the mount root cannot be read (warning, other controllers go on).
4. A controller on a v1 hierarchy wins over v2 (a controller is bound to one hierarchy; on a
   hybrid host the v2 mount has no ``cpu``): v2 is used only if ``cgroup.controllers`` at the
   v2 mount point lists the controller. Below that, a level whose own ``cgroup.controllers``
   lacks it simply has no interface files (not a warning).

Limits are hierarchical: the kernel enforces every ancestor's CFS quota and memory limit
(Documentation/scheduler/sched-bwc.rst, "Hierarchical considerations"), so the **tightest**
value from the process's cgroup up to the mount root is the limit. Ancestors above the mount
root are invisible and cannot be checked.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from app.budget.cpulist import format_cpulist, parse_cpulist
from app.budget.files import RootFiles

#: Period the kernel uses when ``cpu.max`` holds only a quota (sched-bwc.rst: default 100 ms).
DEFAULT_CFS_PERIOD_US = 100_000

#: cgroup v1 shows "no memory limit" as PAGE_COUNTER_MAX * page size, 9223372036854771712 with
#: 4 KiB pages (9223372036854710272 with 64 KiB pages); anything at or above 2**62 bytes
#: (4 EiB) is treated as unlimited.
UNLIMITED_MEMORY_THRESHOLD = 1 << 62

#: Downward API variables (k8s manifests use ``divisor: 1m``, so values are millicores).
CPU_LIMIT_ENV = "CPU_LIMIT"
CPU_REQUEST_ENV = "CPU_REQUEST"


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


@dataclass(frozen=True)
class Mount:
    """One cgroup/cgroup2 line of ``/proc/self/mountinfo`` (escapes decoded)."""

    root: str
    mount_point: str
    fs_type: str
    super_options: frozenset[str]


@dataclass(frozen=True)
class CgroupEntry:
    """One line of ``/proc/self/cgroup``: hierarchy id, its controllers and the cgroup path."""

    hierarchy_id: str
    controllers: frozenset[str]
    path: str


@dataclass(frozen=True)
class Hierarchy:
    """Where one controller of this process lives: version, mount and the path below it."""

    version: int
    mount: Mount
    cgroup_path: str
    relative: str

    def directories(self) -> list[str]:
        """Cgroup directories from the process's own cgroup up to the mount point."""
        parts = self.relative.split("/") if self.relative else []
        return [
            posixpath.join(self.mount.mount_point, *parts[:n]) for n in range(len(parts), -1, -1)
        ]


_ESCAPE = re.compile(r"\\([0-7]{3})")


def unescape_mountinfo(text: str) -> str:
    """Decode the kernel's octal escapes in mountinfo paths: ``\\040`` → space (show_path)."""
    return _ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), text)


def parse_mountinfo(text: str) -> tuple[list[Mount], list[str]]:
    """Parse ``/proc/self/mountinfo``, keeping only ``cgroup`` and ``cgroup2`` mounts.

    Line format (proc_pid_mountinfo(5)): ``id parent major:minor root mount-point options
    [optional fields...] - fstype source super-options``. Other filesystems (proc, nsfs whose
    root is ``net:[4026532570]``, overlay, ...) are skipped.

    Returns:
        ``(mounts, problems)``: the cgroup mounts in file order, and one message per line
        that could not be parsed (skipped, never fatal).
    """
    mounts: list[Mount] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        separator = fields.index("-", 6) if "-" in fields[6:] else -1
        if separator < 0 or len(fields) < separator + 3:
            problems.append(f"mountinfo line {number} is malformed and was skipped: {line!r}")
            continue
        fs_type = fields[separator + 1]
        if fs_type not in ("cgroup", "cgroup2"):
            continue
        options = fields[separator + 3] if len(fields) > separator + 3 else ""
        mounts.append(
            Mount(
                root=unescape_mountinfo(fields[3]),
                mount_point=unescape_mountinfo(fields[4]),
                fs_type=fs_type,
                super_options=frozenset(options.split(",")),
            )
        )
    return mounts, problems


def _is_cgroup_mount_line(line: str) -> bool:
    fields = line.split()
    return "-" in fields and fields[fields.index("-") + 1 :][:1] in (["cgroup"], ["cgroup2"])


def parse_proc_cgroup(text: str) -> tuple[list[CgroupEntry], list[str]]:
    """Parse ``/proc/self/cgroup`` lines ``hierarchy-ID:controller-list:cgroup-path``.

    The path may itself contain ``:`` (only the first two colons separate fields).

    Returns:
        ``(entries, problems)``: entries in file order and one message per malformed line.
    """
    entries: list[CgroupEntry] = []
    problems: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith("/"):
            problems.append(f"/proc/self/cgroup line is malformed and was skipped: {line!r}")
            continue
        controllers = frozenset(c for c in parts[1].split(",") if c)
        entries.append(CgroupEntry(parts[0], controllers, parts[2]))
    return entries, problems


def relative_to_mount_root(mount_root: str, cgroup_path: str) -> str | None:
    """``cgroup_path`` minus ``mount_root`` (``""`` when equal), or None if not below it.

    A path with ``..`` segments (the process sits outside its cgroup namespace root) is
    never below the mount root.
    """
    if ".." in cgroup_path.split("/"):
        return None
    root = posixpath.normpath(mount_root)
    path = posixpath.normpath(cgroup_path)
    if root == "/":
        return path.strip("/")
    if path == root:
        return ""
    if path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return None


def _locate(
    controller: str, entries: list[CgroupEntry], mounts: list[Mount], probe: RootFiles
) -> Hierarchy | None:
    """Find the hierarchy holding ``controller`` for this process (module docstring, 1-4)."""
    v1_entry = next(
        (e for e in entries if e.hierarchy_id != "0" and controller in e.controllers), None
    )
    if v1_entry is not None:
        candidates = [m for m in mounts if m.fs_type == "cgroup" and controller in m.super_options]
        return _translate(controller, 1, v1_entry.path, candidates, probe)
    v2_entry = next((e for e in entries if e.hierarchy_id == "0"), None)
    if v2_entry is None:
        probe.note(f"{controller}: no cgroup hierarchy with this controller in /proc/self/cgroup")
        return None
    candidates = [m for m in mounts if m.fs_type == "cgroup2"]
    hierarchy = _translate(controller, 2, v2_entry.path, candidates, probe)
    if hierarchy is None:
        return None
    top = hierarchy.mount.mount_point
    listing = f"{top}/cgroup.controllers"
    available = probe.read(listing)
    if available is None or controller not in available.split():
        shown = probe.status(listing) if available is None else repr(available.strip())
        probe.note(
            f"{controller}: the cgroup v2 hierarchy at {top} does not offer it ({listing}: {shown})"
        )
        return None
    return hierarchy


def _translate(
    controller: str, version: int, cgroup_path: str, candidates: list[Mount], probe: RootFiles
) -> Hierarchy | None:
    label = f"cgroup v{version}"
    if not candidates:
        probe.warn(f"{controller}: {label} path {cgroup_path} but no such hierarchy is mounted")
        return None
    for mount in candidates:
        relative = relative_to_mount_root(mount.root, cgroup_path)
        if relative is not None:
            levels = relative.count("/") + 2 if relative else 1
            probe.note(
                f"{controller}: {label} mounted at {mount.mount_point} (mount root {mount.root}),"
                f" process cgroup {cgroup_path}, {levels} level(s) visible"
            )
            return Hierarchy(version, mount, cgroup_path, relative)
    roots = ", ".join(f"{m.mount_point} (root {m.root})" for m in candidates)
    probe.warn(
        f"{controller}: process cgroup {cgroup_path} is not below the mount root of {roots};"
        f" its files cannot be read, {controller} limits are ignored"
    )
    return None


def _parse_int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _v1_quota(directory: str, probe: RootFiles) -> float | None:
    """CPUs from ``cpu.cfs_quota_us / cpu.cfs_period_us``; None = unlimited or unusable."""
    quota_path, period_path = f"{directory}/cpu.cfs_quota_us", f"{directory}/cpu.cfs_period_us"
    raw = probe.read(quota_path)
    if raw is None:
        probe.warn(f"{quota_path} {probe.status(quota_path)}: no CFS quota from this level")
        return None
    quota = _parse_int(raw)
    if quota is None:
        probe.warn(f"{quota_path} holds {raw.strip()!r}, not an integer: level ignored")
        return None
    if quota < 0:
        return None
    raw_period = probe.read(period_path)
    period = _parse_int(raw_period) if raw_period is not None else None
    if period is None or period <= 0 or quota == 0:
        shown = probe.status(period_path) if raw_period is None else repr(raw_period.strip())
        probe.warn(f"{quota_path}={quota} with {period_path} {shown}: level ignored")
        return None
    return quota / period


def _v2_missing_is_expected(
    directory: str, controller: str, probe: RootFiles, is_top: bool
) -> bool:
    """A v2 interface file is absent where its controller is not enabled for that cgroup
    (the parent's ``cgroup.subtree_control`` lacks it) and in the root cgroup, which has no
    ``cpu.max``/``memory.max`` (cgroup-v2.rst, "Controlling Controllers", interface files)."""
    if is_top:
        return True
    enabled = probe.read(f"{directory}/cgroup.controllers")
    return enabled is not None and controller not in enabled.split()


def _v2_quota(directory: str, probe: RootFiles, is_top: bool) -> float | None:
    """CPUs from ``cpu.max`` ("max 100000" or "150000 100000"); None = unlimited or unusable."""
    path = f"{directory}/cpu.max"
    raw = probe.read(path)
    if raw is None:
        if not _v2_missing_is_expected(directory, "cpu", probe, is_top):
            probe.warn(f"{path} {probe.status(path)}: no CFS quota from this level")
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


def _cpu_quota(hierarchy: Hierarchy, probe: RootFiles) -> tuple[float | None, str]:
    """Tightest CFS quota (CPUs) from the process's cgroup up to the mount root, and the
    directory that sets it (the process's own cgroup when none does)."""
    found: list[tuple[float, str]] = []
    directories = hierarchy.directories()
    for directory in directories:
        if hierarchy.version == 1:
            quota = _v1_quota(directory, probe)
        else:
            quota = _v2_quota(directory, probe, directory == directories[-1])
        if quota is not None:
            found.append((quota, directory))
    if not found:
        probe.note(f"cpu quota: none set on {len(directories)} level(s) (unlimited)")
        return None, directories[0]
    quota, where = min(found)
    probe.note(
        f"cpu quota: {quota:g} CPUs from {where}"
        + (" (tightest of the chain)" if len(directories) > 1 else "")
    )
    return quota, where


def _memory_limit(hierarchy: Hierarchy, probe: RootFiles) -> int | None:
    """Tightest memory limit in bytes from the process's cgroup up to the mount root."""
    name = "memory.limit_in_bytes" if hierarchy.version == 1 else "memory.max"
    limits: list[tuple[int, str]] = []
    directories = hierarchy.directories()
    for directory in directories:
        path = f"{directory}/{name}"
        raw = probe.read(path)
        if raw is None:
            is_top = directory == directories[-1]
            if hierarchy.version == 1 or not _v2_missing_is_expected(
                directory, "memory", probe, is_top
            ):
                probe.warn(f"{path} {probe.status(path)}: no memory limit from this level")
            continue
        if raw.strip() == "max":
            continue
        value = _parse_int(raw)
        if value is None:
            probe.warn(f"{path} holds {raw.strip()!r}, not an integer: level ignored")
        elif 0 <= value < UNLIMITED_MEMORY_THRESHOLD:
            limits.append((value, directory))
    if not limits:
        probe.note(f"memory limit: none set on {len(directories)} level(s) (unlimited)")
        return None
    limit, where = min(limits)
    probe.note(f"memory limit: {limit} bytes from {where}")
    return limit


def parse_cpu_hint(value: str) -> float:
    """CPUs from a Downward API value: ``"1500"`` (millicores, ``divisor: 1m``), ``"1500m"``,
    or cores with a decimal point ``"1.5"``.

    Raises:
        ValueError: not a number, or not a finite positive amount.
    """
    text = value.strip()
    if text.endswith("m"):
        cpus = float(text[:-1]) / 1000
    elif "." in text or "e" in text.lower():
        cpus = float(text)
    else:
        cpus = int(text) / 1000
    if not math.isfinite(cpus) or cpus <= 0:
        raise ValueError(f"{value!r} is not a positive CPU amount")
    return cpus


def _env_hint(name: str, env: Mapping[str, str], probe: RootFiles) -> float | None:
    value = env.get(name)
    if value is None:
        return None
    probe.inputs[f"env {name}"] = value.strip()
    try:
        return parse_cpu_hint(value)
    except ValueError:
        probe.warn(f"{name}={value!r} is not a CPU amount (millicores like 1500, or 1.5): ignored")
        return None


def _cgroup_cpuset(hierarchy: Hierarchy, probe: RootFiles) -> tuple[int, ...] | None:
    """CPUs from the nearest readable cpuset file, walking up from the process's cgroup."""
    name = "cpuset.cpus" if hierarchy.version == 1 else "cpuset.cpus.effective"
    for directory in hierarchy.directories():
        path = f"{directory}/{name}"
        raw = probe.read(path)
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
    probe.warn(f"no readable {name} from {hierarchy.directories()[0]} up: cgroup cpuset ignored")
    return None


def _affinity(
    root: str | os.PathLike[str], affinity: Iterable[int] | None, probe: RootFiles
) -> tuple[tuple[int, ...] | None, str]:
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


def _online(probe: RootFiles) -> tuple[int, ...] | None:
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


def _combine_cpusets(
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
    entries, problems = parse_proc_cgroup(probe.read("/proc/self/cgroup") or "")
    mountinfo = probe.read("/proc/self/mountinfo")
    mounts, mount_problems = parse_mountinfo(mountinfo or "")
    if mountinfo is not None:  # record only the cgroup mounts: the rest is noise in the log
        probe.inputs["/proc/self/mountinfo"] = "\n".join(
            line for line in mountinfo.splitlines() if _is_cgroup_mount_line(line)
        )
    for problem in problems + mount_problems:
        probe.warn(problem)
    if not entries or mountinfo is None:
        probe.warn("no /proc/self/cgroup or /proc/self/mountinfo: cgroup limits unknown")

    cpu = _locate("cpu", entries, mounts, probe)
    cpu_quota, cpu_dir = _cpu_quota(cpu, probe) if cpu else (None, None)
    quota_source = f"cgroup v{cpu.version}" if cpu and cpu_quota is not None else "none"
    cpu_request = None
    if cpu_quota is None:
        environment = os.environ if env is None else env
        cpu_quota = _env_hint(CPU_LIMIT_ENV, environment, probe)
        if cpu_quota is not None:
            quota_source = f"{CPU_LIMIT_ENV} env"
            probe.note(f"cpu quota: cgroups set none; {CPU_LIMIT_ENV} gives {cpu_quota:g} CPUs")
        cpu_request = _env_hint(CPU_REQUEST_ENV, environment, probe)
        if cpu_request is not None:
            probe.note(f"cpu request: {CPU_REQUEST_ENV} gives {cpu_request:g} CPUs (a hint only)")

    allowed, allowed_name = _affinity(root, affinity, probe)
    cpuset_hierarchy = _locate("cpuset", entries, mounts, probe)
    cgroup_cpus = _cgroup_cpuset(cpuset_hierarchy, probe) if cpuset_hierarchy else None
    cpuset = _combine_cpusets(
        [(allowed_name, allowed), ("cpuset", cgroup_cpus), ("online", _online(probe))], probe
    )

    memory = _locate("memory", entries, mounts, probe)
    memory_limit = _memory_limit(memory, probe) if memory else None

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
