"""The apply step (app/budget/apply.py) sets TF's env vars before import and refuses after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES, REPO

SNIPPET = """
import json, os
from app.budget.cgroups.detect import CpuBudget
from app.budget.plan import Overrides, make_plan
from app.budget import apply
plan = make_plan(CpuBudget(cpu_quota=1.0, cpuset=(0,), memory_limit=None, quota_source="t"),
                 overrides=Overrides(inter_op_threads=3))
env = {"TF_CPP_MIN_LOG_LEVEL": "0"}
done = apply.apply(plan, env)
import tensorflow
try:
    apply.apply(plan, {})
    late = "applied"
except RuntimeError as exc:
    late = str(exc)
print(json.dumps({"env": env, "done": done, "late": late}))
"""


def test_apply_sets_thread_env_keeps_user_settings_and_refuses_after_import() -> None:
    proc = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["env"] == {
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "3",
        "TF_CPP_MIN_LOG_LEVEL": "0",  # the user's value stays
        "TF_CPU_ALLOCATOR_USE_BFC": "true",
    }
    assert "TF_CPP_MIN_LOG_LEVEL=2" not in out["done"]
    assert "before TensorFlow is imported" in out["late"]


def _run(code: str, env: dict[str, str] | None = None, path: Path | None = None) -> Any:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    full.update(env or {})
    if path is not None:  # a stand-in "tensorflow" package first on the path
        full["PYTHONPATH"] = os.pathsep.join([str(path), str(REPO)])
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, cwd=REPO
    )


IMPORT = """
from app.budget import apply
from app.budget.cgroups.detect import CpuBudget
from app.budget.plan import make_plan, overrides_from
from app.budget.topology import detect_cpu
import os
plan = make_plan(CpuBudget(cpu_quota=None, cpuset=(0,), memory_limit=None, quota_source="t"),
                 overrides=overrides_from(os.environ), cpu=detect_cpu("/"))
apply.apply(plan)
tf = apply.import_tensorflow()
print(tf.constant(2.0).numpy(), os.environ.get("TF_ENABLE_ONEDNN_OPTS"))
"""


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_importing_tensorflow_prints_nothing_on_stderr(onednn: str) -> None:
    # With oneDNN on, TensorFlow writes absl's pre-init warning and the oneDNN notice at
    # import, whatever TF_CPP_MIN_LOG_LEVEL says; both are filtered, nothing else is.
    proc = _run(IMPORT, {"TF_ENABLE_ONEDNN_OPTS": onednn})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.split() == ["2.0", onednn]


def test_apply_sets_the_planned_onednn_switch() -> None:
    from app.budget.cgroups.detect import CpuBudget
    from app.budget.plan import make_plan
    from app.budget.topology import detect_cpu

    b = CpuBudget(cpu_quota=None, cpuset=(0,), memory_limit=None, quota_source="t")
    for case, value in (("amd-epyc-zen3-milan", "0"), ("intel-xeon-sapphire-rapids", "1")):
        plan = make_plan(b, cpu=detect_cpu(FIXTURES / "cpuinfo" / case))
        assert _apply_in_subprocess(plan.onednn)["TF_ENABLE_ONEDNN_OPTS"] == value
    assert "TF_ENABLE_ONEDNN_OPTS" not in _apply_in_subprocess(None)


def _apply_in_subprocess(onednn: bool | None) -> dict[str, str]:
    code = (
        "import json\nfrom app.budget import apply\n"
        "from app.budget.cgroups.detect import CpuBudget\n"
        "from app.budget.plan import make_plan\nimport dataclasses\n"
        "b = CpuBudget(cpu_quota=None, cpuset=(0,), memory_limit=None, quota_source='t')\n"
        f"plan = dataclasses.replace(make_plan(b), onednn={onednn!r})\n"
        "env = {}\napply.apply(plan, env)\nprint(json.dumps(env))\n"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


FAKE_TF = """
import os
os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written "
            b"to STDERR\\n")
os.write(2, b"I0000 00:00:1.0  1 port.cc:153] oneDNN custom operations are on. You may see...\\n")
os.write(2, b"E0000 a real error from TensorFlow\\n")
if os.environ.get("FAKE_TF_ABORT"):
    os.write(2, b"F0000 fatal: the CPU lacks an instruction\\n")
    os.abort()
