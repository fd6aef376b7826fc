"""How a choice's candidates are timed: CPU time in interleaved rounds, the load seen."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from app.training.state import timing


class _Call:
    """A call returning something with ``numpy()`` (as a tensor), counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self

    def numpy(self) -> None:
        return None


def _scripted(monkeypatch: pytest.MonkeyPatch, rounds: dict[Any, list[float]]) -> list[Any]:
    """Make each round of a call return the next of ``rounds[call]`` as its CPU ms (and twice
    that as wall ms); the calls in the order they were timed."""
    timed: list[Any] = []
    left = {name: list(values) for name, values in rounds.items()}

    def per_call(call: Any, count: int) -> tuple[float, float]:
        timed.append(call.name)
        cpu = left[call.name].pop(0)
        return cpu, 2 * cpu

    monkeypatch.setattr(timing, "_per_call", per_call)
    monkeypatch.setattr(timing, "_calls_per_round", lambda call: 2)
    return timed


def _calls(*names: str) -> dict[str, Any]:
    calls = {}
    for name in names:
        call = _Call()
        call.name = name  # type: ignore[attr-defined]
        calls[name] = call
    return calls


def test_rounds_interleave_and_the_least_round_is_the_figure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timed = _scripted(monkeypatch, {"a": [10, 11, 10.5, 10, 10.2], "b": [12, 12.5, 13, 12, 12]})
    figures, load = timing.time_calls(_calls("a", "b"))
    assert timed == ["a", "b"] * timing.ROUNDS  # interleaved, a round each in turn
    assert (figures["a"].cpu_ms, figures["a"].wall_ms, figures["a"].rounds) == (10, 20, 5)
    assert figures["b"].cpu_ms == 12
    # The spread: how b's CPU time relative to the round's least (a's) moves, 1.2, 1.136,
    # 1.238, 1.2, 1.176: their median absolute deviation (1.2 - 1.176) over their median.
    assert figures["b"].spread == pytest.approx((1.2 - 12 / 10.2) / 1.2)
    assert figures["a"].spread == 0  # the least in every round
    assert load.others is not None and 0 <= load.others <= 1  # /proc/stat read on Linux


def test_a_slow_spell_of_every_candidate_is_no_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rounds 2-4 20 % slower for both (the whole VM slowed): the ratio holds, no more rounds.
    _scripted(monkeypatch, {"a": [10, 12, 12, 12, 10], "b": [15, 18, 18, 18, 15]})
    figures, _ = timing.time_calls(_calls("a", "b"))
    assert (figures["a"].spread, figures["b"].spread) == (0, 0)
    assert figures["b"].rounds == timing.ROUNDS and not timing.noisy(figures.values())


@pytest.mark.parametrize(("cpu_ms", "expected"), [(40.0, 2), (4.0, 15), (0.5, 50), (0.0, 50)])
def test_a_round_lasts_long_enough_to_be_more_than_timer_noise(
    monkeypatch: pytest.MonkeyPatch, cpu_ms: float, expected: int
) -> None:
    monkeypatch.setattr(timing, "_per_call", lambda call, count: (cpu_ms, cpu_ms))
    call = _Call()
    assert timing._calls_per_round(call) == expected  # ROUND_CPU_MS (60) of CPU, 2 to 50 calls
    assert call.calls == timing.WARMUP_CALLS - 1  # and the last warm-up call was the timed one


def test_a_round_is_its_least_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call timed alone, the round's figure its least (load only adds time)."""
    from types import SimpleNamespace

    # Clock readings around three calls: CPU 5, 1, 3 ms; wall 9, 2, 4 ms.
    cpu = iter([0.0, 0.005, 1.0, 1.001, 2.0, 2.003])
    wall = iter([0.0, 0.009, 1.0, 1.002, 2.0, 2.004])
    clocks = SimpleNamespace(process_time=lambda: next(cpu), perf_counter=lambda: next(wall))
    monkeypatch.setattr(timing, "time", clocks)
    call = _Call()
    assert timing._per_call(call, 3) == pytest.approx((1.0, 2.0))
    assert call.calls == 3


def test_a_candidate_that_cannot_win_is_not_timed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    timed = _scripted(monkeypatch, {"fast": [10.0] * 5, "slow": [30.0, 31.0]})
    figures, _ = timing.time_calls(_calls("fast", "slow"))
    assert timed.count("slow") == timing.DROP_AFTER == 2 and timed.count("fast") == timing.ROUNDS
    assert (figures["slow"].cpu_ms, figures["slow"].rounds) == (30, 2)


def test_a_candidate_left_out_does_not_make_the_measurement_noisy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # slow's two rounds spread (3.0, 3.6 of fast's): it can't win, and its spread says nothing.
    _scripted(monkeypatch, {"fast": [10.0] * 5, "slow": [30.0, 36.0]})
    figures, _ = timing.time_calls(_calls("fast", "slow"))
    assert figures["slow"].spread > timing.NOISE and figures["fast"].rounds == timing.ROUNDS
    assert list(timing.contenders(figures)) == ["fast"]
    assert not timing.noisy(timing.contenders(figures).values())
    assert timing.contenders({}) == {}


