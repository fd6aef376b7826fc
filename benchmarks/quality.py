"""How well the CNN trains: recipes × seeds on generated sets large enough not to overfit.

``python -m benchmarks.quality`` generates two data sets (``coretrain generate --kind demo``
and ``--kind lines``, 40,000 training / 4,000 test rows by default), then trains every
recipe of :data:`RECIPES` with every seed, each in a fresh process running ``coretrain
train`` (the real job, its default validation split), and records each run's
``metrics.json``: the test RMSE of the exported model, its validation RMSE and step, the
linear baseline and the mean predictor, the training loop's time and the run's wall time.

Equal steps: every recipe runs ``--steps`` steps. Equal wall time (``--equal-time``): each
recipe then runs as many steps as fit in the training-loop seconds the seed's recipe took
for ``--steps`` (the median over its seeds), at that recipe's own measured rate.

Runs are appended to ``--results`` (JSON lines) as they finish and skipped when already
there, so the sweep can be run in parts (``--sets``, ``--recipes``) and resumed;
``--report`` prints the table (mean, standard deviation and coefficient of variation over
the seeds) from that file alone. Not in CI: at 1,000 steps a run takes about a minute on
2 vCPUs (docs/quality.md has the table and the machine).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

SEED_RECIPE = (
    "--optimizer sgd --learning-rate 0.1 --momentum 0.8 --lr-schedule exponential "
    "--lr-decay 0.8 --lr-decay-steps 200 --keep-prob 0.5"
)
#: name → the train options that make the recipe (the rest are the job's defaults). Names:
#: optimizer, schedule (cos = cosine), peak learning rate; no dropout unless "keep".
RECIPES: dict[str, list[str]] = {
    name: options.split()
    for name, options in {
        "seed": SEED_RECIPE,
        "seed-nodrop": SEED_RECIPE.replace("--keep-prob 0.5", "--keep-prob 1.0"),
        "sgd-cos-m0.9": "--optimizer sgd --learning-rate 0.1 --momentum 0.9 "
        "--lr-schedule cosine --keep-prob 1.0",
        "adam-cos-1e-3": "--optimizer adam --learning-rate 1e-3 --lr-schedule cosine "
        "--keep-prob 1.0",
        "adam-cos-3e-3": "--optimizer adam --learning-rate 3e-3 --lr-schedule cosine "
        "--keep-prob 1.0",
        "adam-cos-1e-2": "--optimizer adam --learning-rate 1e-2 --lr-schedule cosine "
        "--keep-prob 1.0",
        "adam-cos-5e-3": "--optimizer adam --learning-rate 5e-3 --lr-schedule cosine "
        "--keep-prob 1.0",
        "adam-cos-2e-3": "--optimizer adam --learning-rate 2e-3 --lr-schedule cosine "
        "--keep-prob 1.0",
        "adam-cos-3e-3-warm100": "--optimizer adam --learning-rate 3e-3 --lr-schedule cosine "
        "--lr-warmup-steps 100 --keep-prob 1.0",
        "adam-cos-5e-3-warm100": "--optimizer adam --learning-rate 5e-3 --lr-schedule cosine "
        "--lr-warmup-steps 100 --keep-prob 1.0",
        "adam-cos-1e-2-warm100": "--optimizer adam --learning-rate 1e-2 --lr-schedule cosine "
        "--lr-warmup-steps 100 --keep-prob 1.0",
        "adam-cos-3e-3-keep0.8": "--optimizer adam --learning-rate 3e-3 --lr-schedule cosine "
        "--keep-prob 0.8",
        "adamw-cos-3e-3": "--optimizer adamw --learning-rate 3e-3 --lr-schedule cosine "
        "--weight-decay 0.004 --keep-prob 1.0",
        "default": "",
        # The validation rows evaluated every --eval-every steps: all of them against fixed
        # samples of a quarter and an eighth (docs/quality.md, "Evaluating a sample").
        "default-eval-all": "--eval-rows 0",
        "default-eval1000": "--eval-rows 1000",
        "default-eval500": "--eval-rows 500",
    }.items()
}
SETS = ("demo", "lines")
#: Every run computes alike (the formulation otherwise chosen by timing, which load moves);
#: the precision is the sweep's (--precision).
FIXED = ["--formulation", "fast"]
#: bfloat16 passes parity when its mean test RMSE over the seeds is at most float32's worst
#: seed: within float32's seed spread, or better.
PARITY_RULE = "bfloat16 mean ≤ float32's largest seed RMSE"


def log(message: str) -> None:
    print(f"[quality {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def coretrain(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, cwd=REPO
    )


def generated(
    data: Path, kind: str, train: int, test: int, seed: int, say: Callable[[str], None] = log
) -> Path:
    """``coretrain generate --kind KIND`` into ``data`` unless it is already there."""
    if not (data / "test_labels.txt").exists():
        say(f"generating {kind}: {train} + {test} rows into {data}")
        proc = coretrain([
            "generate", "--out", str(data), "--kind", kind, "--train", str(train),
            "--test", str(test), "--seed", str(seed),
        ])  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"generate failed: {proc.stderr.strip()[-500:]}")
    return data


def data_set(work: Path, kind: str, train: int, test: int) -> Path:
    """The generated set (made once: seed 100 for its rows, apart from the runs' seeds)."""
    return generated(work / f"{kind}-{train}-{test}", kind, train, test, seed=100)


def train(
    work: Path, data: Path, recipe: str, seed: int, steps: int, precision: str
) -> dict[str, Any]:
    """One ``coretrain train`` run; its metrics (or the error)."""
    out = work / "runs" / f"{data.name}-{recipe}-{seed}-{steps}-{precision}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    t0 = time.perf_counter()
    proc = coretrain([
        "train", "--data", str(data), "--output", str(out), "--cache-dir", str(work / "cache"),
        "--max-steps", str(steps), "--seed", str(seed), "--target-loss", "0",
        "--eval-every", "100", "--checkpoint-every", str(steps), *FIXED,
        "--precision", precision, *RECIPES[recipe],
    ])  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-500:], "exit": proc.returncode}
    m = json.loads((out / "metrics.json").read_text())
    loop_s = m["steps_trained"] * m.get("global_batch_size", 1000) / max(m["examples_per_sec"], 1)
    subprocess.run(["rm", "-rf", str(out)], check=True)
    return {
        "test_rmse": m["test_rmse"],
        "val_rmse": m["val_rmse"],
        "exported_step": m["exported_step"],
        "baseline_rmse": m["baseline_rmse"],
        "linear_rmse": m["linear_rmse"],
        "linear_seconds": (m.get("linear") or {}).get("seconds"),
        "examples_per_sec": m["examples_per_sec"],
        "loop_seconds": round(loop_s, 2),
        "wall_seconds": round(wall, 2),
        "precision": m["precision"],
        "formulation": m["formulation"],
    }


