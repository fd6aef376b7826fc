"""Run a command inside a fresh cgroup v1 ``cpu`` group with a real CFS quota.

Used by ``benchmarks.cpu_rounding`` and ``tests/test_real_cgroup.py``. Needs root and a
writable cgroup v1 hierarchy that carries the ``cpu`` controller (``/sys/fs/cgroup/cpu`` on
hybrid hosts); :func:`unavailable_reason` says why not when that is missing.

Kernel interface (Documentation/scheduler/sched-bwc.rst): ``cpu.cfs_period_us`` and
``cpu.cfs_quota_us`` in microseconds (quota/period = CPUs; each between 1 ms and 1 s, quota
``-1`` = unlimited); ``cpu.stat`` counts ``nr_periods`` (periods in which the group was
runnable), ``nr_throttled`` (periods in which it ran out of quota) and ``throttled_time``
(nanoseconds its CPUs spent throttled). A process joins a group when its pid is written to
``cgroup.procs`` (Documentation/admin-guide/cgroup-v1/cgroups.rst); its children stay there.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.budget.cgroups import parse_mountinfo

#: Where hybrid and v1 hosts mount the hierarchy with the ``cpu`` controller.
CPU_MOUNT = "/sys/fs/cgroup/cpu"
#: The kernel's default CFS period (sched-bwc.rst), microseconds.
PERIOD_US = 100_000
#: Largest v1 ``cpu.shares`` (MAX_SHARES = 2^18 in kernel/sched/sched.h); default is 1024.
MAX_SHARES = 262_144


def cpu_mount_point(mount: str = CPU_MOUNT) -> str | None:
    """The v1 mount point of the ``cpu`` controller that ``mount`` resolves to, or None.

    ``mount`` may be a symlink (``/sys/fs/cgroup/cpu`` → ``cpu,cpuacct`` on many distros).
    """
    try:
        text = Path("/proc/self/mountinfo").read_text(encoding="utf-8")
    except OSError:
        return None
    real = os.path.realpath(mount)
    mounts, _ = parse_mountinfo(text)
    for m in mounts:
        if m.fs_type == "cgroup" and "cpu" in m.super_options and m.mount_point == real:
            return m.mount_point
    return None


def unavailable_reason(mount: str = CPU_MOUNT) -> str | None:
    """Why a v1 ``cpu`` cgroup with a CFS quota cannot be created here; None if it can.

    Checks, in order: root; a cgroup v1 hierarchy with ``cpu`` at ``mount`` (a cgroup
    v2-only host has none); CFS bandwidth control files; no quota on the mount root (the
    groups made here must be the only limit); that a child group can really be created and
    removed (read-only mounts in unprivileged containers fail here).
    """
    if os.geteuid() != 0:
        return f"needs root to create cgroups (running as uid {os.geteuid()})"
    point = cpu_mount_point(mount)
    if point is None:
        v2_only = Path("/sys/fs/cgroup/cgroup.controllers").is_file()
        if v2_only:
            return "cgroup v2-only host: no cgroup v1 cpu hierarchy to create groups in"
        return f"{mount} is not a cgroup v1 hierarchy with the cpu controller"
    root = Path(point)
    if not (root / "cpu.cfs_quota_us").is_file():
        return f"no CFS bandwidth control at {point} (kernel without CONFIG_CFS_BANDWIDTH)"
    try:
        root_quota = int((root / "cpu.cfs_quota_us").read_text())
    except (OSError, ValueError) as error:
        return f"cannot read {point}/cpu.cfs_quota_us: {error}"
    if root_quota != -1:
        return f"{point} has its own CFS quota ({root_quota} us): measured quotas would mix"
    probe = root / f"coretrain-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError as error:
        return f"cannot create a cgroup under {point}: {error.strerror or error}"
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
class CpuCgroup:
    """A live v1 cpu cgroup: ``path`` is its directory, ``name`` its path below the mount."""

    path: Path
    name: str

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
    point = cpu_mount_point(mount)
    if point is None:
        raise OSError(f"{mount} is not a cgroup v1 hierarchy with the cpu controller")
    name = f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path = Path(point) / name
    path.mkdir()
    group = CpuCgroup(path=path, name=name)
    try:
        group.set_quota(cpus)
        if shares is not None:
            group.set_shares(shares)
        yield group
    finally:
        _remove(group, Path(point))


def _remove(group: CpuCgroup, root: Path) -> None:
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
