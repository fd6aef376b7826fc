"""Run a command inside a fresh cgroup v1 group: ``cpu`` with a real CFS quota, or
``memory`` with a real memory limit.

Used by ``benchmarks.cpu_rounding``, ``tests/test_real_cgroup.py`` and
``tests/test_bounds.py``. Needs root and a writable cgroup v1 hierarchy that carries the
controller (``/sys/fs/cgroup/cpu``, ``/sys/fs/cgroup/memory`` on hybrid hosts);
:func:`unavailable_reason` says why not when that is missing.

Kernel interface (Documentation/scheduler/sched-bwc.rst): ``cpu.cfs_period_us`` and
``cpu.cfs_quota_us`` in microseconds (quota/period = CPUs; each between 1 ms and 1 s, quota
``-1`` = unlimited); ``cpu.stat`` counts ``nr_periods`` (periods in which the group was
runnable), ``nr_throttled`` (periods in which it ran out of quota) and ``throttled_time``
(nanoseconds its CPUs spent throttled). A process joins a group when its pid is written to
``cgroup.procs`` (Documentation/admin-guide/cgroup-v1/cgroups.rst); its children stay there.
Memory (Documentation/admin-guide/cgroup-v1/memory.rst): ``memory.limit_in_bytes`` is the
limit, ``memory.max_usage_in_bytes`` the peak usage so far (RSS and page cache).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from app.mountinfo import read_mountinfo

G = TypeVar("G", bound="Cgroup")

#: Where hybrid and v1 hosts mount the hierarchy with the ``cpu`` (``memory``) controller.
CPU_MOUNT = "/sys/fs/cgroup/cpu"
MEMORY_MOUNT = "/sys/fs/cgroup/memory"
CPUSET_MOUNT = "/sys/fs/cgroup/cpuset"
#: The kernel's default CFS period (sched-bwc.rst), microseconds.
PERIOD_US = 100_000
#: Largest v1 ``cpu.shares`` (MAX_SHARES = 2^18 in kernel/sched/sched.h); default is 1024.
MAX_SHARES = 262_144


def cpu_mount_point(mount: str = CPU_MOUNT, controller: str = "cpu") -> str | None:
    """The v1 mount point of ``controller`` that ``mount`` resolves to, or None.

    ``mount`` may be a symlink (``/sys/fs/cgroup/cpu`` → ``cpu,cpuacct`` on many distros).
    """
    real = os.path.realpath(mount)
    for m in read_mountinfo():
        if m.fs_type == "cgroup" and controller in m.super_options and m.mount_point == real:
            return m.mount_point
    return None


def unavailable_reason(mount: str = CPU_MOUNT, controller: str = "cpu") -> str | None:
    """Why a v1 ``cpu`` cgroup with a CFS quota (a ``memory`` cgroup with a limit) cannot be
    created here; None if it can.

    Checks, in order: root; a cgroup v1 hierarchy with ``controller`` at ``mount`` (a cgroup
    v2-only host has none); CFS bandwidth control files and no quota on the mount root (the
    groups made here must be the only limit), or the memory limit (cpuset) file; that a child group
    can really be created and removed (read-only mounts in unprivileged containers fail here).
    """
    if os.geteuid() != 0:
        return f"needs root to create cgroups (running as uid {os.geteuid()})"
    point = cpu_mount_point(mount, controller)
    if point is None:
        v2_only = Path("/sys/fs/cgroup/cgroup.controllers").is_file()
        if v2_only:
            return f"cgroup v2-only host: no cgroup v1 {controller} hierarchy to create groups in"
        return f"{mount} is not a cgroup v1 hierarchy with the {controller} controller"
    root = Path(point)
    interface = {"memory": "memory.limit_in_bytes", "cpuset": "cpuset.cpus"}.get(controller)
    if interface is not None:
        if not (root / interface).is_file():
            return f"no {interface} at {point}"
        return _probe(root)
    if not (root / "cpu.cfs_quota_us").is_file():
        return f"no CFS bandwidth control at {point} (kernel without CONFIG_CFS_BANDWIDTH)"
    try:
        root_quota = int((root / "cpu.cfs_quota_us").read_text())
    except (OSError, ValueError) as error:
        return f"cannot read {point}/cpu.cfs_quota_us: {error}"
    if root_quota != -1:
        return f"{point} has its own CFS quota ({root_quota} us): measured quotas would mix"
    return _probe(root)


def _probe(root: Path) -> str | None:
    """Why a child group can't be created (and removed) under ``root``; None if it can."""
    probe = root / f"coretrain-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError as error:
        return f"cannot create a cgroup under {root}: {error.strerror or error}"
    with contextlib.suppress(OSError):
        probe.rmdir()
    return None


def parse_cpu_stat(text: str) -> dict[str, int]:
    """``cpu.stat`` → ``{"nr_periods": n, "nr_throttled": n, "throttled_time": ns, ...}``."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


@dataclass(frozen=True)
class Cgroup:
    """A live v1 cgroup: ``path`` is its directory, ``name`` its path below the mount."""

    path: Path
    name: str

    def pids(self) -> list[int]:
        """Processes currently in the group."""
        text = (self.path / "cgroup.procs").read_text()
        return [int(p) for p in text.split()]

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped so it runs inside the group.

        ``sh`` writes its own pid to ``cgroup.procs`` and then ``exec``s ``argv``: the
        program starts in the group, before it creates any thread, with no ``preexec_fn``.
        """
        script = 'echo $$ > "$0" && exec "$@"'
        return ["sh", "-c", script, str(self.path / "cgroup.procs"), *argv]


