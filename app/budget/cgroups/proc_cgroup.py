"""The process's cgroup paths: ``/proc/self/cgroup`` (proc_pid_cgroup(7)).

One line per hierarchy, ``hierarchy-ID:controller-list:cgroup-path``: ``ID:ctrl,ctrl:/path``
for v1 (named hierarchies appear as ``name=systemd``), ``0::/path`` for the v2 hierarchy.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CgroupEntry:
    """One line of ``/proc/self/cgroup``: hierarchy id, its controllers and the cgroup path."""

    hierarchy_id: str
    controllers: frozenset[str]
    path: str


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
