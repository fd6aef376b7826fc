"""``make bench``: every performance figure measured side by side in one run.

``python -m benchmarks.run [--quick]`` generates the data (``app.data.synthetic``, 4,000
train / 400 test samples, ~130 MB of text, kept in ``bench-output/data`` for the next
run), then measures, each in a fresh process with the thread plan applied before
TensorFlow is imported (:mod:`benchmarks.worker`):

(a) the matmul probe, GFLOP/s, and (b) train-step samples/s of the plain Keras seed CNN vs
    the project's fast formulation, both by :mod:`benchmarks.model_step`'s workers, and
    the same CNN in PyTorch eager (optional: when torch imports in ``--torch-python``,
    default ``$BENCH_TORCH_PYTHON``, else this interpreter; never a dependency), with
    the same batch, threads and steps;
(c) end-to-end samples/s of ``train()`` on its on-disk cache vs the same loop fed from
    memory (:mod:`benchmarks.end_to_end`), ``--e2e-rounds`` interleaved rounds (cache,
    one reused batch, ...); the ratio is the median of the per-round ratios;
(d) ingest MB/s and samples/s: decode_csv, pandas (optional), the converter at 1 and N
    threads (:mod:`benchmarks.ingest`);
(e) peak RSS (ru_maxrss via wait4) of every measurement, training and conversion included;
(f) the roofline of the step the run chose (:mod:`benchmarks.roofline`): each op's time
    against its compute and memory bounds.

Every worker gets the same environment: the project's thread plan for this machine
(:func:`app.budget.plan.make_plan` on the detected CPU budget, applied by
:func:`app.budget.apply.apply` to a copy of the environment), so compared variants share one
thread plan. The targets are ratios within this one run. Prints a table and the JSON report
on stdout and writes the JSON to ``bench-output/report.json``. The machine's load average
is recorded before and after: other processes distort wall-clock figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from app.budget.plan import BF16_FLAGS
from app.budget.topology import ONEDNN_DEFAULT_FLAGS, detect_cpu
from benchmarks import end_to_end, ingest, model_step, roofline, worker
from benchmarks.table import table

REPO = Path(__file__).resolve().parent.parent
# The targets. Wall-clock ratios, and the same per CPU-second where load from other
# sessions distorts wall time.
TARGETS = {
    "converter_1t_over_pandas": 3.0,
    "converter_1t_over_pandas_per_cpu_s": 3.0,
    "converter_1t_over_pandas_one_cpu": 3.0,
    "converter_2t_over_1t": 1.8,
    "fast_over_plain": 3.0,
    "fast_gflops_over_probe": 0.40,
    "end_to_end_over_in_memory": 0.95,
    "end_to_end_over_in_memory_per_cpu_s": 0.95,
    "end_to_end_over_model_step_chosen": 0.95,
    "end_to_end_over_best_peer": 1.5,
    "chosen_gflops_over_probe": 0.30,
}


def log(message: str) -> None:
    """Progress on stderr (stdout carries the report)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


#: The /proc/cpuinfo flags that decide a formulation's speed here: vector width, and what
#: turns oneDNN on or gives bfloat16 dot products (app.budget.topology, app.budget.plan).
DECIDING_FLAGS = ("avx2", "fma", "avx512f", *ONEDNN_DEFAULT_FLAGS, *BF16_FLAGS)


def machine() -> dict[str, Any]:
    """CPU model (name, family, model number), the deciding flags it has, CPU counts,
    kernel, Python and the load average now."""
    model = platform.processor() or platform.machine()
    lscpu: dict[str, str] = {}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in text.splitlines():
            key, _, value = line.partition(":")
            lscpu[key.strip()] = value.strip()
        model = lscpu.get("Model name", model)
    except (OSError, subprocess.SubprocessError):
        pass
    flags = detect_cpu("/").flags
    return {
        "cpu_model": model,
        "cpu_family": lscpu.get("CPU family"),
        "cpu_model_number": lscpu.get("Model"),
        "cpu_flags": [f for f in dict.fromkeys(DECIDING_FLAGS) if f in flags],
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg": [round(v, 2) for v in os.getloadavg()],
    }


