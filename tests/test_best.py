"""The best validated step (app/training/state/best.py): kept, resumed, restored for the export.

TensorFlow runs in a subprocess (its settings are process-global): the script offers
steps with chosen validation RMSEs and prints what Best kept and restored.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

SCRIPT = r"""
import json, sys
import numpy as np
from app import model as model_lib
from app.atomic import open_dir
from app.training.loop import replicas
from app.training.state.best import Best

directory = sys.argv[1]
model = model_lib.build_model(3, height=20, width=195, seed=0)
reps = replicas.create(None)

def set_weights(value):
    for v in model.variables:
        v.assign(np.full(v.shape, value, np.float32))

def weight():
    return float(model.variables[0].numpy().ravel()[0])

out = {}
with open_dir(__import__("pathlib").Path(directory)) as held:
    best = Best(model, held, reps)
    best.resume(0)
    for step, value, rmse in [(3, 3.0, 0.5), (6, 6.0, 0.2), (9, 9.0, 0.4)]:
        set_weights(value)
        out[f"kept_{step}"] = best.offer(step, rmse)
    out["files"] = sorted(held.names())
    set_weights(12.0)  # the last step's weights, worse than step 6's
    out["restored"] = best.restore()
    out["weight"] = weight()
    for start in (9, 5):
        again = Best(model, held, reps)
        again.resume(start)
        out[f"resumed_from_{start}"] = [again.step, again.rmse, sorted(held.names())]
print(json.dumps(out))
"""


def _run(directory: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(directory)],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_best_step_is_kept_and_its_weights_restored_not_the_last(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert (out["kept_3"], out["kept_6"], out["kept_9"]) == (True, True, False)
    assert out["files"] == ["best-6.data-00000-of-00001", "best-6.index"]  # older removed
    assert out["restored"] == 6
    assert out["weight"] == 6.0  # step 6's weights, not the last step's (12)
    step, rmse, _ = out["resumed_from_9"]
    assert (step, rmse) == (6, 0.2)
    # Resumed from before step 6 (a fallback to an older checkpoint): step 6 is trained
    # again, so its file goes and nothing is taken up.
    assert out["resumed_from_5"] == [None, float("inf"), []]
