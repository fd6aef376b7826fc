"""How the candidates of a choice are timed: process CPU time per call, interleaved rounds.

The measure is the process's CPU time per call (``CLOCK_PROCESS_CPUTIME_ID``: every thread
of the process, in nanoseconds), not the wall clock: a busy process on the same CPUs takes
turns with the step's threads and stretches the wall time of every call (2.2–2.6× beside
two busy loops pinned one to each of 2 vCPUs), and unevenly (the many small ops of the fast
formulation wait at more barriers than the plain one's few large ones: on an Intel Xeon with
AMX fast/bfloat16 led plain/bfloat16 21.2 to 29.1 ms quiet, 51.5 to 52.0 loaded), but it
does not change the work a call needs: beside the same loops the CPU time of the fast
candidates moved by 1–2 %, their ratio 1.398 → 1.404 (docs/performance.md, "A choice that
holds"). What CPU time does not see, the share of the wall time a call leaves a thread idle,
differed by up to 10 % between the candidates measured quiet (CPU / wall time 1.70–1.92 on
2 vCPUs): app/training/state/choose.py's margin covers it.

Each call is warmed up (:data:`WARMUP_CALLS`, the first traces it), then timed in rounds of
calls (enough for :data:`ROUND_CPU_MS` of CPU time, at least :data:`CALLS_PER_ROUND`), the
candidates interleaved (a moment of load from elsewhere hurts one round, not one candidate); a
round's figure is the least CPU time of its calls, each timed alone, and a candidate's the
least over its rounds (load adds time, it never removes any: beside busy processes a step's
threads spin while one of them waits for its CPU, and short steps lose most to it). A candidate
whose figure after :data:`DROP_AFTER` rounds or more is over :data:`CANNOT_WIN` times the least
is not timed again (one round is not enough: on Zen 4, quiet, a single slow round put
fast/float32 at 1.6–2.3× fast/bfloat16, whose ratio is 1.35–1.45). Its **spread** is how much
its CPU time relative to the round's least moves from round to round (the median absolute
deviation of that ratio, over its median): what the decision depends on. A slow spell of the
whole VM that stretches every candidate of a few rounds alike (seen quiet, with no other
process on the CPUs and nothing stolen: 20 % for 1.5 s) leaves it unmoved. After :data:`ROUNDS`
rounds, while a candidate still timed spreads over :data:`NOISE`, or the caller's decision is
not ``settled`` by the figures (a decision close to its margin: app/training/state/choose.py),
another round is timed, up to :data:`MAX_ROUNDS`: the least over more rounds is less likely to
lie in one slow spell of the VM. What the CPUs did meanwhile is read from ``/proc/stat``
(proc(5)) for the CPUs this process may run on: the share of their time other processes used
(``others``) and the hypervisor took (``steal``).
No TensorFlow here: the calls are given.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

WARMUP_CALLS = 2
#: Calls a round times: at least this many, and enough for :data:`ROUND_CPU_MS` of CPU time
#: (a round of a few short calls is mostly timer and scheduler noise).
CALLS_PER_ROUND = 2
ROUND_CPU_MS = 60.0
MAX_CALLS_PER_ROUND = 50
ROUNDS = 5
MAX_ROUNDS = 10
#: A candidate this many times the least CPU time after :data:`DROP_AFTER` rounds or more is
#: not timed again.
CANNOT_WIN = 1.5
DROP_AFTER = 2
#: A spread (above) or a stolen share over this is noise the figures can't be trusted
#: through. Measured (Zen 4, batch 1,000, the four step candidates and two forward passes):
#: 0.5–2.6 % quiet, 0.4–1.5 % beside busy processes pinned to both vCPUs
#: (docs/performance.md, "A choice that holds").
NOISE = 0.05
#: How candidates are timed: part of what a kept choice depends on (app/training/state/kept.py).
RULE = {
    "clock": "process CPU time, the least call", "warmup": WARMUP_CALLS, "calls": CALLS_PER_ROUND,
    "round_cpu_ms": ROUND_CPU_MS, "max_calls": MAX_CALLS_PER_ROUND,
    "rounds": ROUNDS, "max_rounds": MAX_ROUNDS, "cannot_win": CANNOT_WIN,
    "drop_after": DROP_AFTER, "noise": NOISE,
    "spread": "median absolute deviation of the ratio to the round's least, over its median",
}  # fmt: skip

STAT = "/proc/stat"
#: /proc/stat's fields after ``cpuN`` (proc(5)) counted as busy; ``guest`` is in ``user``.
_BUSY = (0, 1, 2, 5, 6)  # user nice system irq softirq
_STEAL = 7

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Timed:
    """A candidate's figures: ``cpu_ms``, the least process CPU ms per call over its rounds
    (what decides), ``wall_ms`` the least wall ms per call, ``spread`` (module docstring;
    0 after one round, or timed alone), ``rounds`` timed."""

    cpu_ms: float
    wall_ms: float
    spread: float
    rounds: int


@dataclass(frozen=True)
class Load:
    """What the CPUs this process may use did while it timed: shares of their time used by
    other processes (``others``) and taken by the hypervisor (``steal``), 0–1; None where
    ``/proc/stat`` could not be read."""

    others: float | None
    steal: float | None

    def to_json(self) -> dict[str, Any]:
        return {"others": self.others, "steal": self.steal}

    def worst(self, other: Load | None) -> Load:
        """The larger of each share of this and ``other`` (None: this)."""
        if other is None:
            return self
        return Load(_larger(self.others, other.others), _larger(self.steal, other.steal))


def _larger(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def time_calls(
    calls: dict[K, Callable[[], Any]], settled: Callable[[dict[K, Timed]], bool] | None = None
) -> tuple[dict[K, Timed], Load]:
    """Each of ``calls`` (each returns a tensor, waited for with ``.numpy()``) timed as the
    module docstring says, and the load the CPUs saw meanwhile. ``settled``: whether the
    figures of the candidates still timed decide clearly enough to stop (None: always)."""
    count = {c: _calls_per_round(call) for c, call in calls.items()}
    span = Span()
    rounds: list[dict[K, tuple[float, float]]] = []
    timed = list(calls)
    while True:
        rounds.append({c: _per_call(calls[c], count[c]) for c in timed})
        figures = {c: _figures(c, rounds) for c in calls}
        left = contenders(figures)
        timed = [c for c in timed if c in left]
        done = len(rounds)
        steady = not noisy(left.values()) and (settled is None or settled(left))
        if done >= MAX_ROUNDS or (done >= ROUNDS and steady):
            break
    return figures, span.load()


def contenders(figures: dict[K, Timed]) -> dict[K, Timed]:
    """The figures of the candidates that can still win, the ones timed to the end: all but
    those over :data:`CANNOT_WIN` times the least after :data:`DROP_AFTER` rounds or more
    (their spread, from the rounds before they were left out, says nothing of the decision)."""
    least = min((t.cpu_ms for t in figures.values()), default=0.0)
    return {
        c: t for c, t in figures.items()
        if t.rounds < DROP_AFTER or t.cpu_ms <= CANNOT_WIN * least
    }  # fmt: skip


def _calls_per_round(call: Callable[[], Any]) -> int:
    """Warm ``call`` up (:data:`WARMUP_CALLS`, the first traces it) and size its rounds from
    the CPU time of the last warm-up call (:data:`ROUND_CPU_MS`)."""
    for _ in range(WARMUP_CALLS - 1):
        call().numpy()
    cpu_ms, _ = _per_call(call, 1)
    wanted = math.ceil(ROUND_CPU_MS / cpu_ms) if cpu_ms > 0 else MAX_CALLS_PER_ROUND
    return min(max(wanted, CALLS_PER_ROUND), MAX_CALLS_PER_ROUND)


def noisy(figures: Iterable[Timed]) -> bool:
    """Whether any of ``figures`` spreads over :data:`NOISE`."""
    return any(t.spread > NOISE for t in figures)


def _per_call(call: Callable[[], Any], count: int) -> tuple[float, float]:
    """(process CPU ms, wall ms) of the least of ``count`` calls, each timed alone."""
    cpu_ms, wall_ms = float("inf"), float("inf")
    for _ in range(count):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        call().numpy()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        cpu_ms, wall_ms = min(cpu_ms, cpu * 1e3), min(wall_ms, wall * 1e3)
    return cpu_ms, wall_ms


def _figures(c: K, rounds: list[dict[K, tuple[float, float]]]) -> Timed:
    """Candidate ``c``'s figures over the ``rounds`` it was timed in (module docstring)."""
    mine = [r for r in rounds if c in r]
    cpu = [r[c][0] for r in mine]
    relative = [r[c][0] / least for r in mine if len(r) > 1 and (least := _least(r)) > 0]
    spread = 0.0
    if len(relative) > 1:
        middle = statistics.median(relative)
        spread = statistics.median(abs(x - middle) for x in relative) / middle
    return Timed(min(cpu), min(r[c][1] for r in mine), spread, len(mine))


