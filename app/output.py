"""A path a person named for a command's output, written by one rule (:class:`Output`).

The job's own directories follow app/atomic.py's rules (each opened without following a
symlink, of the run's UID); a file a person names on the command line (``predict --out``,
``exec --plan-out``, ``bench-scaling --out``, the files of ``generate --out``) is theirs to
place, as a shell's ``>`` is: its path is followed as given, and what it names decides how
it is written. A regular file is replaced whole, atomically; a FIFO, a pipe or a character
device is written through, never replaced, and every wait on its reader has a deadline and
gives way to SIGTERM/SIGINT (docs/security.md, "Files"). Files written as one set (those of
``generate --out``: :func:`write_set`) are renamed into place only once all are written; a
name typed for an output that can only name a directory (``out/``) is refused
(:func:`check_name`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import select
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from app import logs
from app.atomic import FILE_MODE, PROC_FD, Dir
from app.errors import ConfigError, Preempted, StorageError
from app.signals import stops_noted

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: The longest a command waits, in all, for the reader of a FIFO, a pipe or a device it
#: writes a named output to: to open it, and to take what was written (seconds).
OUTPUT_WAIT_S = 120.0
#: What a named output that is neither a file, a FIFO, a pipe nor a character device is.
_REFUSED = ((stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class Output:
    """A path a person named for a command's output (``predict --out``, ``exec
    --plan-out``, ``bench-scaling --out``, the files of ``generate --out``), written by one
    rule (docs/security.md, "Files"); a context manager: :meth:`write` the bytes in it.

    - **Missing, or a regular file of the run's UID** (a symlink is followed to it, as a
      shell's ``>`` follows one, and stays a symlink): written to an unnamed file in its
      directory (``O_TMPFILE``; a random ``O_EXCL`` name where the file system lacks it),
      fsynced and renamed over it when the block ends without an error: a reader sees the
      old file or the whole new one; an error, a stop or a kill leaves the old one.
    - **A regular file that is this process's stdout or stderr** (``/dev/stdout`` after a
      shell's ``>``/``>>``, or the file by its name): written through that descriptor, at
      its offset, never replaced: what the stream held before and what else is written to
      it stay.
    - **A FIFO, a pipe or a character device** (``/dev/stdout`` into a pipe, ``/dev/null``,
      a terminal): written through as the bytes come (:attr:`streaming`), never replaced.
      The time spent waiting for a FIFO's reader to open it, and for the reader to take
      what is written, is at most ``wait_s`` in all (then StorageError, exit 4); SIGTERM or
      SIGINT ends the wait at once (Preempted, exit 143): ``stop()`` when given, else a
      handler installed while the stream is open (the main thread's).
    - **A directory**, or a path whose directory does not exist: ConfigError (exit 2), as
      is a name that can only name a directory, ``exist.txt/`` (:func:`check_name`, which
      the command line applies to the name as typed: ``path`` has lost its slash). A
      block device, a socket or another UID's file: StorageError (exit 4), and so is
      anything that can't be written (a read-only or full file system, a reader gone),
      naming the path.
    """

    def __init__(
        self, path: Path, what: str = "output", stop: Callable[[], bool] | None = None,
        wait_s: float = OUTPUT_WAIT_S,
    ) -> None:  # fmt: skip
        self.path, self.what, self._stop, self._wait_s = Path(path), what, stop, wait_s
        self._left, self._fd, self._final = wait_s, -1, ""
        self._dir: Dir | None = None  # the directory of a file replaced whole
        self._temp: str | None = None  # the temporary's name; None: unnamed (O_TMPFILE)
        self._handlers = contextlib.ExitStack()
        self.streaming, self._told, self._settled = False, False, False

    def __enter__(self) -> Output:
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def _open(self) -> None:
        """Open what ``path`` names by the class docstring's rule."""
        try:
            found: os.stat_result | None = os.stat(self.path)  # symlinks followed
        except (FileNotFoundError, NotADirectoryError):  # no such file (or directory)
            found = None
        except OSError as exc:
            raise StorageError(f"{self.path}: {self.what}: {exc.strerror}") from exc
        if found is not None and stat.S_ISREG(found.st_mode) and found.st_uid != os.geteuid():
            raise StorageError(
                f"{self.path}: {self.what} belongs to uid {found.st_uid}, not to this run's uid "
                f"{os.geteuid()}; refusing to replace it (remove it, or name another file)"
            )
        own = _own_stream(found)
        if own is not None:  # written through where the shell's redirection points
            self.streaming, self._fd = True, os.dup(own)
        elif found is None or stat.S_ISREG(found.st_mode):
            self._open_file()
        elif stat.S_ISFIFO(found.st_mode) or stat.S_ISCHR(found.st_mode):
            self.streaming = True
            if self._stop is None:  # a wait ends at once on SIGTERM/SIGINT (app/signals.py)
                noted = self._handlers.enter_context(stops_noted())
                self._stop = lambda: bool(noted)
            self._open_stream(found)
        elif stat.S_ISDIR(found.st_mode):
            raise ConfigError(f"{self.path}: {self.what} is a directory: name a file")
        else:
            kind = next(what for test, what in _REFUSED if test(found.st_mode))
            raise StorageError(f"{self.path}: {self.what} is {kind}; refusing to write to it")

    def _open_file(self) -> None:
        """The temporary file in the directory of the file ``path`` names."""
        target = Path(os.path.realpath(self.path))
        try:
            fd = os.open(target.parent, _DIR)  # resolved already
        except (FileNotFoundError, NotADirectoryError):
            raise ConfigError(
                f"{self.path}: {self.what}: the directory {target.parent} does not exist"
            ) from None
        except OSError as exc:
            raise StorageError(f"{self.path}: {self.what}: {exc.strerror}") from exc
        where = Dir(target.parent, fd)
        self._dir, self._final = where, target.name
        flags = os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC
        try:
            if not os.path.isdir(PROC_FD):  # an unnamed file could not be named
                raise OSError(errno.EOPNOTSUPP, "no /proc")
            self._fd = os.open(".", flags, FILE_MODE, dir_fd=fd)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise StorageError(f"{self.path}: cannot write: {exc.strerror}") from exc
            temp = f".{target.name}.{secrets.token_hex(6)}.tmp"
            try:
                self._fd = where.create(temp, "temporary file")
            except FileNotFoundError as missing:  # the directory went away
                raise StorageError(f"{self.path}: cannot write: {missing.strerror}") from None
            self._temp = temp

    def _open_stream(self, found: os.stat_result) -> None:
        """``path`` opened for writing without blocking, once a FIFO has a reader (ENXIO
        until then: :meth:`_wait`; from a device, no such device); it must be what was
        found."""
        flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        while self._fd < 0:
            try:
                self._fd = os.open(self.path, flags)
            except OSError as exc:
                if exc.errno != errno.ENXIO or not stat.S_ISFIFO(found.st_mode):
                    raise StorageError(f"{self.path}: cannot write: {exc.strerror}") from exc
                self._wait(None)
        if not os.path.samestat(os.fstat(self._fd), found):
            raise StorageError(f"{self.path}: {self.what} changed while it was opened")

    def _wait(self, fd: int | None) -> None:
        """Wait a moment for the reader (to open the FIFO: ``fd`` None; to take bytes from
        ``fd``), within what is left of ``wait_s``. Raises Preempted, StorageError."""
        if self._stop is not None and self._stop():
            raise Preempted(f"{self.path}: stopped by signal while waiting for its reader")
        if self._left <= 0:
            raise StorageError(
                f"{self.path}: no reader took the {self.what} within {self._wait_s:g} s "
                "(a FIFO needs its reader running)"
            )
        if not self._told:
            self._told = True
            logs.event(
                "output_waiting",
                f"{self.path}: waiting for its reader (at most {self._wait_s:g} s in all)",
                level=logging.WARNING,
                path=str(self.path),
            )
        moment, t0 = min(0.1, self._left), time.monotonic()
        if fd is None:
            time.sleep(moment)
        else:
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.poll(moment * 1000)
        self._left -= time.monotonic() - t0

    def write(self, data: bytes) -> None:
        """Write all of ``data``. Raises StorageError (no reader within ``wait_s``, a
        reader gone, a full disk), Preempted."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._fd, view) :]
            except BlockingIOError:
                self._wait(self._fd)
            except OSError as exc:
                raise StorageError(f"{self.path}: cannot write: {exc.strerror}") from exc

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        try:
            if kind is None and not self.streaming:
                self._commit()
        finally:
            self.close()

    def settle(self) -> None:
        """Make a file that replaces ``path`` durable under its temporary name (fsynced, an
        unnamed one named), so that only the rename is left; nothing for a stream. Raises
        StorageError."""
        if self.streaming or self._settled:
            return
        assert self._dir is not None
        try:
            os.fsync(self._fd)
            if self._temp is None:
                self._temp = f".{self._final}.{secrets.token_hex(6)}.tmp"
                os.link(f"{PROC_FD}/{self._fd}", self._temp, dst_dir_fd=self._dir.fd)
        except OSError as exc:
            raise StorageError(f"{self.path}: cannot write: {exc.strerror}") from exc
        self._settled = True

    def _commit(self) -> None:
        """The written file renamed over the final name (settled first)."""
        self.settle()
        assert self._dir is not None and self._temp is not None
        try:
            self._dir.rename(self._temp, self._final)
            self._temp = None
        except OSError as exc:
            raise StorageError(f"{self.path}: cannot write: {exc.strerror}") from exc

    def close(self) -> None:
        """Close what is open; a temporary not renamed into place is removed."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._dir is not None:
            if self._temp is not None:
                self._dir.remove(self._temp)
            self._dir.close()
        self._handlers.close()


def write_set(files: Iterable[tuple[Path, bytes]], what: str = "output") -> None:
    """Write each ``(path, data)`` of ``files`` (taken as they come) by :class:`Output`'s
    rule as one set: every file is written to its temporary and settled (fsynced) before
    any is renamed over its name, so an error on any of them (another UID's file, a socket,
    a full disk) leaves each file the set replaces as it was. A stream (a FIFO) is written
    through and closed at once, as it comes: its reader may read them one after another.
    Raises as :class:`Output` does."""
    with contextlib.ExitStack() as written:  # renamed when every one is settled
        sinks = []
        for path, data in files:
            sinks.append(sink := written.enter_context(Output(path, what)))
            sink.write(data)
            if sink.streaming:
                sink.close()
        for sink in sinks:
            sink.settle()


def check_name(name: str, what: str = "output") -> None:
    """Raise ConfigError (exit 2, as for a directory: :class:`Output`) when ``name``, as the
    person typed it, can only name a directory: it ends in ``/``, ``/.`` or ``/..`` (POSIX
    path resolution: a trailing slash resolves only to a directory, so a shell's ``>``
    says "Is a directory" or "Not a directory"). Checked on the text: a :class:`Path`
    made of it has dropped the slash, and would name the file."""
    last = name.rsplit("/", 1)[-1] if "/" in name else None
    if last in ("", ".", ".."):
        raise ConfigError(f"{name}: {what} names a directory (ends in /{last}): name a file")


def _own_stream(found: os.stat_result | None) -> int | None:
    """1 or 2 when ``found`` is a regular file that is this process's stdout or stderr
    (a shell's redirection), else None."""
    if found is None or not stat.S_ISREG(found.st_mode):
        return None
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            if os.path.samestat(found, os.fstat(fd)):
                return fd
    return None


def is_stdout(path: Path) -> bool:
    """Whether ``path`` is this process's stdout (``/dev/stdout``, ``/proc/self/fd/1``, the
    file or pipe it is), so the output and the log must not share it."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(1))
    except OSError:
        return False
