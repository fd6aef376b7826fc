"""What every command writes where collectors and people read it: no line over 2,000
characters, and a stdout or stderr that is closed, full or gone (a pipe's reader that
stopped, ``>/dev/full``, ``>&-``) changes neither the exit code nor the log file, with at
most one line said about it (app/logs.py). Real processes, real pipes, the real
``/dev/full``; the runs that train TensorFlow are marked slow."""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from app import logs
from app.cli import cli
from tests.conftest import PINNED, REPO

FULL = "/dev/full"
needs_dev_full = pytest.mark.skipif(
    not os.path.exists(FULL), reason="no /dev/full (a Linux device) to fill stdout with"
)


def env(**extra: str) -> dict[str, str]:
    """The caller's environment without its coretrain settings, and ``extra``."""
    drop = ("CORETRAIN_", "TF_NUM_", "CPU_LIMIT", "CPU_REQUEST")
    base = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**base, "TF_CPP_MIN_LOG_LEVEL": "2", **PINNED, **extra}


def run(*args: str, stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE,
        **extra: str) -> subprocess.CompletedProcess[bytes]:  # fmt: skip
    """``python -m app ARGS`` with these streams (a path opens that file for writing)."""
    opened = []
    streams = []
    for target in (stdout, stderr):
        if isinstance(target, str):
            opened.append(open(target, "wb"))  # noqa: SIM115 - closed below
            streams.append(opened[-1])
        else:
            streams.append(target)
    try:
        return subprocess.run(
            [sys.executable, "-m", "app", *args], stdin=subprocess.DEVNULL,
            stdout=streams[0], stderr=streams[1], env=env(**extra), cwd=REPO, timeout=600,
        )  # fmt: skip
    finally:
        for handle in opened:
            handle.close()


