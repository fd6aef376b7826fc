"""One run per output directory; a killed holder never blocks the next run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app import lock
from app.errors import OutputLocked
from tests.conftest import REPO, run_cli

HOLD = """
import sys, time
from pathlib import Path
from app import lock
h = lock.acquire(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(120)
"""


def _holder(out: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_second_holder_is_refused_and_named(tmp_path: Path) -> None:
    first = lock.acquire(tmp_path)
    with pytest.raises(OutputLocked) as err:
        lock.acquire(tmp_path)
    assert str(tmp_path / ".lock") in str(err.value)
    first.close()
    lock.acquire(tmp_path).close()  # released on close


def test_overlapping_train_exits_75_at_once(tmp_path: Path) -> None:
    holder = _holder(tmp_path / "out")
    try:
        proc = run_cli("train", "--data", str(tmp_path), "--output", str(tmp_path / "out"))
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 75, proc.stderr
    assert f"pid {holder.pid}" in proc.stderr


def test_lock_of_a_killed_run_does_not_block(tmp_path: Path) -> None:
    holder = _holder(tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.wait()  # reaped: the kernel has released its flock
    assert (tmp_path / ".lock").read_text().strip() == str(holder.pid)  # stale file remains
    lock.acquire(tmp_path).close()


HAND_OVER = """
import os, sys
from pathlib import Path
from app import lock
out = Path(sys.argv[1])
if sys.argv[2] == "first":  # take the lock, then exec into the second image, as a re-plan does
    held = lock.acquire(out)
    os.set_inheritable(held.fileno(), True)
    os.environ[lock.HELD_FD_ENV] = str(held.fileno())
    os.execv(sys.executable, [sys.executable, sys.argv[0], str(out), "second"])
held = lock.acquire(out)  # adopts the inherited lock instead of failing with exit 75
print("adopted", lock.HELD_FD_ENV in os.environ, flush=True)
sys.stdin.readline()  # hold it until the test is done
"""


def test_a_restarted_run_keeps_its_lock_across_exec(tmp_path: Path) -> None:
    script = tmp_path / "hand_over.py"
    script.write_text(HAND_OVER)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out), "first"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().split() == ["adopted", "False"]
        with pytest.raises(OutputLocked):  # held all along: nobody else got in
            lock.acquire(out)
    finally:
        proc.communicate("done\n", timeout=30)
    assert proc.returncode == 0
    lock.acquire(out).close()  # released when it exited
