"""How the process answers signals: SIGTERM/SIGINT as a polite stop request, or as the end of a
wait on something outside the process; SIGBUS from a mapped file that shrank.

**A stop request** (:class:`StopRequest`): finish the step, checkpoint, exit 143. Python as
PID 1 ignores SIGTERM without a handler, so the job always installs one. The handler only
sets a flag; the training loop and the cache converter poll it between steps/chunks.

**A wait outside the process** has one rule: a deadline for the whole of it, not per read,
and a SIGTERM/SIGINT that ends it at once (:func:`stops_noted`: the signal is noted for the
wait to see, the handler in place still told). The waits: a Pushgateway's answer
(app/report/gateway.py), a FIFO's or a device's reader (app/output.py), and a library's
open by name (:func:`waiting`): a call that may block on something no check can rule out
(a FIFO put in place the moment after it was checked; HDF5 holds the GIL meanwhile, so no
other thread can act) has its blocked system call interrupted every :data:`TICK_SECONDS`,
so it fails instead of waiting; a stop meanwhile makes it Preempted (exit 143).

**A mapped file cut short** (:func:`watch_mapped`): reading a memory map past the end of its
file raises SIGBUS in the thread that reads, which ends the process (exit 135, no message,
no ``end`` event). Python's own handler returns to the read, which faults again for ever
(the Python docs' "apparently hang"), so the handler is a C callback (ctypes) that runs in
the faulting thread: it finds the watched file that shrank or changed and ends the run with
that file's error (:func:`end_now`); a SIGBUS of no watched file gets the kernel's action
back and ends the process as before. The job's Python code reads such files with
``preadv`` (a short read, never a SIGBUS); their maps are read by TensorFlow's threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn

from app import logs
from app.errors import AppError, Preempted

#: Seconds between the interruptions of a system call blocked in a wait (:func:`waiting`):
#: a call on a regular file is not interrupted (its sleeps are not interruptible), a FIFO's
#: open is.
TICK_SECONDS = 0.2


class StopRequest:
    """Callable flag: ``stop()`` is True once SIGTERM or SIGINT arrived."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> StopRequest:
        """Install the handler for SIGTERM and SIGINT (main thread only); returns self."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            name = signal.Signals(signum).name
            logs.event("signal", f"{name} received: stopping after the current step", signal=name)

    def __call__(self) -> bool:
        return self.signum is not None


_waits: list[str] = []  # the wait in progress (main thread)
#: The signals that end a wait.
STOPS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stops_noted(pass_on: bool = True) -> Iterator[list[int]]:
    """While in the block, a SIGTERM or SIGINT is noted in the yielded list, for a wait to
    end at once (module docstring); with ``pass_on`` the handler in place when it is
    Python's (a run's :class:`StopRequest`, which logs the ``signal`` event) is called too.
    The handlers are put back after the block. In the main thread only (Python sets
    handlers there alone): elsewhere the list stays empty."""
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def note(signum: int, frame: FrameType | None) -> None:
        if pass_on and callable(before := held[signum]):
            before(signum, frame)
        noted.append(signum)

    held: dict[int, Any] = {s: signal.signal(s, note) for s in STOPS}
    try:
        yield noted
    finally:
        for s, before in held.items():
            signal.signal(s, signal.SIG_DFL if before is None else before)


@contextlib.contextmanager
def waiting(what: str) -> Iterator[None]:
    """Run the block as a wait on ``what`` (a file, named in a message): a system call
    blocked in it (a library opening a FIFO by name, which its check could not see: it was
    put there after) is interrupted every :data:`TICK_SECONDS` (SIGALRM: Python's handlers
    have no ``SA_RESTART``, and the kernel gives a signal sent to the process to its main
    thread first), so the library fails instead of waiting; a SIGTERM or SIGINT meanwhile
    (the handler in place runs: a :class:`StopRequest`'s ``signal`` event) makes the failure
    Preempted (exit 143). In the main thread only (elsewhere the block runs as it is:
    Python sets handlers there alone); a wait inside another is the outer one's."""
    if threading.current_thread() is not threading.main_thread() or _waits:
        yield
        return
    alarm = signal.signal(signal.SIGALRM, lambda signum, frame: None)
    signal.setitimer(signal.ITIMER_REAL, TICK_SECONDS, TICK_SECONDS)
    _waits.append(what)
    try:
        with stops_noted() as came:
            try:
                yield
            except Exception as exc:
                if came:
                    name = signal.Signals(came[0]).name
                    raise Preempted(f"{what}: stopped by {name} while waiting for it") from exc
                raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _waits.pop()
        signal.signal(signal.SIGALRM, alarm)


def end_now(error: AppError) -> NoReturn:
    """End the process at once with ``error``, from any thread, as the command line ends a
    run that failed (app/cli/): the ``end`` event, one line ``coretrain: <message>`` on
    stderr (a progress bar erased first), its exit code. For a failure found where the
    main thread can't be reached (it is inside TensorFlow, which waits for the thread that
    found it): what the run wrote stays as a kill would leave it, which a rerun resumes.
    Once a process: the first caller ends it; another thread that finds a failure meanwhile
    (two of TensorFlow's threads reading a map cut short both fault) waits for that end, so
    there is one ``end`` event and one line."""
    if not _ENDING.acquire(blocking=False):
        if threading.get_ident() in _ENDER:  # re-entered in the thread that is ending it
            os._exit(error.exit_code)
        while True:  # another thread is ending the process
            threading.Event().wait(60)
    _ENDER.append(threading.get_ident())
    message = str(error)
    with contextlib.suppress(Exception):
        logs.event("end", message, level=logging.ERROR, status="failed",
                   exit_code=error.exit_code)  # fmt: skip
        logs.clear_view()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):
        os.write(2, f"coretrain: {message}\n".encode(errors="replace"))
    os._exit(error.exit_code)


