"""``coretrain predict`` end to end on a small exported model (no training): an array picked
out of a .npz and an HDF5 file by ``--array`` (as train picks one), and ``--out`` by the
output rule (app/output.py): a symlink kept, a FIFO's reader fed and never replaced,
``/dev/stdout`` without the log in it, SIGTERM while waiting for a reader."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import PINNED, events, json_lines, run_cli

keras = pytest.importorskip("keras")
h5py = pytest.importorskip("h5py")

REPO = Path(__file__).parents[1]
WIDTH, ROWS = 3900, 9


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A SavedModel (n, 3900) → (n, 3) of known weights, and a .npz and an HDF5 file that
    hold ``features`` (other rows) beside ``test_features``."""
    root = tmp_path_factory.mktemp("predict")
    rng = np.random.default_rng(7)
    kernel = rng.normal(0, 0.01, (WIDTH, 3)).astype(np.float32)
    inputs = keras.Input((WIDTH,), name="features")
    model = keras.Model(inputs, keras.layers.Dense(3, name="out")(inputs))
    model.layers[-1].set_weights([kernel, np.zeros(3, np.float32)])
    model.export(str(root / "model" / "saved_model"), format="tf_saved_model", verbose=False)
    test = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    other = rng.normal(size=(4, WIDTH)).astype(np.float32)
    np.savez(root / "d.npz", features=other, test_features=test)
    with h5py.File(root / "d.h5", "w") as f:
        f["features"] = other
        f["splits/test_features"] = test
    return {"root": root, "model": root / "model", "expected": test @ kernel}


def _predict(served: dict, features: Path, out: Path | str, *more: str):
    return run_cli(
        "predict", "--model", str(served["model"]), "--features", str(features),
        "--out", str(out), *more,
    )  # fmt: skip


def test_predict_reads_test_features_out_of_a_npz_and_an_hdf5_file(
    served: dict, tmp_path: Path
) -> None:
    """Both files also hold ``features`` (read by default): ``--array test_features`` picks
    the other array (in an HDF5 group too). The .npz's predictions go through a symlink
    (kept, its target replaced); the HDF5 file's to a FIFO named .npy, whose reader gets
    the whole array (header and rows) and which stays a FIFO."""
    target = tmp_path / "target.txt"
    target.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    proc = _predict(served, served["root"] / "d.npz", link, "--array", "test_features")
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and events(json_lines(proc.stdout), "predicted")[0]["rows"] == ROWS
    np.testing.assert_allclose(np.loadtxt(target), served["expected"], rtol=1e-5, atol=1e-5)
    fifo = tmp_path / "pred.npy"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    proc = _predict(served, served["root"] / "d.h5", fifo, "--array", "test_features")
    reader.join(timeout=120)
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "copy.npy").write_bytes(got[0])
    predicted = np.load(tmp_path / "copy.npy")
    np.testing.assert_allclose(predicted, served["expected"], rtol=1e-5, atol=1e-5)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_predictions_to_stdout_leave_the_log_on_stderr(served: dict) -> None:
    proc = _predict(served, served["root"] / "d.npz", "/dev/stdout", "--array", "test_features")
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(
        np.loadtxt(proc.stdout.splitlines()), served["expected"], rtol=1e-5, atol=1e-5
    )
    assert events(json_lines(proc.stderr), "predicted")[0]["out"] == "/dev/stdout"


def test_sigterm_while_predict_waits_for_a_fifos_reader_is_143(
    served: dict, tmp_path: Path
) -> None:
    fifo = tmp_path / "nobody.fifo"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORETRAIN_", "TF_NUM"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "predict", "--model", str(served["model"]),
         "--features", str(served["root"] / "d.npz"), "--out", str(fifo)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={**env, **PINNED},
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            if json.loads(line).get("event") == "output_waiting":
                break
        else:
            raise AssertionError(f"exit {proc.wait()} before waiting: {proc.stderr.read()}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 143
        assert proc.stderr.read().splitlines()[-1] == (
            f"coretrain: {fifo}: stopped by signal while waiting for its reader"
        )
    finally:
        proc.kill()
        proc.wait()
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_an_out_ending_in_a_slash_is_a_directory_not_the_file(served: dict, tmp_path: Path) -> None:
    """``--out exist.txt/`` (or a missing ``new.npy/``, from its variable) names a directory,
    as a shell's ``>`` takes it: exit 2 in one line, the file untouched, nothing made."""
    exist = tmp_path / "exist.txt"
    exist.write_bytes(b"kept\n")
    proc = _predict(served, served["root"] / "d.npz", f"{exist}/")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1].endswith(
        f"{exist}/: --out names a directory (ends in /): name a file (see coretrain predict --help)"
    )
    new = f"{tmp_path}/new.npy/"
    proc = run_cli("predict", "--model", str(served["model"]), "--features",
                   str(served["root"] / "d.npz"), env={"CORETRAIN_PREDICT_OUT": new})  # fmt: skip
    assert proc.returncode == 2 and f"{new}: --out names a directory" in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["exist.txt"]
    assert exist.read_bytes() == b"kept\n"
