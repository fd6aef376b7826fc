"""``coretrain exec [plan options] -- COMMAND [ARGS…]``: any program, on the CPUs planned
for it.

The plan is made exactly as ``coretrain plan`` makes it (:func:`app.budget.detect_plan`,
the same options and variables); each runtime's thread variables follow from it
(:mod:`app.budget.runtimes`), the plan's affinity is applied, and the plan is logged once
(event ``exec``: a JSON line on stderr, or ``--plan-out FILE``). Then the command replaces
this process (``execve``: the same PID, signals and exit code are the program's own,
nothing of coretrain stays), or, with ``--report``, runs as a child with its signals
forwarded (:mod:`app.commands.supervise`) and an ``exec_end`` event reports its wall time,
CPU seconds against the budget and the CFS throttling of the cgroup that holds the quota
over its life (:mod:`app.budget.usage`); the exit code is still the child's (128 + N for a
death by signal N).

The events go to stderr (stdout is the program's): JSON lines, or lines for people when
stderr is a terminal (``--log-format``). The ``exec`` line holds the plan in brief
(:meth:`~app.budget.plan.ThreadPlan.brief`: the budget, its source, the threads, the
pinning, oneDNN), the variables set and the user's kept, the affinity applied: what the
program was given, in one line of a few hundred characters. Why (the plan's ``reasons``, the
files it was decided from: the cgroup files, every CPU flag, the mount table; a reason per
variable) is in ``--plan-out FILE``, which holds the whole record instead of the line, and
in ``coretrain plan --format json`` with the same options and variables.

A command that can't be found is exit 127, one found but not executable 126 (the shell's
codes, POSIX "Command Search and Execution"; env(1) uses the same); a file the kernel
can't execute (a script without ``#!``) runs under ``/bin/sh``, as execvp(3) runs it;
coretrain's own usage errors stay exit 2. No TensorFlow.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from app import logs
from app.budget import apply, detect_plan
from app.budget.plan import PlanOptions, ThreadPlan
from app.budget.runtimes import RuntimeEnv, runtime_env
from app.budget.usage import Throttling
from app.commands import Exit
from app.commands.supervise import ChildEnd, spawn
from app.errors import CommandNotExecutable, CommandNotFound, ConfigError
from app.options import option
from app.output import Output
from app.report import LogOptions


@dataclass(frozen=True)
class ExecConfig:
    """How ``coretrain exec`` runs the command and where it logs the plan."""

    report: bool = option(
        False,
        "Run the command as a child (signals forwarded, its exit code kept) and log its "
        "wall time, CPU seconds and CFS throttling at its end, instead of replacing "
        "coretrain by it.",
        flag="--report/--no-report",
    )
    plan_out: Path | None = option(
        None,
        "Write the applied plan, whole (with its reasons and the files read), and the "
        "variables (the exec event, JSON) to this file instead of a line on stderr.",
        shown_default="stderr",
        output=True,
    )


def resolve(command: str, environ: Mapping[str, str]) -> str:
    """The file ``command`` names: itself when it has a ``/``, else the first executable
    ``command`` on ``environ``'s PATH (as execvp). Raises CommandNotFound (127),
    CommandNotExecutable (126)."""
    if "/" in command:
        path = command
    else:
        found = shutil.which(command, path=environ.get("PATH", os.defpath))
        if found is None:
            raise CommandNotFound(f"{command}: command not found")
        path = found
    if not os.path.exists(path):
        raise CommandNotFound(f"{command}: no such file")
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise CommandNotExecutable(f"{command}: not an executable file")
    return path


def run(config: ExecConfig, options: PlanOptions, argv: Sequence[str], log: LogOptions) -> Exit:
    """Plan, set the variables and the affinity, log the plan (on stderr as ``log``
    says), then run ``argv``: replace this process by it (never returns) or, with
    ``config.report``, run it as a child and return its exit code. Raises ConfigError (no
    command, a bad setting), CommandNotFound (127), CommandNotExecutable (126),
    StorageError (``--plan-out``)."""
    if not argv:
        raise ConfigError("exec: no command given (coretrain exec [OPTIONS] -- COMMAND [ARGS]...)")
    path = resolve(argv[0], os.environ)
    plan = detect_plan("/", options)  # as `coretrain plan`: the same options and variables
    variables = runtime_env(plan, os.environ)
    env = variables.environ(os.environ)
    done = apply.set_affinity(plan)
    logs.setup(stream=sys.stderr, text=log.text(sys.stderr))  # stdout is the program's
    _log_plan(plan, variables, argv, done, config.plan_out)
    with logs.handed_over():  # the program's standard streams as they were given
        if not config.report:
            _as_execvp(apply.replace_process, path, list(argv), env)  # never returns
        throttling = Throttling(plan.cpu_stat)  # the cgroup that holds the quota
        end = _as_execvp(spawn, path, list(argv), env)
    _log_end(end, plan, throttling.read(), argv)
    return Exit(end.exit_code)


T = TypeVar("T")

#: What runs a file the kernel can't execute (no ``#!``, not a binary), as execvp(3) and
#: the shells do (POSIX "Command Search and Execution": ENOEXEC).
SHELL = "/bin/sh"


def _as_execvp(
    start: Callable[[str, list[str], dict[str, str]], T], path: str, argv: list[str],
    env: dict[str, str],
) -> T:  # fmt: skip
    """``start(path, argv, env)`` (replace this process, or spawn a child), retried under
    :data:`SHELL` when the kernel can't execute the file (ENOEXEC), as execvp(3) does.
    Raises CommandNotFound (127), CommandNotExecutable (126)."""
    try:
        return start(path, argv, env)
    except OSError as exc:
        if exc.errno != errno.ENOEXEC:
            raise _not_runnable(argv[0], exc) from exc
    try:
        return start(SHELL, [SHELL, path, *argv[1:]], env)
    except OSError as exc:
        raise _not_runnable(argv[0], exc) from exc


def _not_runnable(command: str, exc: OSError) -> CommandNotFound | CommandNotExecutable:
    """The error of an exec that failed: 127 when the file went missing, else 126."""
    kind = CommandNotFound if isinstance(exc, FileNotFoundError) else CommandNotExecutable
    return kind(f"{command}: {exc.strerror or exc}")


def _log_plan(
    plan: ThreadPlan,
    variables: RuntimeEnv,
    argv: Sequence[str],
    affinity: list[str],
    plan_out: Path | None,
) -> None:
    """The ``exec`` event, once: on stderr, what the program is given (the plan in brief,
    the variables set and kept, the affinity); or as the JSON file ``plan_out``, with the
    whole plan and a reason per variable (``env_reasons``) too (module docstring)."""
    kept = ", ".join(f"{k}={v}" for k, v in variables.kept.items()) or "none"
    message = (
        f"{argv[0]}: {plan.intra_op_threads} threads for a budget of {plan.cpu_budget:g} "
        f"CPUs ({plan.budget_source}); the user's variables kept: {kept}"
    )
    fields: dict[str, Any] = {
        "command": list(argv),
        "pid": os.getpid(),
        "plan": plan.brief(),
        "env": variables.set,
        "kept": variables.kept,
        "affinity": affinity,
    }
    if plan_out is None:
        logs.event("exec", message, **fields)
    else:
        why = {"plan": plan.to_json(), "env_reasons": list(variables.reasons)}
        _write_plan(plan_out, {"event": "exec", "message": message, **fields, **why})


def _write_plan(path: Path, record: dict[str, Any]) -> None:
    """``record`` as a JSON line to ``path`` by app/output.py's rule (a file replaced whole;
    a FIFO, a terminal, ``/dev/stderr`` written through). Raises ConfigError (exit 2: a
    directory, or in none), StorageError (exit 4: can't be written)."""
    with Output(path, "--plan-out") as sink:
        sink.write((json.dumps(record) + "\n").encode())


def _log_end(
    end: ChildEnd, plan: ThreadPlan, throttled: Mapping[str, float | None], argv: Sequence[str]
) -> None:
    """The ``exec_end`` event (a sentence for people on a terminal: its message)."""
    budget_s = end.wall_s * plan.cpu_budget
    util = round(end.cpu_s / budget_s, 3) if budget_s > 0 else None
    how = f"signal {end.signal}" if end.signal is not None else f"exit {end.exit_code}"
    ratio, seconds = throttled["cpu_throttled_ratio"], throttled["cpu_throttled_s"]
    message = (
        f"{argv[0]} ended ({how}) after {end.wall_s:.1f} s: {end.cpu_s:.1f} CPU s of a "
        f"{plan.cpu_budget:g}-CPU budget (cpu_util {util}); throttled "
        + ("unknown (cpu.stat unreadable)" if seconds is None else f"{seconds:g} s")
        + ("" if ratio is None else f" in {ratio:.0%} of CFS periods")
        + (f"; signals forwarded: {', '.join(end.forwarded)}" if end.forwarded else "")
    )
    logs.event(
        "exec_end",
        message,
        level=logging.INFO if end.exit_code == 0 else logging.WARNING,
        command=list(argv),
        pid=end.pid,
        exit_code=end.exit_code,
        signal=end.signal,
        forwarded=list(end.forwarded),
        wall_s=round(end.wall_s, 3),
        cpu_s=round(end.cpu_s, 3),
        cpu_user_s=round(end.cpu_user_s, 3),
        cpu_system_s=round(end.cpu_system_s, 3),
        cpu_budget=plan.cpu_budget,
        cpu_util=util,
        cpu_throttled_ratio=ratio,
        cpu_throttled_s=seconds,
        cpu_stat=plan.cpu_stat,
        max_rss_bytes=end.max_rss_bytes,
    )
