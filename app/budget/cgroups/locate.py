"""Locating a controller's hierarchy: which mount, which cgroup directory below it.

How a controller's directory is found (proc_pid_cgroup(7), proc_pid_mountinfo(5)):

1. ``/proc/self/cgroup`` gives the process's cgroup path per hierarchy: ``ID:ctrl,ctrl:/path``
   for v1 (named hierarchies appear as ``name=systemd``), ``0::/path`` for the v2 hierarchy.
2. ``/proc/self/mountinfo`` gives, for each cgroup mount, its mount point (field 5), the
   path of the mount's root inside the hierarchy (field 4) and, for v1, the controllers in
   the super options (:mod:`app.mountinfo` parses it and decodes its ``\\ooo`` escapes).
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
"""

from __future__ import annotations

from collections.abc import Iterable

from app.budget.cgroups.hierarchy import Hierarchy, relative_to_mount_root
from app.budget.cgroups.proc_cgroup import CgroupEntry, parse_proc_cgroup
from app.budget.cgroups.usual_mounts import usual_mount
from app.budget.rootfiles import RootFiles
from app.mountinfo import Mount, parse_mountinfo


def cgroup_mounts(mounts: Iterable[Mount]) -> list[Mount]:
    """The ``cgroup`` (v1) and ``cgroup2`` mounts among ``mounts``, in their order."""
    return [mount for mount in mounts if mount.fs_type in ("cgroup", "cgroup2")]


def read_proc_files(probe: RootFiles) -> tuple[list[CgroupEntry], list[Mount]]:
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


def locate(
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
    guessed = usual_mount(controller, 1, entry, probe)
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
    guessed = usual_mount(controller, 2, entry, probe)
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
