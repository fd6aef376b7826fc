"""``coretrain exec``: real programs get the planned threads, and keep their PID, signals
and exit code; ``--report`` measures the child, throttling included.

The first tests run anywhere (the real CLI, real programs). The ones below "Real cgroups"
run the programs inside fresh cgroup v1 groups with a real CFS quota (and a cpuset), as
tests/test_real_cgroup.py does, and are skipped with the reason where that is impossible.
How TensorFlow's pool is seen: ``tf.config.threading.get_intra_op_parallelism_threads()``
answers 0 whatever ``TF_NUM_INTRAOP_THREADS`` says (it reports only its own setter), so the
pool is counted in the process's threads: the intra-op (Eigen) threads are unnamed, keep the
process's ``comm`` (tests/test_real_cgroup.py) and are made by the first op, so the pool is
the unnamed threads that op added (OpenBLAS's workers, also unnamed, exist before it).
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.budget.runtimes import RUNTIME_VARIABLES
from benchmarks.cgroup_run import (
    CPUSET_MOUNT,
    Cgroup,
    cpu_cgroup,
    cpuset_cgroup,
    in_groups,
    unavailable_reason,
)
from tests.conftest import REPO, json_lines
from tests.test_real_cgroup import clean_env, coretrain

PY = sys.executable
# The BLAS pool numpy's OpenBLAS made, as threadpoolctl reads it from the library.
BLAS_SNIPPET = (
    "import json, numpy, threadpoolctl; "
    "print(json.dumps([p['num_threads'] for p in threadpoolctl.threadpool_info() "
    "if p['user_api'] == 'blas']))"
)
# TensorFlow after its first op: what its API says, what it was told, the unnamed threads.
TF_SNIPPET = r"""
import json, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
def comm(path):
    with open(path) as handle:
        return handle.read().strip()
def unnamed():
    me = comm("/proc/self/comm")
    return {t for t in os.listdir("/proc/self/task") if comm(f"/proc/self/task/{t}/comm") == me}
