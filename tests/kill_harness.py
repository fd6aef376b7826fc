"""Random kill -9 harness: kill training runs at random moments, rerun, check nothing was lost.

    python -m tests.kill_harness N [--workdir DIR] [--seed S] [--data DIR]

One output directory lives through N rounds. Round ``i`` raises the absolute
``--max-steps`` by :data:`STEPS_PER_ROUND`, starts ``coretrain train`` and sends it
SIGKILL at a random moment, then reruns it to the end and checks the rerun:

- exits 0 with ``end`` status ``completed`` at the absolute max step (also in ``metrics.json``);
- resumes from a step >= the newest checkpoint any earlier run logged (a logged
  checkpoint is never lost, and never silently replaced by a start from scratch);
- prints only JSON lines, and ``logs/train.jsonl`` holds only complete JSON lines;
- leaves no temporary files of the killed run (``ckpt-N_temp``, ``*.tempstate*``,
  ``checkpoint.tmp*``, ``.model.*``, cache temporaries);
- exported a model that loads (Keras and SavedModel agree; checked for every round in
  one process at the end, so TensorFlow is imported once).

The moment of the kill rotates through four triggers, each followed by a random delay
drawn from the duration the reruns measured for that operation: ``cache`` (the cache is
deleted first; trigger: the conversion's temporary directory appears), ``checkpoint``
(after a ``progress`` event at a checkpoint step, ``ckpt-N_temp`` appears: inside the
save), ``export`` (after the final checkpoint, ``.model.*`` appears: inside the export),
``anytime`` (uniform over the run after TensorFlow started). The output directory is
polled every millisecond for those names. The first round of each file trigger kills
at once (delay 0), so the kill lands inside the operation; later rounds wait a random
delay. What the kill left behind is recorded per round as evidence of where it landed
(``inside``: the operation's temporary file was still there after the kill). The harness
itself never imports TensorFlow. Exit status 0 when every round passed; the JSON summary
goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STEPS_PER_ROUND = 4
TRAIN_ARGS = [
    "--batch-size", "40", "--eval-every", "2", "--checkpoint-every", "2",
    "--keep-checkpoints", "3", "--seed", "5",
]  # fmt: skip
TRIGGERS = ("cache", "checkpoint", "export", "anytime")
RUN_TIMEOUT = 900.0  # seconds; a run that hangs this long is a failure, not a slow machine


@dataclass
class Round:
    """What one round did and found."""

    index: int
    max_steps: int
    trigger: str
    delay: float = 0.0  # seconds from the trigger to SIGKILL
    seen: bool = False  # the trigger happened (the operation's temporary file appeared)
    killed: bool = False
    last_event: str | None = None  # the last event the killed run printed
    leftovers: list[str] = field(default_factory=list)  # temporary files the kill left
    inside: bool = False  # the kill interrupted the operation: its temporary file remained
    newest_logged_checkpoint: int | None = None
    resumed_from: int | None = None
    rerun_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def child_env() -> dict[str, str]:
    """The environment for a child run: no CORETRAIN_*/TF_NUM_* settings leak in, and the
    formulation and precision are fixed (a rerun must compute as the killed run did)."""
    from tests.conftest import PINNED

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORETRAIN_", "TF_NUM"))}
    return {**env, **PINNED}


def parse_lines(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(JSON records, lines that are not JSON objects)."""
    records, bad = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            bad.append(line[:200])
            continue
        if isinstance(obj, dict):
            records.append(obj)
        else:
            bad.append(line[:200])
    return records, bad


def leftovers(out: Path) -> list[str]:
    """Temporary files of an interrupted checkpoint save, export or cache conversion."""
    found = []
    ckpt = out / "checkpoints"
    if ckpt.is_dir():
        for p in ckpt.iterdir():
            if "_temp" in p.name or ".tempstate" in p.name or p.name.startswith("checkpoint.tmp"):
                found.append(f"checkpoints/{p.name}")
    if out.is_dir():
        found += [p.name for p in out.iterdir() if p.name.startswith(".model.")]
    cache = out / "cache"
    if cache.is_dir():
        found += [f"cache/{p.name}" for p in cache.iterdir() if p.name.startswith(".")]
    log = out / "logs" / "train.jsonl"
    if log.is_file() and log.stat().st_size and not log.read_bytes().endswith(b"\n"):
        found.append("logs/train.jsonl (partial last line)")
    return sorted(found)


