"""Memory and start-up as the data grow: peak RSS and time to the first step, per size.

``python -m benchmarks.memory_scale [--sizes 20000,200000]`` generates each data set once
(``coretrain generate``; 200,000 training samples are ~8.7 GB of text, kept in
``--work``), converts it, then runs ``coretrain train`` in a fresh process and reports:

* the process's peak RSS (``ru_maxrss`` of the child, via ``wait4``) next to the size of
  the training split (float32 features + labels) and the target: split × 1.2 + 1 GB;
* whether the split was held in memory or streamed, and why (the ``input`` event);
* the seconds from ``start`` (and from ``input``) to the first step's ``progress``
  (start-up), the load time of a resident split, and the steady rate of later windows.

The binary cache of each size is kept in ``--work`` too, so a rerun measures start-up
without the conversion.

A run of ``--steps`` steps (default 200, batch 1000) is long enough for holding the
split in memory to pay at these sizes (app/data/input/pipeline.py ``choose_input``); pass
``--steps 20`` to see it streamed. Prints a table on stderr and the JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GB = 1 << 30


def log(message: str) -> None:
    print(f"[memory {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _stamp(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["timestamp"]).timestamp()


def measure(data: Path, out: Path, cache: Path, steps: int, batch: int) -> dict[str, Any]:
    args = [sys.executable, "-m", "app", "train", "--data", str(data), "--output", str(out)]
    args += ["--cache-dir", str(cache)]
    args += ["--max-steps", str(steps), "--batch-size", str(batch)]
    args += ["--eval-every", str(max(steps // 4, 1)), "--checkpoint-every", str(steps)]
    args += ["--target-loss", "0", "--formulation", "fast", "--precision", "float32"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    records = [json.loads(line) for line in proc.stdout]
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    ev = {r["event"]: r for r in reversed(records)}  # the first of each event
    progress = [r for r in records if r["event"] == "progress"]
    start = _stamp(ev["start"]) if "start" in ev else None
    result: dict[str, Any] = {
        "exit": os.waitstatus_to_exitcode(status),
        "peak_rss_gb": round(usage.ru_maxrss * 1024 / GB, 2),
        "resident": ev.get("input", {}).get("resident"),
        "input": ev.get("input", {}).get("message"),
        "split_gb": round(ev.get("input", {}).get("split_bytes", 0) / GB, 2),
    }
    if start and "input_loaded" in ev:
        result["load_s"] = ev["input_loaded"]["seconds"]
    if start and progress:
        result["start_to_first_progress_s"] = round(_stamp(progress[0]) - start, 1)
        if "input" in ev:
            result["input_to_first_progress_s"] = round(
                _stamp(progress[0]) - _stamp(ev["input"]), 1
            )
        rates = [p["examples_per_sec"] for p in progress[1:]]
        result["steady_samples_per_s"] = round(sum(rates) / len(rates), 1) if rates else None
    if result["exit"] != 0:
        result["stderr"] = err[-500:]
    result["target_gb"] = round(result["split_gb"] * 1.2 + 1.0, 2)
    result["within_target"] = result["peak_rss_gb"] <= result["target_gb"]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="20000,200000")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--work", type=Path, default=REPO / "bench-output" / "memory")
    args = p.parse_args(argv)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        data = args.work / f"data-{size}"
        if not (data / "test_labels.txt").is_file():
            log(f"generating {size} training samples into {data} ...")
            subprocess.run(
                [sys.executable, "-m", "app", "generate", "--out", str(data), "--train",
                 str(size), "--test", str(max(size // 10, 100))],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        out = args.work / f"out-{size}"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        log(f"{size} samples: training {args.steps} steps ...")
        cache = args.work / f"cache-{size}"  # converted once, reused by later runs
        row = {"train_samples": size, **measure(data, out, cache, args.steps, args.batch_size)}
        rows.append(row)
        log(json.dumps(row))
    print(json.dumps({"steps": args.steps, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
