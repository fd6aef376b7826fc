"""``coretrain train`` (app/commands/train.py): end to end, the real CLI trains a tiny data
set, checkpoints, resumes and exports; and the one place an outcome becomes an exit."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TINY_TRAIN_ARGS, events, json_lines, run_cli


def train_tiny(data: Path, out: Path, steps: int, *extra: str) -> subprocess.CompletedProcess[str]:
    """``coretrain train`` of ``data`` into ``out`` for ``steps`` steps, tiny settings."""
    return run_cli(
        "train", "--data", str(data), "--output", str(out), "--max-steps", str(steps),
        *TINY_TRAIN_ARGS, *extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def first_run(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("run") / "output"
    proc = train_tiny(tiny_data, out, 6)
    return out, proc


@pytest.mark.slow
def test_train_writes_json_logs_checkpoints_export_and_metrics(first_run) -> None:
    out, proc = first_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json_lines(proc.stdout)  # every stdout line is JSON
    for r in records:
        assert {"timestamp", "level", "event", "message"} <= r.keys()
    assert max(len(line) for line in proc.stdout.splitlines()) < 2000  # lean events
    start = events(records, "start")[0]
    assert start["plan"]["intra_op_threads"] >= 1
    assert start["config"]["max_steps"] == 6
    # The whole plan, with the files it was decided from, is written once beside the log.
    assert start["plan_file"] == str(out / "logs" / "plan.json")
    whole = json.loads((out / "logs" / "plan.json").read_text())
    assert "/proc/cpuinfo" in whole["inputs"] and whole["reasons"]
    assert "inputs" not in start["plan"] and "reasons" not in start["plan"]
    assert whole["intra_op_threads"] == start["plan"]["intra_op_threads"]
    assert [p["step"] for p in events(records, "progress")] == [3, 6]
    for p in events(records, "progress"):
        assert {"loss", "val_rmse", "lr", "examples_per_sec", "cpu_util", "eta_s"} <= p.keys()
    assert [c["step"] for c in events(records, "checkpoint")] == [3, 6]
    (inp,) = events(records, "input")  # held or streamed, by the measured costs
    assert inp["training_rows"] == 216  # 240 less the validation split's 10 %
    assert isinstance(inp["resident"], bool) and inp["split_bytes"] == 4 * 216 * (20 * 195 + 3)
    assert "loading 216 rows" in inp["message"] and "streaming 6 batches" in inp["message"]
    end = events(records, "end")[-1]
    assert end["status"] == "completed" and end["final_step"] == 6
    assert "plan" not in end and np.isfinite(end["test_rmse"])  # results, not the plan again
    assert (out / "checkpoints" / "ckpt-6.index").is_file()
    assert (out / "model" / "model.keras").is_file()
    assert (out / "model" / "saved_model" / "saved_model.pb").is_file()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["final_step"] == 6 and metrics["status"] == "completed"
    assert metrics["baseline_rmse"] > 0 and np.isfinite(metrics["test_rmse"])
    assert metrics["examples_per_sec"] > 0
    assert metrics["plan"]["cpu_budget"] > 0
    file_records = json_lines((out / "logs" / "train.jsonl").read_text())
    assert [r["event"] for r in file_records if r["event"] in ("start", "end")] == ["start", "end"]


@pytest.mark.slow
def test_baseline_rmse_is_the_mean_predictor(first_run, tiny_data: Path) -> None:
    out, _ = first_run
    train_y = np.loadtxt(tiny_data / "train_labels.txt", dtype=np.float64)
    test_y = np.loadtxt(tiny_data / "test_labels.txt", dtype=np.float64)
    expected = np.sqrt(np.mean(np.square(test_y - train_y.mean(axis=0))))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["baseline_rmse"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_export_takes_raw_lines_and_predicts_n_by_k(first_run, tiny_data: Path) -> None:
    out, _ = first_run
    script = f"""
import numpy as np, keras, tensorflow as tf
import app.model
x = np.loadtxt({str(tiny_data / "test_features.txt")!r}, dtype=np.float32)[:7]
m = keras.models.load_model({str(out / "model" / "model.keras")!r})
a = m.predict(x, verbose=0)
sm = tf.saved_model.load({str(out / "model" / "saved_model")!r})
b = sm.serve(tf.constant(x)).numpy()
print(a.shape, b.shape, float(np.max(np.abs(a - b))))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("(7, 3) (7, 3) ")
    assert float(line.split()[-1]) < 1e-4


