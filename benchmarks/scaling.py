"""``python -m benchmarks.scaling``: the scaling benchmark of ``coretrain bench-scaling``.

The measurement itself lives in app/bench/step_scaling.py, so that the image can run it on a
user's node (``docker run … coretrain bench-scaling``); this wrapper writes the report
to ``bench-output/scaling.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app.bench import step_scaling as scaling
from app.commands.bench_scaling import table

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-threads", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--out", type=Path, default=REPO / "bench-output" / "scaling.json")
    args = p.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(table(scaling.run(args.max_threads, args.batch_size, args.out)))
