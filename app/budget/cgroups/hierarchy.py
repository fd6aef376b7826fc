"""Where one controller's files are: a hierarchy's mount and the chain of cgroup directories.

The process's directory is ``mount point + (cgroup path - mount root)`` (the mount root is
field 4 of proc_pid_mountinfo(5), the cgroup path comes from proc_pid_cgroup(7)); the chain
runs from it up to the mount point. Ancestors above the mount root are invisible.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from app.budget.rootfiles import RootFiles

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