@pytest.mark.slow
def test_rerun_resumes_from_saved_step_and_reuses_cache(first_run, tiny_data: Path) -> None:
    out, _ = first_run
    proc = train_tiny(tiny_data, out, 9)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json_lines(proc.stdout)
    assert events(records, "resume")[0]["step"] == 6
    assert events(records, "cache")[0]["reused"] is True
    assert [p["step"] for p in events(records, "progress")] == [9]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["start_step"] == 6 and metrics["final_step"] == 9


@pytest.mark.slow
def test_env_variables_set_options(tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli(
        "train",
        *TINY_TRAIN_ARGS,
        env={
            "CORETRAIN_DATA": str(tiny_data),
            "CORETRAIN_OUTPUT": str(out),
            "CORETRAIN_MAX_STEPS": "2",
            "CORETRAIN_EVAL_EVERY": "1",
            "CORETRAIN_INTRA_OP_THREADS": "1",
        },
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json_lines(proc.stdout)
    start = events(records, "start")[0]
    assert start["config"]["max_steps"] == 2
    assert start["plan"]["intra_op_threads"] == 1
    assert events(records, "end")[-1]["final_step"] == 2


def _fmt(values: np.ndarray, i: int) -> str:
    styles = ["{:.6e}", "{:.5f}", "{:g}", "{:.3E}"]
    seps = [" ", "\t", "  ", " \t "]
    return seps[i % 4].join(styles[(i + j) % 4].format(v) for j, v in enumerate(values))


@pytest.mark.slow
def test_hand_written_seed_format_with_crlf_tabs_exponents_and_gzip(tmp_path: Path) -> None:
    """A data set not made by `coretrain generate`: CRLF, tabs, exponents, .gz, no final EOL."""
    rng = np.random.default_rng(7)
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 50), ("test", 20)):
        x = rng.normal(size=(n, 20 * 195))
        y = x[:, :4].sum(axis=1, keepdims=True) * np.array([[1.0, -2.0]])
        feats = "\r\n".join(_fmt(row, i) + " " for i, row in enumerate(x))
        labels = "\r\n".join(_fmt(row, i) for i, row in enumerate(y)) + "\r\n"
        (data / f"{split}_features.txt").write_bytes(feats.encode())
        with gzip.open(data / f"{split}_labels.txt.gz", "wt", newline="") as f:
            f.write(labels)
    out = tmp_path / "out"
    proc = run_cli(
        "train",
        "--data",
        str(data),
        "--output",
        str(out),
        "--max-steps",
        "3",
        "--batch-size",
        "10",
        "--eval-every",
        "3",
        "--train-labels",
        "train_labels.txt.gz",
        "--test-labels",
        "test_labels.txt.gz",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_size"] == 50 and metrics["test_size"] == 20
    assert metrics["final_step"] == 3


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--max-steps", "abc"], "abc"),
        (["--batch-size", "0"], "--batch-size"),
        (["--pin", "sideways"], "sideways"),
        (["--no-such-option"], "no-such-option"),
    ],
)
def test_bad_cli_input_exits_2(args: list[str], needle: str, tmp_path: Path) -> None:
    proc = run_cli("train", "--data", str(tmp_path), "--output", str(tmp_path / "o"), *args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_data_exits_3_naming_the_file(tmp_path: Path) -> None:
    proc = run_cli("train", "--data", str(tmp_path), "--output", str(tmp_path / "o"))
    assert proc.returncode == 3, proc.stderr
    assert f"{tmp_path}/train_features.txt" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("kind", ["missing", "below a file", "a symlink loop"])
def test_a_data_directory_that_does_not_exist_is_a_usage_error_writing_nothing(
    kind: str, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("1 2 3\n")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")  # a symlink to itself: ELOOP
    data = {"missing": "nowhere", "below a file": "file/data", "a symlink loop": "loop"}[kind]
    out = tmp_path / "out"
    proc = run_cli("train", "--data", str(tmp_path / data), "--output", str(out))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("coretrain: ") and f"{tmp_path / data}" in line
    assert not out.exists()  # nothing written, not even the log or the lock


def _with_nan(tiny_data: Path, tmp_path: Path, name: str, field: int) -> tuple[Path, Path]:
    """A copy of the tiny data set whose file ``name`` has NaN at ``field`` of line 5; the
    copy's directory and that file."""
    data = shutil.copytree(tiny_data, tmp_path / "data")
    path = data / name
    lines = path.read_text().splitlines(keepends=True)
    fields = lines[4].split()
    fields[field] = "nan"
    lines[4] = " ".join(fields) + "\n"
    path.write_text("".join(lines))
    return data, path


def test_allowed_nan_with_standardisation_is_a_data_error_naming_the_way_out(
    tiny_data: Path, tmp_path: Path
) -> None:
    data, path = _with_nan(tiny_data, tmp_path, "train_features.txt", field=7)
    proc = train_tiny(data, tmp_path / "a", 2, "--allow-nonfinite")
    assert proc.returncode == 3, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"coretrain: {path}: NaN/Inf values")
    assert "--no-standardize" in line
    assert "RuntimeWarning" not in proc.stdout


def test_allowed_nan_in_the_training_labels_diverges_naming_them_not_only_the_rate(
    tiny_data: Path, tmp_path: Path
) -> None:
    data, _ = _with_nan(tiny_data, tmp_path, "train_labels.txt", field=0)
    proc = train_tiny(data, tmp_path / "a", 6, "--allow-nonfinite", "--no-standardize")
    assert proc.returncode == 5, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.endswith(
        "lower --learning-rate, or remove the NaN/Inf values --allow-nonfinite let into the "
        "training data (a batch holding one has a NaN loss)"
    )


@pytest.mark.slow
def test_divergence_before_any_checkpoint_says_so(tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = train_tiny(tiny_data, out, 3, "--learning-rate", "1e30")
    assert proc.returncode == 5, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert "no checkpoint had been saved yet" in line and "lower --learning-rate" in line
    assert list(out.glob("checkpoints/ckpt-*")) == []


def _result(outcome_type: type, decision: dict | None = None) -> object:
    from app.release.gate import Decision
    from app.training.loop.outcome import Result

    publish = Decision.from_json(decision["publish"]) if decision else None
    return Result(outcome_type(0, 5, 0.1, 1.0, 2), decision or {}, publish)


def test_an_outcome_becomes_its_exit_in_one_place(tmp_path: Path) -> None:
    from app.commands.train import conclude
    from app.training.loop import outcome

    def held() -> object:
        return (tmp_path / "lock").open("w")

    done = conclude(_result(outcome.Completed), held())  # type: ignore[arg-type]
    assert (done.code, done.message) == (0, None)
    assert conclude(_result(outcome.TargetReached), held()).code == 0  # type: ignore[arg-type]
    stopped = conclude(_result(outcome.Stopped), held())  # type: ignore[arg-type]
    assert stopped.code == 143
    assert stopped.message == "stopped by signal at step 5; checkpoint saved, rerun to resume"
    refused = {"publish": {"published": False, "reason": "worse than version 2"}}
    kept_out = conclude(_result(outcome.Completed, refused), held())  # type: ignore[arg-type]
    assert (kept_out.code, kept_out.message) == (7, "model not published: worse than version 2")
    published = {"publish": {"published": True, "reason": "better"}}
    assert conclude(_result(outcome.Completed, published), held()).code == 0  # type: ignore[arg-type]


def test_a_replan_restarts_the_process_with_the_lock_and_when_it_was_noticed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app import lock
    from app.budget import apply
    from app.commands.train import conclude
    from app.training.loop import outcome

    restarts: list[tuple[dict, tuple]] = []
    monkeypatch.setattr(apply, "restart", lambda env, keep_fds: restarts.append((env, keep_fds)))
    held = (tmp_path / "lock").open("w")
    fd = held.fileno()
    replan = outcome.Replan(0, 5, 0.1, 1.0, 2, at=1234.5)
    before = time.time()
    conclude(outcome.Result(replan, {"wall_seconds": 30.0}), held)  # the real one execs
    ((env, keep),) = restarts
    started = float(env.pop(outcome.STARTED_AT_ENV))  # 30 s before: the run's first start
    assert before - 30.0 <= started <= time.time() - 30.0
    assert env == {outcome.REPLAN_AT_ENV: "1234.5", lock.HELD_FD_ENV: str(fd)}
    assert keep == (fd,)