@dataclass(frozen=True)
class MemoryCgroup(Cgroup):
    """A live v1 memory cgroup."""

    def set_limit(self, limit_bytes: int) -> None:
        """``memory.limit_in_bytes``: the group's processes are OOM-killed past it."""
        (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))

    def peak(self) -> int:
        """``memory.max_usage_in_bytes``: the most the group has used (RSS + page cache)."""
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def failcnt(self) -> int:
        """``memory.failcnt``: how often the usage hit the limit."""
        return int((self.path / "memory.failcnt").read_text())


@dataclass(frozen=True)
class CpuCgroup(Cgroup):
    """A live v1 cpu cgroup."""

    def set_quota(self, cpus: float | None, period_us: int = PERIOD_US) -> None:
        """Limit the group to ``cpus`` CPUs (quota = round(cpus × period) µs); None = unlimited.

        Raises ValueError for a quota under the kernel's 1 ms minimum, OSError from the kernel.
        """
        (self.path / "cpu.cfs_period_us").write_text(str(period_us))
        if cpus is None:
            (self.path / "cpu.cfs_quota_us").write_text("-1")
            return
        quota_us = round(cpus * period_us)
        if quota_us < 1000:
            raise ValueError(f"{cpus} CPUs is a quota of {quota_us} us, under the 1 ms minimum")
        (self.path / "cpu.cfs_quota_us").write_text(str(quota_us))

    def set_shares(self, shares: int) -> None:
        """Set ``cpu.shares``, the group's weight against its siblings when CPUs are contended.

        The quota is a cap, not a reservation: on a busy machine a group with the default
        weight (1024, like one nice-0 task or one autogroup) may get far less than its quota.
        """
        (self.path / "cpu.shares").write_text(str(shares))

    def quota_us(self) -> int:
        """The group's ``cpu.cfs_quota_us`` (µs per period, -1 = unlimited)."""
        return int((self.path / "cpu.cfs_quota_us").read_text())

    def stat(self) -> dict[str, int]:
        """The group's ``cpu.stat`` counters (periods, throttled periods, throttled ns)."""
        return parse_cpu_stat((self.path / "cpu.stat").read_text())


@contextlib.contextmanager
def cpu_cgroup(
    cpus: float | None,
    prefix: str = "coretrain",
    mount: str = CPU_MOUNT,
    shares: int | None = None,
) -> Iterator[CpuCgroup]:
    """Create a fresh cpu cgroup limited to ``cpus`` CPUs, yield it, and always remove it.

    ``shares``: ``cpu.shares`` for the group (None = the kernel's default, 1024).

    The group sits directly under the mount point with a unique name. On exit any process
    still inside is moved back to the mount root (the kernel refuses to remove a group with
    members) and the directory is removed, also when the body raised. Raises OSError when
    the group cannot be created (see :func:`unavailable_reason`).
    """
    with _fresh(CpuCgroup, mount, "cpu", prefix) as group:
        group.set_quota(cpus)
        if shares is not None:
            group.set_shares(shares)
        yield group


@contextlib.contextmanager
def memory_cgroup(
    limit_bytes: int, prefix: str = "coretrain", mount: str = MEMORY_MOUNT
) -> Iterator[MemoryCgroup]:
    """Create a fresh memory cgroup limited to ``limit_bytes``, yield it, always remove it
    (as :func:`cpu_cgroup`). Raises OSError when it cannot be created."""
    with _fresh(MemoryCgroup, mount, "memory", prefix) as group:
        group.set_limit(limit_bytes)
        yield group


@contextlib.contextmanager
def cpuset_cgroup(
    cpus: Sequence[int], prefix: str = "coretrain", mount: str = CPUSET_MOUNT
) -> Iterator[Cgroup]:
    """Create a fresh cpuset cgroup holding only ``cpus`` (its memory nodes: the parent's),
    yield it, always remove it (as :func:`cpu_cgroup`). The kernel narrows the affinity of a
    process that joins it to ``cpus`` (Documentation/admin-guide/cgroup-v1/cpusets.rst).
    Raises OSError when it cannot be created (also for CPUs the parent does not have)."""
    with _fresh(Cgroup, mount, "cpuset", prefix) as group:
        mems = (group.path.parent / "cpuset.mems").read_text().strip()
        (group.path / "cpuset.cpus").write_text(",".join(str(c) for c in cpus))
        (group.path / "cpuset.mems").write_text(mems)
        yield group


def in_groups(groups: Sequence[Cgroup], argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped so it starts inside every group of ``groups`` (one per hierarchy),
    as :meth:`Cgroup.command` does for one."""
    joins = " && ".join(f'echo $$ > "${i}"' for i in range(len(groups)))
    script = f'{joins} && shift {len(groups) - 1} && exec "$@"'
    return ["sh", "-c", script, *(str(g.path / "cgroup.procs") for g in groups), *argv]


@contextlib.contextmanager
def _fresh(kind: type[G], mount: str, controller: str, prefix: str) -> Iterator[G]:
    """A new group of ``kind`` directly under ``controller``'s mount point, removed on exit."""
    point = cpu_mount_point(mount, controller)
    if point is None:
        raise OSError(f"{mount} is not a cgroup v1 hierarchy with the {controller} controller")
    name = f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path = Path(point) / name
    path.mkdir()
    group = kind(path=path, name=name)
    try:
        yield group
    finally:
        _remove(group, Path(point))


def _remove(group: Cgroup, root: Path) -> None:
    """Move leftover members to ``root`` and rmdir the group (retrying while they exit)."""
    for attempt in range(50):
        with contextlib.suppress(OSError):
            for pid in group.pids():
                with contextlib.suppress(OSError):
                    (root / "cgroup.procs").write_text(str(pid))
        try:
            group.path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if attempt == 49:
                raise
            time.sleep(0.1)