"""


@pytest.mark.parametrize("abort", [False, True])
def test_real_messages_during_the_import_reach_stderr(tmp_path: Path, abort: bool) -> None:
    for name in ("tensorflow", "keras"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(FAKE_TF if name == "tensorflow" else "")
    code = "from app.budget import apply\napply.import_tensorflow()\nprint('imported')\n"
    proc = _run(code, {"FAKE_TF_ABORT": "1"} if abort else {}, path=tmp_path)
    expected = ["E0000 a real error from TensorFlow"]
    if abort:  # the parent died inside the import; the filter process still delivered
        assert proc.returncode != 0
        expected.append("F0000 fatal: the CPU lacks an instruction")
    else:
        assert proc.returncode == 0 and proc.stdout == "imported\n"
    assert proc.stderr.splitlines() == expected


AFTER_IMPORT = """
import os
before = os.fstat(2)
from app.budget import apply
apply.import_tensorflow()
after = os.fstat(2)
print((before.st_dev, before.st_ino) == (after.st_dev, after.st_ino))
os.write(2, b"I0000 00:00:2.0  1 port.cc:153] oneDNN custom operations are on. (later)\\n")
os.write(2, b"a line after the import\\n")
"""


def test_stderr_is_the_original_again_after_the_import(tmp_path: Path) -> None:
    """The filter is for the import only: afterwards fd 2 is the process's own stderr again,
    so even a line that looks like a start-up notice reaches it, at once."""
    for name in ("tensorflow", "keras"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(FAKE_TF if name == "tensorflow" else "")
    with open(tmp_path / "stderr.txt", "w+b") as err:
        proc = subprocess.run(
            [sys.executable, "-c", AFTER_IMPORT], stdout=subprocess.PIPE, stderr=err,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])},
            cwd=REPO, timeout=60,
        )  # fmt: skip
        err.seek(0)
        lines = err.read().decode().splitlines()
    assert proc.returncode == 0
    assert proc.stdout == b"True\n"  # the same open file as before the import
    assert lines == [
        "E0000 a real error from TensorFlow",
        "I0000 00:00:2.0  1 port.cc:153] oneDNN custom operations are on. (later)",
        "a line after the import",
    ]


# --- In this process: apply to a given environment, the restart's environment, Keras's home ----


def _plan(onednn: bool | None = None, pin: tuple[int, ...] | None = None) -> Any:
    import dataclasses

    from app.budget.cgroups.detect import CpuBudget
    from app.budget.plan import Overrides, make_plan

    b = CpuBudget(cpu_quota=1.0, cpuset=(0,), memory_limit=None, quota_source="t")
    plan = make_plan(b, overrides=Overrides(inter_op_threads=3))
    return dataclasses.replace(plan, onednn=onednn, pin_cpus=pin)


@pytest.fixture
def before_tensorflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as it is before TensorFlow's import (apply refuses after it)."""
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)


@pytest.mark.usefixtures("before_tensorflow")
def test_apply_sets_the_thread_variables_and_only_the_defaults_not_set() -> None:
    from app.budget import apply

    env = {"TF_CPU_ALLOCATOR_USE_BFC": "false"}
    assert apply.apply(_plan(), env) == [
        "TF_NUM_INTRAOP_THREADS=1",
        "TF_NUM_INTEROP_THREADS=3",
        "TF_CPP_MIN_LOG_LEVEL=2",
    ]
    assert env == {
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "3",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TF_CPU_ALLOCATOR_USE_BFC": "false",  # the user's value stays
    }
    env = {}
    assert apply.apply(_plan(onednn=False), env)[2] == "TF_ENABLE_ONEDNN_OPTS=0"
    assert (env["TF_ENABLE_ONEDNN_OPTS"], env["TF_CPU_ALLOCATOR_USE_BFC"]) == ("0", "true")


@pytest.mark.usefixtures("before_tensorflow")
def test_apply_pins_this_process_to_the_planned_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.budget import apply

    pinned: list[tuple[int, Any]] = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: pinned.append((pid, cpus)))
    done = apply.apply(_plan(pin=(2, 3)), {})
    assert pinned == [(0, (2, 3))]  # pid 0: this process
    assert done[-1] == "sched_setaffinity([2, 3])"
    apply.apply(_plan(), {})
    assert pinned == [(0, (2, 3))]  # no pin planned: the affinity is left alone


