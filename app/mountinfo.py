"""The mount table of this process: the one parser of ``/proc/self/mountinfo``.

Line format (proc_pid_mountinfo(5); written by ``show_mountinfo`` in fs/proc_namespace.c)::

    36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    (1)(2) (3)  (4)   (5)     (6)       (7)   (8) (9)    (10)         (11)

(1) mount ID, (2) parent mount ID, (3) ``major:minor`` of the filesystem's device, (4) root:
the directory of the filesystem that is mounted (for an nsfs mount not a path but the
namespace, e.g. ``net:[4026532570]``), (5) mount point, relative to the process's root,
(6) per-mount options, (7) zero or more optional fields ``tag[:value]`` (``shared:290``,
``master:16``), (8) the separator ``-``, (9) filesystem type, (10) mount source, (11)
per-superblock options. The kernel escapes space, tab, newline and backslash in (4), (5),
(9) and (10) as ``\\ooo`` (octal: ``\\040`` is a space).

A low-level module: nothing from the rest of the project (``app.atomic`` and the cgroup
detection in ``app.budget.cgroups`` both use it), no TensorFlow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: The file this process's mount table is read from (proc_pid_mountinfo(5)).
MOUNTINFO = "/proc/self/mountinfo"

_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo, its escapes decoded (module docstring: fields 1-11).

    Attributes:
        mount_id, parent_id: fields 1 and 2, as written (decimal).
        device: field 3, ``major:minor``.
        root: field 4, the directory of the filesystem that forms the mount's root.
        mount_point: field 5, the path the mount is seen at.
        mount_options: field 6, e.g. ``{"rw", "nosuid"}``.
        optional_fields: fields 7, in order, e.g. ``("shared:290",)``.
        fs_type: field 9, e.g. ``"cgroup2"``.
        source: field 10, e.g. ``"/dev/sda1"`` or ``"none"``.
        super_options: field 11, e.g. ``{"rw", "cpu", "cpuacct"}``.
        line: the line as read, escapes and all.
    """

    mount_id: str
    parent_id: str
    device: str
    root: str
    mount_point: str
    mount_options: frozenset[str]
    optional_fields: tuple[str, ...]
    fs_type: str
    source: str
    super_options: frozenset[str]
    line: str


def unescape(text: str) -> str:
    """Decode the kernel's octal escapes in a mountinfo field: ``\\040`` → space."""
    return _ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), text)


def _parse_line(line: str) -> Mount | None:
    """One mountinfo line as a :class:`Mount`; None when it is malformed.

    Malformed: no ``-`` separator after the six fixed fields, or fewer than the filesystem
    type and the source after it. Missing super options read as ``{""}``.
    """
    fields = line.split()
    separator = fields.index("-", 6) if "-" in fields[6:] else -1
    if separator < 0 or len(fields) < separator + 3:
        return None
    super_options = fields[separator + 3] if len(fields) > separator + 3 else ""
    return Mount(
        mount_id=fields[0],
        parent_id=fields[1],
        device=fields[2],
        root=unescape(fields[3]),
        mount_point=unescape(fields[4]),
        mount_options=frozenset(fields[5].split(",")),
        optional_fields=tuple(fields[6:separator]),
        fs_type=unescape(fields[separator + 1]),
        source=unescape(fields[separator + 2]),
        super_options=frozenset(super_options.split(",")),
        line=line,
    )


def parse_mountinfo(text: str) -> tuple[list[Mount], list[str]]:
    """Parse the text of a mountinfo file: every mount, in file order.

    Returns:
        ``(mounts, problems)``: one :class:`Mount` per well-formed line, and one message per
        malformed line (``"mountinfo line N is malformed and was skipped: '...'"``), which is
        skipped, never fatal. Blank lines are neither.
    """
    mounts: list[Mount] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        mount = _parse_line(line)
        if mount is None:
            problems.append(f"mountinfo line {number} is malformed and was skipped: {line!r}")
        else:
            mounts.append(mount)
    return mounts, problems


def read_mountinfo(path: str = MOUNTINFO) -> list[Mount]:
    """The well-formed mounts of ``path`` (default this process's), in its order.

    Returns ``[]`` when the file cannot be read (no ``/proc``); malformed lines are skipped.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return []
    return parse_mountinfo(text)[0]
