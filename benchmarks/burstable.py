"""Requests without limits (a Kubernetes Burstable pod): what should the pools be sized to?

``python -m benchmarks.burstable`` (root, cgroup v1 ``cpu`` hierarchy; a one-off
measurement, not part of CI). A Burstable pod with a CPU request and no limit has no CFS
quota; its request only becomes ``cpu.shares`` (request × 1024 per CPU), a weight that
matters when the node's CPUs are contended. Here, on all of this machine's CPUs:

* the job (``coretrain train``) runs in a cgroup with the shares of its request
  (``--request``, default 1 CPU → 1024) and no quota;
* a neighbour cgroup runs busy loops (one per CPU) with equal or larger shares, or
  nothing (the node idle);
* the job runs with threads = the request (what sizing by the ``CPU_REQUEST`` hint would
  give) and threads = all CPUs (the cpuset, the plan's rule without a quota).

For each case: the job's steady-state samples/s (progress windows after the first) and
the CPU seconds each group got while the job trained (``/proc/<pid>/stat`` of every
process in the group). The order of runs is shuffled per round; ``--rounds`` repeats.
Prints a table on stderr and the JSON report on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.cgroup_run import CpuCgroup, cpu_cgroup, unavailable_reason
from benchmarks.cpu_rounding import clean_env, coretrain, load_average

REPO = Path(__file__).resolve().parents[1]
SHARES_PER_CPU = 1024  # Kubernetes: cpu.shares = request in millicores × 1024 / 1000
BURN = "while True:\n    pass\n"


def log(message: str) -> None:
    print(f"[burstable {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cpu_seconds(group: CpuCgroup) -> float:
    """User + system CPU seconds of the processes now in ``group`` (and their threads)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in group.pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


@contextmanager
def neighbour(shares: int | None, burners: int) -> Iterator[CpuCgroup | None]:
    """A cgroup of ``burners`` busy loops with ``shares``; None when the node is idle."""
    if shares is None or burners == 0:
        yield None
        return
    with cpu_cgroup(None, prefix="coretrain-bench-neighbour", shares=shares) as group:
        procs = [
            subprocess.Popen(group.command([sys.executable, "-c", BURN])) for _ in range(burners)
        ]
        try:
            time.sleep(0.5)
            yield group
        finally:
            for p in procs:
                p.kill()
                p.wait()


def run_job(
    threads: int, request: float, data: Path, cache: Path, args: argparse.Namespace, other: Any
) -> dict[str, Any]:
    """Train once in a fresh cgroup with the request's shares; rates and CPU seconds."""
    out = Path(tempfile.mkdtemp(prefix="burst-", dir=args.work))
    cmd = [*coretrain(), "train", "--data", str(data), "--output", str(out)]
    cmd += ["--cache-dir", str(cache), "--max-steps", str(args.steps)]
    cmd += ["--batch-size", str(args.batch_size), "--eval-every", str(args.eval_every)]
    cmd += ["--checkpoint-every", str(args.steps), "--intra-op-threads", str(threads)]
    env = {**clean_env(), "CPU_REQUEST": str(int(request * 1000))}
    rates: list[tuple[int, float]] = []
    marks: list[tuple[float, float]] = []
    with cpu_cgroup(None, prefix="coretrain-bench-job", shares=int(request * SHARES_PER_CPU)) as g:
        proc = subprocess.Popen(
            g.command(cmd), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            event = json.loads(line)
            if event.get("event") == "progress":
                rates.append((event["step"], event["examples_per_sec"]))
                marks.append((cpu_seconds(g), cpu_seconds(other) if other else 0.0))
        returncode = proc.wait()
    shutil.rmtree(out, ignore_errors=True)
    record: dict[str, Any] = {"threads": threads, "returncode": returncode}
    if returncode != 0 or len(rates) < 2:
        return {**record, "error": f"exit {returncode}, {len(rates)} progress events"}
    steady = rates[1:]
    seconds = sum(
        (step - prev) * args.batch_size / rate
        for (prev, _), (step, rate) in zip(rates, steady, strict=False)
    )
    samples = (rates[-1][0] - rates[0][0]) * args.batch_size
    job_cpu = marks[-1][0] - marks[0][0]
    other_cpu = marks[-1][1] - marks[0][1]
    return {
        **record,
        "samples_per_s": round(samples / seconds, 1),
        "job_cpus": round(job_cpu / seconds, 2),
        "neighbour_cpus": round(other_cpu / seconds, 2),
        "seconds": round(seconds, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=REPO / "bench-output" / "data")
    p.add_argument("--request", type=float, default=1.0, help="the job's CPU request (CPUs)")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()))
    args = p.parse_args(argv)
    reason = unavailable_reason()
    if reason:
        log(f"skipped: {reason}")
        return 2
    cpus = len(os.sched_getaffinity(0))
    request = args.request
    neighbours = {
        "idle node": None,
        f"busy neighbour, shares {SHARES_PER_CPU} (equal)": SHARES_PER_CPU,
        f"busy neighbour, shares {2 * SHARES_PER_CPU} (larger)": 2 * SHARES_PER_CPU,
    }
    thread_counts = sorted({max(1, round(request)), cpus})
    args.work.mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix="burst-cache-", dir=args.work))
    rng = random.Random(args.seed)
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        cases = [(n, t) for n in neighbours for t in thread_counts]
        rng.shuffle(cases)
        for name, threads in cases:
            log(f"round {r + 1}: {name}, {threads} intra-op threads")
            with neighbour(neighbours[name], cpus) as other:
                rec = run_job(threads, request, args.data, cache, args, other)
            runs.append({"case": name, "load_before": load_average(), **rec})
    shutil.rmtree(cache, ignore_errors=True)
    rows = []
    for name in neighbours:
        for threads in thread_counts:
            ok = [
                x
                for x in runs
                if x["case"] == name and x["threads"] == threads and "error" not in x
            ]
            if not ok:
                continue
            rows.append(
                {
                    "case": name,
                    "threads": threads,
                    "samples_per_s": round(statistics.median(x["samples_per_s"] for x in ok), 1),
                    "job_cpus": round(statistics.median(x["job_cpus"] for x in ok), 2),
                    "neighbour_cpus": round(statistics.median(x["neighbour_cpus"] for x in ok), 2),
                    "runs": [x["samples_per_s"] for x in ok],
                }
            )
    for row in rows:
        log(
            f"{row['case']:40s} threads {row['threads']}: {row['samples_per_s']:>9,.0f} samples/s, "
            f"job {row['job_cpus']} CPUs, neighbour {row['neighbour_cpus']} CPUs {row['runs']}"
        )
    report = {"request": request, "cpus": cpus, "rows": rows, "runs": runs}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