class Child:
    """A ``coretrain train`` process whose stdout lines are read as they come."""

    def __init__(self, args: list[str], stderr_path: Path) -> None:
        self._stderr = open(stderr_path, "w")  # noqa: SIM115 - closed in finish()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "train", *args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=REPO,
            env=child_env(),
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.text: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.text.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, want: Any, timeout: float = RUN_TIMEOUT) -> dict[str, Any] | None:
        """The first record for which ``want(record)`` is true; None if the run ended first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                return None
            if line is None:
                return None
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and want(record):
                return record

    def finish(self, timeout: float = RUN_TIMEOUT) -> tuple[int, str]:
        """Wait for the exit; (exit status, all of stdout)."""
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(timeout=30)
            self._stderr.close()
        return rc, "".join(self.text)


def _appears(child: Child, directory: Path, match: Any, timeout: float) -> bool:
    """Poll ``directory`` (every ms) until a name for which ``match(name)`` is true appears."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and child.proc.poll() is None:
        try:
            if any(match(name) for name in os.listdir(directory)):
                return True
        except FileNotFoundError:
            pass
        time.sleep(0.001)
    return False


#: What each file trigger's interrupted operation leaves (a name in :func:`leftovers`).
LEFTOVER_OF = {"cache": "cache/.", "checkpoint": "_temp", "export": ".model."}


def _kill_after(
    child: Child, out: Path, rnd: Round, rng: random.Random, est: dict[str, float]
) -> None:
    """Wait for the trigger, sleep a random delay, SIGKILL (if still running).

    For ``cache``, ``checkpoint`` and ``export`` the trigger is the operation's first
    temporary file appearing on disk (after the event that precedes the operation), so
    the kill lands inside the write with a good chance; ``rnd.seen`` says if it appeared.
    """
    max_steps = rnd.max_steps
    every = int(TRAIN_ARGS[TRAIN_ARGS.index("--checkpoint-every") + 1])
    if rnd.trigger == "cache":
        seen = child.wait_for(lambda r: r.get("event") == "cache" and r.get("reused") is False)
        rnd.seen = seen is not None and _appears(
            child, out / "cache", lambda n: n.startswith("."), 30.0
        )
        rnd.delay = rng.uniform(0.0, est["cache"])
    elif rnd.trigger == "checkpoint":
        seen = child.wait_for(
            lambda r: (
                r.get("event") == "progress"
                and r.get("step", 0) % every == 0
                and r.get("step") != max_steps
            )
        )
        rnd.seen = seen is not None and _appears(
            child, out / "checkpoints", lambda n: "_temp" in n, 10.0
        )
        rnd.delay = rng.uniform(0.0, est["save"])
    elif rnd.trigger == "export":
        seen = child.wait_for(
            lambda r: r.get("event") == "checkpoint" and r.get("step") == max_steps
        )
        rnd.seen = seen is not None and _appears(
            child, out, lambda n: n.startswith(".model."), 60.0
        )
        rnd.delay = rng.uniform(0.0, est["export"])
    else:
        seen = child.wait_for(lambda r: r.get("event") == "start")
        rnd.seen = seen is not None
        rnd.delay = rng.uniform(0.0, est["run"])
    if seen is None or child.proc.poll() is not None:
        return
    if rnd.index < len(TRIGGERS) and rnd.trigger in LEFTOVER_OF:
        rnd.delay = 0.0  # the first round of each kind: inside the operation
    time.sleep(rnd.delay)
    if child.proc.poll() is None:
        child.proc.send_signal(signal.SIGKILL)
        rnd.killed = True