def _least(one_round: dict[Any, tuple[float, float]]) -> float:
    return min(cpu for cpu, _ in one_round.values())


class Span:
    """The load on this process's CPUs from the span's start (its making) to each
    :meth:`load`: what other processes and the hypervisor took meanwhile."""

    def __init__(self) -> None:
        self.cpus = sorted(os.sched_getaffinity(0))
        self.before = read_stat(self.cpus)
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def load(self) -> Load:
        own, wall = time.process_time() - self.cpu0, time.perf_counter() - self.wall0
        return load_between(self.before, read_stat(self.cpus), own, wall, len(self.cpus))


def read_stat(cpus: list[int], path: str = STAT) -> tuple[float, float] | None:
    """(busy, stolen) seconds so far of ``cpus`` from ``/proc/stat`` (proc(5): per-CPU
    lines in USER_HZ ticks); None when it can't be read or lacks one of them."""
    try:
        with open(path, encoding="ascii") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    wanted, busy, steal, seen = {f"cpu{c}" for c in cpus}, 0, 0, 0
    for line in lines:
        name, *fields = line.split()
        if name not in wanted or len(fields) <= _STEAL or not all(f.isdigit() for f in fields):
            continue
        busy += sum(int(fields[i]) for i in _BUSY)
        steal += int(fields[_STEAL])
        seen += 1
    if seen != len(wanted):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    return busy / hz, steal / hz


def load_between(
    before: tuple[float, float] | None, after: tuple[float, float] | None, own_cpu_s: float,
    wall_s: float, cpus: int,
) -> Load:  # fmt: skip
    """The :class:`Load` between two :func:`read_stat` readings, this process having used
    ``own_cpu_s`` of ``cpus`` CPUs over ``wall_s``."""
    if before is None or after is None or wall_s <= 0 or cpus <= 0:
        return Load(None, None)
    capacity = wall_s * cpus
    others = max(after[0] - before[0] - own_cpu_s, 0.0) / capacity
    steal = max(after[1] - before[1], 0.0) / capacity
    return Load(round(min(others, 1.0), 3), round(min(steal, 1.0), 3))
