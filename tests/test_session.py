"""The session's training input: the batches come from the training rows only.

The validation rows (app/data/split.py) choose the exported step and the target loss: a
run whose batches also held them would report a validation RMSE on rows it trained on.
tf.data and TensorFlow's thread pools are process-global: the input runs in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = textwrap.dedent(
    """
    import json, sys, types
    from pathlib import Path
    import numpy as np
    import tensorflow as tf
    from app.config import TrainConfig
    from app.data import split, stream
    from app.training import session
    from app.training.inputs.load import Inputs
    from tests.conftest import prepare_cache

    data, tmp, limit = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    config = TrainConfig.of(data_dir=data, output_dir=tmp / "out", cache_dir=tmp / "cache",
                         batch_size=40, max_steps=12, validation_fraction=0.25, seed=3)
    c = prepare_cache(config)
    rows = split.split(c.train_size, config.data.validation_fraction, config.recipe.seed)
    inputs = Inputs(c, rows, None)
    plan = types.SimpleNamespace(memory_limit=limit, tfdata_threads=1)
    reps = types.SimpleNamespace(count=1, index=0)
    given = session._train_input(config, plan, inputs, reps, None, 0)
    if given.resident is not None:
        labels = [tf.gather(given.resident.labels, i).numpy() for i in given.dataset]
    else:
        labels = [y.numpy() for _, y in given.dataset]
    seen = np.concatenate(labels)
    raw = np.asarray(c.labels("train"))
    # each generated label row is unique: the row ids the batches came from
    match = (seen[:, None, :] == raw[None, :, :]).all(axis=2)
    ids = sorted({int(i) for i in np.flatnonzero(match.any(axis=0))})
    print(json.dumps({
        "resident": given.resident is not None,
        "unmatched": int((~match.any(axis=1)).sum()),
        "ids": ids,
        "train": rows.train.tolist(),
        "validation": rows.validation.tolist(),
    }))
    """
)


@pytest.mark.parametrize(
    ("memory_limit", "resident"), [(1, False), (None, None)], ids=["streamed", "measured"]
)
def test_training_input_holds_only_the_training_rows(
    tiny_data: Path, tmp_path: Path, memory_limit: int | None, resident: bool | None
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_data), str(tmp_path), json.dumps(memory_limit)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if resident is not None:
        assert got["resident"] is resident
    assert got["unmatched"] == 0
    assert len(got["validation"]) == 60  # a quarter of the 240 training rows held out
    # 12 steps of 40 rows: every one of the 180 training rows, none of the validation rows
    assert got["ids"] == got["train"]
    assert not set(got["ids"]) & set(got["validation"])
