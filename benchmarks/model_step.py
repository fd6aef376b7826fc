"""Train-step throughput of the seed CNN: plain Keras layers vs the fast formulation.

``python -m benchmarks.model_step`` (about 2 minutes on 2 cores). Every measurement runs
in its own subprocess with the thread environment (``TF_NUM_INTRAOP_THREADS``,
``TF_NUM_INTEROP_THREADS=1``, ``OMP_NUM_THREADS``) set before TensorFlow or PyTorch is
imported, because thread pools are process-global and fixed at first use:

* ``probe``: a 2048² float32 matmul, GFLOP/s (2·n³ per product);
* ``plain`` / ``fast``: the project's train step (app/training/loop/step.py: the one the run
  trains with and ``--formulation auto`` times) with the seed's recipe (SGD momentum 0.8,
  dropout keeping half, as the peers) on in-memory standardised tensors, batch 1000 by
  default;
* ``plain+xla`` / ``fast+xla`` (with ``--xla``): the same step's update with
  ``jit_compile=True``;
* ``torch``: the same CNN in PyTorch eager (optional; only when ``torch`` imports in
  ``--torch-python``, default this interpreter). Its OpenMP threads spin at barriers, so
  on a busy machine its median step suffers far more than TensorFlow's; compare the
  fastest steps too.

Each ``--env NAME=VALUE[,NAME=VALUE]`` adds another probe/plain/fast set under that
environment (default: ``TF_CPU_ALLOCATOR_USE_BFC=true``, which keeps TensorFlow from handing
large tensors back to the OS after every op, and ``TF_ENABLE_ONEDNN_OPTS=1``, oneDNN
kernels, off by default on AMD CPUs); ``--env none`` measures the default environment only.
Ratios compare measurements taken under the same environment.

Per step: median wall seconds and median process CPU seconds of ``--steps`` timed steps
after ``--warmup`` steps; samples/s = batch / median wall. The fastest step is kept too: on
a shared machine it is the least disturbed one. FLOPs per sample are the model's forward
FLOPs ×3 (the usual train-step convention: forward, input gradient, weight gradient;
1.75 MFLOP for 20×195, K=3). ``fast_flop_rate_pct_of_probe`` compares the fast step's
GFLOP/s with the probe's under the same environment. The measurements of a round run back
to back; rounds repeat the whole set (``--rounds``); the report keeps each round's figures
and the median over rounds. The load average before each measurement is recorded because
other processes distort wall-clock times.

Prints one JSON object on stdout and a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ENVS = ("TF_CPU_ALLOCATOR_USE_BFC=true", "TF_ENABLE_ONEDNN_OPTS=1")


# ---------------------------------------------------------------------------
# FLOP count (no TensorFlow needed)
# ---------------------------------------------------------------------------


def forward_flops(height: int = 20, width: int = 195, outputs: int = 3) -> int:
    """Forward FLOPs per sample of the seed CNN (2 per multiply-add; biases ignored)."""
    ho, wo = height - 2, (width - 30) // 5 + 1
    hp, wp = ho // 2, wo // 2
    h2, w2 = hp - 1, wp - 1
    flat = (h2 // 2) * (w2 // 2) * 5
    conv1 = 2 * ho * wo * 5 * (3 * 30)
    conv2 = 2 * h2 * w2 * 5 * (2 * 2 * 5)
    dense = 2 * flat * 20 + 2 * 20 * outputs
    return conv1 + conv2 + dense


def train_flops(height: int = 20, width: int = 195, outputs: int = 3) -> int:
    """Train-step FLOPs per sample: 3× forward."""
    return 3 * forward_flops(height, width, outputs)


# ---------------------------------------------------------------------------
# Workers (run in subprocesses)
# ---------------------------------------------------------------------------


def _timed(fn: Any, sync: Any, warmup: int, steps: int) -> dict[str, float]:
    for _ in range(warmup):
        sync(fn())
    walls, cpus = [], []
    for _ in range(steps):
        w0, c0 = time.perf_counter(), time.process_time()
        sync(fn())
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {
        "wall_s": statistics.median(walls),
        "cpu_s": statistics.median(cpus),
        "wall_min_s": min(walls),
    }


def _worker_probe(spec: dict[str, Any]) -> dict[str, Any]:
    import tensorflow as tf

    n = spec.get("n", 2048)
    dtype = tf.as_dtype(spec.get("precision", "float32"))
    a = tf.cast(tf.random.stateless_normal((n, n), seed=(1, 2)), dtype)
    b = tf.cast(tf.random.stateless_normal((n, n), seed=(3, 4)), dtype)
    mm = tf.function(lambda: tf.reduce_sum(tf.matmul(a, b)[:1]))
    r = _timed(mm, lambda t: t.numpy(), 2, spec.get("steps", 5))
    r["gflops"] = 2 * n**3 / r["wall_s"] / 1e9
    return r


def _worker_step(spec: dict[str, Any]) -> dict[str, Any]:
    """The run's training step (app/training/loop/step.py, as ``auto`` times it) with the seed's
    recipe, the peers' step; under ``xla`` its update compiled with ``jit_compile``."""

    import numpy as np
    import tensorflow as tf

    from app.config import TrainConfig
    from app.training.loop.replicas import Replicas
    from app.training.loop.step import TrainStep
    from app.training.state.choose import Choice, train_step

    batch, k = spec["batch"], spec["outputs"]
    h, w = spec["height"], spec["width"]
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch, h, w, 1), dtype=np.float32))
    y = tf.constant(rng.standard_normal((batch, k), dtype=np.float32))
    config = TrainConfig.of(
        data_dir=Path("."), output_dir=Path("."), batch_size=batch, optimizer="sgd",
        learning_rate=0.1, momentum=0.8, lr_schedule="exponential", keep_prob=0.5,
    )  # fmt: skip
    formulation, precision = spec["formulation"], spec.get("precision", "float32")
    if spec.get("xla", False):
        candidate = Choice(formulation, precision, "a candidate", {})
        step = TrainStep(config.recipe, config.schedule.max_steps, candidate, (h, w, k), Replicas())
        zero = tf.constant(0.0)
        fn = tf.function(lambda: step.update(x, y, zero)[0], jit_compile=True)
    else:
        fn = train_step(formulation, precision, x, y, config.recipe, config.schedule.max_steps)
    r = _timed(fn, lambda t: t.numpy(), spec["warmup"], spec["steps"])
    r["samples_per_s"] = batch / r["wall_s"]
    return r


