"""A held split's rows: the training step gathering from the cache's float32 rows against
the rows rounded to bfloat16 (app/data/cache/rounded.py), side by side in one process.

``python -m benchmarks.held_rows --cache-dir DIR --key KEY`` (not in CI) loads the cache
``DIR/KEY`` (made by ``coretrain train``), applies the thread plan ``coretrain train`` would
make here, builds the project's training step (fast formulation, bfloat16, the default
recipe), holds the split twice (app/data/input/mapped.py: the float32 rows, and the rows
rounded to bfloat16, made first if the cache lacks them) and trains ``--steps`` steps from
each in turn, ``--rounds`` times, the order reversed every other round. Both train the
same model variables, so the two see the same weights' cost; what differs is only what
the step gathers its batch from: 1,000 float32 rows standardised and cast in the step, or
1,000 bfloat16 rows as they are. Reports per round the wall and process-CPU seconds per
step of each, and the median over rounds of the per-round ratios (float32 / bfloat16: how
much faster the rounded rows are). A disturbance from other work tends to hit one
segment, not one variant every round, hence the medians of paired ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _timed(step: Any, it: Any, held: Any, steps: int) -> tuple[float, float]:
    """Wall and process-CPU seconds per step of ``steps`` steps."""
    import tensorflow as tf

    w0, c0 = time.perf_counter(), time.process_time()
    losses, _, _ = step.run(it, tf.constant(steps), tf.constant(0.0), held)
    losses.numpy()
    return (time.perf_counter() - w0) / steps, (time.process_time() - c0) / steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache-dir", type=Path, required=True, help="The --cache-dir of a run.")
    p.add_argument("--key", required=True, help="The data set's directory in it.")
    p.add_argument("--steps", type=int, default=200, help="Steps per segment.")
    p.add_argument("--rounds", type=int, default=6, help="Pairs of segments.")
    args = p.parse_args(argv)

    from app.budget import apply, detect_plan

    plan = detect_plan("/")
    apply.apply(plan)
    apply.import_tensorflow()
    from app.atomic import open_dir
    from app.config import RecipeConfig
    from app.data.cache import rounded
    from app.data.cache.store import load
    from app.data.input import pipeline, stream
    from app.training.loop.replicas import Replicas
    from app.training.loop.step import TrainStep
    from app.training.state.choose import Choice

    with open_dir(args.cache_dir, "cache", create=False) as root:
        cache = load(root, args.key, verify=False)
    path = rounded.find(cache, True) or rounded.make(cache, True, threads=plan.intra_op_threads)
    source = stream.Source((path, 0), rounded.DTYPE, standardized=True)
    recipe = RecipeConfig()
    total = 2 * args.rounds * args.steps + 2 * args.steps
    shape = (cache.height, cache.width, cache.num_outputs)
    step = TrainStep(recipe, total, Choice("fast", "bfloat16", "timed", {}), shape, Replicas())
    stats = stream.Stats.of(cache)
    kw = dict(seed=recipe.seed, batch_size=recipe.batch_size, start_step=0, end_step=total,
              resident=True, stats=stats)  # fmt: skip
    inputs = {
        "float32": pipeline.train_input(cache, plan.tfdata_threads, **kw),
        "bfloat16": pipeline.train_input(cache, plan.tfdata_threads, source=source, **kw),
    }
    its = {name: iter(given.dataset) for name, given in inputs.items()}
    for name, given in inputs.items():  # tracing and warm-up
        _timed(step, its[name], given.held, args.steps)
    rounds = []
    for r in range(args.rounds):
        order = ["float32", "bfloat16"][:: 1 if r % 2 == 0 else -1]
        got = {name: _timed(step, its[name], inputs[name].held, args.steps) for name in order}
        rounds.append({
            "wall_ms": {n: round(1000 * got[n][0], 2) for n in got},
            "cpu_ms": {n: round(1000 * got[n][1], 2) for n in got},
            "wall_ratio": round(got["float32"][0] / got["bfloat16"][0], 3),
            "cpu_ratio": round(got["float32"][1] / got["bfloat16"][1], 3),
        })  # fmt: skip
        print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    report = {
        "cpu_model": _cpu_model(),
        "intra_op_threads": plan.intra_op_threads,
        "rows": cache.train_size,
        "steps_per_segment": args.steps,
        "rounds": rounds,
        "median_wall_ratio": statistics.median(r["wall_ratio"] for r in rounds),
        "median_cpu_ratio": statistics.median(r["cpu_ratio"] for r in rounds),
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