def test_apply_refuses_once_tensorflow_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.budget import apply

    monkeypatch.setitem(sys.modules, "tensorflow", object())
    message = r"^app\.budget\.apply\.apply\(\) must run before TensorFlow is imported$"
    with pytest.raises(RuntimeError, match=message):
        apply.apply(_plan(), {})


@pytest.mark.usefixtures("before_tensorflow")
def test_a_restart_puts_back_what_apply_changed_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """apply() on the process's own environment remembers each variable as it was before
    (the first time only); restart() hands the new image that environment, plus its own
    variables, and the file descriptors to keep open."""
    from app.budget import apply

    monkeypatch.setattr(apply, "_BEFORE", {})
    for name in ("TF_NUM_INTRAOP_THREADS", "TF_ENABLE_ONEDNN_OPTS", "TF_CPU_ALLOCATOR_USE_BFC"):
        monkeypatch.setenv(name, "x")  # so that monkeypatch removes what apply sets
        monkeypatch.delenv(name)
    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "4")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    apply.apply(_plan())  # oneDNN left to TensorFlow: its variable is not set
    apply.apply(_plan())  # a second plan: the first "before" stays
    assert os.environ["TF_NUM_INTRAOP_THREADS"] == "1"
    assert "TF_ENABLE_ONEDNN_OPTS" not in os.environ
    assert apply._BEFORE == {
        "TF_NUM_INTRAOP_THREADS": None,
        "TF_NUM_INTEROP_THREADS": "4",
        "TF_ENABLE_ONEDNN_OPTS": None,
        "TF_CPP_MIN_LOG_LEVEL": "1",
        "TF_CPU_ALLOCATOR_USE_BFC": None,
    }
    execs: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: execs.append((path, argv, env)))
    read_end, write_end = os.pipe()  # not inheritable, as Python opens every descriptor
    try:
        apply.restart({"_CORETRAIN_RESTARTED": "1"}, keep_fds=(write_end,))
        assert os.get_inheritable(write_end) and not os.get_inheritable(read_end)
    finally:
        os.close(read_end)
        os.close(write_end)
    ((path, argv, env),) = execs
    assert (path, argv) == (sys.executable, list(sys.orig_argv))
    expected = {k: v for k, v in os.environ.items() if k not in apply._BEFORE}
    expected.update(TF_NUM_INTEROP_THREADS="4", TF_CPP_MIN_LOG_LEVEL="1")
    assert env == {**expected, "_CORETRAIN_RESTARTED": "1"}


def test_import_tensorflow_returns_the_module_already_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.budget import apply

    imported = object()
    monkeypatch.setitem(sys.modules, "tensorflow", imported)
    assert apply.import_tensorflow() is imported