import tensorflow as tf
before = unnamed()  # the main thread, OpenBLAS's workers (numpy is imported with TensorFlow)
x = tf.random.normal((256, 256))
float(tf.reduce_sum(tf.matmul(x, x)))
print(json.dumps({
    "api": tf.config.threading.get_intra_op_parallelism_threads(),
    "env": os.environ.get("TF_NUM_INTRAOP_THREADS"),
    "pool": len(unnamed() - before),
    "affinity": len(os.sched_getaffinity(0)),
}))
"""


def exec_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run(
        [*coretrain(), "exec", *args],
        capture_output=True,
        text=True,
        env={**clean_env(), **(env or {})},
        cwd=REPO,
        timeout=timeout,
    )


def exec_event(stderr: str, name: str = "exec") -> dict[str, Any]:
    found = [r for r in json_lines(stderr) if r.get("event") == name]
    assert len(found) == 1, stderr
    return found[0]


def wait_for_line(stream: Any, expected: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if line.strip() == expected:
            return
        assert line, f"stream ended before {expected!r}"
    raise AssertionError(f"no {expected!r} within {timeout} s")


# Anywhere


def test_the_program_keeps_the_pid_and_its_exit_code() -> None:
    proc = subprocess.Popen(
        [*coretrain(), "exec", "--", "sh", "-c", "echo $$; exit 7"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7
    assert int(out.strip()) == proc.pid  # the same process: execve, no child
    event = exec_event(err)
    assert event["pid"] == proc.pid and event["command"] == ["sh", "-c", "echo $$; exit 7"]


HANDLER = (
    "import signal, sys, time; "
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42)); "
    "print('ready', flush=True); time.sleep(60)"
)


@pytest.mark.parametrize("report", [False, True])
def test_sigterm_reaches_the_programs_own_handler(report: bool) -> None:
    flags = ["--report"] if report else []
    proc = subprocess.Popen(
        [*coretrain(), "exec", *flags, "--", PY, "-c", HANDLER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    wait_for_line(proc.stdout, "ready")
    proc.send_signal(signal.SIGTERM)  # to coretrain's PID: the program (exec), or forwarded
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 42, err
    if report:
        end = exec_event(err, "exec_end")
        assert (end["exit_code"], end["signal"], end["forwarded"]) == (42, None, ["SIGTERM"])
        assert end["message"].endswith("; signals forwarded: SIGTERM")
        assert end["pid"] != proc.pid


@pytest.mark.parametrize("report, code", [(False, -signal.SIGTERM), (True, 128 + signal.SIGTERM)])
def test_a_death_by_sigterm_is_the_programs(report: bool, code: int) -> None:
    flags = ["--report"] if report else []
    script = "echo ready; exec sleep 60"
    proc = subprocess.Popen(
        [*coretrain(), "exec", *flags, "--", "sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    wait_for_line(proc.stdout, "ready")
    time.sleep(0.2)  # sh has exec'd sleep
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err  # exec: killed by the signal itself; --report: 143
    if report:
        assert exec_event(err, "exec_end")["signal"] == signal.SIGTERM


COUNT_SIGINT = (
    "import signal, time; seen = []; "
    "signal.signal(signal.SIGINT, lambda *a: seen.append(1)); "
    "print('ready', flush=True); end = time.monotonic() + 2\n"
    "while time.monotonic() < end: time.sleep(0.05)\n"
    "print('sigint', len(seen), flush=True)"
)


def test_a_terminals_ctrl_c_reaches_the_child_once_and_the_report_is_a_sentence() -> None:
    """On a terminal the kernel sends Ctrl-C's SIGINT to the whole foreground process group:
    the child has it already, so --report does not forward it again; and the end is one
    sentence for a person instead of a JSON line."""
    argv = [*coretrain(), "exec", "--report", "--", PY, "-c", COUNT_SIGINT]
    pid, fd = pty.fork()
    if pid == 0:  # the child: a new session whose controlling terminal is the pty
        os.execve(argv[0], argv, clean_env())
    output = b""
    with contextlib.suppress(OSError):  # EIO once the child side is closed
        while b"ready" not in output:
            output += os.read(fd, 1024)
        time.sleep(0.3)
        os.write(fd, b"\x03")  # Ctrl-C: the line discipline signals the foreground group
        while chunk := os.read(fd, 1024):
            output += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    text = output.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "sigint 1" in text  # the terminal's
    assert "coretrain exec: " in text and " ended (exit 0) after " in text, text
    assert "signals forwarded" not in text  # coretrain did not send it a second time
    assert '"event": "exec_end"' not in text


def test_signals_python_ignores_are_not_ignored_by_the_program() -> None:
    script = "grep SigIgn /proc/$$/status"
    bare = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    for flags in ([], ["--report"]):
        proc = exec_cli(*flags, "--", "sh", "-c", script)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == bare.stdout  # SIGPIPE, SIGXFSZ at their defaults, as bare


def test_a_command_that_cant_run_is_one_line_and_the_shells_code(tmp_path: Path) -> None:
    missing = exec_cli("--", "no-such-program-xyz")
    assert (missing.returncode, missing.stderr) == (
        127,
        "coretrain: no-such-program-xyz: command not found\n",
    )
    text = tmp_path / "notes.txt"
    text.write_text("not a program\n")
    not_executable = exec_cli("--", str(text))
    assert not_executable.returncode == 126
    assert not_executable.stderr == f"coretrain: {text}: not an executable file\n"
    nothing = exec_cli()
    assert nothing.returncode == 2 and nothing.stderr.count("\n") == 1, nothing.stderr


def test_the_logged_plan_is_coretrain_plans(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    proc = exec_cli("--cpus", "1.5", "--plan-out", str(out), "--", "true")
    assert (proc.returncode, proc.stderr) == (0, "")  # the plan is in the file, not on stderr
    logged = json.loads(out.read_text())
    planned = subprocess.run(
        [*coretrain(), "plan", "--cpus", "1.5", "--format", "json"],
        capture_output=True,
        text=True,
        env=clean_env(),
        check=True,
    )
    assert logged["plan"] == json.loads(planned.stdout)
    assert logged["plan"]["intra_op_threads"] == 2
    assert logged["env"]["OPENBLAS_NUM_THREADS"] == "2"
    assert logged["env"]["GOMAXPROCS"] == "2"


@pytest.mark.parametrize("closed", ["2>&-", ">&-"])
@pytest.mark.parametrize("mode", ["exec", "exec --report"])
def test_a_closed_stdout_or_stderr_still_runs_the_program(closed: str, mode: str) -> None:
    """Python starts with sys.stderr (or stdout) None when the descriptor is closed."""
    line = f"{' '.join(coretrain())} {mode} -- sh -c 'echo ran > \"$0\"; exit 3' {{}} {closed}"
    with contextlib.ExitStack() as stack:
        marker = Path(stack.enter_context(_tmpdir())) / "ran"
        proc = subprocess.run(
            ["sh", "-c", line.format(marker)], capture_output=True, text=True,
            env=clean_env(), cwd=REPO, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert marker.read_text() == "ran\n"
    assert "Traceback" not in proc.stdout + proc.stderr and '"event"' not in proc.stdout


@contextlib.contextmanager
def _tmpdir() -> Iterator[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        yield tmp


def test_a_script_without_a_shebang_runs_under_sh(tmp_path: Path) -> None:
    script = tmp_path / "plain.sh"
    script.write_text("echo plain ran; exit 5\n")
    script.chmod(0o755)
    for report in ([], ["--report"]):
        proc = exec_cli(*report, "--", str(script))
        assert (proc.returncode, proc.stdout) == (5, "plain ran\n"), proc.stderr


def test_plan_out_writes_through_what_is_not_a_regular_file(tmp_path: Path) -> None:
    target = tmp_path / "target.json"
    target.write_text("old")
    (tmp_path / "link.json").symlink_to(target)
    proc = exec_cli("--plan-out", str(tmp_path / "link.json"), "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "link.json").is_symlink()  # the link kept, its target written
    assert json.loads(target.read_text())["event"] == "exec"
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    proc = exec_cli("--plan-out", str(fifo), "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(reader.communicate(timeout=30)[0])["event"] == "exec"
    assert fifo.is_fifo()  # never replaced by a file
    missing = exec_cli("--plan-out", str(tmp_path / "no" / "such" / "p.json"), "--", "true")
    assert missing.returncode == 2 and not (tmp_path / "no").exists()
    assert missing.stderr.strip().splitlines()[-1].startswith("coretrain: ")


def test_a_users_omp_num_threads_is_kept_and_named() -> None:
    names = [v.name for v in RUNTIME_VARIABLES]
    script = f"import json, os; print(json.dumps({{n: os.environ.get(n) for n in {names!r}}}))"
    proc = exec_cli("--cpus", "1", "--", PY, "-c", script, env={"OMP_NUM_THREADS": "3"})
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["OMP_NUM_THREADS"] == "3"  # the user's
    assert seen["OPENBLAS_NUM_THREADS"] == "1" and seen["TF_NUM_INTRAOP_THREADS"] == "1"
    event = exec_event(proc.stderr)
    assert event["kept"] == {"OMP_NUM_THREADS": "3"}
    assert "OMP_NUM_THREADS=3" in event["message"]
    assert "OMP_NUM_THREADS" not in event["env"]


def test_the_plans_affinity_is_the_programs() -> None:
    first = min(os.sched_getaffinity(0))
    script = "import os; print(sorted(os.sched_getaffinity(0)))"
    for flags in ([], ["--report"]):
        proc = exec_cli("--cpus", "1", "--pin", "cores", *flags, "--", PY, "-c", script)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == [first]
        event = exec_event(proc.stderr)
        assert event["plan"]["pin_cpus"] == str(first)  # the brief plan: the kernel's form
        assert event["affinity"] == [f"sched_setaffinity([{first}])"]
    unpinned = exec_cli("--cpus", "1", "--", PY, "-c", script)
    assert json.loads(unpinned.stdout) == sorted(os.sched_getaffinity(0))  # --pin auto: none


# Real cgroups

REASON = unavailable_reason()
real = pytest.mark.skipif(REASON is not None, reason=f"no real cgroup: {REASON}")
CPUSET_REASON = REASON or unavailable_reason(CPUSET_MOUNT, "cpuset")


@contextlib.contextmanager
def groups(quota: float, cpuset: tuple[int, ...] | None = None) -> Iterator[list[Cgroup]]:
    """A cpu group with ``quota`` CPUs (and a cpuset group of ``cpuset``), removed after."""
    with contextlib.ExitStack() as stack:
        made: list[Cgroup] = [stack.enter_context(cpu_cgroup(quota, prefix="coretrain-exec"))]
        if cpuset is not None:
            made.append(stack.enter_context(cpuset_cgroup(cpuset, prefix="coretrain-exec")))
        yield made
    assert not any(g.path.exists() for g in made), "cgroups were not removed"


def run_in(made: list[Cgroup], argv: list[str], timeout: float = 180):
    return subprocess.run(
        in_groups(made, argv),
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=timeout,
    )


def blas_threads(made: list[Cgroup], through_exec: bool) -> tuple[list[int], dict | None]:
    prefix = [*coretrain(), "exec", "--"] if through_exec else []
    proc = run_in(made, [*prefix, PY, "-c", BLAS_SNIPPET])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout), exec_event(proc.stderr) if through_exec else None


@real
@pytest.mark.parametrize("quota, threads", [(1.5, 2), (0.5, 1)])
def test_numpys_blas_pool_follows_the_quota(quota: float, threads: int) -> None:
    visible = len(os.sched_getaffinity(0))
    with groups(quota) as made:
        bare, _ = blas_threads(made, through_exec=False)
        pools, event = blas_threads(made, through_exec=True)
    assert bare == [visible]  # before: OpenBLAS counts the CPUs it sees, not the quota
    assert pools == [min(threads, visible)]
    assert event is not None and event["plan"]["cpu_quota"] == quota


@pytest.mark.skipif(CPUSET_REASON is not None, reason=f"no cpuset cgroup: {CPUSET_REASON}")
def test_a_cpuset_narrower_than_the_quota_wins() -> None:
    with groups(2.0, cpuset=(0,)) as made:
        pools, event = blas_threads(made, through_exec=True)
    assert event is not None
    plan = event["plan"]
    assert (plan["cpu_quota"], plan["cpuset"], plan["cpu_budget"]) == (2.0, "0", 1.0)
    assert plan["intra_op_threads"] == 1 and event["env"]["OMP_NUM_THREADS"] == "1"
    assert pools == [1]


# Throttled for certain, whatever the load: in its group, the child sets the quota to the
# kernel's least (1 ms per 100 ms period: a runnable task uses it up in every period), runs
# until the group's counter shows 3 throttled periods, restores the quota, and prints the
# group's cpu.stat as it read it at its start and at its end.
THROTTLED = """
import json, sys, time
group = sys.argv[1]
def stat():
    with open(group + "/cpu.stat") as f:
        return {k: int(v) for k, v in (line.split() for line in f)}
