"""Accuracy parity of bfloat16 with float32: the same training, the test RMSE compared.

``python -m benchmarks.precision_parity`` trains the CNN with ``--precision float32`` and
``--precision bfloat16`` for the same steps on two generated data sets (the demo set,
``coretrain generate`` seed 0, and a second one with other seeds and sizes), for each
formulation, in fresh processes, and prints a table of the final test RMSEs (raw label
units) and the relative difference. bfloat16 passes when it is within
:data:`TOLERANCE` of float32 on every set; ``--precision auto`` measures bfloat16 as a
candidate only where the CPU computes it natively (docs/quality.md, "bfloat16", has the table).
The JSON report goes to stdout, the table to stderr.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TOLERANCE = 0.02
DATA_SETS = {
    "demo (seed 0, 3000/600)": {"seed": 0, "train": 3000, "test": 600},
    "second (seed 7, 5000/1000)": {"seed": 7, "train": 5000, "test": 1000},
}


def log(message: str) -> None:
    print(f"[parity {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, cwd=REPO
    )


def train(data: Path, out: Path, precision: str, formulation: str, steps: int) -> dict[str, Any]:
    proc = _run([
        "train", "--data", str(data), "--output", str(out), "--max-steps", str(steps),
        "--eval-every", str(steps), "--checkpoint-every", str(steps), "--target-loss", "0",
        "--precision", precision, "--formulation", formulation,
    ])  # fmt: skip
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-300:]}
    metrics = json.loads((out / "metrics.json").read_text())
    return {"test_rmse": metrics["test_rmse"], "samples_per_s": metrics["examples_per_sec"]}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--formulations", default="fast,plain")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in DATA_SETS.items():
            data = Path(tmp) / f"data-{spec['seed']}"
            gen = ["generate", "--out", str(data), "--seed", str(spec["seed"])]
            _run([*gen, "--train", str(spec["train"]), "--test", str(spec["test"])])
            for formulation in args.formulations.split(","):
                result = {}
                for precision in ("float32", "bfloat16"):
                    log(f"{name}: {formulation}, {precision}, {args.steps} steps")
                    out = Path(tmp) / f"{spec['seed']}-{formulation}-{precision}"
                    result[precision] = train(data, out, precision, formulation, args.steps)
                a = result["float32"].get("test_rmse")
                b = result["bfloat16"].get("test_rmse")
                diff = (b - a) / a if a and b else None
                rows.append({"data": name, "formulation": formulation, "steps": args.steps,
                             **{f"{k}_rmse": v.get("test_rmse") for k, v in result.items()},
                             "relative_difference": diff,
                             "within_tolerance": diff is not None and abs(diff) <= TOLERANCE,
                             "runs": result})  # fmt: skip
    for r in rows:
        log(f"{r['data']:28s} {r['formulation']:5s} float32 {r['float32_rmse']}  "
            f"bfloat16 {r['bfloat16_rmse']}  diff {r['relative_difference']}")  # fmt: skip
    passed = all(r["within_tolerance"] for r in rows)
    print(json.dumps({"tolerance": TOLERANCE, "passed": passed, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
