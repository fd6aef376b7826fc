"""A held split's rows: the training step gathering from the cache's float32 rows against
the rows rounded to bfloat16 (app/data/cache/rounded.py), side by side in one process.

``python -m benchmarks.held_rows --cache-dir DIR --key KEY`` (not in CI) loads the cache
``DIR/KEY`` (made by ``coretrain train``), applies the thread plan ``coretrain train`` would
make here, builds the project's training step (fast formulation, bfloat16, the default
recipe), holds the split twice (app/data/input/mapped.py: the float32 rows, and the rows
rounded to bfloat16, made first if the cache lacks them) and trains ``--steps`` steps from
each in turn, and a third segment on one batch fed again every step, as tensors (what the
choice times, app/training/state/choose.py: no gather), ``--rounds`` times, the order
reversed every other round. All train the same model variables, so they see the same
weights' cost; what differs is only what the step gathers its batch from: 1,000 float32
rows standardised and cast in the step, 1,000 bfloat16 rows as they are, or nothing.
Reports per round the wall and process-CPU milliseconds a step of each, the median over
rounds of the per-round ratios (float32 / bfloat16: how much faster the rounded rows are;
each / the batch fed again: what gathering costs), and what reading the float32 rows
alone takes: ``numpy.take`` of 10 of the run's batches from the mapped file, one thread,
the median (the memory traffic's bound on the gather). A disturbance from other work tends
to hit one segment, not one variant every round, hence the medians of paired ratios.
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


#: The ratios reported, of the wall and the process-CPU time a step.
RATIOS = (("float32", "bfloat16"), ("float32", "batch"), ("bfloat16", "batch"))
CLOCKS = ("wall", "cpu")


def _read_ms(rows: Any, batches: list[Any]) -> float:
    """Median ms to copy each of ``batches`` (row ids (B,)) of the mapped float32 rows
    ``rows`` (N, H, W) into memory with ``numpy.take``, one thread."""
    import numpy as np

    out, times = np.empty((len(batches[0]), *rows.shape[1:]), np.float32), []
    for ids in batches:
        t0 = time.perf_counter()
        np.take(rows, ids, axis=0, out=out)
        times.append(1000 * (time.perf_counter() - t0))
    return round(statistics.median(times), 2)


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
    import tensorflow as tf

    from app.atomic import open_dir
    from app.config import RecipeConfig
    from app.data.cache import rounded
    from app.data.cache.store import load
    from app.data.input import mapped, pipeline, stream
    from app.training.loop.replicas import Replicas
    from app.training.loop.step import TrainStep, repeated
    from app.training.state.choose import Choice

    with open_dir(args.cache_dir, "cache", create=False) as root:
        cache = load(root, args.key, verify=False)
    path = rounded.find(cache, True) or rounded.make(cache, True, threads=plan.intra_op_threads)
    source = stream.Source((path, 0), rounded.DTYPE, standardized=True)
    recipe = RecipeConfig()
    total = 3 * (args.rounds + 1) * args.steps + 10  # every segment's steps, and 10 read
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
    ids = [next(its["float32"]).numpy() for _ in range(10)]
    x, y = mapped.batch(tf.constant(ids[0]), inputs["float32"].held or ())
    its["batch"] = repeated(x, y)
    held = {name: given.held for name, given in inputs.items()} | {"batch": None}
    for name in its:  # tracing and warm-up
        _timed(step, its[name], held[name], args.steps)
    rounds = []
    for r in range(args.rounds):
        order = ["float32", "bfloat16", "batch"][:: 1 if r % 2 == 0 else -1]
        got = {name: _timed(step, its[name], held[name], args.steps) for name in order}
        rounds.append({
            "wall_ms": {n: round(1000 * got[n][0], 2) for n in got},
            "cpu_ms": {n: round(1000 * got[n][1], 2) for n in got},
            **{f"{a}/{b}": {k: round(got[a][i] / got[b][i], 3) for i, k in enumerate(CLOCKS)}
               for a, b in RATIOS},
        })  # fmt: skip
        print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    report = {
        "cpu_model": _cpu_model(),
        "intra_op_threads": plan.intra_op_threads,
        "rows": cache.train_size,
        "steps_per_segment": args.steps,
        "rounds": rounds,
        "median_ratios": {
            f"{a}/{b}": {
                k: round(statistics.median(r[f"{a}/{b}"][k] for r in rounds), 3) for k in CLOCKS
            }
            for a, b in RATIOS
        },
        "float32_read_ms": _read_ms(cache.features("train"), ids),
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