def test_tensorflow_s_version_from_whichever_wheel_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.metadata

    from app.budget import apply

    assert apply.tensorflow_version() == importlib.metadata.version("tensorflow-cpu")
    installed: dict[str, str] = {}

    def version(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert apply.tensorflow_version() == "unknown"
    installed["tensorflow"] = "2.20.0"
    assert apply.tensorflow_version() == "2.20.0"
    installed["tensorflow-cpu"] = "2.21.0"  # the x86 wheel first
    assert apply.tensorflow_version() == "2.21.0"


@pytest.fixture
def at_exit(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """What is registered to run at exit (recorded, not run)."""
    import atexit

    registered: list[tuple[Any, ...]] = []
    monkeypatch.setattr(atexit, "register", lambda *call: registered.append(call))
    return registered


def test_keras_gets_a_private_home_removed_at_exit_when_home_is_unusable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_exit: list[tuple[Any, ...]]
) -> None:
    import shutil
    import stat
    import tempfile

    from app.budget import apply

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for env in ({"HOME": str(tmp_path / "missing")}, {}):  # a home that is not there, or none
        made = apply.keras_home(env)
        assert made is not None and Path(made).parent == tmp_path
        assert Path(made).name.startswith("coretrain-keras-")
        assert stat.S_IMODE(os.stat(made).st_mode) == 0o700
        assert env == {**env, "KERAS_HOME": made, "_CORETRAIN_KERAS_HOME": made}
        assert at_exit[-1] == (shutil.rmtree, made, True)
    assert len(at_exit) == 2


def test_a_restarted_image_keeps_the_private_keras_home_and_removes_it_at_exit(
    tmp_path: Path, at_exit: list[tuple[Any, ...]]
) -> None:
    import shutil

    from app.budget import apply

    own = str(tmp_path / "coretrain-keras-1")
    env = {"KERAS_HOME": own, "_CORETRAIN_KERAS_HOME": own, "HOME": str(tmp_path)}
    assert apply.keras_home(env) == own
    assert at_exit == [(shutil.rmtree, own, True)]


def test_keras_home_is_left_alone_when_the_user_set_it_or_home_is_usable(
    tmp_path: Path, at_exit: list[tuple[Any, ...]]
) -> None:
    from app.budget import apply

    for env in (
        {"HOME": str(tmp_path)},  # our own, writable
        {"HOME": str(tmp_path / "missing"), "KERAS_HOME": "/srv/keras"},
        # the variable of a private home that KERAS_HOME no longer names: the user's now
        {"KERAS_HOME": "/srv/keras", "_CORETRAIN_KERAS_HOME": "/tmp/coretrain-keras-1"},
    ):
        before = dict(env)
        assert apply.keras_home(env) is None
        assert env == before
    assert at_exit == []


def test_keras_home_uses_this_process_s_environment_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_exit: list[tuple[Any, ...]]
) -> None:
    from app.budget import apply

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KERAS_HOME", raising=False)
    assert apply.keras_home() is None
    monkeypatch.setenv("KERAS_HOME", "/srv/keras")
    monkeypatch.setenv("HOME", str(tmp_path / "missing"))
    assert apply.keras_home() is None
    assert at_exit == []


def test_a_usable_home_is_a_writable_directory_of_this_user(tmp_path: Path) -> None:
    from app.budget import apply

    assert apply._usable_home(str(tmp_path))
    (tmp_path / "file").write_text("")
    assert not apply._usable_home(str(tmp_path / "file"))
    assert not apply._usable_home(str(tmp_path / "missing"))
    assert not apply._usable_home("")  # HOME unset
    assert not apply._usable_home("bad\0path")
    if os.geteuid() == 0:  # root may write anywhere: a directory of another user is not ours
        other = tmp_path / "other"
        other.mkdir()
        os.chown(other, 65534, 65534)
        assert not apply._usable_home(str(other))


# A stand-in TensorFlow whose import is interrupted: the terminal's Ctrl-C goes to the job's
# whole process group (the job itself lives on here: it ignores the signal).
INTERRUPTED_TF = """
import os, signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
os.killpg(0, signal.SIGINT)
os.write(2, b"E0000 a message after the interrupt\\n")
"""


def _fake_tensorflow(path: Path, code: str) -> None:
    for name in ("tensorflow", "keras"):
        (path / name).mkdir()
        (path / name / "__init__.py").write_text(code if name == "tensorflow" else "")


def test_a_ctrl_c_during_the_import_does_not_cut_its_messages_short(tmp_path: Path) -> None:
    """The filter runs in a session of its own: the job's interrupt does not stop it."""
    _fake_tensorflow(tmp_path, INTERRUPTED_TF)
    code = "from app.budget import apply\napply.import_tensorflow()\nprint('imported')\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
        timeout=60, start_new_session=True,  # a process group of its own, as a job has
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "imported\n"
    assert proc.stderr.splitlines() == ["E0000 a message after the interrupt"]


def test_the_import_runs_unfiltered_when_the_filter_cannot_start(tmp_path: Path) -> None:
    _fake_tensorflow(tmp_path, FAKE_TF)
    code = (
        "import sys\nfrom app.budget import apply\n"
        "sys.executable = '/nonexistent/python'  # the filter's interpreter\n"
        "apply.import_tensorflow()\nprint('imported')\n"
    )
    proc = _run(code, path=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "imported\n"
    assert proc.stderr.splitlines() == [  # every line, the notices too
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1.0  1 port.cc:153] oneDNN custom operations are on. You may see...",
        "E0000 a real error from TensorFlow",
    ]


# --- The import in this process, of a stand-in TensorFlow on the path ----------------------


