"""The kernel's CPU list syntax ("0-3,8,10-11"), as in cpuset files and sysfs.

Source of the format: the kernel's ``bitmap_parselist``/``%*pbl`` printing, used by
``/sys/devices/system/cpu/online``, ``cpuset.cpus`` (cgroup v1), ``cpuset.cpus.effective``
(cgroup v2), ``thread_siblings_list``, ``node*/cpulist`` and ``Cpus_allowed_list`` in
``/proc/<pid>/status`` (Documentation/admin-guide/cgroup-v2.rst, "Cpuset Interface Files").
"""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse a CPU list such as ``"0-3,8,10-11\\n"`` into sorted, unique CPU ids.

    An empty or all-whitespace string is the empty set (a cpuset file with no CPUs).

    Returns:
        Sorted tuple of CPU ids, e.g. ``(0, 1, 2, 3, 8, 10, 11)``.

    Raises:
        ValueError: on anything but comma-separated non-negative ids and ``a-b`` ranges
            with ``a <= b`` (the kernel's stride form ``0-7:2`` is not used in these files
            and is rejected).
    """
    cpus: set[int] = set()
    stripped = text.strip()
    if not stripped:
        return ()
    for part in stripped.split(","):
        item = part.strip()
        first, sep, last = item.partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise ValueError(f"bad CPU list item {item!r} in {stripped!r}")
        low = int(first)
        high = int(last) if sep else low
        if high < low:
            raise ValueError(f"bad CPU range {item!r} in {stripped!r}")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format CPU ids in the kernel's compact form: ``[0, 1, 2, 3, 8]`` → ``"0-3,8"``.

    Returns ``""`` for no CPUs. The inverse of :func:`parse_cpulist`.
    """
    ordered = sorted(set(cpus))
    parts: list[str] = []
    index = 0
    while index < len(ordered):
        start = ordered[index]
        while index + 1 < len(ordered) and ordered[index + 1] == ordered[index] + 1:
            index += 1
        end = ordered[index]
        parts.append(str(start) if start == end else f"{start}-{end}")
        index += 1
    return ",".join(parts)