def thread_plan() -> tuple[Any, dict[str, str]]:
    """The plan ``coretrain train`` would make here and the environment it would run in."""
    from app.budget import apply as runtime
    from benchmarks.end_to_end import _plan

    plan = _plan()
    env = dict(os.environ)
    runtime.apply(plan, environ=env)
    return plan, env


def ensure_data(directory: Path, train: int, test: int, env: dict[str, str]) -> Path:
    """Generate the benchmark data set once per size (a stamp file records the sizes).

    Generated in a worker process: the driver stays small (see ``driver_rss_mb``).
    Raises RuntimeError when generation fails.
    """
    stamp = directory / "sizes.json"
    want = {"train": train, "test": test, "seed": 0}
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return directory
    log(f"generating {train} train / {test} test samples into {directory} ...")
    spec = {"kind": "generate", "out": str(directory), **want}
    result = worker.run(ingest.MODULE, spec, env)
    if "error" in result:
        raise RuntimeError(f"generating the data failed: {result['error']}")
    stamp.write_text(json.dumps(want))
    return directory


def model_steps(
    env: dict[str, str],
    threads: int,
    steps: int,
    warmup: int,
    torch_py: str | None,
    jax_py: str | None = None,
) -> dict[str, Any]:
    """(a) float32 and bfloat16 matmul probes, (b) the train step of every formulation and
    precision, and the peers in their best configurations on this CPU: plain Keras float32
    and mixed_bfloat16 (the project's plain formulation in both precisions), PyTorch eager
    float32, bfloat16 autocast and ``torch.compile``, JAX ``jit`` (the optional ones only
    where they import)."""
    common = {"batch": 1000, "height": 20, "width": 195, "outputs": 3, "threads": threads}
    common.update(warmup=warmup, steps=steps)
    out: dict[str, Any] = {}
    for precision in ("float32", "bfloat16"):
        log(f"matmul probe, {precision} ...")
        out[f"probe/{precision}"] = model_step.run_worker(
            {"kind": "probe", "precision": precision}, env
        )
    flops = model_step.train_flops()
    torch_python, out["torch_note"] = model_step.peer_python(torch_py, "torch")
    jax_python, out["jax_note"] = model_step.peer_python(jax_py, "jax")
    variants = [
        (f"{f}/{p}", {"kind": "step", "formulation": f, "precision": p}, sys.executable)
        for f in ("plain", "fast")
        for p in ("float32", "bfloat16")
    ]
    if torch_python is not None:
        for mode in ("eager", "bf16", "compile"):
            variants.append((f"torch/{mode}", {"kind": "torch", "mode": mode}, torch_python))
    if jax_python is not None:
        variants.append(("jax/jit", {"kind": "jax"}, jax_python))
    for name, kind, interpreter in variants:
        log(f"train step, {name} ...")
        result = model_step.run_worker({**common, **kind}, env, python=interpreter)
        if "samples_per_s" in result:
            result["gflops"] = round(flops * result["samples_per_s"] / 1e9, 2)
        out[name] = result
    # The project's names of earlier reports: the float32 steps.
    out["plain"], out["fast"], out["probe"] = (
        out["plain/float32"],
        out["fast/float32"],
        out["probe/float32"],
    )
    if "torch/eager" in out:
        out["torch"] = out["torch/eager"]
    return out


PEERS = ("plain/float32", "plain/bfloat16", "torch/eager", "torch/bf16", "torch/compile", "jax/jit")


def best_peer(model: dict[str, Any]) -> tuple[str | None, float | None]:
    """The fastest peer configuration measured (samples/s)."""
    rates = {n: model[n]["samples_per_s"] for n in PEERS if "samples_per_s" in model.get(n, {})}
    if not rates:
        return None, None
    name = max(rates, key=lambda n: rates[n])
    return name, rates[name]


