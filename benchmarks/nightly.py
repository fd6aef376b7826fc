"""Nightly retraining, simulated: N nights of growing data into one publish directory.

``python -m benchmarks.nightly`` generates a pool of ``lines`` data (15 outputs: ``coretrain
generate --kind lines``) and runs ``coretrain train`` once a night, as the CronJob does:
a fresh output directory, the same ``--publish-dir``, default options and ``--max-steps``
(600). Night i trains on the first ``first × (1 + i/5)`` rows of the pool (the training set
grows by a fifth of the first night's each night: 20,000 → 36,000 by default) and the test
set stays the same. After the nights, a deliberately bad candidate (``--bad-steps``, 30
steps on the last night's data) must be refused with exit 7.

Prints one row per night: the exit code, the candidate's and the champion's test RMSE on
the same rows, their relative difference and its bootstrap interval, the decision and the
version published (docs/deploy.md, "Nightly retraining", has the table). The JSON report
goes to ``--out``. Not in CI (10–15 minutes on 2 vCPUs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.quality import coretrain, generated


def log(message: str) -> None:
    print(f"[nightly {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pool(work: Path, rows: int, test: int, seed: int) -> Path:
    """The generated pool: ``rows`` training lines (nights take a prefix) and the test set."""
    return generated(work / f"pool-{rows}-{test}-{seed}", "lines", rows, test, seed, log)


def night_data(work: Path, source: Path, rows: int) -> Path:
    """A data directory with the first ``rows`` training lines of ``source`` and its test
    set (what has landed by that night)."""
    data = work / f"night-data-{rows}"
    if not (data / "test_labels.txt").exists():
        data.mkdir(parents=True, exist_ok=True)
        for role in ("train_features", "train_labels"):
            with (source / f"{role}.txt").open("rb") as src, (data / f"{role}.txt").open("wb") as f:
                for _, line in zip(range(rows), src, strict=False):
                    f.write(line)
        for role in ("test_features", "test_labels"):
            (data / f"{role}.txt").write_bytes((source / f"{role}.txt").read_bytes())
    return data


def run_night(work: Path, data: Path, models: Path, name: str, steps: int) -> dict[str, Any]:
    """One night's ``coretrain train`` with ``--publish-dir``; its exit code and decision."""
    out = work / "runs" / name
    subprocess.run(["rm", "-rf", str(out)], check=True)
    t0 = time.perf_counter()
    proc = coretrain([
        "train", "--data", str(data), "--output", str(out), "--publish-dir", str(models),
        "--max-steps", str(steps),
    ])  # fmt: skip
    row: dict[str, Any] = {"night": name, "steps": steps, "exit": proc.returncode,
                           "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    metrics_file = out / "metrics.json"
    if metrics_file.exists():
        m = json.loads(metrics_file.read_text())
        row.update(test_rmse=m["test_rmse"], val_rmse=m.get("val_rmse"),
                   linear_rmse=m.get("linear_rmse"), precision=m.get("precision"),
                   publish=m.get("publish"))  # fmt: skip
    else:
        row["stderr"] = proc.stderr.strip()[-500:]
    return row


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| night | train rows | steps | exit | test RMSE | champion | difference | "
             "95 % interval | published |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]  # fmt: skip
    for r in rows:
        gate = r.get("publish") or {}
        span = gate.get("interval")
        champ, diff, version = (gate.get(k) for k in ("champion_rmse", "difference",
                                                        "champion_version"))  # fmt: skip
        lines.append(
            f"| {r['night']} | {r['rows']:,} | {r['steps']} | {r['exit']} | "
            f"{r.get('test_rmse', float('nan')):.4f} | "
            f"{'—' if champ is None else f'{champ:.4f} (v{version})'} | "
            f"{'—' if diff is None else f'{diff:+.1%}'} | "
            f"{'—' if not span else f'{span[0]:+.1%} … {span[1]:+.1%}'} | "
            f"{'version ' + str(gate['version']) if gate.get('published') else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="/tmp/coretrain-nightly")
    p.add_argument("--nights", type=int, default=5)
    p.add_argument("--first", type=int, default=20_000, help="training rows of night 0")
    p.add_argument("--test", type=int, default=4_000)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--bad-steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=200, help="the generated pool's seed")
    p.add_argument("--out", default="nightly-report.json")
    args = p.parse_args(argv)
    work = Path(args.work)
    models = work / "models"
    subprocess.run(["rm", "-rf", str(models), str(work / "runs")], check=True)
    models.mkdir(parents=True)  # TF Serving's base path: it exists before the first night
    sizes = [args.first + args.first * i // 5 for i in range(args.nights)]
    source = pool(work, sizes[-1], args.test, args.seed)
    rows = []
    for i, size in enumerate(sizes):
        log(f"night {i}: {size} training rows, {args.steps} steps")
        row = {"rows": size, **run_night(work, night_data(work, source, size), models,
                                         f"night {i}", args.steps)}  # fmt: skip
        log(f"  exit {row['exit']}: {(row.get('publish') or {}).get('reason')}")
        rows.append(row)
    log(f"a bad candidate: {args.bad_steps} steps on {sizes[-1]} rows")
    bad = {"rows": sizes[-1], **run_night(work, night_data(work, source, sizes[-1]), models,
                                          "bad candidate", args.bad_steps)}  # fmt: skip
    rows.append(bad)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    print(_table(rows))
    good = rows[:-1]
    print(f"\nnights exit 0: {sum(r['exit'] == 0 for r in good)} of {len(good)}; "
          f"published: {sum(bool((r.get('publish') or {}).get('published')) for r in good)}; "
          f"bad candidate exit {bad['exit']} (7 expected)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
