"""Cheap refusals first (app/training/admit/identity.py, previous.py): a resume of another
run's checkpoints is refused before the data are converted, the ridge fitted or the
formulations timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.config import TrainConfig
from app.data import synthetic
from app.training.state import identity
from tests.conftest import events, json_lines, run_cli


def _record(out: Path, precision: str = "float32", **options: object) -> None:
    """Checkpoints in ``out`` recorded as trained with ``options`` (else the defaults)."""
    ckpt = out / "checkpoints"
    ckpt.mkdir(parents=True)
    (ckpt / "ckpt-5.index").write_bytes(b"")
    config = TrainConfig.of(data_dir=out, output_dir=out, **options)  # type: ignore[arg-type]
    data = {"train": {"samples": 1, "fingerprint": "x"}, "test": {}, "outputs": 3}
    mine = identity.Identity(data, identity.options_of(config), 1)
    record = {"formulation": "fast", "precision": precision, **mine.to_json()}
    (ckpt / identity.RUN_FILE).write_text(json.dumps(record))


@pytest.mark.parametrize(
    ("recorded", "args", "says"),
    [
        ({"learning_rate": 0.05}, [], "--learning-rate 0.05 recorded"),
        ({}, ["--batch-size", "20"], "--batch-size 20 now"),
        ({}, ["--precision", "bfloat16"], "trained in float32"),
    ],
)
def test_another_run_s_checkpoints_are_refused_before_the_data_are_converted(
    tmp_path: Path, recorded: dict, args: list[str], says: str
) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    synthetic.generate(data, train=60, test=10, seed=0)
    _record(out, **recorded)
    proc = run_cli(
        "train", "--data", str(data), "--output", str(out), "--cache-dir",
        str(tmp_path / "cache"), *args, env={"CORETRAIN_PRECISION": "auto"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert says in line
    records = json_lines(proc.stdout)
    assert not events(records, "cache") and not events(records, "linear_baseline")
    assert not (tmp_path / "cache").exists()  # nothing converted, nothing kept


def test_checkpoints_past_a_lower_max_steps_are_refused_and_left_as_they_are(
    tmp_path: Path,
) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    synthetic.generate(data, train=60, test=10, seed=0)
    _record(out)  # at step 5
    before = {p.name: p.read_bytes() for p in (out / "checkpoints").iterdir()}
    proc = run_cli(
        "train", "--data", str(data), "--output", str(out), "--cache-dir",
        str(tmp_path / "cache"), "--max-steps", "4",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line == (
        f"coretrain: {out / 'checkpoints'}: this run is already at step 5, past --max-steps 4: "
        "nothing to train, and its model and records stay as they are. To train a model of 4 "
        "steps, train into a new --output; to go on, raise --max-steps"
    )
    assert {p.name: p.read_bytes() for p in (out / "checkpoints").iterdir()} == before
    assert not (tmp_path / "cache").exists()  # refused before converting
    # Another run's checkpoints past it are named as another run's, not as this one's.
    other = tmp_path / "other"
    _record(other, learning_rate=0.05)
    proc = run_cli("train", "--data", str(data), "--output", str(other), "--max-steps", "4")
    assert proc.returncode == 2 and "the checkpoints are of another run" in proc.stderr
    # At its own step it is a resume as before (refused here only for the made-up record).
    same = run_cli(
        "train", "--data", str(data), "--output", str(out), "--cache-dir",
        str(tmp_path / "cache"), "--max-steps", "5",
    )  # fmt: skip
    assert "past --max-steps" not in same.stderr


def test_the_same_options_on_other_data_are_refused_before_the_baselines(tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    synthetic.generate(data, train=60, test=10, seed=0)
    _record(out)  # the default options, but other data (fingerprint "x")
    proc = run_cli("train", "--data", str(data), "--output", str(out))
    assert proc.returncode == 2, proc.stderr
    assert "the training data" in proc.stderr.splitlines()[0]
    records = json_lines(proc.stdout)
    assert events(records, "cache") and not events(records, "linear_baseline")


def test_a_mistyped_publish_dir_is_refused_before_the_output_is_made(tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    synthetic.generate(data, train=60, test=10, seed=0)
    proc = run_cli(
        "train", "--data", str(data), "--output", str(out),
        "--publish-dir", str(tmp_path / "nope"),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"coretrain: {tmp_path / 'nope'}: the publish directory does not exist (create it, or "
        "check the path: TF Serving must read the same one)"
    )
    assert not out.exists()  # no .lock, no logs/: nothing written
