"""The command line (app/cli/): every error path of ``coretrain train`` prints exactly one
line on stderr, with oneDNN forced on and forced off, so the contract is checked on either
kind of CPU; and the environment variables a command reads.

TensorFlow writes start-up notices to stderr when oneDNN is on (absl's pre-init warning,
"oneDNN custom operations are on"), which only some CPUs turn on by default;
``TF_ENABLE_ONEDNN_OPTS`` forces either behaviour here whatever this machine is.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import click
import pytest

from app.errors import ConfigError
from app.options import Options, flat, from_flat, group, option, option_fields
from tests.conftest import REPO, SEED_RECIPE_ARGS, TINY_TRAIN_ARGS, run_cli

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


@pytest.mark.slow
@pytest.mark.parametrize("onednn", ["0", "1"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_line_on_stderr(case: str, onednn: str, tiny_data: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    args, code, needle = CASES[case](tiny_data, tmp_path)
    proc = run_cli("train", *args, env={"TF_ENABLE_ONEDNN_OPTS": onednn})
    assert proc.returncode == code, proc.stderr[-3000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith("coretrain: ") and needle in line, line


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("onednn", ["0", "1"])
def test_a_successful_run_prints_nothing_on_stderr(
    onednn: str, tiny_data: Path, tmp_path: Path
) -> None:
    args = ["--data", str(tiny_data), "--output", str(tmp_path / "o"), "--max-steps", "2"]
    proc = run_cli("train", *args, *TINY_TRAIN_ARGS, env={"TF_ENABLE_ONEDNN_OPTS": onednn})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""


@pytest.mark.slow
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


# Environment variables: CORETRAIN_<COMMAND>_<OPTION>, and CORETRAIN_<OPTION> where it can't
# mean another command's option (app/cli/options.py's module docstring).


def _readers() -> dict[str, set[int]]:
    """Every variable any command reads → the declarations (fields) that read it."""
    from app import cli
    from app.options import option_fields

    readers: dict[str, set[int]] = {}
    for command, classes in cli.COMMANDS.items():
        for cls in classes:
            for field in option_fields(cls):
                for name in cli.envvars(command, field):
                    readers.setdefault(name, set()).add(id(field))
    return readers


def test_no_variable_is_read_by_two_different_options() -> None:
    shared = {name: ids for name, ids in _readers().items() if len(ids) > 1}
    assert shared == {}


def test_train_reads_the_short_names_its_deployments_set_and_its_own_first() -> None:
    from app.cli import cli

    params = {p.name: p.envvar for p in cli.commands["train"].params}
    assert params["max_steps"] == ["CORETRAIN_TRAIN_MAX_STEPS", "CORETRAIN_MAX_STEPS"]
    assert params["seed"] == ["CORETRAIN_TRAIN_SEED", "CORETRAIN_SEED"]
    generate = {p.name: p.envvar for p in cli.commands["generate"].params}
    assert generate["seed"] == ["CORETRAIN_GENERATE_SEED"]  # train's CORETRAIN_SEED is not read
    assert generate["kind"] == ["CORETRAIN_GENERATE_KIND", "CORETRAIN_KIND"]  # unique: both
    plan = {p.name: p.envvar for p in cli.commands["plan"].params}
    assert plan["intra_op_threads"] == [  # one declaration shared with train: both
        "CORETRAIN_PLAN_INTRA_OP_THREADS",
        "CORETRAIN_INTRA_OP_THREADS",
    ]
    assert plan["format"] == ["CORETRAIN_PLAN_FORMAT"]  # models has --format too


def test_a_short_variable_meant_for_another_command_is_named_not_read(tmp_path: Path) -> None:
    proc = run_cli("models", str(tmp_path), env={"CORETRAIN_FORMAT": "text"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"no published versions in {tmp_path}\n"
    (line,) = proc.stderr.splitlines()
    assert "CORETRAIN_FORMAT is not read" in line and "CORETRAIN_MODELS_FORMAT" in line
    own = run_cli("models", str(tmp_path), env={"CORETRAIN_MODELS_FORMAT": "json"})
    assert (own.returncode, own.stdout, own.stderr) == (0, "[]\n", "")


def test_a_variable_of_no_option_is_named_in_one_line(tmp_path: Path) -> None:
    env = {"CORETRAIN_MAX_STPES": "3", "CORETRAIN_PLAN_FORMAT": "text"}  # a typo, plan's
    proc = run_cli("models", str(tmp_path), env=env)
    assert proc.returncode == 0
    (line,) = proc.stderr.splitlines()  # plan's own variable is not named under models
    assert line.startswith("coretrain models: CORETRAIN_MAX_STPES matches no option")
    from app.cli import unknown_variables

    environ = {"CORETRAIN_SEED": "1", "CORETRAIN_GENERATE_SEED": "2", "CORETRAIN_X": "3"}
    assert unknown_variables({**environ, "_CORETRAIN_LOCK_FD": "4", "HOME": "/"}) == ["CORETRAIN_X"]


def test_each_command_reads_its_own_variables() -> None:
    import json

    text = run_cli("plan", env={"CORETRAIN_PLAN_FORMAT": "text", "CORETRAIN_FORMAT": "json"})
    assert text.returncode == 0 and text.stdout.startswith("cpu_quota"), text.stdout[:200]
    shared = run_cli("plan", env={"CORETRAIN_INTRA_OP_THREADS": "1"})
    assert json.loads(shared.stdout)["intra_op_threads"] == 1
    both = {"CORETRAIN_INTRA_OP_THREADS": "1", "CORETRAIN_PLAN_INTRA_OP_THREADS": "2"}
    assert json.loads(run_cli("plan", env=both).stdout)["intra_op_threads"] == 2


def test_train_s_own_variable_wins_over_the_short_one(tmp_path: Path) -> None:
    env = {
        "CORETRAIN_DATA": str(tmp_path / "short"),
        "CORETRAIN_TRAIN_DATA": str(tmp_path / "own"),
        "CORETRAIN_OUTPUT": str(tmp_path / "out"),
    }
    proc = run_cli("train", env=env)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert f"--data {tmp_path / 'own'}: no such file or directory" in line
    assert line.endswith(" (--data: from CORETRAIN_TRAIN_DATA)")  # what to change


def test_a_refusal_names_the_variable_an_option_came_from_and_only_then(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    args = ("train", "--data", str(data), "--output", str(tmp_path / "o"))
    by_variable = run_cli(*args, env={"CORETRAIN_HEIGHT": "7"})
    by_flag = run_cli(*args, "--height", "7")
    assert by_variable.returncode == by_flag.returncode == 2
    (line,) = by_variable.stderr.splitlines()
    assert line.startswith("coretrain: --height 7 --width 195: input 7×195 is too small")
    assert line.endswith(" (--height: from CORETRAIN_HEIGHT)")  # --width is the default
    assert by_flag.stderr.strip() == line.removesuffix(" (--height: from CORETRAIN_HEIGHT)")


@dataclass(frozen=True)
class _Inner(Options):
    b: int = option(1, "b", minimum=0)
    new: int = option(2, "an option ORDER does not list yet")


@dataclass(frozen=True)
class _Outer(Options):
    a: int = option(0, "a")
    inner: _Inner = group(_Inner)
    c: int = option(3, "c")
    ORDER: ClassVar[tuple[str, ...]] = ("c", "b", "a")


def test_grouped_options_are_seen_flat_in_the_declared_order() -> None:
    assert [f.name for f in option_fields(_Outer)] == ["c", "b", "new", "a"]
    built = from_flat(_Outer, {"a": 5, "b": 6})
    assert built.inner == _Inner(b=6) and flat(built) == {"c": 3, "b": 6, "new": 2, "a": 5}
    with pytest.raises(ConfigError, match="--b must be at least 0"):
        from_flat(_Outer, {"b": -1})


# A variable set but empty (a manifest's `- name: CORETRAIN_MAX_STEPS` without a value) is a
# usage error naming it, not the default.


def _context_args(command: click.Command, skip: click.Parameter, tmp_path: Path) -> list[str]:
    """Arguments that satisfy ``command``'s required options (but ``skip``) and arguments."""
    args = [
        arg
        for p in command.params
        if isinstance(p, click.Option) and p.required and p is not skip
        for arg in (p.opts[0], str(tmp_path))
    ]
    return args + [str(tmp_path) for p in command.params if isinstance(p, click.Argument)]


