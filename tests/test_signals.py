"""The stop path (app/signals.py): SIGTERM or SIGINT stops a run where it is safe, with a
checkpoint of the step it was in or without a partial cache, exit 143; the rerun goes on
exactly where it stopped.

Each scenario signals the real ``coretrain train`` in a subprocess, in the background
(tests/runs.py).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SMALLEST, events, json_lines, widen
from tests.runs import (
    FAR_STEPS,
    LOSS_TOLERANCE,
    STEPS,
    WAIT,
    Done,
    Signalled,
    losses,
    no_partial_cache,
    reference_ok,
    run_and_signal,
    start_in_background,
    train,
    train_args,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _start_in_background(request: pytest.FixtureRequest) -> None:
    start_in_background(request, "reference", "preempted", "conversion_stopped")


# --------------------------------------------------------------------------------------
# SIGTERM during training


@pytest.fixture(scope="module")
def preempted(
    pool: ThreadPoolExecutor, tiny_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> Future[Signalled]:
    """SIGTERM once the first ``progress`` event is out, to a run whose end it can't reach
    first (:data:`FAR_STEPS`); then a rerun to step 10 when the stop left steps before it."""
    workdir = tmp_path_factory.mktemp("preempted")
    out = workdir / "out"

    def job() -> Signalled:
        stopped, seconds = run_and_signal(
            train_args(tiny_data, out, FAR_STEPS),
            out,
            signal.SIGTERM,
            lambda r: r.get("event") == "progress",
            workdir,
        )
        left = sorted(p.name for p in out.iterdir())
        saved = sorted(p.name for p in (out / "checkpoints").glob("*.index"))
        log_file = (out / "logs" / "train.jsonl").read_text()
        ends = events(stopped.records, "end")
        resumable = stopped.returncode == 143 and ends and ends[-1]["final_step"] < STEPS
        rerun = train(tiny_data, out) if resumable else None
        return Signalled(stopped, seconds, rerun, left, saved, log_file)

    return pool.submit(job)


def test_sigterm_during_training_checkpoints_the_step_and_exits_143(
    preempted: Future[Signalled], record_property: Callable[[str, Any], None]
) -> None:
    result = preempted.result(timeout=WAIT)
    run = result.stopped
    assert run.returncode == 143, run.why()
    records = run.records
    assert [s["signal"] for s in events(records, "signal")] == ["SIGTERM"]
    end = events(records, "end")[-1]
    assert end["status"] == "preempted"
    stop_step = end["final_step"]
    assert 1 <= stop_step < FAR_STEPS  # stopped by the signal, after the step it was in
    assert events(records, "checkpoint")[-1]["step"] == stop_step  # saved at the stop
    assert f"ckpt-{stop_step}.index" in result.checkpoints
    assert result.left == [".lock", "cache", "checkpoints", "logs", "tensorboard"]  # no export
    assert run.stderr.strip().splitlines()[-1] == (
        f"coretrain: stopped by signal at step {stop_step}; checkpoint saved, rerun to resume"
    )
    file_records = json_lines(result.log_file)
    assert file_records[-1]["event"] == "end" and file_records[-1]["status"] == "preempted"
    record_property("sigterm_to_exit_seconds", round(result.seconds_to_exit, 2))
    print(f"SIGTERM -> exit 143 in {result.seconds_to_exit:.2f} s (stopped at step {stop_step})")


def test_resumed_run_reproduces_the_uninterrupted_losses(
    preempted: Future[Signalled],
    reference: Future[Done],
    record_property: Callable[[str, Any], None],
) -> None:
    """Interrupted at step k and resumed == uninterrupted (the ``reference`` run of
    tests/conftest.py), step by step."""
    ref = reference_ok(reference)
    result = preempted.result(timeout=WAIT)
    assert result.stopped.returncode == 143, result.stopped.why()
    if result.rerun is None:  # an event, not a speed: the stop left nothing before STEPS
        pytest.skip(f"the signal landed after step {STEPS}: nothing left to resume")
    rerun = result.rerun
    assert rerun.returncode == 0, rerun.why()
    stop_step = events(result.stopped.records, "end")[-1]["final_step"]
    assert events(rerun.records, "resume")[0]["step"] == stop_step
    end = events(rerun.records, "end")[-1]
    assert (end["status"], end["final_step"], end["start_step"]) == ("completed", STEPS, stop_step)
    expected = losses(ref.records)
    assert sorted(expected) == list(range(1, STEPS + 1))
    got = {**losses(result.stopped.records), **losses(rerun.records)}
    assert sorted(got) == sorted(expected)
    delta = max(abs(got[s] - expected[s]) for s in expected)
    record_property("max_abs_delta_loss", delta)
    print(f"max |Δloss| resumed at step {stop_step} vs uninterrupted: {delta!r}")
    assert delta <= LOSS_TOLERANCE, {s: (got[s], expected[s]) for s in expected}


# --------------------------------------------------------------------------------------
# SIGINT during the cache conversion


@pytest.fixture(scope="module")
def conversion_stopped(
    pool: ThreadPoolExecutor, tmp_path_factory: pytest.TempPathFactory
) -> Future[Signalled]:
    """SIGINT as soon as the ``cache`` event says the conversion started.

    train_features.txt has 15,000 lines of 440 fields (8×55, 25 MB): about a second of
    parsing on this machine, polled for the stop request every 512 lines.
    """
    workdir = tmp_path_factory.mktemp("conversion")
    data = workdir / "data"
    data.mkdir()
    (data / "train_features.txt").write_bytes(widen(b"0.5 -1.25 3 4.0 -0 100\n") * 15_000)
    (data / "train_labels.txt").write_bytes(b"1 2 3\n" * 15_000)
    (data / "test_features.txt").write_bytes(widen(b"1 2 3 4 5 6\n") * 10)
    (data / "test_labels.txt").write_bytes(b"1 2 3\n" * 10)
    out = workdir / "out"
    args = ["--data", str(data), "--output", str(out), *SMALLEST]

    def job() -> Signalled:
        stopped, seconds = run_and_signal(
            args,
            out,
            signal.SIGINT,
            lambda r: r.get("event") == "cache" and r.get("reused") is False,
            workdir,
        )
        return Signalled(stopped, seconds, None)

    return pool.submit(job)


def test_sigint_during_cache_conversion_removes_partial_files_and_exits_143(
    conversion_stopped: Future[Signalled],
) -> None:
    run = conversion_stopped.result(timeout=WAIT).stopped
    assert run.returncode == 143, run.why()
    records = run.records
    assert [s["signal"] for s in events(records, "signal")] == ["SIGINT"]
    assert events(records, "end")[-1]["status"] == "preempted"
    assert "during cache conversion" in run.stderr.strip().splitlines()[-1], run.stderr
    assert not any("ready" in r["message"] for r in events(records, "cache"))
    assert (run.out / "cache").is_dir()
    assert no_partial_cache(run.out) == []  # no final cache, no half-written file
    assert not (run.out / "checkpoints").exists()