def quota(us):
    with open(group + "/cpu.cfs_quota_us", "w") as f:
        f.write(str(us))
first = stat()
quota(1000)
deadline = time.monotonic() + 120  # never reached: the kernel throttles in 0.3 s
while stat()["nr_throttled"] < first["nr_throttled"] + 3 and time.monotonic() < deadline:
    pass
quota(50000)
print(json.dumps({"first": first, "last": stat()}))
"""


@real
def test_report_shows_the_throttling_of_the_quota_that_holds_the_child() -> None:
    with groups(0.5) as made:
        before = made[0].stat()
        argv = [*coretrain(), "exec", "--report", "--", PY, "-c", THROTTLED, str(made[0].path)]
        proc = run_in(made, argv)
        after = made[0].stat()
        path = made[0].path
    assert proc.returncode == 0, proc.stderr[-2000:]
    child = json.loads(proc.stdout)
    end = exec_event(proc.stderr, "exec_end")
    assert end["cpu_stat"] == f"{path}/cpu.stat"
    assert end["cpu_budget"] == 0.5 and end["exit_code"] == 0
    # The report is the group's counters over the child's life: at least what the child saw
    # between its own reads (throttled for certain), at most the group's over coretrain's.
    during_child = (child["last"]["throttled_time"] - child["first"]["throttled_time"]) / 1e9
    around = (after["throttled_time"] - before["throttled_time"]) / 1e9
    assert child["last"]["nr_throttled"] >= child["first"]["nr_throttled"] + 3
    assert 0 < during_child - 1e-3 <= end["cpu_throttled_s"] <= around + 1e-3
    assert 0 < end["cpu_throttled_ratio"] <= 1
    assert 0 < end["cpu_s"] < end["wall_s"]  # the child's own CPU time, from its rusage


def tf_child(made: list[Cgroup], through_exec: bool) -> dict[str, Any]:
    prefix = [*coretrain(), "exec", "--"] if through_exec else []
    proc = run_in(made, [*prefix, PY, "-c", TF_SNIPPET])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@real
@pytest.mark.slow
def test_a_tensorflow_childs_intra_op_pool_follows_the_quota() -> None:
    with groups(0.5) as half:
        bare = tf_child(half, through_exec=False)
        small = tf_child(half, through_exec=True)
    with groups(1.5) as one_and_half:
        large = tf_child(one_and_half, through_exec=True)
    # Before: TensorFlow's default is the affinity count (tensorflow/tensorflow#17206).
    assert (bare["env"], bare["pool"]) == (None, bare["affinity"])
    assert (small["env"], small["pool"]) == ("1", 1)
    two = min(2, large["affinity"])
    assert (large["env"], large["pool"]) == (str(two), two)
    # TensorFlow's own API reports only its setter's value: 0 ("the runtime chooses").
    assert (bare["api"], small["api"], large["api"]) == (0, 0, 0)


LOSES_SIGCHLD = """
import os, signal
from app.commands import supervise

taken = signal.sigtimedwait


def losing(signals, timeout):  # as if another thread of the process took the child's SIGCHLD
    info = taken(signals, timeout)
    return None if info is not None and info.si_signo == signal.SIGCHLD else info


signal.sigtimedwait = losing
end = supervise.spawn("/bin/sh", ["sh", "-c", "exit 3"], dict(os.environ))
print(end.exit_code, end.forwarded)
"""


def test_the_childs_end_is_noticed_without_its_sigchld() -> None:
    done = subprocess.run(
        [PY, "-c", LOSES_SIGCHLD], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["3", "()"]