def _worker_torch(spec: dict[str, Any]) -> dict[str, Any]:
    """The same CNN and step in PyTorch: eager float32, ``autocast`` bfloat16 (its
    mixed precision on CPU), or ``torch.compile`` (spec["mode"])."""
    import torch
    from torch import nn

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    batch, k = spec["batch"], spec["outputs"]
    h, w = spec["height"], spec["width"]
    ho, wo = h - 2, (w - 30) // 5 + 1
    flat = ((ho // 2 - 1) // 2) * ((wo // 2 - 1) // 2) * 5
    conv1, conv2 = nn.Conv2d(1, 5, (3, 30), stride=(1, 5)), nn.Conv2d(5, 5, 2)
    dense1, dense2 = nn.Linear(flat, 20), nn.Linear(20, k)
    features = nn.Sequential(
        conv1, nn.ReLU(), nn.MaxPool2d(2), conv2, nn.ReLU(), nn.MaxPool2d(2), nn.Flatten()
    )
    head = nn.Sequential(nn.Dropout(0.5), dense1, nn.ReLU(), dense2)
    net = nn.Sequential(features, head)
    params = list(net.parameters())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.8)
    x = torch.randn(batch, 1, h, w)
    y = torch.randn(batch, k)
    mode = spec.get("mode", "eager")
    forward = torch.compile(net) if mode == "compile" else net

    def train_step() -> Any:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
            pred = forward(x).float()
        rmse = torch.sqrt(torch.mean((pred - y) ** 2))
        l2 = lambda m: (m.weight**2).sum() / 2  # noqa: E731
        loss = rmse + 0.001 * (l2(conv1) + l2(conv2)) + 0.004 * (l2(dense1) + l2(dense2))
        loss.backward()
        opt.step()
        return loss

    r = _timed(train_step, lambda t: float(t), spec["warmup"], spec["steps"])
    r["samples_per_s"] = batch / r["wall_s"]
    r["torch"] = torch.__version__
    return r


def _worker_jax(spec: dict[str, Any]) -> dict[str, Any]:
    """The same CNN and step in JAX, the whole step under ``jax.jit`` (XLA on the CPU)."""
    os.environ.setdefault(
        "XLA_FLAGS",
        f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={spec['threads']}",
    )
    import jax
    import jax.numpy as jnp

    batch, k, h, w = spec["batch"], spec["outputs"], spec["height"], spec["width"]
    ho, wo = h - 2, (w - 30) // 5 + 1
    flat = ((ho // 2 - 1) // 2) * ((wo // 2 - 1) // 2) * 5
    keys = jax.random.split(jax.random.PRNGKey(0), 8)
    params = {
        "c1": jax.random.normal(keys[0], (5, 1, 3, 30)) * 0.1, "b1": jnp.zeros(5),
        "c2": jax.random.normal(keys[1], (5, 5, 2, 2)) * 0.1, "b2": jnp.full(5, 0.1),
        "d1": jax.random.normal(keys[2], (flat, 20)) * 0.1, "e1": jnp.zeros(20),
        "d2": jax.random.normal(keys[3], (20, k)) * 0.1, "e2": jnp.zeros(k),
    }  # fmt: skip
    momentum = jax.tree_util.tree_map(jnp.zeros_like, params)
    x = jax.random.normal(keys[4], (batch, 1, h, w))
    y = jax.random.normal(keys[5], (batch, k))

    def pool(a: Any) -> Any:
        return jax.lax.reduce_window(a, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def loss_fn(p: Any, key: Any) -> Any:
        a = jax.lax.conv_general_dilated(x, p["c1"], (1, 5), "VALID") + p["b1"][:, None, None]
        a = pool(jax.nn.relu(a))
        a = jax.lax.conv_general_dilated(a, p["c2"], (1, 1), "VALID") + p["b2"][:, None, None]
        a = pool(jax.nn.relu(a)).reshape(batch, -1)
        a = a * jax.random.bernoulli(key, 0.5, a.shape) * 2.0
        pred = jax.nn.relu(a @ p["d1"] + p["e1"]) @ p["d2"] + p["e2"]
        rmse = jnp.sqrt(jnp.mean((pred - y) ** 2))
        l2 = sum(jnp.sum(p[n] ** 2) / 2 for n in ("c1", "c2")) * 0.001
        return rmse + l2 + sum(jnp.sum(p[n] ** 2) / 2 for n in ("d1", "d2")) * 0.004

    @jax.jit
    def step(p: Any, m: Any, key: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(p, key)
        m = jax.tree_util.tree_map(lambda mv, g: 0.8 * mv + g, m, grads)
        p = jax.tree_util.tree_map(lambda pv, mv: pv - 0.1 * mv, p, m)
        return p, m, loss

    state = {"p": params, "m": momentum, "key": keys[6]}

    def train_step() -> Any:
        state["key"], sub = jax.random.split(state["key"])
        state["p"], state["m"], loss = step(state["p"], state["m"], sub)
        return loss

    r = _timed(train_step, lambda t: t.block_until_ready(), spec["warmup"], spec["steps"])
    r["samples_per_s"] = batch / r["wall_s"]
    r["jax"] = jax.__version__
    return r


WORKERS = {
    "probe": _worker_probe,
    "step": _worker_step,
    "torch": _worker_torch,
    "jax": _worker_jax,
}


def _worker_main(raw: str) -> None:
    spec = json.loads(raw)
    result = WORKERS[spec["kind"]](spec)
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def _thread_env(threads: int, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TF_NUM_INTRAOP_THREADS=str(threads),
        TF_NUM_INTEROP_THREADS="1",
        OMP_NUM_THREADS=str(threads),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    env.update(extra)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_worker(
    spec: dict[str, Any], env: dict[str, str], python: str = sys.executable
) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; its last stdout line is the JSON result."""
    proc = subprocess.run(
        [python, "-m", "benchmarks.model_step", "--worker", json.dumps(spec)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _torch_available(python: str, module: str = "torch") -> bool:
    try:
        proc = subprocess.run([python, "-c", f"import {module}"], capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def peer_python(candidate: str | None, module: str) -> tuple[str | None, str]:
    """(interpreter that imports ``module`` or None, note): ``candidate`` first, then this
    one. torch and jax are never dependencies of the project: without them the peer rows
    are skipped, with a note."""
    for python in dict.fromkeys(p for p in (candidate, sys.executable) if p):
        if _torch_available(python, module):
            return python, f"{module} from {python}"
    return None, f"skipped: {module} is not importable (optional)"


def torch_python(candidate: str | None) -> tuple[str | None, str]:
    """(interpreter that imports torch or None, note): ``candidate`` first, then this one.

    torch is never a dependency of the project: without it the comparison is skipped.
    """
    for python in dict.fromkeys(p for p in (candidate, sys.executable) if p):
        if _torch_available(python):
            return python, f"torch from {python}"
    return None, "skipped: torch is not importable (optional; pass --torch-python)"


def _parse_env(items: list[str]) -> list[tuple[str, dict[str, str]]]:
    sets: list[tuple[str, dict[str, str]]] = [("default", {})]
    for item in items:
        if item == "none":
            continue
        extra = {}
        for pair in item.split(","):
            name, eq, value = pair.partition("=")
            if not name or not eq:
                raise SystemExit(f"--env wants NAME=VALUE[,NAME=VALUE], got {item!r}")
            extra[name] = value
        sets.append((item, extra))
    return sets


def _suffix(label: str) -> str:
    return "" if label == "default" else f" [{label}]"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run every measurement ``args.rounds`` times; return the report dict."""
    common = {
        "batch": args.batch,
        "height": args.height,
        "width": args.width,
        "outputs": args.outputs,
        "threads": args.threads,
        "warmup": args.warmup,
        "steps": args.steps,
    }
    envs = _parse_env(args.env if args.env is not None else list(DEFAULT_ENVS))
    torch_python = args.torch_python or sys.executable
    plan: list[tuple[str, dict[str, Any], dict[str, str], str]] = []
    for label, extra in envs:
        plan.append(("probe" + _suffix(label), {"kind": "probe"}, extra, sys.executable))
        for formulation in ("plain", "fast"):
            spec = {**common, "kind": "step", "formulation": formulation}
            plan.append((formulation + _suffix(label), spec, extra, sys.executable))
    if args.xla:
        for formulation in ("plain", "fast"):
            spec = {**common, "kind": "step", "formulation": formulation, "xla": True}
            plan.append((formulation + "+xla", spec, {}, sys.executable))
    torch_ok = _torch_available(torch_python)
    if torch_ok:
        plan.append(("torch", {**common, "kind": "torch"}, {}, torch_python))

    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        results: dict[str, Any] = {}
        for name, spec, extra, python in plan:
            print(f"round {r + 1}/{args.rounds}: {name} ...", file=sys.stderr, flush=True)
            load, t0 = os.getloadavg()[0], time.perf_counter()
            results[name] = run_worker(spec, _thread_env(args.threads, extra), python)
            results[name].update(
                load1_before=round(load, 2), process_s=round(time.perf_counter() - t0, 1)
            )
        rounds.append(results)

    def med(name: str, key: str) -> float | None:
        vals = [rd[name][key] for rd in rounds if key in rd.get(name, {})]
        return statistics.median(vals) if vals else None

    flops = train_flops(args.height, args.width, args.outputs)
    summary: dict[str, Any] = {}
    for name, *_ in plan:
        errors = [rd[name]["error"] for rd in rounds if "error" in rd.get(name, {})]
        if name.startswith("probe"):
            gflops = med(name, "gflops")
            summary[name] = {"gflops": None if gflops is None else round(gflops, 1)}
        else:
            wall, cpu = med(name, "wall_s"), med(name, "cpu_s")
            entry: dict[str, Any] = {"step_ms": None}
            if wall is not None:
                entry["step_ms"] = round(wall * 1e3, 1)
                entry["step_ms_min"] = round((med(name, "wall_min_s") or wall) * 1e3, 1)
                entry["cpu_ms"] = round((cpu or 0) * 1e3, 1)
                entry["samples_per_s"] = round(args.batch / wall)
                entry["gflops"] = round(flops * args.batch / wall / 1e9, 2)
            summary[name] = entry
        if errors:
            summary[name]["errors"] = errors

    def ratio(a: str, b: str, key: str = "samples_per_s") -> float | None:
        va, vb = summary.get(a, {}).get(key), summary.get(b, {}).get(key)
        return round(va / vb, 2) if va and vb else None

    ratios: dict[str, Any] = {}
    for label, _ in envs:
        sx = _suffix(label)
        ratios["fast_over_plain" + sx] = ratio("fast" + sx, "plain" + sx)
        ratios["fast_over_plain_fastest_steps" + sx] = ratio(
            "plain" + sx, "fast" + sx, "step_ms_min"
        )
        ratios["plain_cpu_over_fast_cpu" + sx] = ratio("plain" + sx, "fast" + sx, "cpu_ms")
        fast, probe = summary["fast" + sx].get("gflops"), summary["probe" + sx]["gflops"]
        ratios["fast_flop_rate_pct_of_probe" + sx] = (
            round(100 * fast / probe, 1) if fast and probe else None
        )
        if torch_ok:
            ratios["fast_over_torch" + sx] = ratio("fast" + sx, "torch")
            ratios["fast_over_torch_fastest_steps" + sx] = ratio(
                "torch", "fast" + sx, "step_ms_min"
            )
    return {
        "benchmark": "model_step",
        "config": common,
        "train_flops_per_sample": flops,
        "machine": {
            "cpus": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)),
            "processor": platform.processor() or platform.machine(),
            "loadavg_end": [round(v, 2) for v in os.getloadavg()],
        },
        "summary": summary,
        "ratios": ratios,
        "torch": None if torch_ok else f"torch not importable in {torch_python}",
        "rounds": rounds,
    }


def table(report: dict[str, Any]) -> str:
    """The summary as a fixed-width table."""
    head = f"{'measurement':44s} {'step ms':>8s} {'cpu ms':>8s} {'samples/s':>9s} {'GFLOP/s':>8s}"
    lines = [head]
    for name, e in report["summary"].items():
        if name.startswith("probe"):
            label = "matmul probe 2048²" + name[len("probe") :]
            lines.append(f"{label:44s} {'':>8s} {'':>8s} {'':>9s} {e['gflops'] or 0:8.1f}")
        elif e.get("step_ms") is None:
            lines.append(f"{name:44s} failed: {e.get('errors')}")
        else:
            lines.append(
                f"{name:44s} {e['step_ms']:8.1f} {e['cpu_ms']:8.1f} {e['samples_per_s']:9d} "
                f"{e['gflops']:8.2f}"
            )
    lines.extend(f"{key:44s} {value}" for key, value in report["ratios"].items())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse options, run the measurements, print JSON (stdout) and a table (stderr)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--height", type=int, default=20)
    p.add_argument("--width", type=int, default=195)
    p.add_argument("--outputs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--env",
        action="append",
        help="extra NAME=VALUE environment for another plain/fast pair (repeatable; "
        f"'none' for none; default {' '.join(DEFAULT_ENVS)})",
    )
    p.add_argument("--xla", action="store_true", help="also time the steps under XLA")
    p.add_argument("--torch-python", help="interpreter with torch (default: this one)")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args(argv)
    if args.worker:
        _worker_main(args.worker)
        return
    report = measure(args)
    text = json.dumps(report, indent=2)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)
    print(table(report), file=sys.stderr)


if __name__ == "__main__":
    main()
