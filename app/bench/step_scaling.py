"""How the training step scales with threads and processes here (``coretrain bench-scaling``).

What a user runs on their own node (``docker run … coretrain bench-scaling``, or
``python -m benchmarks.scaling``) before choosing ``--cpus``, ``--workers`` and threads:

* **threads**: train-step samples/s of each formulation and precision at 1, 2, 4, … up
  to the CPU budget's threads, each in a fresh process pinned to that many CPUs (thread
  pools are fixed per process; inter-op threads as the plan gives that many CPUs), with
  the speed-up over 1 thread, the parallel efficiency (speed-up / threads) and the
  knee: the first count after which doubling the threads gains less than
  :data:`KNEE_GAIN`;
* **processes**: the same budget split as K worker processes of N/K threads each
  (MultiWorkerMirroredStrategy on localhost, each pinned to its own CPUs), end to end
  with ``coretrain train`` on generated data, against one process of N threads;
* **hyperthreads**: where CPUs share physical cores, one thread per physical core vs one
  per logical CPU.

The report is a dict (app/commands/bench_scaling.py prints it as a table). The measured step is
the run's training step (app/training/loop/step.py, timed as app/training/state/choose.py times the
candidates) on a synthetic batch of the default shape (20×195, K = 3); every measuring
process plans and applies its threads and affinity as a run does (app/budget/apply.py).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from app.cluster.spec import free_ports
from app.output import Output

#: Doubling the threads must gain at least this factor to be worth it (the knee).
KNEE_GAIN = 1.2
STEPS = 8
WARMUP = 3


def _threads_ladder(top: int) -> list[int]:
    ladder, n = [], 1
    while n < top:
        ladder.append(n)
        n *= 2
    return [*ladder, top]


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: the plan for ``spec``'s threads, pinned to its CPUs (``pin``:
    the first N CPUs, or one per physical core), applied; then the run's training step
    timed on a synthetic batch (:func:`app.training.state.choose.step_time`)."""
    from app.budget import apply, detect_plan
    from app.budget.plan import PlanOptions

    threads = spec["threads"]
    options = PlanOptions(cpus=threads, intra_op_threads=threads, pin=spec["pin"])
    apply.apply(detect_plan("/", options, bfloat16=True))
    apply.import_tensorflow()
    import numpy as np
    import tensorflow as tf

    from app.config import RecipeConfig, ScheduleConfig
    from app.training.state.choose import step_time

    rng = np.random.default_rng(0)
    b = spec["batch"]
    x = tf.constant(rng.standard_normal((b, 20, 195, 1), dtype=np.float32))
    y = tf.constant(rng.standard_normal((b, 3), dtype=np.float32))
    recipe, end = RecipeConfig(batch_size=b), ScheduleConfig().max_steps  # the defaults
    ms = step_time(spec["formulation"], spec["precision"], x, y, recipe, end, STEPS, WARMUP)
    return {"step_ms": ms, "samples_per_s": b / ms * 1e3}


