"""Every error path of ``coretrain train`` prints exactly one line on stderr, with oneDNN
forced on and forced off, so the contract is checked on either kind of CPU.

TensorFlow writes start-up notices to stderr when oneDNN is on (absl's pre-init warning,
"oneDNN custom operations are on"), which only some CPUs turn on by default;
``TF_ENABLE_ONEDNN_OPTS`` forces either behaviour here whatever this machine is.
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import SEED_RECIPE_ARGS, TINY_TRAIN_ARGS, run_cli

pytestmark = pytest.mark.slow

Case = Callable[[Path, Path], tuple[list[str], int, str]]


def _missing_file(data: Path, tmp: Path) -> tuple[list[str], int, str]:
    return ["--data", str(tmp / "empty"), "--output", str(tmp / "o")], 3, "missing data file"


def _bad_line(data: Path, tmp: Path) -> tuple[list[str], int, str]:
    bad = tmp / "bad"
    shutil.copytree(data, bad)
    lines = (bad / "test_labels.txt").read_text().splitlines(keepends=True)
    lines[7] = "0.5 x 0.1\n"
    (bad / "test_labels.txt").write_text("".join(lines))
    return ["--data", str(bad), "--output", str(tmp / "o")], 3, "test_labels.txt:8"


def _empty_labels(data: Path, tmp: Path) -> tuple[list[str], int, str]:
    bad = tmp / "bad"
    shutil.copytree(data, bad)
    (bad / "train_labels.txt").write_bytes(b"")
    return ["--data", str(bad), "--output", str(tmp / "o")], 3, "train_labels.txt: empty file"


def _bad_option(data: Path, tmp: Path) -> tuple[list[str], int, str]:
    args = ["--data", str(data), "--output", str(tmp / "o"), "--max-steps", "0"]
    return args, 2, "--max-steps"


def _not_writable(data: Path, tmp: Path) -> tuple[list[str], int, str]:
    (tmp / "file").write_text("in the way")
    return ["--data", str(data), "--output", str(tmp / "file" / "o")], 4, "not writable"


def _diverged(data: Path, tmp: Path) -> tuple[list[str], int, str]:
    args = ["--data", str(data), "--output", str(tmp / "o"), "--max-steps", "3"]
    return [*args, *TINY_TRAIN_ARGS, "--learning-rate", "1e30"], 5, "lower --learning-rate"


def _unreadable_checkpoints(data: Path, tmp: Path) -> tuple[list[str], int, str]:
    ckpt = tmp / "o" / "checkpoints"
    ckpt.mkdir(parents=True)
    (ckpt / "ckpt-3.index").write_bytes(b"not a checkpoint")
    (ckpt / "ckpt-3.data-00000-of-00001").write_bytes(b"")
    args = ["--data", str(data), "--output", str(tmp / "o"), "--max-steps", "6"]
    # Without run.json: checkpoints of an older coretrain, trained with the seed's recipe.
    return [*args, *TINY_TRAIN_ARGS, *SEED_RECIPE_ARGS], 4, "none of 1 checkpoints can be restored"


CASES: dict[str, Case] = {
    "missing_file": _missing_file,
    "bad_line": _bad_line,
    "empty_labels": _empty_labels,
    "bad_option": _bad_option,
    "output_not_writable": _not_writable,
    "diverged": _diverged,
    "unreadable_checkpoints": _unreadable_checkpoints,
}


@pytest.mark.parametrize("onednn", ["0", "1"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_line_on_stderr(case: str, onednn: str, tiny_data: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    args, code, needle = CASES[case](tiny_data, tmp_path)
    proc = run_cli("train", *args, env={"TF_ENABLE_ONEDNN_OPTS": onednn})
    assert proc.returncode == code, proc.stderr[-3000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith("coretrain: ") and needle in line, line


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_locked_output_is_one_line(onednn: str, tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    with open(out / ".lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = run_cli(
            "train", "--data", str(tiny_data), "--output", str(out),
            env={"TF_ENABLE_ONEDNN_OPTS": onednn},
        )  # fmt: skip
    assert proc.returncode == 75, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "another coretrain run" in line


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_a_successful_run_prints_nothing_on_stderr(
    onednn: str, tiny_data: Path, tmp_path: Path
) -> None:
    args = ["--data", str(tiny_data), "--output", str(tmp_path / "o"), "--max-steps", "2"]
    proc = run_cli("train", *args, *TINY_TRAIN_ARGS, env={"TF_ENABLE_ONEDNN_OPTS": onednn})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""


@pytest.mark.parametrize("value", ["inf", "nan", "1e309"])
@pytest.mark.parametrize("command", ["plan", "train"])
def test_a_non_finite_number_is_a_one_line_usage_error(
    command: str, value: str, tiny_data: Path, tmp_path: Path
) -> None:
    args = [] if command == "plan" else ["--data", str(tiny_data), "--output", str(tmp_path)]
    proc = run_cli(command, *args, "--cpus", value)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith("coretrain: --cpus must be a finite number, got "), line
