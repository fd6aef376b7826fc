"""Run one measurement in a fresh interpreter and read back its JSON result and its rusage.

TensorFlow's thread pools are process-global and fixed at first use, so every measurement
runs as ``python -m <module> --worker <json spec>`` with its environment (the thread plan)
set before anything is imported. The worker prints one JSON object as its last stdout
line (:func:`serve`); :func:`run` reaps it with ``wait4(2)``, whose rusage covers the
process and the children it waited for: ``peak_rss_mb`` is the largest resident set of
any of them (``ru_maxrss``, KiB on Linux), ``cpu_s`` their user + system CPU seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def run(
    module: str,
    spec: Mapping[str, Any],
    env: Mapping[str, str],
    python: str = sys.executable,
    timeout: float = 900,
) -> dict[str, Any]:
    """Run ``python -m module --worker spec`` under ``env``; return its result dict.

    Adds ``process_s`` (wall seconds of the whole process, imports included),
    ``cpu_s`` (user + system CPU seconds of it and its waited-for children) and
    ``peak_rss_mb`` (MiB). A failed worker gives ``{"error": <last stderr line>}``
    with the same fields.
    """
    full_env = dict(env)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [python, "-m", module, "--worker", json.dumps(dict(spec))],
            cwd=REPO,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=err,
        )
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None
            out = proc.stdout.read().decode(errors="replace")
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        measured = {
            "process_s": round(time.perf_counter() - t0, 2),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        }
        err.seek(0)
        stderr = err.read().decode(errors="replace").strip().splitlines()
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": (stderr or [f"exit {proc.returncode}"])[-1], **measured}
    return {**json.loads(lines[-1]), **measured}


def serve(workers: Mapping[str, Callable[[dict[str, Any]], dict[str, Any]]]) -> bool:
    """If argv is ``--worker SPEC``: run ``workers[spec["kind"]](spec)``, print its JSON.

    Returns True when it ran a worker (the caller then exits), False otherwise.
    """
    if len(sys.argv) != 3 or sys.argv[1] != "--worker":
        return False
    spec = json.loads(sys.argv[2])
    result = workers[spec["kind"]](spec)
    print(json.dumps(result), flush=True)
    return True


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(fn(), wall seconds, CPU seconds of this process) -- children not included."""
    w0, c0 = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - w0, time.process_time() - c0
