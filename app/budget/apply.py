"""The only module that changes the process for TensorFlow: env vars, affinity, the import.

``apply`` must run before the first ``import tensorflow`` in the process:
TensorFlow sizes its intra-op/inter-op pools once, when the first op runs, and
reads ``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS`` /
``TF_ENABLE_ONEDNN_OPTS`` at that point (docs/architecture.md, "TensorFlow facts").
``import_tensorflow`` then imports it with its start-up notices kept off stderr.
``restart`` and ``replace_process`` replace the process by a new program (``execve``): the
job itself with a new plan, or ``coretrain exec``'s program.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import MutableMapping
from types import ModuleType
from typing import NoReturn

from app.budget.plan import ONEDNN_ENV, ThreadPlan

# Defaults set only where the user has not set the variable:
# - TF C++ logging: 0 all, 1 no INFO, 2 no WARNING, 3 no ERROR. 2 keeps errors visible.
# - TensorFlow's BFC allocator on the CPU: reuses the fast model's patch matrix instead
#   of mapping it fresh every step (page faults and system time: docs/performance.md).
DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_CPU_ALLOCATOR_USE_BFC": "true"}

#: Lines TensorFlow's C++ code writes to fd 2 while it is imported, before its own log
#: level applies (so ``TF_CPP_MIN_LOG_LEVEL`` does not hide them): absl's notice that
#: logging is not initialised yet, and port.cc's "oneDNN custom operations are on" (once
#: per shared library that reads the switch). The switch itself is logged in ``start``.
STARTUP_NOTICES = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    b"] oneDNN custom operations are on.",
)

# Runs in a child process so that whatever TensorFlow prints reaches stderr even if the
# import crashes the parent (e.g. SIGILL on a CPU without the instructions it needs).
_FILTER = """
import os, sys
drop = [n.encode() for n in sys.argv[1:]]
pending = b""
while True:
    chunk = os.read(0, 65536)
    if not chunk:
        break
    *lines, pending = (pending + chunk).split(b"\\n")
    for line in lines:
        if not any(n in line for n in drop):
            os.write(1, line + b"\\n")
if pending and not any(n in pending for n in drop):
    os.write(1, pending)
"""


#: Set to the private Keras home the job made (:func:`keras_home`), so a restarted image
#: keeps it and removes it at exit (internal).
KERAS_HOME_ENV = "_CORETRAIN_KERAS_HOME"

#: The environment as it was before :func:`apply` changed it (name → value or None), so a
#: restart (:func:`restart`) plans afresh instead of taking our settings for the user's.
_BEFORE: dict[str, str | None] = {}


def apply(plan: ThreadPlan, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Set TF's thread and oneDNN env vars and the CPU affinity from ``plan``.

    Returns one line per change made. Raises RuntimeError if TensorFlow is
    already imported (the pool sizes could no longer change).
    """
    if "tensorflow" in sys.modules:
        raise RuntimeError("app.budget.apply.apply() must run before TensorFlow is imported")
    env = os.environ if environ is None else environ
    if environ is None:
        names = ["TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", ONEDNN_ENV, *DEFAULTS]
        _BEFORE.update({n: os.environ.get(n) for n in names if n not in _BEFORE})
    done = []
    settings: list[tuple[str, object]] = [
        ("TF_NUM_INTRAOP_THREADS", plan.intra_op_threads),
        ("TF_NUM_INTEROP_THREADS", plan.inter_op_threads),
    ]
    if plan.onednn is not None:
        settings.append((ONEDNN_ENV, int(plan.onednn)))
    for name, value in settings:
        env[name] = str(value)
        done.append(f"{name}={value}")
    for name, default in DEFAULTS.items():
        if name not in env:
            env[name] = default
            done.append(f"{name}={default}")
    return done + set_affinity(plan)


def set_affinity(plan: ThreadPlan) -> list[str]:
    """Pin this process (and what it starts from now on) to ``plan.pin_cpus``; nothing
    when the plan does not pin. Returns one line per change made."""
    if plan.pin_cpus is None:
        return []
    os.sched_setaffinity(0, plan.pin_cpus)
    return [f"sched_setaffinity({list(plan.pin_cpus)})"]