def _done(results: Path) -> list[dict[str, Any]]:
    if not results.exists():
        return []
    lines = results.read_text().splitlines()
    return [{"precision": "float32", **json.loads(line)} for line in lines if line.strip()]


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def sweep(args: argparse.Namespace) -> None:
    """Every (set, recipe, seed) at equal steps, then (``--equal-time``) at equal time."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results = Path(args.results)
    for kind in args.sets:
        data = data_set(work, kind, args.train, args.test)
        plans = [(r, s, args.steps, "steps") for r in args.recipes for s in args.seeds]
        if args.equal_time:
            plans += [(r, s, _equal_steps(results, kind, r, args), "time")
                      for r in args.recipes for s in args.seeds]  # fmt: skip
        for recipe, seed, steps, mode in plans:
            key = {"set": kind, "train": args.train, "recipe": recipe, "seed": seed,
                   "steps": steps, "mode": mode, "precision": args.precision}  # fmt: skip
            if any(all(r.get(k) == v for k, v in key.items()) for r in _done(results)):
                continue
            log(f"{kind}: {recipe}, seed {seed}, {steps} steps ({mode})")
            row = {**key, **train(work, data, recipe, seed, steps, args.precision), "cpu": _cpu()}
            log(f"  → {json.dumps({k: row.get(k) for k in ('test_rmse', 'loop_seconds')})}")
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")


def _equal_steps(results: Path, kind: str, recipe: str, args: argparse.Namespace) -> int:
    """Steps of ``recipe`` that fit in the seed recipe's median training-loop time."""

    def loop(name: str) -> list[dict[str, Any]]:
        key = {"set": kind, "recipe": name, "mode": "steps", "steps": args.steps}
        done = [r for r in _done(results) if "loop_seconds" in r]
        return [r for r in done if all(r.get(k) == v for k, v in key.items())]

    seed_runs, own = loop("seed"), loop(recipe)
    if not seed_runs or not own:
        raise SystemExit(f"--equal-time needs the equal-steps runs of 'seed' and {recipe!r}")
    budget = statistics.median(r["loop_seconds"] for r in seed_runs)
    rate = statistics.median(r["steps"] / r["loop_seconds"] for r in own)
    return max(1, round(budget * rate))


