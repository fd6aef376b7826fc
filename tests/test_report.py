"""app/report/: the console view on a real pseudo-terminal, the choice of format, the
lines it draws. The terminal runs train TensorFlow in a subprocess (slow)."""

from __future__ import annotations

import contextlib
import fcntl
import io
import itertools
import json
import logging
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import pytest

from app import logs
from app.report import ReportOptions
from app.report.view import ConsoleView, bar_figures, evaluation_line, fit, summary_block
from tests.conftest import PINNED, REPO

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class Tty:
    """A run whose stdout was a pseudo-terminal: its code, raw bytes, stderr."""

    returncode: int
    raw: bytes
    stderr: str

    def lines(self) -> list[str]:
        """What was drawn, line by line (ANSI codes removed; a bar redraw is a line)."""
        text = ANSI.sub(b"", self.raw).decode("utf-8", "replace")
        return [line for line in re.split(r"[\r\n]+", text) if line.strip()]


def tty_env(**env: str) -> dict[str, str]:
    """The environment of a run on a pseudo-terminal, its own: what a terminal session
    has (PATH, HOME, a UTF-8 locale, ``TERM=xterm-256color``), the test's pinned choices
    and ``env`` (a value "" unsets), nothing of the caller's (its TERM, NO_COLOR,
    FORCE_COLOR, COLUMNS, CORETRAIN_... variables)."""
    full = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "TERM": "xterm-256color",
        **PINNED,
        **env,
    }
    return {name: value for name, value in full.items() if value != ""}


