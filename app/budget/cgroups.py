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
   A path that is not below the mount root, or a mount root with ``..`` (a mount made outside
   the process's cgroup namespace, shown relative to it), cannot be read: warning, the other
   controllers go on.
4. A controller on a v1 line of ``/proc/self/cgroup`` is bound to that v1 hierarchy (one
   controller, one hierarchy) and is not looked up on v2, unless no v1 mount of it is
   visible and the v2 chain has its interface file (warning). Any other controller is read
   on v2.
5. The evidence is the interface file itself: on v2, ``cpu.max``, ``memory.max`` and
   ``cpuset.cpus.effective`` exist in a cgroup only where the controller is enabled
   (Documentation/admin-guide/cgroup-v2.rst, "Controlling Controllers"), so a file that is
   there is read and a missing one means no limit at that level. ``cgroup.controllers`` at
   the mount point is supporting evidence: when it is missing or unreadable that is a
   warning, never a reason to ignore the interface files that exist.
6. A missing detail falls back per hierarchy, with a warning: no mountinfo line (absent or
   malformed) → the usual mount point (``/sys/fs/cgroup`` for v2, ``/sys/fs/cgroup/<ctrl>``
   for v1) if the interface file is there, from the deepest directory of the path that
   exists; no ``/proc/self/cgroup`` line for a mounted hierarchy → its mount point alone
   (the container's own cgroup when the runtime bind-mounts or namespaces it).

Limits are hierarchical: the kernel enforces every ancestor's CFS quota and memory limit
(Documentation/scheduler/sched-bwc.rst, "Hierarchical considerations"), so the **tightest**
value from the process's cgroup up to the mount root is the limit. Ancestors above the mount
root are invisible and cannot be checked. docs/cpu-budget.md lists every rule and fallback.
"""

from __future__ import annotations

import math
import os
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from app.budget.cpulist import format_cpulist, parse_cpulist
from app.budget.files import RootFiles
from app.mountinfo import Mount, parse_mountinfo

#: Period the kernel uses when ``cpu.max`` holds only a quota (sched-bwc.rst: default 100 ms).
DEFAULT_CFS_PERIOD_US = 100_000

#: cgroup v1 shows "no memory limit" as PAGE_COUNTER_MAX * page size, 9223372036854771712 with
#: 4 KiB pages (9223372036854710272 with 64 KiB pages); anything at or above 2**62 bytes
#: (4 EiB) is treated as unlimited.
UNLIMITED_MEMORY_THRESHOLD = 1 << 62

#: Downward API variables (k8s manifests use ``divisor: 1m``, so values are millicores).
CPU_LIMIT_ENV = "CPU_LIMIT"
CPU_REQUEST_ENV = "CPU_REQUEST"

#: Where systemd, docker, podman and containerd mount cgroup2 (``unified``: hybrid systemd).
USUAL_V2_MOUNTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")

#: Parent of the v1 mounts, each named after its controllers (``cpu,cpuacct``) or one of them.
USUAL_V1_PARENT = "/sys/fs/cgroup"

#: The interface file that holds each limit, by (controller, cgroup version).
INTERFACE_FILES = {
    ("cpu", 1): "cpu.cfs_quota_us",
    ("cpu", 2): "cpu.max",
    ("cpuset", 1): "cpuset.cpus",
    ("cpuset", 2): "cpuset.cpus.effective",
    ("memory", 1): "memory.limit_in_bytes",
    ("memory", 2): "memory.max",
}


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
class CgroupEntry:
    """One line of ``/proc/self/cgroup``: hierarchy id, its controllers and the cgroup path."""

    hierarchy_id: str
    controllers: frozenset[str]
    path: str


@dataclass(frozen=True)
class Hierarchy:
    """Where one controller of this process lives: version, mount and the path below it.

    ``mount_root`` is the mount's root inside the hierarchy (mountinfo field 4; ``"unknown"``
    at a usual mount point found without mountinfo), ``relative`` the process's cgroup path
    below it (``""``: the mount point itself).
    """

    controller: str
    version: int
    mount_point: str
    mount_root: str
    cgroup_path: str
    relative: str

    def directories(self) -> list[str]:
        """Cgroup directories from the process's own cgroup up to the mount point."""
        parts = self.relative.split("/") if self.relative else []
        return [posixpath.join(self.mount_point, *parts[:n]) for n in range(len(parts), -1, -1)]

    @property
    def interface_file(self) -> str:
        """Name of the file holding this controller's limit (:data:`INTERFACE_FILES`)."""
        return INTERFACE_FILES[(self.controller, self.version)]

    def has_interface_file(self, probe: RootFiles) -> bool:
        """True when the interface file exists (readable or not) at some level of the chain."""
        return any(probe.exists(f"{d}/{self.interface_file}") for d in self.directories())


def cgroup_mounts(mounts: Iterable[Mount]) -> list[Mount]:
    """The ``cgroup`` (v1) and ``cgroup2`` mounts among ``mounts``, in their order."""
    return [mount for mount in mounts if mount.fs_type in ("cgroup", "cgroup2")]


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
    never below the mount root; nor is anything below a mount root with ``..`` segments (a
    mount made outside the reader's cgroup namespace: the kernel shows its root relative to
    the namespace, e.g. ``/../..``, and the directories in between have no names here).
    """
    if ".." in cgroup_path.split("/") or ".." in mount_root.split("/"):
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
    """Find where this process's ``controller`` files are (module docstring, steps 1-6).

    Returns None, with the reason in ``probe``, when no readable place exists.
    """
    v1_entry = next(
        (e for e in entries if e.hierarchy_id != "0" and controller in e.controllers), None
    )
    v1_mounts = [m for m in mounts if m.fs_type == "cgroup" and controller in m.super_options]
    if v1_entry is not None:
        hierarchy = _locate_v1(controller, v1_entry, v1_mounts, entries, mounts, probe)
    else:
        hierarchy = _locate_v2(controller, entries, mounts, probe)
        if v1_mounts and (hierarchy is None or not hierarchy.has_interface_file(probe)):
            hierarchy = _mount_point_only(controller, 1, v1_mounts[0], probe)
    if hierarchy is not None:
        _announce(hierarchy, probe)
    return hierarchy


def _locate_v1(
    controller: str,
    entry: CgroupEntry,
    v1_mounts: list[Mount],
    entries: list[CgroupEntry],
    mounts: list[Mount],
    probe: RootFiles,
) -> Hierarchy | None:
    """The v1 hierarchy ``entry`` names; its usual mount point, or v2, when it has no mount."""
    if v1_mounts:
        return _translate(controller, 1, entry.path, v1_mounts, probe)
    guessed = _usual_mount(controller, 1, entry, probe)
    if guessed is not None:
        return guessed
    v2 = _locate_v2(controller, entries, mounts, probe)
    if v2 is not None and v2.has_interface_file(probe):
        probe.warn(
            f"{controller}: bound to cgroup v1 (hierarchy {entry.hierarchy_id} in"
            f" /proc/self/cgroup) but no v1 mount of it is visible; {v2.interface_file} exists"
            f" on cgroup v2 at {v2.mount_point}: read there"
        )
        return v2
    probe.warn(f"{controller}: cgroup v1 path {entry.path} but no such hierarchy is mounted")
    return None


def _locate_v2(
    controller: str, entries: list[CgroupEntry], mounts: list[Mount], probe: RootFiles
) -> Hierarchy | None:
    """The v2 hierarchy: mountinfo's cgroup2 mount, else the usual mount point if it has files."""
    entry = next((e for e in entries if e.hierarchy_id == "0"), None)
    v2_mounts = [m for m in mounts if m.fs_type == "cgroup2"]
    if entry is not None and v2_mounts:
        return _translate(controller, 2, entry.path, v2_mounts, probe)
    if v2_mounts:
        return _mount_point_only(controller, 2, v2_mounts[0], probe)
    guessed = _usual_mount(controller, 2, entry, probe)
    if guessed is None:
        probe.note(f"{controller}: no cgroup hierarchy with this controller is visible")
    return guessed


def _translate(
    controller: str, version: int, cgroup_path: str, candidates: list[Mount], probe: RootFiles
) -> Hierarchy | None:
    """The first mount whose root holds ``cgroup_path`` (step 3), or None with a warning."""
    for mount in candidates:
        relative = relative_to_mount_root(mount.root, cgroup_path)
        if relative is not None:
            return Hierarchy(
                controller, version, mount.mount_point, mount.root, cgroup_path, relative
            )
    roots = ", ".join(f"{m.mount_point} (root {m.root})" for m in candidates)
    if all(".." in m.root.split("/") for m in candidates):
        probe.warn(
            f"{controller}: the mount root of {roots} lies outside this process's cgroup"
            f" namespace, so its cgroup {cgroup_path} cannot be named there;"
            f" {controller} limits are not read"
        )
        return None
    probe.warn(
        f"{controller}: process cgroup {cgroup_path} is not below the mount root of {roots};"
        f" its files cannot be read, {controller} limits are ignored"
    )
    return None


def _mount_point_only(controller: str, version: int, mount: Mount, probe: RootFiles) -> Hierarchy:
    """The mount point alone, for a mounted hierarchy that /proc/self/cgroup does not name."""
    probe.warn(
        f"{controller}: /proc/self/cgroup has no line for the cgroup v{version} hierarchy"
        f" mounted at {mount.mount_point}: only the mount point itself is read (the"
        " container's own cgroup when the runtime bind-mounts or namespaces it)"
    )
    return Hierarchy(controller, version, mount.mount_point, mount.root, mount.root, "")


def _usual_mounts(controller: str, version: int, entry: CgroupEntry | None) -> list[str]:
    """Usual mount points of the hierarchy (systemd's names): v2 first, then v1 by name."""
    if version == 2:
        return list(USUAL_V2_MOUNTS)
    names = [",".join(sorted(entry.controllers))] if entry else []
    return [f"{USUAL_V1_PARENT}/{name}" for name in dict.fromkeys([*names, controller])]


def _usual_mount(
    controller: str, version: int, entry: CgroupEntry | None, probe: RootFiles
) -> Hierarchy | None:
    """A hierarchy at a usual mount point, when mountinfo has no line for it (step 6).

    Used only if the interface file exists there; the process's directory is the deepest
    directory of its cgroup path that exists (mount root unknown: bind mount or namespace).
    """
    cgroup_path = entry.path if entry is not None else "/"
    for mount_point in _usual_mounts(controller, version, entry):
        relative = _deepest_existing(mount_point, cgroup_path, probe)
        if relative is None:
            continue
        hierarchy = Hierarchy(controller, version, mount_point, "unknown", cgroup_path, relative)
        if hierarchy.has_interface_file(probe):
            probe.warn(
                f"{controller}: no cgroup v{version} mount of it in /proc/self/mountinfo;"
                f" {hierarchy.interface_file} found under the usual mount point {mount_point}:"
                f" read from {hierarchy.directories()[0]} up"
            )
            return hierarchy
    return None


def _deepest_existing(mount_point: str, cgroup_path: str, probe: RootFiles) -> str | None:
    """The longest leading part of ``cgroup_path`` that is a directory under ``mount_point``.

    Returns it relative to the mount point (``""`` for the mount point itself), or None when
    not even the mount point exists.
    """
    parts = [part for part in cgroup_path.split("/") if part and part != ".."]
    for depth in range(len(parts), -1, -1):
        if probe.is_dir(posixpath.join(mount_point, *parts[:depth])):
            return "/".join(parts[:depth])
    return None


def _announce(hierarchy: Hierarchy, probe: RootFiles) -> None:
    """Say where the controller's files are read; on v2 check the supporting listing."""
    levels = len(hierarchy.directories())
    probe.note(
        f"{hierarchy.controller}: cgroup v{hierarchy.version} mounted at {hierarchy.mount_point}"
        f" (mount root {hierarchy.mount_root}), process cgroup {hierarchy.cgroup_path},"
        f" {levels} level(s) visible"
    )
    if hierarchy.version == 2:
        _check_listing(hierarchy, probe)


def _check_listing(hierarchy: Hierarchy, probe: RootFiles) -> None:
    """``cgroup.controllers`` at the v2 mount point: supporting evidence, never a veto.

    A missing or unreadable listing is a warning; one that does not list the controller is
    a note (its interface files then normally do not exist). Either way the interface files
    that exist are read (cgroup-v2.rst, "Controlling Controllers").
    """
    controller = hierarchy.controller
    listing = f"{hierarchy.mount_point}/cgroup.controllers"
    available = probe.read(listing)
    if available is None:
        probe.warn(
            f"{controller}: {listing} {probe.status(listing)}: whether cgroup v2 offers"
            f" {controller} is decided by its interface files alone"
        )
    elif controller not in available.split():
        probe.note(
            f"{controller}: {listing} does not list it ({available.strip()!r}):"
            f" only interface files that exist anyway count"
        )


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
    raw = probe.read(path)
    if raw is None and (version == 1 or probe.status(path) != "missing"):
        probe.warn(f"{path} {probe.status(path)}: no {what} from this level")
    return raw


def _v1_period(directory: str, quota_path: str, quota: int, probe: RootFiles) -> int | None:
    """``cpu.cfs_period_us`` in µs; the kernel's default 100000 µs when the file is absent.

    A present quota is never dropped for a missing period (sched-bwc.rst: the period
    defaults to 100 ms); a period that is there but not a positive integer voids the level.
    """
    path = f"{directory}/cpu.cfs_period_us"
    raw = probe.read(path)
    if raw is None:
        probe.warn(
            f"{path} {probe.status(path)} next to {quota_path}={quota}:"
            f" assuming the default period {DEFAULT_CFS_PERIOD_US} us"
        )
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


def _cpu_quota(hierarchy: Hierarchy, probe: RootFiles) -> tuple[float | None, str]:
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


def _memory_limit(hierarchy: Hierarchy, probe: RootFiles) -> int | None:
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
    """CPU ids from the nearest cpuset file that exists, walking up from the process's cgroup.

    The nearest is the tightest: a cpuset is always a subset of its parent's (v1 enforces
    it on write, v2's ``cpuset.cpus.effective`` is already the intersection). An unreadable
    or malformed file is warned and the walk goes on.
    """
    name = hierarchy.interface_file
    for directory in hierarchy.directories():
        path = f"{directory}/{name}"
        raw = probe.read(path)
        if raw is None:
            if probe.status(path) != "missing":
                probe.warn(f"{path} {probe.status(path)}: trying the level above")
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


def _read_proc_files(probe: RootFiles) -> tuple[list[CgroupEntry], list[Mount]]:
    """``/proc/self/cgroup`` entries and cgroup mounts; bad or missing input is warned.

    Neither file is required: without cgroup paths each mounted hierarchy is read at its
    mount point, without mountinfo the usual mount points are tried (module docstring, 6).
    """
    cgroup_text = probe.read("/proc/self/cgroup")
    entries, problems = parse_proc_cgroup(cgroup_text or "")
    mountinfo = probe.read("/proc/self/mountinfo")
    all_mounts, mount_problems = parse_mountinfo(mountinfo or "")
    mounts = cgroup_mounts(all_mounts)
    if mountinfo is not None:  # record only the cgroup mounts: the rest is noise in the log
        probe.inputs["/proc/self/mountinfo"] = "\n".join(mount.line for mount in mounts)
    for problem in problems + mount_problems:
        probe.warn(problem)
    if not entries:
        shown = (
            "has no usable line" if cgroup_text is not None else probe.status("/proc/self/cgroup")
        )
        probe.warn(f"/proc/self/cgroup {shown}: the process's cgroup paths are unknown")
    if mountinfo is None:
        shown = probe.status("/proc/self/mountinfo")
        probe.warn(f"/proc/self/mountinfo {shown}: only the usual cgroup mount points are tried")
    return entries, mounts


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
    entries, mounts = _read_proc_files(probe)

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
