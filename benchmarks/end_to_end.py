"""End-to-end training speed: ``train()`` reading its on-disk cache vs in-memory tensors.

Both variants run the project's entry point, :func:`app.training.run.train`, in a fresh process
with the thread plan applied by :func:`app.budget.apply.apply` (as ``coretrain train`` does),
on the same prepared cache, config and steps. ``cache`` is the real job: batches gathered
from the memory-mapped cache by the tf.data pipeline (:mod:`app.data.input.pipeline`).
``memory`` replaces only that pipeline with batches already in memory as tensors: the
first :data:`DISTINCT_BATCHES` batches of the run (125 MB of features at batch 1000, more
than the CPU's 32 MiB L3 cache), cycled, so the difference is what the input pipeline costs
the training loop. ``memory_one_batch`` feeds one batch again every step, as a fixed
tensor: it is reported too, and is faster than any real input can be, because the 15.6 MB
batch then stays in the L3 cache from one step to the next (measured: 8 distinct
in-memory batches ran at the on-disk cache's speed, one reused batch 4–8 % faster).

samples/s come from the ``progress`` events in ``logs/train.jsonl``: the first window
(``--e2e-window`` steps; tracing, warm-up) is dropped, the rest are pooled (samples over
seconds; each window also holds one evaluation of the test set, in both variants).
samples per CPU-second divide by the process's CPU time instead (``cpu_util`` × budget ×
seconds): it does not move with the CPU share other sessions leave the run, but it does
not see a stall either (an idle wait costs wall time, not CPU). The
``cache`` worker also measures the CPU time the training pipeline alone takes per batch
(``input_cpu_ms_per_batch``), the input's cost.

On a shared machine one pair of processes is not enough: load from other sessions moves
one variant's figure and not the other's (the ratio swung 0.80–1.02 between runs). So
:func:`measure` interleaves ``rounds`` pairs, ``cache`` then ``memory`` each round, and
reports per variant the median samples/s and samples/CPU-s over rounds (the other fields
come from the round with the median samples/s; ``peak_rss_mb`` is the largest of all
rounds), every round's figures, and each round's ratio cache/memory; the target ratio is
the median of those per-round ratios (a disturbance tends to hit one pair, taken back to
back, rather than one variant in every round).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import worker

MODULE = "benchmarks.end_to_end"
#: Distinct in-memory batches the ``memory`` variant cycles through.
DISTINCT_BATCHES = 8
VARIANTS = ("cache", "memory", "memory_one_batch")


def _plan() -> Any:
    """The thread plan ``coretrain train`` would make here (explicit TF_NUM_* win)."""
    from app.budget import detect_plan

    return detect_plan("/")


def _input_ms(data: Any, plan: Any, batch: int, seed: int, batches: int = 20) -> float:
    """CPU milliseconds per batch of the real training pipeline alone (all threads of
    this process while it produces ``batches`` batches, after 5 to warm up)."""
    from app.data.input import pipeline

    given = pipeline.train_input(
        data, plan.tfdata_threads, seed=seed, batch_size=batch, start_step=0,
        end_step=batches + 5,
        resident=pipeline.split_bytes(data) <= pipeline.resident_limit(plan.memory_limit),
    )  # fmt: skip
    it = iter(given.dataset)
    for _ in range(5):
        next(it)
    cpu = time.process_time()
    for _ in range(batches):
        next(it)
    return round(1e3 * (time.process_time() - cpu) / batches, 1)


def _train(spec: dict[str, Any]) -> dict[str, Any]:
    import logging

    from app import logs
    from app.budget import apply

    plan = _plan()
    apply.apply(plan)
    logging.getLogger(logs.LOGGER_NAME).setLevel(logging.INFO)  # events to the file only

    tf = apply.import_tensorflow()

    from app.config import TrainConfig
    from app.data import cache as cache_lib
    from app.data.input import mapped, pipeline
    from app.training.admit.sources import find
    from app.training.run import train
    from app.training.state import workspace

    window, steps = spec["window"], spec["steps"]
    with tempfile.TemporaryDirectory(dir=spec["tmp"]) as out:
        config = TrainConfig.of(
            data_dir=Path(spec["data"]),
            output_dir=Path(out),
            cache_dir=Path(spec["cache"]),
            max_steps=window + steps,
            eval_every=window,
            checkpoint_every=10 * (window + steps),
            batch_size=spec["batch"],
            target_loss=0.0,
        )
        input_ms = None
        if spec["variant"].startswith("memory"):
            real = pipeline.train_input
            distinct = 1 if spec["variant"] == "memory_one_batch" else DISTINCT_BATCHES

            def in_memory(data: Any, threads: int, **kw: Any) -> Any:
                kw = {**kw, "resident": False}  # the batches themselves, then held as tensors
                first = real(data, threads, **{**kw, "end_step": kw["start_step"] + distinct})
                # Each element is a streamed chunk and the step's rows in it: its batch.
                batches = [mapped.batch(e, first.held or ()) for e in first.dataset]
                x = tf.stack([b[0] for b in batches])
                y = tf.stack([b[1] for b in batches])
                count = kw["end_step"] - kw["start_step"]
                ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().take(count)
                return pipeline.TrainInput(ds)

            pipeline.train_input = in_memory  # type: ignore[assignment]
        else:
            data = cache_lib.prepare(find(config.data), Path(spec["cache"]))
            input_ms = _input_ms(data, plan, spec["batch"], config.recipe.seed)
        summary = train(workspace.for_run(config), config, plan).summary
        records = [json.loads(line) for line in (Path(out) / "logs" / "train.jsonl").open()]
    progress = [r for r in records if r.get("event") == "progress"][1:]  # drop warm-up
    choice = next((r for r in records if r.get("event") == "choice"), {})
    samples = sum(window * spec["batch"] for _ in progress)
    seconds = sum(window * spec["batch"] / r["examples_per_sec"] for r in progress)
    # cpu_util = process CPU seconds / (wall seconds × CPU budget), per window.
    cpu_seconds = sum(
        window * spec["batch"] / r["examples_per_sec"] * r["cpu_util"] * plan.cpu_budget
        for r in progress
    )
    return {
        "samples_per_s": round(samples / seconds, 1) if seconds else None,
        "samples_per_cpu_s": round(samples / cpu_seconds, 1) if cpu_seconds else None,
        "windows": [r["examples_per_sec"] for r in progress],
        "cpu_util": [r["cpu_util"] for r in progress],
        "steps": summary["steps_trained"],
        "train_size": summary["train_size"],
        "input_cpu_ms_per_batch": input_ms,
        "chosen": f"{summary['formulation']}/{summary['precision']}",
        "candidates": sorted(choice.get("timings", {})),
        "margin": choice.get("measurement", {}).get("margin"),
        "intra_op_threads": plan.intra_op_threads,
        "inter_op_threads": plan.inter_op_threads,
        "cpu_budget": plan.cpu_budget,
    }


def _prepare(spec: dict[str, Any]) -> dict[str, Any]:
    """Convert the whole data set into the cache, as ``train`` does first (timed)."""
    from app.config import TrainConfig
    from app.data import cache as cache_lib
    from app.training.admit.sources import find

    with tempfile.TemporaryDirectory(dir=spec["tmp"]) as out:
        config = TrainConfig.of(
            data_dir=Path(spec["data"]), output_dir=Path(out), cache_dir=Path(spec["cache"])
        )
        data, wall, cpu = worker.timed(
            lambda: cache_lib.prepare(
                find(config.data), Path(spec["cache"]), threads=spec["threads"]
            )
        )
    return {
        "wall_s": round(wall, 3),
        "cpu_self_s": round(cpu, 3),
        "train_size": data.train_size,
        "test_size": data.test_size,
        "threads": spec["threads"],
    }


WORKERS = {"train": _train, "prepare": _prepare}


def conversion(data_dir: Path, cache_dir: Path, env: dict[str, str], threads: int) -> dict:
    """Build the cache for ``data_dir`` in a fresh process (removing an old one first)."""
    import shutil

    shutil.rmtree(cache_dir, ignore_errors=True)
    spec = {
        "kind": "prepare",
        "data": str(data_dir),
        "cache": str(cache_dir),
        "tmp": str(cache_dir.parent),
        "threads": threads,
    }
    return worker.run(MODULE, spec, env)


def _ratio(a: Any, b: Any) -> float | None:
    """a / b to 3 places; None unless both are non-zero numbers."""
    numbers = isinstance(a, int | float) and isinstance(b, int | float)
    return round(a / b, 3) if numbers and a and b else None


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant over its rounds: medians, the median round's other fields, each round."""
    ok = [r for r in results if "error" not in r and r.get("samples_per_s")]
    if not ok:
        return {**results[-1], "rounds": results}
    by_rate = sorted(ok, key=lambda r: r["samples_per_s"])
    out = dict(by_rate[(len(by_rate) - 1) // 2])
    out["samples_per_s"] = round(statistics.median([r["samples_per_s"] for r in ok]), 1)
    per_cpu = [r["samples_per_cpu_s"] for r in ok if r.get("samples_per_cpu_s")]
    out["samples_per_cpu_s"] = round(statistics.median(per_cpu), 1) if per_cpu else None
    out["peak_rss_mb"] = max(r.get("peak_rss_mb", 0.0) for r in results)
    keep = ("samples_per_s", "samples_per_cpu_s", "process_s", "cpu_s", "peak_rss_mb", "error")
    out["rounds"] = [{k: r[k] for k in keep if k in r} for r in results]
    return out


def measure(
    data_dir: Path,
    cache_dir: Path,
    env: dict[str, str],
    *,
    batch: int = 1000,
    window: int = 10,
    steps: int = 30,
    rounds: int = 3,
    log: Any = print,
) -> dict[str, Any]:
    """``rounds`` interleaved rounds of :data:`VARIANTS` on the prepared cache under ``cache_dir``.

    Returns the report part: per variant the median over rounds (:func:`_summary`),
    ``round_ratios`` / ``ratio_median`` (cache over memory, wall and per CPU-second) and
    ``ratio_median_one_batch`` (cache over memory_one_batch).
    """
    out: dict[str, Any] = {
        "batch": batch,
        "window_steps": window,
        "timed_steps": steps,
        "rounds": rounds,
    }
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for variant in VARIANTS:
            log(f"end to end: train() reading {variant}, round {r + 1}/{rounds} ...")
            spec = {
                "kind": "train",
                "variant": variant,
                "data": str(data_dir),
                "cache": str(cache_dir),
                "tmp": str(cache_dir.parent),
                "batch": batch,
                "window": window,
                "steps": steps,
            }
            runs[variant].append(worker.run(MODULE, spec, env))
    for variant, results in runs.items():
        out[variant] = _summary(results)
    for baseline, suffix in (("memory", ""), ("memory_one_batch", "_one_batch")):
        pairs = [
            {
                "samples_per_s": _ratio(c.get("samples_per_s"), m.get("samples_per_s")),
                "samples_per_cpu_s": _ratio(c.get("samples_per_cpu_s"), m.get("samples_per_cpu_s")),
            }
            for c, m in zip(runs["cache"], runs[baseline], strict=True)
        ]
        out[f"round_ratios{suffix}"] = pairs
        medians: dict[str, float | None] = {}
        for key in ("samples_per_s", "samples_per_cpu_s"):
            values = [v for p in pairs if (v := p[key]) is not None]
            medians[key] = round(statistics.median(values), 3) if values else None
        out[f"ratio_median{suffix}"] = medians
    return out


if __name__ == "__main__":
    if not worker.serve(WORKERS):
        sys.exit("benchmarks.end_to_end runs as a worker of benchmarks.run (make bench)")
    sys.stdout.flush()
    os._exit(0)  # TF's threads can hang a normal interpreter exit
