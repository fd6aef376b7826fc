"""Real ``coretrain train`` runs for the end-to-end tests, in the background.

Every scenario of tests/test_signals.py, tests/test_checkpointer.py and tests/test_inputs.py
runs the real ``coretrain train`` in a subprocess on real files. Those runs are independent
of each other, so a module starts the ones its selected tests use as soon as it starts
(:func:`start_in_background`), in the session's pool of two workers (the ``pool`` fixture
of tests/conftest.py: the machine has 2 cores; TensorFlow's import alone is ~6 CPU
seconds), and each test waits for the result it asserts on. A scenario is a module-scoped
fixture returning a Future, placed directly above the tests that use it. Runs that need a
finished reference run (the ``reference`` fixture of tests/conftest.py) copy its output
directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests import kill_harness
from tests.conftest import events, json_lines, run_cli

STEPS = 10
#: A step a signalled run can't reach before its signal lands, however slow the machine.
FAR_STEPS = 100_000
# A constant learning rate: a stopped run (--max-steps FAR_STEPS) and its rerun to step 10
# then train with the same rates as the uninterrupted run to 10 (under the cosine default
# the rate depends on --max-steps: tests/test_identity.py).
ARGS = [
    "--batch-size", "40", "--eval-every", "1", "--checkpoint-every", "2",
    "--keep-checkpoints", "5", "--seed", "3", "--lr-schedule", "constant",
]  # fmt: skip
WORKERS = 2
WAIT = 1200.0  # seconds a test waits for its background run (a hang, not a slow machine)
# Resumed vs uninterrupted per-step losses on one machine: identical to the bit (the
# batches and dropout masks depend only on (seed, step), the restored state is the saved
# state, and the CPU kernels, Eigen's or oneDNN's, are deterministic for a fixed thread
# count on one CPU).
LOSS_TOLERANCE = 0.0
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def start_in_background(request: pytest.FixtureRequest, *names: str) -> None:
    """Start the background runs ``names`` (fixtures of the requesting module) that the
    module's selected tests use, in that order, so that they overlap each other and the
    module's tests. Called from a module's autouse module-scoped fixture."""
    wanted: set[str] = set()
    for item in request.session.items:
        if getattr(item, "module", None) is request.module:
            wanted.update(getattr(item, "fixturenames", ()))
    for name in names:
        if name in wanted:
            request.getfixturevalue(name)


@dataclass
class Done:
    """A finished ``coretrain train`` run."""

    out: Path
    returncode: int
    stdout: str
    stderr: str

    @property
    def records(self) -> list[dict]:
        return json_lines(self.stdout)

    def why(self) -> str:
        return (
            f"exit {self.returncode}\nstderr: {self.stderr[-2000:]}\nstdout: {self.stdout[-2000:]}"
        )


def train_args(data: Path, out: Path, steps: int = STEPS, *extra: str) -> list[str]:
    return ["--data", str(data), "--output", str(out), "--max-steps", str(steps), *ARGS, *extra]


def train(data: Path, out: Path, steps: int = STEPS, *extra: str, env: dict | None = None) -> Done:
    proc = run_cli("train", *train_args(data, out, steps, *extra), env=env, timeout=WAIT)
    return Done(out, proc.returncode, proc.stdout, proc.stderr)


def reference_ok(reference: Future[Done]) -> Done:
    ref = reference.result(timeout=WAIT)
    assert ref.returncode == 0, "the reference run failed: " + ref.why()
    return ref


def ref_data(ref: Done) -> Path:
    """The data set a run trained on (its ``start`` event's configuration)."""
    start = events(ref.records, "start")[0]
    return Path(start["config"]["data_dir"])


def losses(records: list[dict]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in events(records, "progress")}


def digest(directory: Path) -> dict[str, str]:
    """File name -> sha256 of every file directly in ``directory``."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def copy_output(src: Path, dst: Path, with_cache: bool = True) -> Path:
    ignore = None if with_cache else shutil.ignore_patterns("cache")
    shutil.copytree(src, dst, ignore=ignore)
    return dst


def checkpoint_tensors(prefix: Path) -> dict[str, np.ndarray]:
    """The saved variables of the checkpoint ``prefix`` (imports TensorFlow)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name not in ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    }


def no_partial_cache(out: Path) -> list[str]:
    """What a failed or stopped conversion left in OUTPUT/cache but its resumable work
    directory (``.partial-<key>``, finished files only): nothing else is allowed."""
    root = out / "cache"
    if not root.exists():
        return []
    left = [p.name for p in root.iterdir() if not p.name.startswith(".partial-")]
    left += [f"{w.name}/{p.name}" for w in root.glob(".partial-*") for p in w.glob("*.part")]
    return sorted(left)


def mount_tmpfs(target: Path, options: str) -> str | None:
    """Mount a tmpfs at ``target``; None, or why it can't be done here (a skip reason)."""
    if not IS_ROOT:
        return "mounting a tmpfs needs root"
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
        capture_output=True,
        text=True,
    )
    return None if done.returncode == 0 else f"mount -t tmpfs not permitted: {done.stderr.strip()}"


def umount(target: Path) -> None:
    subprocess.run(["umount", str(target)], capture_output=True)
    if os.path.ismount(target):
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


@dataclass
class Signalled:
    stopped: Done
    seconds_to_exit: float  # from sending the signal to the exit, measured by the parent
    rerun: Done | None
    left: list[str] = dataclasses.field(default_factory=list)  # OUTPUT after the stop
    checkpoints: list[str] = dataclasses.field(default_factory=list)  # its checkpoints/
    log_file: str = ""  # its logs/train.jsonl


def run_and_signal(
    args: list[str], out: Path, sig: signal.Signals, when: Callable[[dict], bool], workdir: Path
) -> tuple[Done, float]:
    """Start ``coretrain train ARGS``, send it ``sig`` at the first record ``when`` accepts,
    wait for its exit: the run and the seconds from the signal to the exit."""
    child = kill_harness.Child(args, workdir / "stderr.txt")
    seen = child.wait_for(when)
    sent = time.monotonic()
    if seen is not None and child.proc.poll() is None:
        child.proc.send_signal(sig)
    rc, stdout = child.finish(timeout=WAIT)
    seconds = time.monotonic() - sent
    return Done(out, rc, stdout, (workdir / "stderr.txt").read_text()), seconds