#: Held by the thread ending the process (:func:`end_now`), whose id is in ``_ENDER``.
_ENDING = threading.Lock()
_ENDER: list[int] = []


@dataclass(frozen=True)
class _Mapped:
    """A file mapped for reading: its descriptor (the mapped file, whatever its path names
    since), the bytes the map needs (``end``), its status change time when mapped, and the
    error the run ends with when it shrank or changed (given what happened)."""

    fd: int
    end: int
    ctime_ns: int
    error: Callable[[str], AppError]

    def changed(self) -> str | None:
        """What happened to the file since it was mapped, or None."""
        st = os.fstat(self.fd)
        if st.st_size < self.end:
            return truncated(st.st_size, self.end)
        return "truncated and written again" if st.st_ctime_ns != self.ctime_ns else None


def truncated(size: int, end: int) -> str:
    """What a file of ``size`` bytes whose rows need ``end`` is, for a message."""
    return f"truncated to {size:,} bytes (its rows need {end:,})"


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.signal.restype = ctypes.c_void_p
_LIBC.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)
_watched: dict[tuple[int, int], _Mapped] = {}  # by device and inode
_installed: list[object] = []  # the handler, kept alive while it is installed


def watch_mapped(fd: int, end: int, error: Callable[[str], AppError]) -> None:
    """Watch the file open as ``fd`` (a duplicate is kept, once per file), mapped for
    reading up to byte ``end``: a SIGBUS while it is shorter, or after it was written, ends
    the run with ``error(what happened)`` (:func:`end_now`); the first call installs the
    handler. Raises OSError (``fd``)."""
    st = os.fstat(fd)
    known = _watched.get((st.st_dev, st.st_ino))
    if known is not None and known.end >= end:
        return
    mapped = _Mapped(os.dup(fd) if known is None else known.fd, end, st.st_ctime_ns, error)
    os.set_inheritable(mapped.fd, False)
    _watched[st.st_dev, st.st_ino] = mapped
    if not _installed:
        handler = _HANDLER(_bus)
        _installed.append(handler)
        _LIBC.signal(signal.SIGBUS, ctypes.cast(handler, ctypes.c_void_p))


def _bus(signum: int) -> None:
    """The SIGBUS handler, in the thread whose read faulted (it waits for the GIL when that
    thread does not hold it: a TensorFlow thread reads the maps, never Python code holding
    it). A watched file that changed ends the run; else the kernel's action is put back and
    the read, repeated on return, ends the process as it would have."""
    with contextlib.suppress(BaseException):  # nothing may leave a signal handler
        for mapped in tuple(_watched.values()):
            if (what := mapped.changed()) is not None:
                end_now(mapped.error(what))
    _LIBC.signal(signal.SIGBUS, None)  # SIG_DFL