def _measure_step(spec: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "app.bench.step_scaling", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _rows(results: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    base = results.get(1, {}).get("samples_per_s")
    rows: list[dict[str, Any]] = []
    previous: float | None = None
    for threads in sorted(results):
        rate = results[threads].get("samples_per_s")
        speedup = rate / base if rate and base else None
        gain: float | None = rate / previous if rate and previous else None
        rows.append(
            {
                "threads": threads,
                "samples_per_s": round(rate, 1) if rate else None,
                "speedup": round(speedup, 2) if speedup else None,
                "efficiency": round(speedup / threads, 2) if speedup else None,
                "gain_over_previous": round(gain, 2) if gain else None,
                **({"error": results[threads]["error"]} if "error" in results[threads] else {}),
            }
        )
        previous = rate
    return rows


def _knee(rows: list[dict[str, Any]]) -> int | None:
    """The last thread count before doubling stops paying (gain < KNEE_GAIN), if any."""
    for before, row in itertools.pairwise(rows):
        if row["gain_over_previous"] is not None and row["gain_over_previous"] < KNEE_GAIN:
            return int(before["threads"])
    return None


def _pin_to(cpus: list[int]) -> Any:
    """A preexec_fn giving a worker process its own ``cpus`` before it starts, as a
    container's cpuset would (``taskset``): the worker's own plan then sees them and
    app/budget/apply.py sets its threads; this process is not changed."""

    def pin() -> None:
        os.sched_setaffinity(0, cpus)

    return pin


def _train_rate(
    data: Path, work: Path, cpus: list[int], workers: int, batch: int, steps: int
) -> dict[str, Any]:
    """End-to-end samples/s of ``workers`` processes splitting ``cpus`` (steady windows)."""
    share = len(cpus) // workers
    hosts = ",".join(f"localhost:{p}" for p in free_ports(workers)) if workers > 1 else None
    procs = []
    for i in range(workers):
        args = [sys.executable, "-m", "app", "train", "--data", str(data), "--output",
                str(work / f"k{workers}-{i}"), "--max-steps", str(steps), "--eval-every",
                str(steps // 4), "--checkpoint-every", str(steps), "--target-loss", "0",
                "--batch-size", str(batch // workers), "--formulation", "fast",
                "--precision", "float32"]  # fmt: skip
        if hosts:
            args += ["--workers", str(workers), "--worker-index", str(i), "--worker-hosts", hosts]
        mine = cpus[i * share : (i + 1) * share]
        procs.append(
            subprocess.Popen(
                args,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                preexec_fn=_pin_to(mine),
            )
        )
    outs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode for p in procs):
        return {"workers": workers, "error": f"exit codes {[p.returncode for p in procs]}"}
    progress = [json.loads(line) for line in outs[0].splitlines() if '"progress"' in line]
    rates = [r["examples_per_sec"] for r in progress[1:]]
    return {
        "workers": workers,
        "threads_per_worker": share,
        "samples_per_s": round(statistics.median(rates), 1) if rates else None,
    }


def run(max_threads: int | None = None, batch: int = 1000, out: Path | None = None) -> dict:
    """Measure everything (module docstring); return the report (also written to ``out``)."""
    from app.budget import detect_plan

    plan = detect_plan("/", bfloat16=True)
    cpus = sorted(plan.cpuset)
    top = min(max_threads or plan.intra_op_threads, len(cpus))
    precisions = ["float32", "bfloat16"] if plan.native_bf16 else ["float32"]
    report: dict[str, Any] = {
        "cpu_model": plan.cpu_model,
        "cpus": len(cpus),
        "budget_threads": plan.intra_op_threads,
        "onednn": plan.onednn,
        "threads": {},
    }
    t0 = time.monotonic()
    for formulation in ("fast", "plain"):
        for precision in precisions:
            results = {}
            for n in _threads_ladder(top):
                spec = {"threads": n, "pin": "cores", "formulation": formulation,
                        "precision": precision, "batch": batch}  # fmt: skip
                results[n] = _measure_step(spec)
                _say(f"{formulation}/{precision} {n} threads: {results[n]}")
            rows = _rows(results)
            report["threads"][f"{formulation}/{precision}"] = {"rows": rows, "knee": _knee(rows)}
    cores = _physical_firsts(plan)
    if len(cores) < len(cpus):
        report["hyperthreads"] = {
            "physical_cores": _measure_step({"threads": len(cores), "pin": "physical",
                                             "formulation": "fast", "precision": "float32",
                                             "batch": batch}),
            "logical_cpus": report["threads"]["fast/float32"]["rows"][-1],
        }  # fmt: skip
    report["processes"] = _processes(cpus[:top], batch)
    report["seconds"] = round(time.monotonic() - t0, 1)
    if out is not None:
        with Output(out, "--out") as sink:
            sink.write((json.dumps(report, indent=2) + "\n").encode())
    return report


def _processes(cpus: list[int], batch: int) -> list[dict[str, Any]]:
    """1 × N vs K × N/K end to end, on a generated data set in a temporary directory."""
    from app.data import synthetic

    splits = [k for k in (1, 2, 4) if k <= len(cpus) and len(cpus) % k == 0]
    if len(splits) < 2:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        synthetic.generate(data, train=4 * batch, test=batch // 2, seed=0)
        rows = []
        for k in splits:
            rows.append(_train_rate(data, Path(tmp), cpus, k, batch, 40))
            _say(f"{k} worker(s): {rows[-1]}")
    return rows


def _physical_firsts(plan: Any) -> list[int]:
    from app.budget.topology import detect_topology

    topo = detect_topology("/", plan.cpuset)
    return sorted(min(core) for core in topo.cores)


def _say(message: str) -> None:
    print(f"[bench-scaling {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.argv[1]))), flush=True)
