"""Choose the thread-rounding rule by measurement: train under real CFS quotas.

``python -m benchmarks.cpu_rounding`` (root, cgroup v1 ``cpu`` hierarchy; a one-off
measurement, not part of CI). For each CPU quota (default 0.5, 1, 1.5, 2 CPUs) it trains the
demo CNN inside a fresh v1 cpu cgroup with that quota (:mod:`benchmarks.cgroup_run`), once per
distinct intra-op thread count that these variants give:

* ``floor`` / ``ceil``: ``coretrain train --rounding floor|ceil`` (the plan's rules);
* ``tf-default``: ``--rounding tf-default``, the affinity count, which is what TensorFlow
  does by itself because it never reads a CFS quota (tensorflow/tensorflow#17206);
* ``oversubscribed``: ``--intra-op-threads 8×quota``, the thread-to-CPU ratio TensorFlow
  picks on a 64-core node in a container limited to 8 CPUs.

Rules that give the same thread count share the same runs (the plan is then identical).
Every configuration runs ``--runs`` times, the order shuffled per round (seeded) so that load
from other processes on the machine hits all variants alike. A run's rate is samples/s over
the steady-state ``progress`` windows only (all but the first, which holds TensorFlow
start-up, tracing and the first evaluation): total samples / total window time. Throttling
comes from the group's ``cpu.stat``, read when each ``progress`` line arrives: throttled
periods (and throttled ms) per step over the same windows.

Prints one JSON report on stdout (also written to ``--json-out``) and a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.budget.plan import ROUNDING_RULES, round_threads
from benchmarks.cgroup_run import MAX_SHARES, cpu_cgroup, unavailable_reason

REPO = Path(__file__).resolve().parents[1]

#: Intra-op threads per quota CPU in the oversubscribed case (64 visible CPUs / --cpus=8).
OVERSUBSCRIPTION = 8
VARIANTS = (*ROUNDING_RULES, "oversubscribed")
REFERENCE = "tf-default"
#: Plan fields kept per run (from the ``start`` event).
PLAN_KEYS = (
    "cpu_quota",
    "cpu_budget",
    "intra_op_threads",
    "inter_op_threads",
    "tfdata_threads",
    "rounding",
)


def log(message: str) -> None:
    """Progress of the benchmark itself, on stderr (stdout carries the JSON report)."""
    print(f"[cpu_rounding {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def coretrain() -> list[str]:
    """The ``coretrain`` console script next to this interpreter, else ``python -m app``."""
    script = Path(sys.executable).with_name("coretrain")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "app"]


def clean_env(code: Path | None = None) -> dict[str, str]:
    """This environment minus anything that would override the plan under test.

    ``code``: a directory holding a copy of the ``app`` package to run instead of the
    working tree's (put first on ``PYTHONPATH``).
    """
    drop = ("CORETRAIN_", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "CPU_LIMIT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.pop("CPU_REQUEST", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [env.get("PYTHONPATH")])])
    return env


def snapshot_code(work: Path) -> dict[str, Any]:
    """Copy ``app/`` into ``work/code`` so every run trains with the same code.

    Returns the git commit and the uncommitted paths under ``app/`` at copy time.
    """
    code = work / "code"
    shutil.rmtree(code, ignore_errors=True)
    shutil.copytree(REPO / "app", code / "app", ignore=shutil.ignore_patterns("__pycache__"))

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return proc.stdout.strip()

    return {
        "path": str(code),
        "commit": git("rev-parse", "HEAD"),
        "uncommitted": git("status", "--porcelain", "--", "app").splitlines(),
    }


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (``/proc/loadavg``)."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def configs(quotas: Sequence[float], visible: int) -> list[dict[str, Any]]:
    """One configuration per (quota, distinct intra-op thread count) with the variants it covers.

    ``args`` are the extra ``coretrain train`` flags: ``--rounding RULE`` for the first rule
    that gives the count, ``--intra-op-threads N`` for the oversubscribed case.
    """
    out: list[dict[str, Any]] = []
    for quota in quotas:
        by_threads: dict[int, dict[str, Any]] = {}
        for variant in VARIANTS:
            if variant == "oversubscribed":
                threads = max(1, round(OVERSUBSCRIPTION * quota))
                args = ["--intra-op-threads", str(threads)]
            else:
                threads = round_threads(quota, variant, visible)
                args = ["--rounding", variant]
            entry = by_threads.setdefault(
                threads, {"quota": quota, "threads": threads, "variants": [], "args": args}
            )
            entry["variants"].append(variant)
        out.extend(by_threads.values())
    return out


def steady_state(progress: list[dict[str, Any]], batch_size: int) -> dict[str, Any]:
    """Rate and throttling over all ``progress`` windows but the first.

    ``progress``: the run's progress records in order, each with ``step``,
    ``examples_per_sec`` and ``cpu_stat`` (the group's counters when the line arrived).
    Returns samples/s (total samples / total time of the windows), per-window rates, and
    throttled periods, CFS periods and throttled milliseconds per step. Raises ValueError
    with fewer than two progress records (no steady window).
    """
    if len(progress) < 2:
        raise ValueError("need at least two progress events for a steady-state window")
    first, last = progress[0], progress[-1]
    utils = [r["cpu_util"] for r in progress[1:] if r.get("cpu_util") is not None]
    samples = seconds = 0.0
    rates = []
    prev_step = first["step"]
    for record in progress[1:]:
        n = (record["step"] - prev_step) * batch_size
        samples += n
        seconds += n / record["examples_per_sec"]
        rates.append(record["examples_per_sec"])
        prev_step = record["step"]
    steps = last["step"] - first["step"]
    a, b = first["cpu_stat"], last["cpu_stat"]
    return {
        "steady_steps": steps,
        "samples_per_sec": samples / seconds,
        "window_rates": rates,
        "cpu_util": statistics.fmean(utils) if utils else None,
        "throttled_periods_per_step": (b["nr_throttled"] - a["nr_throttled"]) / steps,
        "periods_per_step": (b["nr_periods"] - a["nr_periods"]) / steps,
        "throttled_ms_per_step": (b["throttled_time"] - a["throttled_time"]) / 1e6 / steps,
    }


def run_once(
    config: dict[str, Any], data: Path, cache: Path, work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Train once inside a fresh cgroup limited to ``config["quota"]`` CPUs; return the record.

    The record holds the plan from the ``start`` event, every ``progress`` event with the
    group's ``cpu.stat`` at that moment, the steady-state numbers (see :func:`steady_state`),
    the whole run's ``cpu.stat``, wall seconds and the exit code.
    """
    out = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    cmd = [
        *coretrain(),
        "train",
        "--data",
        str(data),
        "--output",
        str(out),
        "--cache-dir",
        str(cache),
        "--max-steps",
        str(args.steps),
        "--batch-size",
        str(args.batch_size),
        "--eval-every",
        str(args.eval_every),
        "--checkpoint-every",
        str(args.steps),
        *config["args"],
    ]
    record: dict[str, Any] = {
        "quota": config["quota"],
        "threads": config["threads"],
        "variants": config["variants"],
        "args": config["args"],
        "load_before": load_average(),
        "progress": [],
    }
    t0 = time.monotonic()
    with cpu_cgroup(config["quota"], prefix="coretrain-bench", shares=args.shares) as group:
        stderr_path = out / "stderr.txt"
        with open(stderr_path, "w") as err:
            proc = subprocess.Popen(
                group.command(cmd),
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=clean_env(args.code),
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                stat = group.stat()
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") == "start":
                    record["plan"] = {k: event["plan"][k] for k in PLAN_KEYS}
                elif event.get("event") == "progress":
                    record["progress"].append(
                        {
                            "step": event["step"],
                            "examples_per_sec": event["examples_per_sec"],
                            "cpu_util": event.get("cpu_util"),
                            "cpu_stat": stat,
                        }
                    )
            record["returncode"] = proc.wait()
        record["cpu_stat"] = group.stat()
    record["wall_seconds"] = round(time.monotonic() - t0, 2)
    if record["returncode"] != 0:
        record["stderr_tail"] = stderr_path.read_text()[-2000:]
    shutil.rmtree(out, ignore_errors=True)
    plan = record.get("plan", {})
    if record["returncode"] == 0 and plan.get("intra_op_threads") != config["threads"]:
        record["error"] = (
            f"plan has {plan.get('intra_op_threads')} intra-op threads, "
            f"expected {config['threads']}"
        )
    if plan and plan.get("cpu_quota") != config["quota"]:
        record["error"] = f"detected quota {plan.get('cpu_quota')} != cgroup quota"
    if record["returncode"] == 0 and "error" not in record:
        record.update(steady_state(record["progress"], args.batch_size))
    return record


def summarise(runs: list[dict[str, Any]], quotas: Sequence[float]) -> list[dict[str, Any]]:
    """One row per (quota, variant): median/min/max samples/s, throttling, ratio to tf-default.

    Ratios: median over median of the ``tf-default`` row of the same quota; ``ratio_low`` /
    ``ratio_high`` compare the variant's min with tf-default's max and vice versa.
    """
    rows: list[dict[str, Any]] = []
    for quota in quotas:
        quota_rows = {}
        for variant in VARIANTS:
            good = [
                r
                for r in runs
                if r["quota"] == quota and variant in r["variants"] and "samples_per_sec" in r
            ]
            rates = [r["samples_per_sec"] for r in good]
            if not rates:
                continue
            quota_rows[variant] = {
                "quota": quota,
                "variant": variant,
                "threads": good[0]["threads"],
                "runs": len(rates),
                "median": statistics.median(rates),
                "min": min(rates),
                "max": max(rates),
                "throttled_periods_per_step": statistics.median(
                    r["throttled_periods_per_step"] for r in good
                ),
                "throttled_ms_per_step": statistics.median(
                    r["throttled_ms_per_step"] for r in good
                ),
                "cpu_util": statistics.median(r["cpu_util"] or 0.0 for r in good),
                "samples": [round(x, 1) for x in rates],
            }
        ref = quota_rows.get(REFERENCE)
        for row in quota_rows.values():
            if ref:
                row["ratio"] = row["median"] / ref["median"]
                row["ratio_low"] = row["min"] / ref["max"]
                row["ratio_high"] = row["max"] / ref["min"]
                row["same_runs_as_tf_default"] = row["threads"] == ref["threads"]
            rows.append(row)
    return rows


def choose(rows: list[dict[str, Any]], quotas: Sequence[float]) -> dict[str, Any]:
    """Pick the rule: at least as fast as tf-default in every quota row, then fastest overall.

    "At least as fast" = the rule's median is not below tf-default's slowest run (i.e. it is
    faster or inside tf-default's measured spread). Among rules that pass in every row, the
    one with the highest geometric-mean ratio wins. ``chosen`` is None if no rule passes.
    """
    verdict: dict[str, Any] = {}
    for rule in ("floor", "ceil"):
        ok, ratios, failed = True, [], []
        for quota in quotas:
            mine = next((r for r in rows if r["quota"] == quota and r["variant"] == rule), None)
            ref = next((r for r in rows if r["quota"] == quota and r["variant"] == REFERENCE), None)
            if mine is None or ref is None:
                ok = False
                failed.append(quota)
                continue
            ratios.append(mine["ratio"])
            if mine["median"] < ref["min"]:
                ok = False
                failed.append(quota)
        geo = math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else 0.0
        verdict[rule] = {"passes_every_row": ok, "rows_failed": failed, "geomean_ratio": geo}
    passing = [rule for rule, v in verdict.items() if v["passes_every_row"]]
    chosen = max(passing, key=lambda rule: verdict[rule]["geomean_ratio"]) if passing else None
    return {"chosen": chosen, "rules": verdict}


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table: quota × variant with median, spread, throttling and ratio."""
    lines = [
        "| quota (CPUs) | rule | intra-op threads | samples/s median | spread (min–max) "
        "| throttled periods / step | throttled ms / step | vs tf-default (median) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        ratio = f"{r['ratio']:.2f}×" if "ratio" in r else "—"
        if r.get("same_runs_as_tf_default") and r["variant"] != REFERENCE:
            ratio += " (same threads)"
        lines.append(
            f"| {r['quota']:g} | {r['variant']} | {r['threads']} | {r['median']:.0f} "
            f"| {r['min']:.0f}–{r['max']:.0f} | {r['throttled_periods_per_step']:.2f} "
            f"| {r['throttled_ms_per_step']:.0f} | {ratio} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cpu_rounding", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quotas", default="0.5,1,1.5,2", help="CPU quotas, comma separated")
    parser.add_argument("--runs", type=int, default=5, help="runs per configuration")
    parser.add_argument("--steps", type=int, default=40, help="training steps per run")
    parser.add_argument("--eval-every", type=int, default=10, help="progress window, in steps")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--train", type=int, default=2000, help="generated training samples")
    parser.add_argument("--test", type=int, default=400, help="generated test samples")
    parser.add_argument("--seed", type=int, default=0, help="seed of the run order")
    parser.add_argument(
        "--shares",
        type=int,
        default=MAX_SHARES,
        help="cpu.shares of each run's group, so that the quota, not other processes on a "
        "shared machine, limits the run (the kernel default 1024 weighs the whole group "
        "like one task)",
    )
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (kept)")
    parser.add_argument("--json-out", type=Path, default=None, help="also write the report here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the measurement; exit code 0, or 2 when real cgroups cannot be used here."""
    args = parse_args(argv)
    reason = unavailable_reason()
    if reason:
        log(f"cannot measure here: {reason}")
        return 2
    quotas = [float(q) for q in args.quotas.split(",")]
    visible = len(os.sched_getaffinity(0))
    work = args.work or Path(tempfile.mkdtemp(prefix="cpu-rounding-"))
    work.mkdir(parents=True, exist_ok=True)
    data, cache = work / "data", work / "cache"
    code = snapshot_code(work)
    args.code = Path(code["path"])
    t_start = time.monotonic()
    machine: dict[str, Any] = {
        "cpus_visible": visible,
        "kernel": platform.release(),
        "load_at_start": load_average(),
        "uptime_at_start": subprocess.run(["uptime"], capture_output=True, text=True).stdout,
    }
    log(f"load average at start: {machine['load_at_start']} ({visible} CPUs visible)")
    if not (data / "train_features.txt").is_file():
        gen = [*coretrain(), "generate", "--out", str(data)]
        gen += ["--train", str(args.train), "--test", str(args.test)]
        subprocess.run(gen, check=True, capture_output=True, env=clean_env(args.code))
    # Build the binary data cache once, outside any quota (every run then reuses it).
    warm = [*coretrain(), "train", "--data", str(data), "--output", str(work / "warm")]
    warm += ["--cache-dir", str(cache), "--max-steps", "1", "--batch-size", str(args.batch_size)]
    proc = subprocess.run(warm, capture_output=True, text=True, env=clean_env(args.code))
    if proc.returncode != 0:
        log(f"warm-up training failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        return 1
    shutil.rmtree(work / "warm", ignore_errors=True)

    plan = configs(quotas, visible)
    rng = random.Random(args.seed)
    runs: list[dict[str, Any]] = []
    total = len(plan) * args.runs
    for round_no in range(args.runs):
        order = list(plan)
        rng.shuffle(order)
        for config in order:
            record = run_once(config, data, cache, work, args)
            record["round"] = round_no
            runs.append(record)
            rate = record.get("samples_per_sec")
            log(
                f"{len(runs)}/{total} quota {config['quota']:g} threads {config['threads']} "
                f"({'/'.join(config['variants'])}): "
                + (
                    f"{rate:.0f} samples/s, "
                    f"{record['throttled_periods_per_step']:.2f} throttled periods/step"
                    if rate
                    else f"FAILED {record.get('error') or record.get('stderr_tail', '')[-300:]}"
                )
                + f" [{record['wall_seconds']:.0f} s, load {record['load_before'][0]}]"
            )
    rows = summarise(runs, quotas)
    machine["load_at_end"] = load_average()
    choice = choose(rows, quotas)
    report: dict[str, Any] = {
        "settings": {
            "quotas": quotas,
            "runs": args.runs,
            "steps": args.steps,
            "eval_every": args.eval_every,
            "batch_size": args.batch_size,
            "train_samples": args.train,
            "test_samples": args.test,
            "oversubscription": OVERSUBSCRIPTION,
            "seed": args.seed,
            "shares": args.shares,
        },
        "code": code,
        "machine": machine,
        "total_seconds": round(time.monotonic() - t_start, 1),
        "rows": rows,
        "choice": choice,
        "runs": runs,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(table(rows), file=sys.stderr)
    log(f"choice: {choice['chosen']} ({json.dumps(choice['rules'])})")
    log(f"total {report['total_seconds']:.0f} s; load at end {machine['load_at_end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
