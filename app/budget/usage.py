"""CPU throttling as the kernel counts it: ``cpu.stat`` of the cgroup whose quota is the limit.

CFS bandwidth control (Documentation/scheduler/sched-bwc.rst, "Statistics") counts, per
cgroup, the enforcement periods that had runnable tasks (``nr_periods``), those in which
the group ran out of quota and was stopped (``nr_throttled``) and the time it stood
still (``throttled_time`` in ns on cgroup v1; ``throttled_usec`` in µs on v2, where the
same file also has ``usage_usec``). Between two reads, throttled periods / periods is
the share of periods in which the kernel held the job back, and the throttled time how
long. Read under a root like the rest of app.budget; no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.budget.rootfiles import RootFiles

#: An interval throttled in more than this share of its periods gets a warning event.
THROTTLED_WARNING_RATIO = 0.25


@dataclass(frozen=True)
class CpuStat:
    """Cumulative counters of one ``cpu.stat``: periods, throttled periods, seconds."""

    periods: int
    throttled: int
    throttled_s: float


def read_cpu_stat(path: str | None, root: str = "/") -> CpuStat | None:
    """Parse ``cpu.stat`` at ``path`` (as seen from ``root``); None when absent/unreadable.

    v1 reports ``throttled_time`` in nanoseconds, v2 ``throttled_usec`` in microseconds.
    """
    if path is None:
        return None
    text = RootFiles(root).read(path)
    if text is None:
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[key] = int(value)
    if "nr_periods" not in values or "nr_throttled" not in values:
        return None
    if "throttled_usec" in values:
        seconds = values["throttled_usec"] / 1e6
    else:
        seconds = values.get("throttled_time", 0) / 1e9
    return CpuStat(values["nr_periods"], values["nr_throttled"], seconds)


@dataclass
class Throttling:
    """Throttling per interval: call :meth:`read` at each progress event.

    ``cpu_throttled_ratio`` is throttled periods / periods over the interval (None when
    no period elapsed: no quota, or nothing ran); ``cpu_throttled_s`` the seconds spent
    throttled; both None when ``cpu.stat`` can't be read.
    """

    path: str | None
    root: str = "/"
    last: CpuStat | None = None

    def __post_init__(self) -> None:
        self.last = read_cpu_stat(self.path, self.root)

    def read(self) -> dict[str, float | None]:
        now = read_cpu_stat(self.path, self.root)
        before, self.last = self.last, now
        if now is None or before is None:
            return {"cpu_throttled_ratio": None, "cpu_throttled_s": None}
        periods = now.periods - before.periods
        throttled = now.throttled - before.throttled
        return {
            "cpu_throttled_ratio": round(throttled / periods, 3) if periods > 0 else None,
            "cpu_throttled_s": round(max(now.throttled_s - before.throttled_s, 0.0), 3),
        }