def _rerun_checks(rnd: Round, out: Path, rc: int, stdout: str, newest: int | None) -> None:
    p = rnd.problems
    records, bad = parse_lines(stdout)
    if bad:
        p.append(f"rerun printed non-JSON lines: {bad[:3]}")
    ends = [r for r in records if r.get("event") == "end"]
    if rc != 0 or not ends:
        p.append(f"rerun exited {rc}; last records: {[r.get('message') for r in records[-3:]]}")
        return
    if ends[-1].get("status") != "completed" or ends[-1].get("final_step") != rnd.max_steps:
        p.append(f"rerun ended {ends[-1].get('status')} at {ends[-1].get('final_step')}")
    resumes = [r for r in records if r.get("event") == "resume"]
    rnd.resumed_from = resumes[0]["step"] if resumes else None
    if newest is not None and (rnd.resumed_from is None or rnd.resumed_from < newest):
        p.append(f"rerun resumed from {rnd.resumed_from}, but checkpoint {newest} was logged")
    metrics = json.loads((out / "metrics.json").read_text())
    if metrics.get("final_step") != rnd.max_steps or metrics.get("status") != "completed":
        p.append(f"metrics.json: {metrics.get('status')} at {metrics.get('final_step')}")
    _, bad_log = parse_lines((out / "logs" / "train.jsonl").read_text())
    if bad_log:
        p.append(f"logs/train.jsonl has non-JSON lines: {bad_log[:2]}")
    left = leftovers(out)
    if left:
        p.append(f"temporary files left after the rerun: {left}")
    for name in ("model/model.keras", "model/saved_model/saved_model.pb"):
        if not (out / name).is_file():
            p.append(f"{name} missing after the rerun")


VERIFY = """
import json, sys
import numpy as np, keras, tensorflow as tf
import app.model  # registers the custom layers
x = np.loadtxt(sys.argv[1], dtype=np.float32, max_rows=5)
result = {}
for path in sys.argv[2:]:
    try:
        a = keras.models.load_model(path + "/model.keras").predict(x, verbose=0)
        loaded = tf.saved_model.load(path + "/saved_model")  # keep it: it owns the variables
        b = loaded.serve(tf.constant(x)).numpy()
        ok = a.shape == b.shape == (len(x), a.shape[1]) and bool(np.isfinite(a).all())
        ok = ok and float(np.abs(a - b).max()) < 1e-4
        result[path] = "ok" if ok else f"bad: {a.shape} {b.shape} {a[0]} {b[0]}"
    except Exception as exc:  # report every model, not just the first failure
        result[path] = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps(result))
"""


