"""app/report/: the console view on a real pseudo-terminal, the choice of format, the
lines it draws. The terminal runs train TensorFlow in a subprocess (slow)."""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from dataclasses import dataclass
from pathlib import Path

import pytest

from app import logs
from app.report import ReportOptions
from app.report.view import ConsoleView, bar_text, evaluation_line, summary_block
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


def run_on_tty(*args: str, env: dict[str, str] | None = None, columns: int = 120) -> Tty:
    """``python -m app ARGS`` with stdout on a new pseudo-terminal of ``columns`` columns
    and stderr on a pipe, read to the end."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("CORETRAIN_", "TF_NUM"))}
    full_env.update({**PINNED, "TERM": "xterm-256color", **(env or {})})
    full_env.pop("COLUMNS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=full_env,
        cwd=REPO,
    )
    os.close(slave)
    raw = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child side is closed
            break
        if not chunk:
            break
        raw += chunk
    os.close(master)
    assert proc.stderr is not None
    stderr = proc.stderr.read().decode()
    return Tty(proc.wait(timeout=300), bytes(raw), stderr)


def _is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


@pytest.mark.slow
def test_a_terminal_gets_the_view_bar_more_often_than_evaluations_and_a_summary(
    tiny_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = ["--data", str(tiny_data), "--output", str(out), "--batch-size", "40"]
    run = run_on_tty(
        "train", *args, "--max-steps", "24", "--eval-every", "12", "--steps-per-loop", "2"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.lines()
    assert sum(map(_is_json, lines)) == 0, "a terminal gets no JSON lines"
    bars = [line for line in lines if re.match(r"training .*\d+/24", line)]
    evaluations = [line for line in lines if re.match(r"step \d+ · loss", line)]
    assert len(evaluations) == 2
    assert len({b for b in bars if "samples/s" in b}) > len(evaluations)
    assert any("ETA" in b and "CPU" in b for b in bars)
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


def test_auto_is_text_on_a_terminal_only(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    try:
        tty, pipe = os.fdopen(slave, "w", closefd=False), io.StringIO()
        assert ReportOptions().text(tty) and not ReportOptions().text(pipe)
        assert not ReportOptions("json").text(tty) and ReportOptions("text").text(pipe)
    finally:
        os.close(master)
        os.close(slave)


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
    tick = {"examples_per_sec": 41234.5, "eta_s": 75, "cpu_util": 0.93, "cpu_budget": 2.0}
    assert bar_text(tick) == "41,234 samples/s · ETA 1:15 · CPU 93% of 2"
    throttled = bar_text({**tick, "cpu_throttled_s": 1.25})
    assert throttled.endswith("· throttled 1.2 s")
    line = evaluation_line(
        {"step": 50, "loss": 0.5, "val_rmse": 0.1, "baseline_rmse": 0.3, "linear_rmse": 0.2}
    )
    assert line == (
        "step 50 · loss 0.5 · validation RMSE 0.1 (test set: mean predictor 0.3, linear 0.2)"
    )
    block = summary_block(_END, None)
    assert block[0] == "completed at step 6 in 1:15"


def test_a_failing_view_never_ends_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    view = ConsoleView(io.StringIO())
    record = logging.LogRecord("coretrain", logging.INFO, "", 0, "x", None, None)
    record.event = "progress"  # without its fields
    view.emit(record)  # logging's handleError, not an exception
    assert "KeyError" in capsys.readouterr().err