def test_an_empty_or_blank_variable_is_an_error_naming_it_for_every_option(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from app.cli import cli

    for name in [n for n in os.environ if n.startswith("CORETRAIN_")]:
        monkeypatch.delenv(name)
    checked: dict[str, int] = {}
    for command_name, command in cli.commands.items():
        for param in command.params:
            if not isinstance(param, click.Option) or not param.envvar:
                continue
            args = _context_args(command, param, tmp_path)
            for variable in param.envvar:
                for value in ("", " \t"):
                    monkeypatch.setenv(variable, value)
                    with pytest.raises(click.BadParameter) as refused:
                        command.make_context(command_name, list(args))
                    message = refused.value.format_message()
                    assert f"{variable} is set but empty" in message, (command_name, message)
                    assert param.opts[0] in message
                    monkeypatch.delenv(variable)
                checked[command_name] = checked.get(command_name, 0) + 1
    assert checked.keys() == cli.commands.keys()  # every command, each of its options


def test_an_empty_variable_stops_a_run_before_anything_is_written(tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    proc = run_cli("train", "--data", str(data), "--output", str(out),
                   env={"CORETRAIN_MAX_STEPS": ""})  # fmt: skip
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("coretrain: Invalid value for '--max-steps'")
    assert "CORETRAIN_MAX_STEPS is set but empty" in line
    assert not out.exists()
    # The command line wins over the variable, as over any value of it; the per-command
    # variable is the one read, so an empty short one beside it is not.
    flag = run_cli("plan", "--cpus", "1", env={"CORETRAIN_CPUS": ""})
    own = run_cli("plan", env={"CORETRAIN_PLAN_CPUS": "1", "CORETRAIN_CPUS": " "})
    assert flag.returncode == own.returncode == 0, flag.stderr + own.stderr
    assert json.loads(flag.stdout)["cpu_budget"] == json.loads(own.stdout)["cpu_budget"] == 1
    empty_own = run_cli("plan", env={"CORETRAIN_PLAN_CPUS": "", "CORETRAIN_CPUS": "1"})
    assert empty_own.returncode == 2 and "CORETRAIN_PLAN_CPUS is set but empty" in empty_own.stderr


@pytest.mark.parametrize("decided", [False, True])
def test_a_sigterm_once_the_exit_code_is_decided_changes_nothing(decided: bool) -> None:
    """Python puts the default SIGTERM handler back while it finalizes (TensorFlow's
    teardown, after a run's ``end``): a pod's kill then ended a completed run as killed.
    Once ``main`` has its code (``_decided``) the signal is ignored; without, it kills."""
    code = textwrap.dedent(
        f"""
        import os, time
        from app import cli
        from app.signals import StopRequest
        StopRequest().install()  # as a run has it
        class Slow:  # work at the interpreter's end, as TensorFlow's teardown is
            def __del__(self):
                os.write(1, b"finalizing\\n")
                time.sleep(2)
        keep = Slow()
        if {decided}:
            cli._decided()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None and proc.stdout.readline() == b"finalizing\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == (0 if decided else -signal.SIGTERM)


def _on_a_terminal(*args: str) -> tuple[int, str]:
    """``python -m app ARGS`` with stdin, stdout and stderr on a real pseudo-terminal: its
    exit code and what the terminal showed (its line ends as written)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CORETRAIN_")}
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", *args], stdin=slave, stdout=slave, stderr=slave,
        env={**environ, "COLUMNS": "100"}, cwd=REPO,
    )  # fmt: skip
    os.close(slave)
    shown = b""
    while True:
        try:
            part = os.read(master, 4096)
        except OSError:  # EIO: the process and its terminal side are gone
            break
        if not part:
            break
        shown += part
    os.close(master)
    return proc.wait(timeout=60), shown.decode().replace("\r\n", "\n")


def test_no_command_is_clicks_help_and_a_missing_option_one_line() -> None:
    """``coretrain`` alone shows the help on stderr as click does, its lines as they are,
    exit 2, piped and on a terminal (it was one line of ``\\x0a`` escapes); ``coretrain
    train`` alone is a usage error: one line."""
    helped = run_cli("--help", env={"COLUMNS": "100"})
    assert helped.returncode == 0 and helped.stdout.startswith(
        "Usage: coretrain [OPTIONS] COMMAND [ARGS]...\n\n  Train a TensorFlow CNN"
    )
    alone = run_cli(env={"COLUMNS": "100"})
    assert (alone.returncode, alone.stdout, alone.stderr) == (2, "", helped.stdout)
    assert _on_a_terminal() == (2, helped.stdout)
    train = run_cli("train")
    assert train.returncode == 2
    (line,) = train.stderr.splitlines()
    assert line.startswith("coretrain: Missing option '--")
    assert line.endswith("(see coretrain train --help)")
    from app import __version__

    assert run_cli("--version").stdout == f"coretrain, version {__version__}\n"
