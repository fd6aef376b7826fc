"""A program run as a child, its signals forwarded, its end measured: ``coretrain exec
--report``.

The forwarded signals are blocked in this process and taken with ``sigtimedwait`` together
with SIGCHLD, so none is lost between the child's start and its end and no handler runs
in between (as tini does it); the child is also looked at every :data:`CHECK_S` seconds, so
an end whose SIGCHLD this thread did not take is not missed. The child starts with the
signal mask this process had and the dispositions it inherited, but for the two Python
itself ignores (``app.budget.apply.PYTHON_IGNORED``, reset by ``subprocess``'s
``restore_signals``), so it sees what it would see started directly (a ``nohup``'s ignored
SIGHUP stays ignored).
A signal the kernel sent to the whole process group (a terminal's Ctrl-C, hang-up or
resize: ``si_code`` SI_KERNEL, sigaction(2)) has reached the child already and is not
sent twice. The CPU time comes from ``wait4``'s rusage of the child (its own and its
waited-for descendants': getrusage(2), RUSAGE_CHILDREN). No TensorFlow.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

#: Forwarded to the child (tini's set without the job-control signals, which the kernel
#: delivers to the whole process group).
_NAMES = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGWINCH")
FORWARDED = tuple(getattr(signal, name) for name in _NAMES if hasattr(signal, name))
#: ``si_code`` of a signal the kernel itself sent (linux/include/uapi/asm-generic/siginfo.h).
SI_KERNEL = 0x80
#: Seconds between two looks at the child when no signal comes: its end is also noticed
#: without its SIGCHLD (one another thread of the process took, or a merge with an earlier
#: pending one), so the supervisor can't wait forever for a child that is gone.
CHECK_S = 1.0


@dataclass(frozen=True)
class ChildEnd:
    """How the child ended: ``exit_code`` as a shell reports it (128 + N for a death by
    signal N, which is ``signal``), wall and CPU seconds (user, system), the largest
    resident set in bytes, and the signals forwarded to it (names)."""

    pid: int
    exit_code: int
    signal: int | None
    wall_s: float
    cpu_user_s: float
    cpu_system_s: float
    max_rss_bytes: int
    forwarded: tuple[str, ...]

    @property
    def cpu_s(self) -> float:
        """User + system CPU seconds."""
        return self.cpu_user_s + self.cpu_system_s


def spawn(path: str, argv: Sequence[str], env: dict[str, str]) -> ChildEnd:
    """Run ``path`` with ``argv`` and ``env`` as a child until it ends, forwarding
    :data:`FORWARDED` signals; return how it ended. Raises OSError when it can't start
    (ENOENT, EACCES, ENOEXEC: the exec's error, as ``subprocess`` reports it). The
    forwarded signals stay blocked in this process afterwards: the caller only reports and
    exits."""
    watched = {*FORWARDED, signal.SIGCHLD}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    start = time.monotonic()
    try:
        # Popen, not posix_spawn: glibc's posix_spawn leaves its internal signals (32, 33)
        # ignored in the program (measured with glibc 2.36); Popen has no signal-mask
        # parameter, so the child puts the mask back itself before the exec.
        child = subprocess.Popen(
            list(argv),
            executable=path,
            env=env,
            restore_signals=True,  # SIGPIPE, SIGXFSZ back to their defaults
            close_fds=False,  # what coretrain inherited, the program inherits (as with exec)
            preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, before),
        )
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        raise
    pid = child.pid
    forwarded: list[str] = []
    while True:
        info = signal.sigtimedwait(watched, CHECK_S)
        if info is not None and info.si_signo != signal.SIGCHLD and info.si_code != SI_KERNEL:
            os.kill(pid, info.si_signo)
            forwarded.append(signal.Signals(info.si_signo).name)
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done == pid:
            break
    code = child.returncode = os.waitstatus_to_exitcode(status)
    return ChildEnd(
        pid=pid,
        exit_code=128 - code if code < 0 else code,
        signal=-code if code < 0 else None,
        wall_s=time.monotonic() - start,
        cpu_user_s=usage.ru_utime,
        cpu_system_s=usage.ru_stime,
        max_rss_bytes=usage.ru_maxrss * 1024,  # kilobytes on Linux (getrusage(2))
        forwarded=tuple(forwarded),
    )