@pytest.fixture
def tensorflow_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A stand-in ``tensorflow`` and ``keras`` (written by the test into the returned
    directory) that this process imports afresh; the modules it had are back afterwards.
    KERAS_HOME is set, so the import leaves the environment alone."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras-home"))
    names = ("tensorflow", "keras")
    kept = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    try:
        yield tmp_path
    finally:
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(kept)


def test_the_import_here_drops_the_start_up_notices_only(
    tensorflow_here: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from app.budget import apply

    _fake_tensorflow(tensorflow_here, FAKE_TF)
    tf = apply.import_tensorflow()
    assert tf is sys.modules["tensorflow"]
    assert tf.__file__ == str(tensorflow_here / "tensorflow" / "__init__.py")
    assert capfd.readouterr().err.splitlines() == ["E0000 a real error from TensorFlow"]


def test_after_the_import_here_stderr_is_the_original_again(
    tensorflow_here: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """fd 2 is the same open file as before the import, and a later line that looks like a
    start-up notice reaches it."""
    from app.budget import apply

    _fake_tensorflow(tensorflow_here, FAKE_TF)
    before = os.fstat(2)
    apply.import_tensorflow()
    after = os.fstat(2)
    os.write(2, b"I0000 00:00:2.0  1 port.cc:153] oneDNN custom operations are on. (later)\n")
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    assert capfd.readouterr().err.splitlines() == [
        "E0000 a real error from TensorFlow",
        "I0000 00:00:2.0  1 port.cc:153] oneDNN custom operations are on. (later)",
    ]


def test_the_import_here_runs_unfiltered_when_the_filter_cannot_start(
    tensorflow_here: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.budget import apply

    _fake_tensorflow(tensorflow_here, FAKE_TF)
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")  # the filter's interpreter
    before, fds = os.fstat(2), sorted(os.listdir("/proc/self/fd"))
    tf = apply.import_tensorflow()
    after = os.fstat(2)
    assert tf.__file__ == str(tensorflow_here / "tensorflow" / "__init__.py")
    assert sorted(os.listdir("/proc/self/fd")) == fds  # the pipe and the copy of fd 2 closed
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    assert capfd.readouterr().err.splitlines() == [  # every line, the notices too
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1.0  1 port.cc:153] oneDNN custom operations are on. You may see...",
        "E0000 a real error from TensorFlow",
    ]


# A stand-in TensorFlow whose import starts a process that keeps the import's stderr open.
HOLDING_TF = """
import subprocess, sys
holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)"])
"""


def test_a_process_started_by_the_import_does_not_hold_the_import_up(
    tensorflow_here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """That process keeps the import's stderr open, so the filter copies until it exits too:
    the import waits for the filter a bounded time (Popen.wait's timeouts cut to 0.2 s
    here), then returns."""
    from app.budget import apply

    _fake_tensorflow(tensorflow_here, HOLDING_TF)
    wait = subprocess.Popen.wait

    def short_wait(proc: subprocess.Popen[bytes], timeout: float | None = None) -> int:
        return wait(proc, None if timeout is None else min(timeout, 0.2))

    monkeypatch.setattr(subprocess.Popen, "wait", short_wait)
    tf = apply.import_tensorflow()
    try:
        assert tf.holder.poll() is None  # returned while that process still runs
    finally:
        tf.holder.kill()
        tf.holder.wait()


# A stand-in TensorFlow whose import is interrupted: a Ctrl-C reaches every process of the job's
# process group, here the processes that read this import's stderr, if they are in it.
INTERRUPTING_TF = """
import os, signal
pipe = os.readlink("/proc/self/fd/2")
for entry in os.listdir("/proc"):
    try:
        if os.readlink(f"/proc/{entry}/fd/0") == pipe and os.getpgid(int(entry)) == os.getpgid(0):
            os.kill(int(entry), signal.SIGINT)
    except (OSError, ValueError):  # not a process, not ours to read, or gone meanwhile
        continue
os.write(2, b"E0000 a message after the interrupt\\n")
"""


def test_a_ctrl_c_during_the_import_here_does_not_cut_its_messages_short(
    tensorflow_here: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The filter runs in a session of its own: the job's interrupt does not stop it."""
    from app.budget import apply

    _fake_tensorflow(tensorflow_here, INTERRUPTING_TF)
    apply.import_tensorflow()
    assert capfd.readouterr().err.splitlines() == ["E0000 a message after the interrupt"]