def test_one_slow_round_does_not_drop_a_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    # a's first round 2x b's (a slow spell), then 1.2x: it is timed on and its figure is 12.
    timed = _scripted(monkeypatch, {"a": [20.0] + [12.0] * 4, "b": [10.0] * 5})
    figures, _ = timing.time_calls(_calls("a", "b"))
    assert timed.count("a") == timing.ROUNDS
    assert (figures["a"].cpu_ms, figures["a"].rounds) == (12, timing.ROUNDS)


def test_an_unsettled_decision_gets_more_rounds_up_to_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def settled(figures: dict) -> bool:  # the caller's: a's lead over b clear beyond 1.3
        return figures["a"].cpu_ms / figures["b"].cpu_ms > 1.3

    # b 10 ms for five rounds (a/b 1.15: not settled), then 8 (1.44): settled at round six.
    timed = _scripted(monkeypatch, {"a": [11.5] * 10, "b": [10.0] * 5 + [8.0] * 5})
    figures, _ = timing.time_calls(_calls("a", "b"), settled)
    assert figures["a"].rounds == timing.ROUNDS + 1 == timed.count("b")
    # Never settled: MAX_ROUNDS, and the figures as they are.
    _scripted(monkeypatch, {"a": [11.5] * 10, "b": [10.0] * 10})
    figures, _ = timing.time_calls(_calls("a", "b"), settled)
    assert figures["a"].rounds == timing.MAX_ROUNDS
    assert (figures["a"].cpu_ms, figures["b"].cpu_ms) == (11.5, 10.0)


def test_a_noisy_measurement_gets_more_rounds_up_to_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a's CPU time relative to b's moves 1.0, 1.2, 1.05, 1.3, 1.1: a spread of 0.1 / 1.1,
    # over NOISE, so more rounds are timed, until steady rounds (1.1) bring it under.
    ratios = [1.0, 1.2, 1.05, 1.3, 1.1] + [1.1] * 5
    timed = _scripted(monkeypatch, {"a": [10 * r for r in ratios], "b": [10.0] * 10})
    figures, _ = timing.time_calls(_calls("a", "b"))
    assert timing.ROUNDS < figures["a"].rounds < timing.MAX_ROUNDS
    assert timed.count("a") == figures["a"].rounds and figures["a"].spread <= timing.NOISE
    # Noise that never settles stops at MAX_ROUNDS, and stays noisy.
    timed = _scripted(monkeypatch, {"a": [10.0, 13.0, 11.5] * 7, "b": [10.0] * 21})
    figures, _ = timing.time_calls(_calls("a", "b"))
    assert figures["a"].rounds == timing.MAX_ROUNDS
    assert timing.noisy(figures.values())


STAT = """cpu  100 0 50 1000 0 0 0 0 0 0
cpu0 10 1 5 500 3 2 1 7 0 0
cpu1 20 2 6 500 3 4 5 9 0 0
intr 12345
"""


def test_the_cpus_busy_and_stolen_time_from_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    hz = os.sysconf("SC_CLK_TCK")
    # busy: user nice system irq softirq (not idle, iowait); steal apart
    assert timing.read_stat([0], str(stat)) == ((10 + 1 + 5 + 2 + 1) / hz, 7 / hz)
    assert timing.read_stat([0, 1], str(stat)) == ((19 + 20 + 2 + 6 + 4 + 5) / hz, 16 / hz)
    assert timing.read_stat([2], str(stat)) is None  # a CPU the file does not have
    assert timing.read_stat([0], str(tmp_path / "none")) is None
    stat.write_text("cpu0 1 2 3\n")  # too few fields: not read as zeros
    assert timing.read_stat([0], str(stat)) is None


def test_the_load_is_the_others_and_stolen_share_of_the_cpus() -> None:
    load = timing.load_between((10.0, 1.0), (13.0, 1.5), own_cpu_s=1.0, wall_s=2.0, cpus=2)
    assert (load.others, load.steal) == (0.5, 0.125)  # (3 - 1) / 4, 0.5 / 4
    assert timing.load_between(None, (1.0, 1.0), 0.0, 1.0, 2) == timing.Load(None, None)
    # Tick-sampled busy time under this process's exact CPU time: no negative share.
    assert timing.load_between((10.0, 0.0), (10.5, 0.0), 1.0, 1.0, 2).others == 0.0
    worst = timing.Load(0.1, None).worst(timing.Load(0.05, 0.2))
    assert (worst.others, worst.steal) == (0.1, 0.2)


def test_another_process_s_cpu_time_is_counted_as_others() -> None:
    """A real busy process on this process's CPUs: its CPU time (from the kernel, wait4)
    shows in the ``others`` share read from /proc/stat."""
    cpus = sorted(os.sched_getaffinity(0))
    before, wall0, cpu0 = timing.read_stat(cpus), time.perf_counter(), time.process_time()
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    _, status, usage = os.wait4(child.pid, 0)
    assert status == 0
    wall, own = time.perf_counter() - wall0, time.process_time() - cpu0
    load = timing.load_between(before, timing.read_stat(cpus), own, wall, len(cpus))
    assert load.others is not None
    child_cpu = usage.ru_utime + usage.ru_stime  # ≥ 0.5 s
    tick = 1 / os.sysconf("SC_CLK_TCK")
    # At least the child's CPU time, less a tick per CPU per reading (sampled counts).
    assert load.others * wall * len(cpus) >= child_cpu - 2 * tick * len(cpus)