def _get(report: dict[str, Any], *keys: str) -> float | None:
    value: Any = report
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, int | float) else None


def _div(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def _round(value: Any) -> float | None:
    return round(float(value), 2) if isinstance(value, int | float) else None


def ratios(report: dict[str, Any], threads: list[int]) -> dict[str, Any]:
    """All ratios of the run; the targets are in TARGETS."""
    fast = _get(report, "model", "fast", "samples_per_s")
    median = report.get("end_to_end", {}).get("ratio_median", {})
    out = {
        "fast_over_plain": _div(fast, _get(report, "model", "plain", "samples_per_s")),
        "fast_gflops_over_probe": _div(
            _get(report, "model", "fast", "gflops"), _get(report, "model", "probe", "gflops")
        ),
        "fast_over_torch": _div(fast, _get(report, "model", "torch", "samples_per_s")),
        # torch's OpenMP threads spin at barriers: on a busy machine its median step suffers
        # far more than TensorFlow's, its fastest step much less (benchmarks/model_step.py).
        "fast_over_torch_fastest_steps": _div(
            _get(report, "model", "torch", "wall_min_s"),
            _get(report, "model", "fast", "wall_min_s"),
        ),
        # Medians of the per-round ratios (interleaved rounds, benchmarks/end_to_end.py).
        "end_to_end_over_in_memory": _round(median.get("samples_per_s")),
        "end_to_end_over_in_memory_per_cpu_s": _round(median.get("samples_per_cpu_s")),
        "end_to_end_over_one_reused_batch": _round(
            report.get("end_to_end", {}).get("ratio_median_one_batch", {}).get("samples_per_s")
        ),
        "end_to_end_over_model_step_fast": _div(
            _get(report, "end_to_end", "cache", "samples_per_s"),
            _get(report, "model", "fast", "samples_per_s"),
        ),
    }
    model = report.get("model", {})
    peer, peer_rate = best_peer(model)
    chosen = report.get("end_to_end", {}).get("cache", {}).get("chosen")  # "fast/bfloat16"
    e2e = _get(report, "end_to_end", "cache", "samples_per_s")
    out["best_peer"] = peer
    out["end_to_end_over_best_peer"] = _div(e2e, peer_rate)
    if chosen:
        precision = chosen.split("/")[1]
        out["chosen"] = chosen
        out["end_to_end_over_model_step_chosen"] = _div(
            e2e, _get(report, "model", chosen, "samples_per_s")
        )
        out["chosen_gflops_over_probe"] = _div(
            _get(report, "model", chosen, "gflops"),
            _get(report, "model", f"probe/{precision}", "gflops"),
        )
        steps = {n: model[n]["samples_per_s"] for n in model if "samples_per_s" in model[n]}
        # Judged among the candidates the run measured (bfloat16 is one under auto only on a
        # CPU with native bf16: docs/quality.md, "bfloat16").
        considered = report.get("end_to_end", {}).get("cache", {}).get("candidates", [])
        ours = {n: v for n, v in steps.items() if n in considered}
        if ours and chosen in ours:
            # The run's own timing at its start and these rows are two measurements, minutes
            # apart on a shared machine; the rule takes an earlier candidate of its order within
            # its margin of the least CPU time (app/training/state/choose.py): the choice is
            # right when within that margin (and 5 % more) of the best.
            margin = report["end_to_end"]["cache"].get("margin") or 0.0
            out["auto_choice_over_fastest_step"] = _div(ours[chosen], max(ours.values()))
            bound = 0.95 / (1 + margin)
            out["auto_picked_the_fastest_step"] = ours[chosen] >= bound * max(ours.values())
    out.update(ingest.ratios(report.get("ingest", {}), threads))
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse options, run everything, print the table and the JSON, write report.json."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "bench-output")
    p.add_argument("--train", type=int, default=4000, help="training samples generated")
    p.add_argument("--test", type=int, default=400, help="test samples generated")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each ingest measurement")
    p.add_argument("--threads", default=None, help="converter threads, e.g. 1,2")
    p.add_argument("--decode-csv-lines", type=int, default=1000)
    p.add_argument(
        "--pandas-python",
        default=os.environ.get("BENCH_PANDAS_PYTHON"),
        help="an interpreter with pandas (default: $BENCH_PANDAS_PYTHON, else this one)",
    )
    p.add_argument("--steps", type=int, default=10, help="timed train steps (model_step)")
    p.add_argument("--warmup", type=int, default=3)
    # One evaluation per window: every 50 steps is twice the job's default (--eval-every
    # 100); what evaluating every 10 steps costs: docs/performance.md, "Evaluation".
    p.add_argument("--e2e-window", type=int, default=50, help="steps per progress window")
    p.add_argument("--e2e-steps", type=int, default=150, help="timed end-to-end steps")
    p.add_argument(
        "--e2e-rounds", type=int, default=3, help="interleaved end-to-end rounds (all variants)"
    )
    p.add_argument(
        "--torch-python",
        default=os.environ.get("BENCH_TORCH_PYTHON"),
        help="an interpreter with torch (default: $BENCH_TORCH_PYTHON, else this one)",
    )
    p.add_argument(
        "--jax-python",
        default=os.environ.get("BENCH_JAX_PYTHON"),
        help="an interpreter with jax (default: $BENCH_JAX_PYTHON, else this one)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that it runs")
    args = p.parse_args(argv)
    if args.quick:
        args.train, args.test, args.rounds, args.decode_csv_lines = 400, 100, 1, 100
        args.steps, args.warmup, args.e2e_window, args.e2e_steps = 2, 1, 2, 4
        args.e2e_rounds = 1
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "coretrain make bench",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
    }
    plan, env = thread_plan()
    report["plan"] = {
        "cpu_budget": plan.cpu_budget,
        "intra_op_threads": plan.intra_op_threads,
        "inter_op_threads": plan.inter_op_threads,
        "reasons": list(plan.reasons),
    }
    threads = sorted(
        {1, max(2, plan.intra_op_threads)}
        if args.threads is None
        else {int(x) for x in args.threads.split(",")}
    )
    report["config"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    data = ensure_data(args.out / "data", args.train, args.test, env)
    cache_dir = args.out / "cache"

    report["model"] = model_steps(
        env, plan.intra_op_threads, args.steps, args.warmup, args.torch_python, args.jax_python
    )
    log(f"cache conversion of the whole data set, {plan.intra_op_threads} thread(s) ...")
    report["prepare"] = end_to_end.conversion(data, cache_dir, env, plan.intra_op_threads)
    report["end_to_end"] = end_to_end.measure(
        data,
        cache_dir,
        env,
        window=args.e2e_window,
        steps=args.e2e_steps,
        rounds=args.e2e_rounds,
        log=log,
    )
    chosen = report["end_to_end"].get("cache", {}).get("chosen") or "fast/float32"
    log(f"roofline of the {chosen} step ...")
    report["roofline"] = roofline.measure(env, *chosen.split("/"), plan.intra_op_threads)
    report["ingest"] = ingest.measure(
        data,
        env,
        threads=threads,
        pandas_py=args.pandas_python,
        rounds=args.rounds,
        decode_csv_lines=args.decode_csv_lines,
        log=log,
    )
    report["ratios"] = ratios(report, threads)
    report["targets"] = TARGETS
    report["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
    # Linux counts a fork+exec'd child's pre-exec image (a copy of this driver) in its
    # ru_maxrss: every peak RSS above includes at least this much.
    report["driver_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    report["seconds"] = round(time.perf_counter() - started, 1)
    text = json.dumps(report, indent=2)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(text + "\n")
    print(table(report))
    print(roofline.table(report["roofline"]))
    print()
    print(text)
    log(f"done in {report['seconds']} s; report in {args.out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