def run_on_tty(
    *args: str,
    env: dict[str, str] | None = None,
    columns: int = 120,
    stderr_too: bool = False,
    resize: tuple[bytes, int] | None = None,
) -> Tty:
    """``python -m app ARGS`` with stdout (and with ``stderr_too`` stderr) on a new
    pseudo-terminal of ``columns`` columns, in :func:`tty_env` ``(**env)``; stderr on a
    pipe otherwise, read to the end. ``resize``: once the output holds these bytes, the
    terminal is made this many columns wide (SIGWINCH to the process)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave if stderr_too else subprocess.PIPE,
        env=tty_env(**(env or {})),
        cwd=REPO,
    )
    os.close(slave)
    raw = bytearray()
    while True:
        if resize is not None and resize[0] in raw:  # the master sets the pair's size
            fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, resize[1], 0, 0))
            proc.send_signal(signal.SIGWINCH)
            resize = None
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child side is closed
            break
        if not chunk:
            break
        raw += chunk
    os.close(master)
    stderr = "" if proc.stderr is None else proc.stderr.read().decode()
    return Tty(proc.wait(timeout=300), bytes(raw), stderr)


def _is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


BAR = re.compile(r"training .*?(\d+)/(\d+) (.*)")


def etas(lines: list[str]) -> list[tuple[int, int | None]]:
    """(step, ETA in seconds or None while not shown) of each bar drawn in ``lines``."""
    found = []
    for line in lines:
        bar = BAR.match(line)
        if bar:
            eta = re.search(r"ETA (?:(\d+):)?(\d+):(\d+)", bar.group(3))
            seconds = (
                None if eta is None else int(eta[1] or 0) * 3600 + int(eta[2]) * 60 + int(eta[3])
            )
            found.append((int(bar.group(1)), seconds))
    return found


def jumps(shown: Sequence[tuple[int, int | None]], max_steps: int) -> list[tuple[int, int]]:
    """The consecutive ETAs of ``shown`` more than 2x apart, before the last step (where
    the ETA is 0: done)."""
    known = [eta for step, eta in shown if eta is not None and step < max_steps]
    return [(a, b) for a, b in itertools.pairwise(known) if max(a, b) > 2 * min(a, b)]


@pytest.mark.slow
def test_a_terminal_gets_the_view_bar_more_often_than_evaluations_and_a_summary(
    tiny_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = ["--data", str(tiny_data), "--output", str(out), "--batch-size", "40"]
    run = run_on_tty(  # steady: K = auto, no checkpoint before the end, one evaluation halfway
        "train", *args, "--max-steps", "1200", "--eval-every", "600", "--checkpoint-every", "1200"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.lines()
    assert sum(map(_is_json, lines)) == 0, "a terminal gets no JSON lines"
    bars = [line for line in lines if BAR.match(line)]
    evaluations = [line for line in lines if re.match(r"step \d+ · loss", line)]
    assert len(evaluations) == 2
    assert len({b for b in bars if "samples/s" in b}) > len(evaluations)
    assert all(re.search(r"\d+/1200 loss \d", b) for b in bars), "the loss is on every bar"
    assert any("ETA" in b and "CPU" in b for b in bars)
    shown = etas(lines)
    assert len([eta for _, eta in shown if eta]) >= 3, shown
    assert jumps(shown, 1200) == [], shown  # rich's estimate over the window
    metrics = json.loads((out / "metrics.json").read_text())
    (rmse,) = [line for line in lines if line.startswith("test RMSE")]
    assert f"{metrics['test_rmse']:.4g}" in rmse and f"{metrics['baseline_rmse']:.4g}" in rmse
    assert f"{metrics['linear_rmse']:.4g}" in rmse
    assert any(line == f"exported step  {metrics['exported_step']}" for line in lines)
    assert any(str(out / "tensorboard") in line for line in lines)
    # The JSON log is JSON whatever the terminal shows, and never holds the bar's records.
    records = [json.loads(x) for x in (out / "logs" / "train.jsonl").read_text().splitlines()]
    assert {"start", "progress", "end"} <= {r["event"] for r in records}
    assert "step" not in {r["event"] for r in records}
    # predict on a terminal: a line for people, no JSON; the predictions are in --out.
    features, predictions = tiny_data / "test_features.txt", tmp_path / "predictions.txt"
    shown_predict = run_on_tty(
        "predict", "--model", str(out / "model"), "--features", str(features), "--out",
        str(predictions),
    )  # fmt: skip
    assert shown_predict.returncode == 0, shown_predict.stderr
    assert not any(map(_is_json, shown_predict.lines())), shown_predict.lines()
    assert any("60 predictions" in line for line in shown_predict.lines())
    assert len(predictions.read_text().splitlines()) == 60


@pytest.mark.slow
def test_a_run_s_bar_is_whole_fields_at_80_columns_and_after_a_resize_to_40(
    tiny_data: Path, tmp_path: Path
) -> None:
    """The README's quick start under ``script`` (80 columns), the terminal narrowed to 40
    at the first evaluation: every bar is whole fields (was: ``100/2…``; at 40
    ``tra… loss 0.1382 · 15,227 samples/s · E…``); at 80 the bar, the step, the loss and
    the ETA, and once narrowed the step, the loss and the ETA."""
    args = ["--data", str(tiny_data), "--output", str(tmp_path / "out"), "--max-steps", "200"]
    run = run_on_tty(
        "train", *args, "--eval-every", "100", columns=80, resize=("step 100 ·".encode(), 40)
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.lines()
    first, last = [i for i, line in enumerate(lines) if re.match(r"step \d+ ·", line)]
    bars = [(i, x) for i, x in enumerate(lines) if "loss " in x and not x.startswith("step ")]
    figure = r"(loss [-+.e\d]+|[\d,]+ samples/s|ETA (\?|[\d:]+)|CPU \d+% of \d+|throttled [.\d]+ s)"
    whole = rf"(training )?([━╸╺]+ +)?\d+/200( {figure}( · {figure})*)?"  # view.py's fields
    assert all(re.fullmatch(whole, line) and len(line) <= 80 for _, line in bars), bars
    wide = [line for i, line in bars if i < first]
    narrow = [line for i, line in bars if i > last]
    assert wide and all(re.match(r"training [━╸╺]{16} +\d+/200 loss .* · ETA ", x) for x in wide)
    assert narrow and all(len(x) <= 40 and re.search(r"\d+/200 loss .* · ETA ", x) for x in narrow)


@pytest.mark.slow
def test_an_error_under_a_bar_clears_it_and_is_one_stderr_line(
    tiny_data: Path, tmp_path: Path
) -> None:
    diverging = ["--optimizer", "sgd", "--learning-rate", "1e6", "--lr-schedule", "constant"]
    args = ["--data", str(tiny_data), "--output", str(tmp_path / "out"), "--batch-size", "40"]
    run = run_on_tty("train", *args, *diverging, "--max-steps", "30", "--steps-per-loop", "1")
    assert run.returncode == 5
    assert any(re.match(r"training .*1/30", line) for line in run.lines()), "no bar was shown"
    assert run.raw.endswith(b"\x1b[2K"), "the bar was not erased last"
    (line,) = run.stderr.splitlines()
    assert line.startswith("coretrain: loss became")


def test_the_format_override_and_an_early_error_on_a_terminal(tmp_path: Path) -> None:
    empty = tmp_path / "data"
    empty.mkdir()
    args = ["train", "--data", str(empty), "--output", str(tmp_path / "out")]
    text = run_on_tty(*args)
    assert text.returncode == 3
    assert not any(_is_json(line) for line in text.lines())
    assert text.lines()[0].startswith("coretrain ")  # the start, for people
    (line,) = text.stderr.splitlines()
    assert line.startswith("coretrain: ")
    as_json = run_on_tty(*args, env={"CORETRAIN_LOG_FORMAT": "json"})
    assert as_json.returncode == 3
    records = [json.loads(x) for x in as_json.lines()]
    assert records[0]["event"] == "start" and records[-1]["status"] == "failed"
    assert max(map(len, as_json.lines())) < 2000


def test_auto_is_text_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")  # the test's own terminal, not the caller's
    master, slave = pty.openpty()
    try:
        tty, pipe = os.fdopen(slave, "w", closefd=False), io.StringIO()
        assert ReportOptions().text(tty) and not ReportOptions().text(pipe)
        assert not ReportOptions("json").text(tty) and ReportOptions("text").text(pipe)
        for term in ("dumb", "unknown", "DUMB"):  # no cursor control: no view
            monkeypatch.setenv("TERM", term)
            assert not ReportOptions().text(tty) and ReportOptions("text").text(tty), term
        monkeypatch.delenv("TERM")  # a terminal all the same
        assert ReportOptions().text(tty)
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize("term", ["dumb", "unknown"])
def test_a_dumb_terminal_gets_json_lines_any_other_terminal_lines_for_people(
    term: str, tmp_path: Path
) -> None:
    args = ("generate", "--train", "20", "--test", "5")
    dumb = run_on_tty(*args, "--out", str(tmp_path / "a"), env={"TERM": term})
    assert dumb.returncode == 0, dumb.stderr
    (record,) = [json.loads(line) for line in dumb.lines()]
    assert record["event"] == "generated" and record["train"] == 20
    # xterm, TERM unset, no colours, a COLUMNS of 0 (rich drew nothing at that width)
    for env in ({}, {"TERM": ""}, {"NO_COLOR": "1"}, {"COLUMNS": "0"}):
        shown = run_on_tty(*args, "--out", str(tmp_path / "b"), env=env)
        assert shown.returncode == 0, shown.stderr
        (line,) = shown.lines()
        assert line == f"synthetic demo data in {tmp_path / 'b'}: 20 training and 5 test samples"
        assert b"\x1b[3" not in shown.raw and b"\x1b[38" not in shown.raw  # uncoloured
    forced = run_on_tty(*args, "--out", str(tmp_path / "c"), "--log-format", "json")
    assert [json.loads(line)["event"] for line in forced.lines()] == ["generated"]


def test_exec_on_a_terminal_says_what_the_program_is_given_in_lines(tmp_path: Path) -> None:
    for report in ([], ["--report"]):
        run = run_on_tty("exec", "--cpus", "1", *report, "--", "true", stderr_too=True)
        assert run.returncode == 0, run.raw
        lines = run.lines()
        assert not any(map(_is_json, lines)), lines
        assert lines[0].startswith("coretrain exec: true: 1 threads for a budget of 1 CPUs (")
        assert (
            lines[1].startswith("  set: TF_NUM_INTRAOP_THREADS=1 ")
            and "OMP_NUM_THREADS=1" in lines[1]
        )
        ended = [line for line in lines if line.startswith("coretrain exec: true ended (exit 0)")]
        assert len(ended) == len(report)


@dataclass
class PtyStream:
    """A text ``stream`` on a pseudo-terminal and the bytes drawn on it (``raw``)."""

    stream: TextIO
    raw: bytearray

    def lines(self) -> list[str]:
        return Tty(0, bytes(self.raw), "").lines()


@contextlib.contextmanager
def pty_stream(monkeypatch: pytest.MonkeyPatch, columns: int = 150) -> Iterator[PtyStream]:
    """A text stream on a new pseudo-terminal (rich sees a terminal of ``columns``
    columns), read by a thread until the stream is closed on leaving."""
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", str(columns))
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    master, slave = pty.openpty()
    got = PtyStream(os.fdopen(slave, "w", encoding="utf-8"), bytearray())

    def read() -> None:
        with contextlib.suppress(OSError):  # EIO: the stream was closed
            while chunk := os.read(master, 65536):
                got.raw.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        yield got
    finally:
        got.stream.close()
        reader.join(timeout=10)
        os.close(master)


def step_record(created: float, step: int, max_steps: int, **fields: object) -> logging.LogRecord:
    """A ``step`` record as the loop's hook sends it, at time ``created`` (s), with 40
    samples a step, a budget of 2 CPUs and ``fields`` (the loss, CPU use...)."""
    return logging.makeLogRecord({
        "event": "step", "levelno": logs.STEP, "created": created, "step": step,
        "max_steps": max_steps, "samples_per_step": 40, "cpu_budget": 2.0, **fields,
    })  # fmt: skip


@pytest.mark.parametrize("start", [0, 600])
def test_the_eta_is_smoothed_where_each_call_s_own_estimate_jumps(
    start: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A steady run's calls as a loaded machine makes them: 10 steps each, 0.3 to 0.7 s,
    every 8th 1.5 s longer (a checkpoint), from step 0 or resumed at 600. Each call's own
    ETA (what the bar showed) jumps by 2x and more; the bar's, rich's estimate over its
    window, never does, and a resumed run's first step is not taken for a rate."""
    jitter = (1.0, 0.6, 1.4, 0.8, 1.2)
    now, step, own = 1000.0, start, []
    with pty_stream(monkeypatch) as tty:
        view = ConsoleView(tty.stream)
        for call in range((1200 - start) // 10):
            seconds = 0.5 * jitter[call % len(jitter)] + (1.5 if call % 8 == 7 else 0.0)
            now, step = now + seconds, step + 10
            own.append((step, round((1200 - step) * seconds / 10)))
            view.handle(step_record(now, step, 1200, loss=1.0 / step, cpu_util=0.9))
        view.clear()
    assert jumps(own, 1200), "the premise: each call's own rate moves the ETA by 2x"
    shown = etas(tty.lines())
    assert [step for step, _ in shown[:3]] == [start + 10, start + 20, start + 30]
    assert [eta for _, eta in shown[:2]] == [None, None]  # not from the first call alone
    assert all(eta is not None for _, eta in shown[2:])
    assert jumps(shown, 1200) == [], shown
    # rich's speed: the 20 steps of the calls after the first, in their 0.3 + 0.7 s: 20/s
    eta = {0: "0:59", 600: "0:29"}[start]  # 1170 or 570 steps to go, rounded up
    third = f"{start + 30}/1200 loss {1 / (start + 30):.4g} · 800 samples/s · ETA {eta} · CPU"
    assert third in tty.lines()[2]


def bars_drawn(monkeypatch: pytest.MonkeyPatch, columns: int) -> list[str]:
    """The bars a view draws on a pseudo-terminal of ``columns`` columns for a run of 2,000
    steps of 256 samples at 50 steps/s (12,800 samples/s), 100 a call, with a loss of
    0.1382 and 93 % of the CPU budget: one a call, the last once more as the bar stops."""
    with pty_stream(monkeypatch, columns) as tty:
        view = ConsoleView(tty.stream)
        for step in range(100, 2100, 100):
            fields = {"loss": 0.1382, "samples_per_step": 256, "cpu_util": 0.93}
            view.handle(step_record(1000 + step / 50, step, 2000, **fields))
        view.clear()
    bars = tty.lines()
    steps = [[f"{step}/2000"] for step in [*range(100, 2100, 100), 2000]]
    assert [re.findall(r"\d+/2000", bar) for bar in bars] == steps, bars
    return bars


def test_at_80_columns_the_bar_keeps_the_step_the_bar_the_loss_and_the_eta_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The README's quick start under ``script`` (80 columns): samples/s is left out, the
    rest is whole (was: ``1000/2…``, the step cut, and the bar narrowed)."""
    bars = bars_drawn(monkeypatch, 80)
    assert bars[9] == "training ━━━━━━━━╺━━━━━━━ 1000/2000 loss 0.1382 · ETA 0:20 · CPU 93% of 2"
    whole = r"training [━╸╺]{16} +\d+/2000 loss 0\.1382 · ETA (\?|0:\d\d) · CPU 93% of 2"
    assert all(re.fullmatch(whole, bar) for bar in bars), bars


def test_at_40_columns_the_bar_loses_whole_fields_least_important_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """samples/s, CPU use and the word "training" are left out, the bar is narrowed; the
    step, the loss and the ETA are whole (was: ``tra… loss 0.1382 · 12,800 samples/s · E…``)."""
    bars = bars_drawn(monkeypatch, 40)
    assert bars[9] == "━━━╸━━━ 1000/2000 loss 0.1382 · ETA 0:20"
    whole = r"[━╸╺]{7,10} +\d+/2000 loss 0\.1382 · ETA (\?|0:\d\d)"
    assert all(re.fullmatch(whole, bar) and len(bar) <= 40 for bar in bars), bars


def test_the_view_draws_a_run_in_lines_with_a_summary(tmp_path: Path) -> None:
    stream = io.StringIO()
    logs.setup(stream=stream, text=True)
    try:
        logs.event("start", "coretrain 1: 2 intra-op threads", config={"output_dir": "/o"})
        logs.event("phase", "timing 4 formulations, ~6 s; --formulation fast skips this")
        logs.event("cache", "converting text data into /c/k", reused=False)
        logs.event("checkpoint", "saved checkpoint at step 3")  # quiet: in the JSON log
        logs.event("steps_past", "a warning", level=logging.WARNING)
        logs.event("end", "done", **_END)
    finally:
        logs.setup(level=logging.INFO)
    text = stream.getvalue()
    assert "timing 4 formulations, ~6 s; --formulation fast skips this" in text
    assert "converting text data into /c/k; once: later runs with the same data reuse" in text
    assert "warning: a warning" in text and "checkpoint" not in text
    assert "test RMSE      0.1234  (mean predictor 0.5, linear baseline 0.2)" in text
    assert "published      version 3" in text and "/o/logs/train.jsonl" in text
    assert not any(_is_json(line) for line in text.splitlines())


_END = {
    "status": "completed", "final_step": 6, "test_rmse": 0.12341, "baseline_rmse": 0.5,
    "linear_rmse": 0.2, "exported_step": 6, "wall_seconds": 75.0, "examples_per_sec": 1200.0,
    "export": "/o/model", "publish": {"published": True, "version": 3},
}  # fmt: skip


def test_the_bar_and_evaluation_texts() -> None:
    tick = {"loss": 0.01234, "samples_per_step": 40, "cpu_util": 0.93, "cpu_budget": 2.0}
    assert bar_figures(tick, 1030.86, 75) == {
        "loss": "loss 0.01234", "samples/s": "41,234 samples/s", "ETA": "ETA 1:15",
        "CPU": "CPU 93% of 2",
    }  # fmt: skip
    assert list(bar_figures(tick, None, None).values()) == [  # not known yet
        "loss 0.01234", "ETA ?", "CPU 93% of 2",
    ]  # fmt: skip
    throttled = bar_figures({**tick, "cpu_throttled_s": 1.25}, 10.0, 3725)
    assert throttled["ETA"] == "ETA 1:02:05"
    assert list(throttled.items())[-1] == ("throttled", "throttled 1.2 s")
    line = evaluation_line(
        {"step": 50, "loss": 0.5, "val_rmse": 0.1, "baseline_rmse": 0.3, "linear_rmse": 0.2}
    )
    assert line == (
        "step 50 · loss 0.5 · validation RMSE 0.1 (test set: mean predictor 0.3, linear 0.2)"
    )
    block = summary_block(_END, None)
    assert block[0] == "completed at step 6 in 1:15"


def test_a_narrower_line_leaves_whole_fields_out_least_important_first() -> None:
    """``training ━━━━ 100/200 loss 0.1382 · 16,000 samples/s · ETA 0:03 · CPU 93% of 2 ·
    throttled 1.2 s``: 108 columns, and what each narrower line keeps."""
    widths = {
        "label": 8, "bar": 16, "step": 7, "loss": 11, "samples/s": 16, "ETA": 8, "CPU": 12,
        "throttled": 15,
    }  # fmt: skip
    assert fit(widths, 108) == widths
    kept = {room: fit(widths, room) for room in (107, 88, 73, 55, 46, 36, 35, 29, 15, 6)}
    assert {room: list(names) for room, names in kept.items()} == {
        107: ["label", "bar", "step", "loss", "ETA", "CPU", "throttled"],
        88: ["label", "bar", "step", "loss", "ETA", "throttled"],
        73: ["label", "bar", "step", "loss", "ETA"],
        55: ["bar", "step", "loss", "ETA"],
        46: ["bar", "step", "loss", "ETA"],
        36: ["bar", "step", "loss", "ETA"],
        35: ["step", "loss", "ETA"],
        29: ["step", "ETA"],
        15: ["step"],
        6: [],  # narrower than the step: nothing rather than a cut "100/2…"
    }
    assert [kept[room]["bar"] for room in (55, 46, 36)] == [16, 15, 5]  # narrowed, then left out
    assert all(
        kept[room][name] == widths[name] for room in kept for name in kept[room] if name != "bar"
    )
    # The widest essentials (10000/10000, loss 1.234e-05, ETA 1:02:05) at 80 and at 40.
    widest = {**widths, "step": 11, "loss": 14, "ETA": 11}
    assert list(fit(widest, 80)) == ["label", "bar", "step", "loss", "ETA"]
    assert list(fit(widest, 40)) == ["step", "loss", "ETA"]


def test_a_failing_view_never_ends_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    view = ConsoleView(io.StringIO())
    record = logging.LogRecord("coretrain", logging.INFO, "", 0, "x", None, None)
    record.event = "progress"  # without its fields
    view.emit(record)  # logging's handleError, not an exception
    assert "KeyError" in capsys.readouterr().err


def test_a_name_with_control_characters_neither_drives_the_terminal_nor_splits_a_line(
    tiny_data: Path, tmp_path: Path
) -> None:
    """A file name is data, maybe someone else's: ESC [2J (clear the screen) and a newline
    in it are shown as escapes, in the view and in the one line on stderr."""
    hostile = "x\x1b[2J\ny"
    shown = run_on_tty("generate", "--out", str(tmp_path / hostile), "--train", "5", "--test", "2")
    assert shown.returncode == 0, shown.stderr
    assert b"\x1b[2J" not in shown.raw and (tmp_path / hostile / "train_labels.txt").exists()
    (line,) = shown.lines()
    assert line.startswith(f"synthetic demo data in {tmp_path}/x\\x1b[2J\\x0ay: 5 training")
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    (data / hostile).write_text("not a number\n")
    refused = run_on_tty("train", "--data", str(data), "--output", str(tmp_path / "out"),
                         "--train-features", hostile)  # fmt: skip
    assert refused.returncode == 3
    (error,) = refused.stderr.splitlines()
    assert "x\\x1b[2J\\x0ay" in error and "\x1b" not in error