def verify_models(model_dirs: list[Path], features: Path) -> dict[str, str]:
    """Load each export (``model.keras`` and ``saved_model/``) in one process: path -> "ok"/why."""
    if not model_dirs:
        return {}
    done = subprocess.run(
        [sys.executable, "-c", VERIFY, str(features), *map(str, model_dirs)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=child_env(),
        timeout=RUN_TIMEOUT,
    )
    if done.returncode != 0:
        return {
            str(d): f"verifier exited {done.returncode}: {done.stderr[-500:]}" for d in model_dirs
        }
    result: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(n: int, workdir: Path, data: Path, seed: int = 0, log: Any = None) -> dict[str, Any]:
    """Run ``n`` kill/rerun rounds in ``workdir`` on the data set in ``data``; return a summary.

    The summary has ``rounds`` (one dict per :class:`Round`), ``killed`` (how many runs
    were really killed by SIGKILL, not finished first), ``problems`` (all rounds' problems;
    empty when everything survived) and ``models`` (path -> load result).
    """
    rng = random.Random(seed)
    out = workdir / "output"
    saved_models = workdir / "models"
    saved_models.mkdir(parents=True, exist_ok=True)
    # Random delays are drawn from these windows (seconds); they follow the measured
    # durations of the reruns, so a slow machine still gets kills spread over each phase.
    est = {"cache": 0.3, "save": 0.1, "export": 3.0, "run": 15.0}
    newest: int | None = None  # newest checkpoint step any run has logged
    rounds: list[Round] = []
    for i in range(n):
        rnd = Round(
            index=i, max_steps=STEPS_PER_ROUND * (i + 1), trigger=TRIGGERS[i % len(TRIGGERS)]
        )
        rounds.append(rnd)
        if rnd.trigger == "cache":
            shutil.rmtree(out / "cache", ignore_errors=True)
        args = ["--data", str(data), "--output", str(out), "--max-steps", str(rnd.max_steps)]
        killed = Child([*args, *TRAIN_ARGS], workdir / f"round-{i}-killed.stderr")
        _kill_after(killed, out, rnd, rng, est)
        rc, stdout = killed.finish()
        records, _ = parse_lines(stdout)  # the last line may be cut by the kill
        rnd.last_event = records[-1].get("event") if records else None
        logged = [r["step"] for r in records if r.get("event") == "checkpoint"]
        if logged:
            newest = max(newest or 0, max(logged))
        rnd.newest_logged_checkpoint = newest
        if not rnd.killed and rc != 0:
            rnd.problems.append(f"the run to be killed failed on its own: exit {rc}")
        rnd.leftovers = leftovers(out)
        mark = LEFTOVER_OF.get(rnd.trigger)
        rnd.inside = rnd.killed and mark is not None and any(mark in x for x in rnd.leftovers)
        t0 = time.monotonic()
        rerun = Child([*args, *TRAIN_ARGS], workdir / f"round-{i}-rerun.stderr")
        rc, stdout = rerun.finish()
        rnd.rerun_seconds = round(time.monotonic() - t0, 1)
        _rerun_checks(rnd, out, rc, stdout, newest)
        if (out / "model").is_dir():
            shutil.copytree(out / "model", saved_models / f"round-{i}")
        records, _ = parse_lines(stdout)
        for r in records:
            if r.get("event") == "checkpoint":
                newest = max(newest or 0, r["step"])
                est["save"] = max(0.02, float(r.get("seconds", 0.0)))
            if r.get("event") == "export":
                est["export"] = max(0.5, 1.2 * float(r.get("seconds", 0.0)))
        stamps = [r["timestamp"] for r in records if r.get("event") in ("start", "end")]
        if len(stamps) == 2:  # the whole run after TensorFlow started
            span = datetime.fromisoformat(stamps[1]) - datetime.fromisoformat(stamps[0])
            est["run"] = max(2.0, span.total_seconds())
        if log:
            log(json.dumps(asdict(rnd)))
    models = verify_models(sorted(saved_models.iterdir()), data / "test_features.txt")
    for rnd in rounds:
        status = models.get(str(saved_models / f"round-{rnd.index}"), "no model exported")
        if status != "ok":
            rnd.problems.append(f"model of round {rnd.index}: {status}")
    return {
        "rounds": [asdict(r) for r in rounds],
        "killed": sum(r.killed for r in rounds),
        "problems": [f"round {r.index}: {p}" for r in rounds for p in r.problems],
        "models": models,
    }


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description="Kill training runs at random, check reruns.")
    parser.add_argument("n", type=int, help="rounds (kill + rerun each)")
    parser.add_argument("--workdir", type=Path, help="kept afterwards (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random kill moments")
    parser.add_argument("--data", type=Path, help="data set (default: a generated tiny one)")
    opts = parser.parse_args(argv)
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="kill-harness-"))
    workdir.mkdir(parents=True, exist_ok=True)
    data = opts.data
    if data is None:
        from app.data import synthetic

        data = workdir / "data"
        synthetic.generate(data, train=240, test=60, seed=1)
    t0 = time.monotonic()
    summary = run(opts.n, workdir, data, seed=opts.seed, log=lambda s: print(s, file=sys.stderr))
    summary["seconds"] = round(time.monotonic() - t0, 1)
    summary["workdir"] = str(workdir)
    print(json.dumps(summary, indent=2))
    return 0 if not summary["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
