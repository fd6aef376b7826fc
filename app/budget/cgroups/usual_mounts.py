"""The usual mount points, tried for a hierarchy that mountinfo does not show.

Without a mountinfo line for a hierarchy (file missing, line absent or malformed) its
controller's files are looked for where systemd, docker, podman and containerd mount it,
and used only when the interface file is there (docs/cpu-budget.md, "Fallbacks").
"""

from __future__ import annotations

import posixpath

from app.budget.cgroups.hierarchy import Hierarchy
from app.budget.cgroups.proc_cgroup import CgroupEntry
from app.budget.rootfiles import RootFiles

#: Where systemd, docker, podman and containerd mount cgroup2 (``unified``: hybrid systemd).
USUAL_V2_MOUNTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")

#: Parent of the v1 mounts, each named after its controllers (``cpu,cpuacct``) or one of them.
USUAL_V1_PARENT = "/sys/fs/cgroup"


def _usual_mounts(controller: str, version: int, entry: CgroupEntry | None) -> list[str]:
    """Usual mount points of the hierarchy (systemd's names): v2 first, then v1 by name."""
    if version == 2:
        return list(USUAL_V2_MOUNTS)
    names = [",".join(sorted(entry.controllers))] if entry else []
    return [f"{USUAL_V1_PARENT}/{name}" for name in dict.fromkeys([*names, controller])]


def usual_mount(
    controller: str, version: int, entry: CgroupEntry | None, probe: RootFiles
) -> Hierarchy | None:
    """A hierarchy at a usual mount point, when mountinfo has no line for it (locate, step 6).

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