def report(results: Path) -> str:
    """The markdown table of ``results``: per set, mode and recipe over its seeds."""
    rows = [r for r in _done(results) if "test_rmse" in r]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        name = r["recipe"] + ("" if r["precision"] == "float32" else f" ({r['precision']})")
        groups.setdefault((r["set"], r["train"], r["mode"], name), []).append(r)
    lines = ["| set | mode | recipe | steps | seeds | test RMSE mean | sd | CV | "
             "/ seed's | linear | mean predictor | loop s | wall s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for (kind, n, mode, recipe), runs in sorted(groups.items()):
        t = [r["test_rmse"] for r in runs]
        mean, sd = statistics.mean(t), statistics.stdev(t) if len(t) > 1 else 0.0
        seed_runs = groups.get((kind, n, mode, "seed"), [])
        vs = mean / statistics.mean(r["test_rmse"] for r in seed_runs) if seed_runs else None
        lines.append(
            f"| {kind} {n:,} | {mode} | {recipe} | {statistics.median(r['steps'] for r in runs)} "
            f"| {len(t)} | {mean:.4f} | {sd:.4f} | {sd / mean:.1%} | "
            f"{'' if vs is None else f'{vs:.2f}'} | {runs[0]['linear_rmse']:.4f} | "
            f"{runs[0]['baseline_rmse']:.4f} | "
            f"{statistics.median(r['loop_seconds'] for r in runs):.1f} | "
            f"{statistics.median(r['wall_seconds'] for r in runs):.1f} |"
        )
    cpus = sorted({r.get("cpu", "") for r in rows})
    return "\n".join([*lines, "", *_parity(groups), "", f"CPU: {', '.join(cpus)}"])


def _parity(groups: dict[tuple, list[dict[str, Any]]]) -> list[str]:
    """bfloat16 against float32 for every (set, mode, recipe) measured in both."""
    lines = [f"Parity ({PARITY_RULE}):", "",
             "| set | mode | recipe | float32 mean | float32 min..max | bfloat16 mean | "
             "bfloat16 / float32 | rate bf16 / f32 | passes |",
             "|---|---|---|---:|---|---:|---:|---:|---|"]  # fmt: skip
    for (kind, n, mode, name), bf16 in sorted(groups.items()):
        if not name.endswith(" (bfloat16)"):
            continue
        f32 = groups.get((kind, n, mode, name.removesuffix(" (bfloat16)")), [])
        if not f32:
            continue
        a = [r["test_rmse"] for r in f32]
        b = statistics.mean(r["test_rmse"] for r in bf16)
        rate = statistics.median(r["examples_per_sec"] for r in bf16) / statistics.median(
            r["examples_per_sec"] for r in f32
        )
        lines.append(
            f"| {kind} {n:,} | {mode} | {name.removesuffix(' (bfloat16)')} | "
            f"{statistics.mean(a):.4f} | {min(a):.4f}..{max(a):.4f} | {b:.4f} | "
            f"{b / statistics.mean(a):.3f} | {rate:.2f} | {'yes' if b <= max(a) else 'no'} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="/tmp/coretrain-quality", help="data, cache, runs")
    p.add_argument("--results", default="quality-results.jsonl", help="JSON lines, appended")
    p.add_argument("--sets", type=lambda s: s.split(","), default=list(SETS))
    p.add_argument("--recipes", type=lambda s: s.split(","), default=list(RECIPES))
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--train", type=int, default=40_000)
    p.add_argument("--test", type=int, default=4_000)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--equal-time", action="store_true", help="also run at equal wall time")
    p.add_argument("--precision", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--report", action="store_true", help="only print the table")
    args = p.parse_args(argv)
    unknown = [r for r in args.recipes if r not in RECIPES]
    if unknown:
        p.error(f"unknown recipes {unknown}; known: {list(RECIPES)}")
    if not args.report:
        sweep(args)
    print(report(Path(args.results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
