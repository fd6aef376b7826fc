"""A user's own Keras script inside a CPU quota: bare, and through ``coretrain exec``.

``python -m benchmarks.exec_keras`` (root, cgroup v1 ``cpu`` hierarchy; a one-off
measurement, not part of CI) generates a demo data set (:mod:`app.data.synthetic`, what
``coretrain generate`` writes), then runs ``benchmarks/seed_keras.py`` (the seed's CNN as a
plain Keras script) ``--rounds`` times in each of two ways, interleaved (the order alternates
per round), each run in a fresh v1 cpu cgroup with a ``--cpus`` CFS quota
(:mod:`benchmarks.cgroup_run`; ``cpu.shares`` at the maximum, so that the quota, not the
machine's other processes, limits it):

* ``bare``: ``python benchmarks/seed_keras.py DATA``: TensorFlow and OpenBLAS count the CPUs
  they see;
* ``exec``: ``coretrain exec -- python benchmarks/seed_keras.py DATA``: the plan's variables.

Per run: the script's samples/s (its steps after the warm-up), and from the group's
``cpu.stat`` over the whole run (TensorFlow's import, the text loading and the fit)
the throttled seconds and the share of throttled periods. Prints the CPU model, a table on
stderr and one JSON report on stdout (also ``--json-out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.data import synthetic
from benchmarks.cgroup_run import MAX_SHARES, cpu_cgroup, unavailable_reason

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "seed_keras.py"
WAYS = ("bare", "exec")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_model() -> dict[str, str]:
    """``model name``, ``cpu family`` and ``model`` of the first processor in /proc/cpuinfo."""
    found: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "cpu family", "model") and key not in found:
            found[key] = value.strip()
        if not line.strip() and found:
            break
    return found


def command(way: str, data: Path, steps: int) -> list[str]:
    script = [sys.executable, str(SCRIPT), str(data), "--steps", str(steps)]
    if way == "bare":
        return script
    coretrain = Path(sys.executable).with_name("coretrain")
    return [str(coretrain), "exec", "--", *script]


def clean_env() -> dict[str, str]:
    """The environment without thread settings of its own (both ways start alike)."""
    drop = ("CORETRAIN_", "TF_NUM_", "OMP_", "MKL_", "OPENBLAS_", "CPU_LIMIT", "CPU_REQUEST")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def run_once(way: str, cpus: float, data: Path, steps: int) -> dict[str, Any]:
    with cpu_cgroup(cpus, prefix="coretrain-bench-exec", shares=MAX_SHARES) as group:
        before = group.stat()
        start = time.monotonic()
        proc = subprocess.run(
            group.command(command(way, data, steps)),
            capture_output=True,
            text=True,
            env=clean_env(),
            cwd=REPO,
            timeout=1800,
        )
        wall = time.monotonic() - start
        after = group.stat()
    if proc.returncode != 0:
        raise RuntimeError(f"{way}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    periods = after["nr_periods"] - before["nr_periods"]
    throttled = after["nr_throttled"] - before["nr_throttled"]
    result.update(
        way=way,
        wall_s=round(wall, 1),
        throttled_s=round((after["throttled_time"] - before["throttled_time"]) / 1e9, 2),
        throttled_ratio=round(throttled / periods, 3) if periods else None,
    )
    return result


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| way | intra-op threads (TF_NUM_INTRAOP_THREADS) | BLAS threads | samples/s median "
        "(rounds) | throttled s median (rounds) | throttled periods | wall s median |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for way in WAYS:
        mine = [r for r in runs if r["way"] == way]
        rates = [r["samples_per_s"] for r in mine]
        throttled = [r["throttled_s"] for r in mine]
        ratios = [r["throttled_ratio"] or 0.0 for r in mine]
        intra = mine[0]["env"]["TF_NUM_INTRAOP_THREADS"] or "unset (TensorFlow: affinity)"
        lines.append(
            f"| {way} | {intra} | {mine[0]['blas_threads']} | "
            f"{statistics.median(rates):,.0f} ({' / '.join(f'{r:,.0f}' for r in rates)}) | "
            f"{statistics.median(throttled):.1f} ({' / '.join(f'{t:.1f}' for t in throttled)}) | "
            f"{statistics.median(ratios):.0%} | "
            f"{statistics.median(r['wall_s'] for r in mine):.0f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason is not None:
        log(f"cannot measure: {reason}")
        return 2
    model = cpu_model()
    log(f"CPU: {model} ({os.cpu_count()} CPUs online), {platform.platform()}")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="coretrain-exec-keras-") as work:
        data = Path(work) / "data"
        synthetic.generate(data, train=args.train, test=10, seed=0)
        for round_ in range(args.rounds):
            order = WAYS if round_ % 2 == 0 else WAYS[::-1]
            for way in order:
                result = run_once(way, args.cpus, data, args.steps)
                result["round"] = round_
                log(json.dumps(result))
                runs.append(result)
    report = {
        "cpu": model,
        "cpus_quota": args.cpus,
        "steps": args.steps,
        "batch_size": 1000,
        "train_rows": args.train,
        "load_average": list(os.getloadavg()),
        "runs": runs,
    }
    log(table(runs))
    text = json.dumps(report, indent=2)
    if args.json_out is not None:
        args.json_out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