def closed_pipe() -> int:
    """The write end of a pipe whose reader is gone (the caller closes it)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


def stderr_lines(proc: subprocess.CompletedProcess[bytes]) -> list[str]:
    return proc.stderr.decode().splitlines() if proc.stderr else []


# The log streams: stdout of generate, predict and train; stderr of exec.


@needs_dev_full
@pytest.mark.parametrize("log_format", ["json", "text"])
def test_generate_into_a_full_stdout_or_a_closed_pipe_says_it_once_and_exits_0(
    log_format: str, tmp_path: Path
) -> None:
    """JSON lines (logging's handler) and the view (rich, whose own rule for a broken pipe
    was SystemExit(1)) alike."""
    for n, stdout in enumerate((FULL, closed_pipe())):
        out = tmp_path / f"data{n}"
        args = ("generate", "--out", str(out), "--train", "5", "--test", "2")
        proc = run(*args, "--log-format", log_format, stdout=stdout)
        if isinstance(stdout, int):
            os.close(stdout)
        assert proc.returncode == 0
        why = "No space left on device" if stdout == FULL else "Broken pipe"
        assert stderr_lines(proc) == [f"coretrain: stdout: {why}: the log stops there"]
        assert len((out / "train_labels.txt").read_text().splitlines()) == 5


def test_a_closed_stdout_swallows_the_log_and_no_file_takes_its_number(tmp_path: Path) -> None:
    out = tmp_path / "data"
    proc = subprocess.run(
        [sys.executable, "-m", "app", "generate", "--out", str(out), "--train", "5", "--test",
         "2"],
        stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env(), cwd=REPO, timeout=60,
        preexec_fn=lambda: os.close(1),
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (0, b""), proc.stderr  # not on stderr either
    for path in out.iterdir():
        assert b'"event"' not in path.read_bytes(), f"the log went into {path}"


@needs_dev_full
def test_a_full_or_closed_stderr_keeps_the_exit_code_and_stdout(tmp_path: Path) -> None:
    args = ("train", "--data", str(tmp_path / "missing"), "--output", str(tmp_path / "o"))
    for stderr in (FULL, closed_pipe()):
        proc = run(*args, stderr=stderr)
        if isinstance(stderr, int):
            os.close(stderr)
        assert proc.returncode == 2
        (end,) = [json.loads(line) for line in proc.stdout.decode().splitlines()]
        assert end["event"] == "end" and end["exit_code"] == 2


@needs_dev_full
def test_exec_with_a_full_stderr_is_the_programs_exit_and_a_closed_one_its_own_pipe() -> None:
    for report in ([], ["--report"]):
        full = run("exec", *report, "--", "sh", "-c", "echo out; exit 3", stderr=FULL)
        assert (full.returncode, full.stdout) == (3, b"out\n")
        # The program is handed the stderr it was given: its write meets the broken pipe
        # (sh is ended by SIGPIPE), not a /dev/null coretrain put in its place.
        broken = closed_pipe()
        proc = run("exec", *report, "--", "sh", "-c", "echo err >&2; echo out", stderr=broken)
        os.close(broken)
        assert proc.stdout == b"", "the program wrote on after its stderr broke"
        assert proc.returncode in (-13, 141)  # SIGPIPE: as exec'd, or reported as 128 + 13


def test_a_record_over_2000_characters_keeps_its_ends_and_says_what_it_lost() -> None:
    stream = io.StringIO()
    logs.setup(stream=stream)
    try:
        config = {"output_dir": "/out" * 500, "max_steps": 30}
        logs.event("start", "m", config=config, plan_file="/p" * 1000, plan={"threads": 2})
        logs.event("traceback", "Traceback\n" + "  File x\n" * 500 + "ValueError: boom")
        logs.event("exec", "m", command=["arg"] * 1000, pid=7)
        logs.event("wide", "many small fields", **{f"f{i}": i for i in range(400)})
        logs.event("nan", "m", rmse=float("nan"), path=Path("/a" * 1200))
    finally:
        logs.setup(level=logging.INFO)
    lines = stream.getvalue().splitlines()
    assert max(map(len, lines)) <= logs.MAX_LINE
    start, traceback, command, wide, nan = map(json.loads, lines)
    assert start["shortened"] == ["plan_file", "config"] and start["config"]["max_steps"] == 30
    assert (
        start["config"]["output_dir"].startswith("/out/out")
        and "characters left out]" in (start["config"]["output_dir"])
    )
    assert start["plan"] == {"threads": 2}  # untouched
    assert traceback["message"].endswith("  File x\nValueError: boom")  # the tail kept
    assert traceback["message"].startswith("Traceback\n")
    assert command["command"] == "[7000 characters of JSON left out]" and command["pid"] == 7
    assert wide["shortened"] == "every field but these" and wide["message"] == "many small fields"
    assert nan["rmse"] is None and nan["shortened"] == ["path"]
    assert all(
        r["event"] and r["level"] == "INFO" and r["timestamp"] for r in map(json.loads, lines)
    )


# The products: what plan, models, bench-scaling, --help and --version print is the command's
# output.


@needs_dev_full
def test_a_product_into_a_closed_pipe_is_141_quietly_into_a_full_disk_4_in_one_line(
    tmp_path: Path,
) -> None:
    products = (("plan",), ("models", str(tmp_path), "--format", "json"), ("train", "--help"),
                ("--help",), ("-h",), ("--version",))  # fmt: skip
    for args in products:
        broken = closed_pipe()
        quiet = run(*args, stdout=broken)
        os.close(broken)
        assert (quiet.returncode, quiet.stderr) == (141, b""), args  # click's own help: 1
        full = run(*args, stdout=FULL)
        assert full.returncode == 4, args
        assert stderr_lines(full) == ["coretrain: stdout: No space left on device"], args


# Every command, piped: no line over 2,000 characters.


def lines_of(proc: subprocess.CompletedProcess[bytes]) -> Iterator[str]:
    for stream in (proc.stdout, proc.stderr):
        yield from (stream or b"").decode().splitlines()


def assert_lean(
    proc: subprocess.CompletedProcess[bytes] | subprocess.CompletedProcess[str],
) -> None:
    """Every line ``proc`` wrote on stdout and stderr holds at most 2,000 characters."""
    out, err = proc.stdout or "", proc.stderr or ""
    text = (out if isinstance(out, str) else out.decode()) + (
        err if isinstance(err, str) else err.decode()
    )
    longest = max((len(line) for line in text.splitlines()), default=0)
    assert longest <= logs.MAX_LINE, max(text.splitlines(), key=len)[:300]


def deep(base: Path, length: int) -> Path:
    """A directory path under ``base`` about ``length`` characters long (components of 200)."""
    path = base
    while len(str(path)) < length:
        path = path / ("d" * 200)
    return path


@pytest.mark.slow
def test_every_command_piped_writes_no_line_over_2000_characters(
    tiny_data: Path, tmp_path: Path
) -> None:
    """Each command on its usual path and with paths of 1,200 characters (the start, the
    end and the errors name them): one JSON line of each stays under the bound (the
    longest fields shortened, named in ``shortened``). bench-scaling measures for
    minutes: tests/test_step_scaling.py checks its lines with :func:`assert_lean`."""
    long = deep(tmp_path, 1200)
    out, publish = long / "out", tmp_path / "publish"
    publish.mkdir()
    trained = ("--data", str(tiny_data), "--output", str(out), "--max-steps", "30",
               "--batch-size", "40", "--publish-dir", str(publish))  # fmt: skip
    predicted = ("--model", str(out / "model"), "--features",
                 str(tiny_data / "test_features.txt"), "--out", str(long / "p.txt"))  # fmt: skip
    runs: dict[str, list[subprocess.CompletedProcess[bytes]]] = {
        "plan": [run("plan"), run("plan", "--format", "text")],
        "generate": [run("generate", "--out", str(long / "data"), "--train", "5", "--test", "2")],
        "train": [
            run("train", *trained),
            run("train", "--data", str(long / "missing"), "--output", str(tmp_path / "o")),
        ],
        "models": [run("models", str(publish)), run("models", str(publish), "--format", "json")],
        "predict": [run("predict", *predicted)],
        "exec": [
            run("exec", "--", "true", str(long)),
            run("exec", "--report", "--", "true", str(long)),
        ],
    }
    assert runs.keys() == cli.commands.keys() - {"bench-scaling"}
    codes = {name: [proc.returncode for proc in procs] for name, procs in runs.items()}
    expected = {"plan": [0, 0], "generate": [0], "train": [0, 2], "models": [0, 0],
                "predict": [0], "exec": [0, 0]}  # fmt: skip
    assert codes == expected, [p.stderr[-600:] for ps in runs.values() for p in ps]
    for procs in runs.values():
        for proc in procs:
            assert_lean(proc)
    start = json.loads(runs["train"][0].stdout.decode().splitlines()[0])
    assert start["event"] == "start" and start["shortened"]  # the long paths, in their middle
    assert start["config"]["max_steps"] == 30 and start["plan"]["intra_op_threads"] >= 1
    assert [v["version"] for v in json.loads(runs["models"][1].stdout)] == [1]  # published
    exec_line = json.loads(runs["exec"][0].stderr.decode())
    assert exec_line["plan"]["cpu_budget"] > 0 and "OMP_NUM_THREADS" in exec_line["env"]


def events_in(output: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (output / "logs" / "train.jsonl").read_text().splitlines()]


@pytest.mark.slow
@needs_dev_full
def test_a_run_whose_stdout_closes_or_fills_keeps_its_code_and_its_log_file(
    tiny_data: Path, tmp_path: Path
) -> None:
    """A real run's stdout: a pipe whose reader stops after the first line (``| head -1``),
    the same in the text view with its bar drawn into the pipe (TTY_COMPATIBLE=1: rich's
    terminal mode), and /dev/full. Each ends 0, says so in one line, and its log file holds
    every record."""
    args = ["train", "--data", str(tiny_data), "--batch-size", "40", "--max-steps", "40",
            "--eval-every", "20", "--steps-per-loop", "2"]  # fmt: skip
    cases = {
        "head": ([], b"\n", "Broken pipe"),
        "bar": (["--log-format", "text"], b"training", "Broken pipe"),
        "full": ([], None, "No space left on device"),
    }
    started = {}
    with open(FULL, "wb") as full:  # the three at once: the machine's 2 cores, less waiting
        for name, (extra, until, _) in cases.items():
            command = [sys.executable, "-m", "app", *args, "--output", str(tmp_path / name)]
            stdout = full if until is None else subprocess.PIPE
            environ = env(TTY_COMPATIBLE="1") if name == "bar" else env()
            started[name] = subprocess.Popen([*command, *extra], stdout=stdout,
                                             stderr=subprocess.PIPE, env=environ)  # fmt: skip

    def finish(name: str) -> tuple[int, str]:
        """Read as the case's reader does (live: a thread each), then the run's end."""
        proc, until = started[name], cases[name][1]
        if proc.stdout is not None and until is not None:
            seen = b""
            while until not in seen and (chunk := proc.stdout.read1(4096)):
                seen += chunk
            proc.stdout.close()  # the reader is gone: the run's next write meets a broken pipe
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode()
        return proc.wait(timeout=300), stderr

    with ThreadPoolExecutor(len(started)) as readers:
        ended = dict(zip(started, readers.map(finish, started), strict=True))
    for name, (code, stderr) in ended.items():
        why = cases[name][2]
        assert code == 0, (name, stderr[-2000:])
        assert stderr.splitlines() == [
            f"coretrain: stdout: {why}: the log stops there; logs/train.jsonl has every record"
        ], name
        records = events_in(tmp_path / name)
        assert records[0]["event"] == "start" and records[-1]["event"] == "end", name
        assert records[-1]["status"] == "completed" and records[-1]["final_step"] == 40
        assert [r["step"] for r in records if r["event"] == "progress"] == [20, 40], name


def test_a_terminal_that_goes_away_under_the_bar_is_said_once(tmp_path: Path) -> None:
    """The view on a real pseudo-terminal whose other side is closed mid-bar (a terminal
    window shut, an ssh session dropped: writes fail with EIO): one line on stderr, the
    process goes on to its own end."""
    feed = (
        "import sys, time\n"
        "from app import logs\n"
        "logs.setup(text=True)\n"
        "for step in range(1, 400):\n"
        "    logs.event('step', 's', level=logs.STEP, step=step, max_steps=400, loss=0.5,\n"
        "               samples_per_step=8, cpu_budget=1.0)\n"
        "    time.sleep(0.005)\n"
        "logs.event('end', 'done', status='preempted')\n"
        "print('the end', file=sys.stderr)\n"
    )
    master, slave = pty.openpty()
    environ = env(TERM="xterm-256color", COLUMNS="120")
    proc = subprocess.Popen([sys.executable, "-c", feed], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=subprocess.PIPE, env=environ, cwd=REPO)  # fmt: skip
    os.close(slave)
    seen = b""
    while b"training" not in seen:
        seen += os.read(master, 4096)
    os.close(master)  # the terminal is gone
    assert proc.stderr is not None
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, stderr
    assert stderr.splitlines() == [
        "coretrain: stdout: Input/output error: the log stops there",
        "the end",
    ]


def test_a_stdout_that_can_t_encode_everything_still_gets_every_record(tmp_path: Path) -> None:
    """PYTHONIOENCODING=ascii (or a Latin-1 locale) and a path with "é" and "≈": JSON lines
    in ASCII (the same JSON), the view with the character escaped; no traceback."""
    out = tmp_path / "données≈"
    args = ("generate", "--out", str(out), "--train", "5", "--test", "2")
    proc = run(*args, PYTHONIOENCODING="ascii")
    assert (proc.returncode, proc.stderr) == (0, b"")
    (record,) = [json.loads(line) for line in proc.stdout.decode("ascii").splitlines()]
    assert record["files"]["train_labels"] == str(out / "train_labels.txt")
    text = run(*args, "--log-format", "text", PYTHONIOENCODING="ascii")
    assert (text.returncode, text.stderr) == (0, b"")
    assert text.stdout.decode("ascii").startswith("synthetic demo data in ")
    assert "donn\\xe9es\\u2248" in text.stdout.decode("ascii")