def import_tensorflow() -> ModuleType:
    """Import TensorFlow and Keras, dropping :data:`STARTUP_NOTICES` from stderr.

    While the import runs, fd 2 is a pipe to a small filter process that copies
    every other line to the real stderr as it arrives; a real error message is
    never lost. Where fd 2 can't be redirected (closed, or the filter can't start)
    the import runs unfiltered. Returns the ``tensorflow`` module.
    """
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    keras_home()
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        import tensorflow

        return tensorflow
    opened = [saved]
    try:
        read_end, write_end = os.pipe()
        opened += [read_end, write_end]
        notices = [n.decode() for n in STARTUP_NOTICES]
        filter_proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _FILTER, *notices],
            stdin=read_end,
            stdout=saved,
            stderr=saved,
            start_new_session=True,  # a Ctrl-C for the job does not cut its messages short
        )
    except OSError:
        for fd in opened:
            os.close(fd)
        import tensorflow

        return tensorflow
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        import keras  # noqa: F401 - imported under the filter too
        import tensorflow
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the filter sees EOF
        os.close(saved)
        # A process started by the import may hold the pipe: the filter then goes on
        # copying until that one exits too.
        with contextlib.suppress(subprocess.TimeoutExpired):
            filter_proc.wait(timeout=10)
    return tensorflow


def keras_home(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Give Keras a private home (``KERAS_HOME``) when HOME is unusable; return it, or None.

    Keras reads ``$KERAS_HOME/keras.json`` (float type, backend) at import and, without
    ``KERAS_HOME``, uses ``~/.keras``, or ``/tmp/.keras`` -- shared by every user of the
    machine -- when the home is not writable (keras/src/backend/config.py). A planted
    ``/tmp/.keras/keras.json`` would then set the model's float type. So unless
    ``KERAS_HOME`` is set, or HOME is a directory of ours that we may write, the job makes
    a directory of its own (``mkdtemp``: 0700, a random name) and removes it at exit; a
    restarted image (:func:`restart`) takes it over through :data:`KERAS_HOME_ENV`.
    """
    env = os.environ if environ is None else environ
    own = env.get(KERAS_HOME_ENV)
    if own and env.get("KERAS_HOME") == own:
        atexit.register(shutil.rmtree, own, True)
        return own
    if "KERAS_HOME" in env or _usable_home(env.get("HOME", "")):
        return None
    made = tempfile.mkdtemp(prefix="coretrain-keras-")
    env["KERAS_HOME"] = env[KERAS_HOME_ENV] = made
    atexit.register(shutil.rmtree, made, True)
    return made


def _usable_home(home: str) -> bool:
    """Whether ``home`` is a directory of this process's user that it may write."""
    try:
        st = os.stat(home)
    except (OSError, ValueError):
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and os.access(home, os.W_OK)


def restart(extra_env: dict[str, str], keep_fds: tuple[int, ...] = ()) -> None:
    """Replace this process by a fresh run of the same command (``execve``; never returns).

    TensorFlow's thread pools can't be resized in a process, so a new plan needs a new
    process; ``exec`` keeps the PID (PID 1 in a container stays PID 1), stdout and the
    file descriptors in ``keep_fds`` (e.g. the output lock). The variables :func:`apply`
    set are put back as they were, so the new process plans from the budget it finds;
    ``extra_env`` is added. Raises OSError when the exec fails.
    """
    env = dict(os.environ)
    for name, value in _BEFORE.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env.update(extra_env)
    for fd in keep_fds:
        os.set_inheritable(fd, True)
    replace_process(sys.executable, list(sys.orig_argv), env)


#: Signals Python ignores at start (SIGPIPE, SIGXFSZ: Python/pylifecycle.c); an ignored
#: signal stays ignored across ``execve`` (execve(2)), so they are put back to the default
#: before another program replaces this one, as ``subprocess`` does (``restore_signals``).
PYTHON_IGNORED = tuple(
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name)
)


def replace_process(path: str, argv: list[str], env: dict[str, str]) -> NoReturn:
    """``execve(path, argv, env)``: the same PID, the open file descriptors not marked
    close-on-exec, the signal mask; the signals of :data:`PYTHON_IGNORED` at their
    defaults, every handler reset by the kernel. Never returns; raises OSError when the
    exec fails (the process then goes on as it was)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: the descriptor was closed when Python started
            stream.flush()
    before = [(signum, signal.signal(signum, signal.SIG_DFL)) for signum in PYTHON_IGNORED]
    try:
        os.execve(path, argv, env)
    except OSError:
        for signum, handler in before:
            signal.signal(signum, handler)
        raise


def tensorflow_version() -> str:
    """TensorFlow's version without importing it (the wheel is tensorflow-cpu on x86)."""
    for name in ("tensorflow-cpu", "tensorflow"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"
