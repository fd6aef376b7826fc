"""The roofline of the training step: each op's time against its compute and memory bounds.

``python -m benchmarks.roofline [--formulation fast] [--precision bfloat16] [--batch 1000]``
(``make bench`` runs it for the chosen step; about 30 s). One worker process with the run's
thread plan (:func:`app.budget.apply.apply`, as ``coretrain train``):

1. **The CPU's roofs**, with the planned threads: compute, the matmul probe (a 2048² product
   in float32 and in bfloat16, GFLOP/s: 2·n³ a product, the best of 5); memory, copies in
   as many threads (bytes read + written per second, the best of 5) of 256 MiB each
   (``dram``) and of a share of the last-level cache each (``cache``). TensorFlow's own
   elementwise op on 256 MiB is measured beside them: its memory-bound kernels reach a
   fraction of the memory's speed.
2. **The step** (app/training/loop/step.py's update, as ``auto`` times it, on one batch
   repeated): the wall ms per step (median of ``--steps`` after warm-up; the share of the
   CPUs other processes used meanwhile beside it, from ``/proc/stat``), then ``--steps``
   more under TensorFlow's profiler (``tf.profiler.experimental``; the XSpace's host plane,
   parsed with TensorFlow's own ``xplane_pb2``). An op's time is its event on the inter-op
   (``tf_Compute``) thread that ran it, less the op events nested in it: the wall time
   of the op, its intra-op shards included (the caller waits for them). Two inter-op
   threads may run two ops at once, so the ops' times may add up to more than the step.
3. **Each op's bounds**, from its shapes in the traced graph (grappler's renamed ops are
   matched to theirs): compute, its FLOPs (2·M·N·K for a matrix product, 2 per multiply-add
   of a convolution, one per element read otherwise) at the probe of its precision (a
   bfloat16 input: the bfloat16 probe); memory, the bytes it must read and write once (every
   input and output tensor) at the ``cache`` bandwidth when they fit in the last-level cache,
   else the ``dram`` one. Its bound is the larger; ``of_bound`` its time over it.

The report: the roofs, the step's wall ms, the ops (each over 1 % of the ops' time, the rest
as one row), and the sums: the ops' time, the ops' bounds (this formulation's ops each at
its roof, one after the other: the best this graph can do) and the model's floor (the
model's train FLOPs, 3× forward: benchmarks/model_step.py, at the probe: any formulation).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import model_step, worker

MODULE = "benchmarks.roofline"
#: Grappler's names for ops it rewrote: the op of the traced graph they stand for.
_REWRITTEN = re.compile(r"ArithmeticOptimizer/(FoldTransposeIntoMatMul|AddOpsRewrite)_")
#: Profiler events of the executor and thread pools, not ops.
_NOT_OPS = ("Threadpool", "Executor", "ParallelFor", "Memory")
SHOWN_SHARE = 0.01


def _best_of(fn: Any, repeats: int = 5) -> float:
    """The least wall seconds of ``repeats`` calls of ``fn`` (each returns a tensor)."""
    fn().numpy()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn().numpy()
        best = min(best, time.perf_counter() - t0)
    return best


def roofs(threads: int) -> dict[str, float]:
    """GFLOP/s of the float32 and bfloat16 probes; GB/s (read + written) of memory copies in
    ``threads`` threads (numpy's ``copyto``, which runs without the GIL) of 256 MiB each
    (``dram``) and of a share of the last-level cache each (``cache``); and, for
    comparison, of TensorFlow's elementwise ``x * 1.0001`` on 256 MiB (``tf_elementwise``)."""
    import tensorflow as tf

    out: dict[str, float] = {}
    n = 2048
    for dtype in ("float32", "bfloat16"):
        a = tf.cast(tf.random.stateless_normal((n, n), seed=(1, 2)), dtype)
        b = tf.cast(tf.random.stateless_normal((n, n), seed=(3, 4)), dtype)
        mm = tf.function(lambda a=a, b=b: tf.reduce_sum(tf.matmul(a, b)[:1]))
        out[f"gflops_{dtype}"] = 2 * n**3 / _best_of(mm) / 1e9
    out["gbps_dram"] = _copy_gbps(256 << 20, threads)
    out["gbps_cache"] = _copy_gbps(_llc_bytes() // (4 * threads), threads)  # half the LLC
    x = tf.random.stateless_normal((64 << 20,), seed=(5, 6))
    scale = tf.function(lambda: x * 1.0001)
    out["gbps_tf_elementwise"] = 2 * x.shape[0] * 4 / _best_of(scale) / 1e9
    return {k: round(v, 1) for k, v in out.items()}


def _copy_gbps(nbytes: int, threads: int, repeats: int = 5) -> float:
    """GB/s read + written by ``threads`` threads each copying ``nbytes`` (the best of
    ``repeats``; a small copy repeated to 256 MiB a round)."""
    import threading

    import numpy as np

    pairs = [(np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32))]
    pairs += [(np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32))
              for _ in range(threads - 1)]  # fmt: skip
    times = max(1, (256 << 20) // nbytes)

    def copy(i: int) -> None:
        for _ in range(times):
            np.copyto(pairs[i][1], pairs[i][0])

    copy(0)
    best = float("inf")
    for _ in range(repeats):
        workers = [threading.Thread(target=copy, args=(i,)) for i in range(threads)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes * times * threads / best / 1e9


def _bytes(tensor: Any) -> int | None:
    shape = tensor.shape
    if shape.rank is None or not shape.is_fully_defined() or tensor.dtype.name == "resource":
        return None
    return int(shape.num_elements()) * tensor.dtype.size


def flops(op: Any) -> int:
    """FLOPs of the traced op ``op`` (module docstring)."""

    def dims(t: Any) -> list[int]:
        return [int(d) for d in t.shape]

    if op.type in ("MatMul", "BatchMatMulV2"):
        a, b = dims(op.inputs[0]), dims(op.inputs[1])
        ta = op.get_attr("transpose_a" if op.type == "MatMul" else "adj_x")
        tb = op.get_attr("transpose_b" if op.type == "MatMul" else "adj_y")
        m, k = (a[-1], a[-2]) if ta else (a[-2], a[-1])
        n = b[-2] if tb else b[-1]
        batch = 1
        for d in a[:-2]:
            batch *= d
        return 2 * batch * m * n * k
    if op.type in ("Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput"):
        out = op.inputs[2] if op.type != "Conv2D" else op.outputs[0]  # out_backprop
        kernel = op.inputs[1] if op.type != "Conv2DBackpropFilter" else None
        kh, kw, cin, _ = dims(kernel) if kernel is not None else _filter_dims(op)
        return 2 * int(out.shape.num_elements()) * kh * kw * cin
    read = [_bytes(t) for t in op.inputs]
    return sum((b or 0) // max(t.dtype.size, 1) for b, t in zip(read, op.inputs, strict=True))


def _filter_dims(op: Any) -> list[int]:
    """Conv2DBackpropFilter's filter shape: its ``filter_sizes`` input, a constant."""
    import tensorflow as tf

    return [int(d) for d in tf.get_static_value(op.inputs[1])]


def traffic(op: Any) -> int:
    """Bytes ``op`` reads and writes at least: each tensor of a known shape once."""
    return sum(b or 0 for b in (_bytes(t) for t in [*op.inputs, *op.outputs]))


def op_times(logdir: str, steps: int) -> dict[str, float]:
    """ms per step of each op of the profile in ``logdir`` (module docstring), by its name in
    the traced graph."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    (path,) = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(path).read_bytes())
    (plane,) = [p for p in space.planes if p.name == "/host:CPU"]
    names = plane.event_metadata
    times: dict[str, float] = collections.defaultdict(float)
    for line in plane.lines:
        if not line.name.startswith("tf_Compute"):
            continue
        events = sorted(
            (e.offset_ps, e.offset_ps + e.duration_ps, names[e.metadata_id].name)
            for e in line.events
        )
        events = [e for e in events if ":" in e[2] and not e[2].startswith(_NOT_OPS)]
        own = [end - start for start, end, _ in events]
        open_: list[int] = []
        for i, (start, end, _) in enumerate(events):
            while open_ and events[open_[-1]][1] <= start:
                open_.pop()
            if open_:
                own[open_[-1]] -= end - start
            open_.append(i)
        for (_, _, name), ps in zip(events, own, strict=True):
            times[_REWRITTEN.sub("", name.split(":")[0])] += ps / 1e9 / steps
    return dict(times)


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """The roofs, the step's wall ms, its ops' times and bounds (module docstring)."""
    import numpy as np
    import tensorflow as tf

    from app.config import TrainConfig
    from app.training.loop.replicas import Replicas
    from app.training.loop.step import TrainStep
    from app.training.state import timing
    from app.training.state.choose import Choice

    batch, steps = spec["batch"], spec["steps"]
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch, 20, 195, 1), dtype=np.float32))
    y = tf.constant(rng.standard_normal((batch, 3), dtype=np.float32))
    config = TrainConfig.of(data_dir=Path("."), output_dir=Path("."), batch_size=batch)
    chosen = Choice(spec["formulation"], spec["precision"], "measured", {})
    step = TrainStep(config.recipe, 3300, chosen, (20, 195, 3), Replicas())
    zero = tf.constant(0.0)
    update = tf.function(lambda: step.update(x, y, zero)[0])
    graph = {op.name: op for op in update.get_concrete_function().graph.get_operations()}
    for _ in range(spec["warmup"]):
        update().numpy()
    walls, span = [], timing.Span()
    for _ in range(steps):
        t1 = time.perf_counter()
        update().numpy()
        walls.append(time.perf_counter() - t1)
    load = span.load()
    logdir = tempfile.mkdtemp(prefix="roofline-")
    try:
        tf.profiler.experimental.start(logdir)
        for _ in range(steps):
            update().numpy()
        tf.profiler.experimental.stop()
        times = op_times(logdir, steps)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    found = roofs(spec["threads"])
    ops = [_bounds(name, ms, graph.get(name), found) for name, ms in times.items()]
    peak = _peak(spec["precision"], found)
    return {
        "formulation": spec["formulation"], "precision": spec["precision"], "batch": batch,
        "roofs": found, "step_ms": round(1e3 * statistics.median(walls), 2),
        "others_while_timed": load.others,
        "ops": sorted(ops, key=lambda o: -o["ms"]),
        "model_floor_ms": round(batch * model_step.train_flops() / peak / 1e6, 2),
    }  # fmt: skip


def _peak(precision: str, found: dict[str, float]) -> float:
    return found[f"gflops_{precision}"]


def _llc_bytes() -> int:
    """The last-level cache's size (sysfs), 32 MiB when unknown."""
    sizes = []
    for f in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        text = Path(f).read_text().strip()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KM")) * scale)
    return max(sizes, default=32 << 20)


def _bounds(name: str, ms: float, op: Any, found: dict[str, float]) -> dict[str, Any]:
    """One op's row: its time, FLOPs, bytes and bounds (module docstring)."""
    row: dict[str, Any] = {"op": name, "ms": round(ms, 3)}
    if op is None:
        return {**row, "type": "?"}
    precision = "bfloat16" if any(t.dtype.name == "bfloat16" for t in op.inputs) else "float32"
    work, moved = flops(op), traffic(op)
    level = "cache" if moved <= _llc_bytes() else "dram"
    compute_ms = work / _peak(precision, found) / 1e6
    memory_ms = moved / found[f"gbps_{level}"] / 1e6
    shapes = [list(t.shape) for t in op.inputs if _bytes(t) and len(t.shape) > 0]
    return {
        **row, "type": op.type, "shapes": shapes, "gflop": round(work / 1e9, 4),
        "mb": round(moved / 1e6, 2), "compute_ms": round(compute_ms, 3),
        "memory_ms": round(memory_ms, 3), "level": level,
        "bound": "compute" if compute_ms >= memory_ms else "memory",
        "of_bound": round(ms / max(compute_ms, memory_ms, 1e-6), 1),
    }  # fmt: skip


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The sums of a worker's result (module docstring)."""
    ops = [o for o in result.get("ops", []) if "compute_ms" in o]
    total = sum(o["ms"] for o in result.get("ops", []))
    bound = sum(max(o["compute_ms"], o["memory_ms"]) for o in ops)
    memory = sum(o["ms"] for o in ops if o["bound"] == "memory")
    return {
        "ops_ms": round(total, 2),
        "ops_at_bound_ms": round(bound, 2),
        "memory_bound_share": round(memory / total, 3) if total else None,
        "step_over_ops_at_bound": round(result["step_ms"] / bound, 2) if bound else None,
        "step_over_model_floor": round(result["step_ms"] / result["model_floor_ms"], 2),
    }


def measure(
    env: dict[str, str], formulation: str, precision: str, threads: int, steps: int = 10
) -> dict[str, Any]:
    """Run the worker (module docstring) under ``env``: its result and :func:`summary`."""
    spec = {"kind": "roofline", "formulation": formulation, "precision": precision,
            "batch": 1000, "steps": steps, "warmup": 3, "threads": threads}  # fmt: skip
    result = worker.run(MODULE, spec, env)
    if "error" not in result:
        result["summary"] = summary(result)
    return result


def table(result: dict[str, Any]) -> str:
    """The roofline as a text table (also in docs/performance.md)."""
    if "error" in result:
        return f"roofline: failed: {result['error']}"
    r, s = result["roofs"], result["summary"]
    lines = [
        f"roofline of the {result['formulation']}/{result['precision']} step, batch "
        f"{result['batch']}: probe {r['gflops_float32']} / {r['gflops_bfloat16']} GFLOP/s "
        f"(float32 / bfloat16); copies {r['gbps_dram']} GB/s from DRAM, {r['gbps_cache']} GB/s "
        f"in the cache; TensorFlow's elementwise op {r['gbps_tf_elementwise']} GB/s",
        f"{'op':58s} {'type':18s} {'ms':>7s} {'GFLOP':>7s} {'MB':>7s} {'compute':>8s} "
        f"{'memory':>7s} {'x bound':>7s}",
    ]
    total = s["ops_ms"]
    rest = [o for o in result["ops"] if o["ms"] < SHOWN_SHARE * total]
    for o in result["ops"]:
        if o in rest:
            continue
        lines.append(
            f"{o['op'][:58]:58s} {o['type'][:18]:18s} {o['ms']:7.2f} {o.get('gflop', 0):7.3f} "
            f"{o.get('mb', 0):7.1f} {o.get('compute_ms', 0):8.2f} {o.get('memory_ms', 0):7.2f} "
            f"{o.get('of_bound', 0):7.1f}"
        )
    lines.append(f"{f'the other {len(rest)} ops':58s} {'':18s} {sum(o['ms'] for o in rest):7.2f}")
    lines.append(
        f"step {result['step_ms']} ms wall; the ops {total} ms; the ops at their bounds "
        f"{s['ops_at_bound_ms']} ms (step / that {s['step_over_ops_at_bound']}); the model's "
        f"floor {result['model_floor_ms']} ms (step / that {s['step_over_model_floor']}); "
        f"memory-bound ops {s['memory_bound_share']:.0%} of the ops' time; other processes "
        f"used {result['others_while_timed']} of the CPUs while the step was timed"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if worker.serve({"roofline": _worker}):
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--formulation", default="fast")
    p.add_argument("--precision", default="bfloat16")
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args(argv)
    from benchmarks.run import thread_plan

    plan, env = thread_plan()
    result = measure(env, args.formulation, args.precision, plan.intra_op_threads, args.steps)
    print(table(result), file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
