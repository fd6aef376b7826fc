"""A data file opened for reading: the one place the job opens the operator's files, and the
rule each of them meets.

A data file is a regular file (a symlink to one is followed: the data are the operator's).
Its status says what it is before it is opened, and a FIFO, a device, a socket or a
directory is refused (DataError, exit 3, ``<file>: <what> is a FIFO (named pipe), not a
regular file``): opening a FIFO for reading waits for a writer (forever: the run held its
output lock, and a SIGTERM landing in another thread was only logged), a device is no data
set (``/dev/zero`` trained on zeros), and neither can be fingerprinted or resumed. A device
is never opened (opening one may act: a tape rewinds, a watchdog arms). The file is then
opened without waiting (``O_NONBLOCK``: a FIFO put in its place in between opens at once)
and its status taken again from the descriptor, so only a regular file is ever read.

Files another library opens by name (HDF5's external links, external raw data files and a
virtual dataset's sources: app/data/formats/hdf5.py) meet the same rule by name
(:func:`checked`) before that library may open them; what remains of a wait there (a file
swapped in the moment between) is bounded by app/signals.py ``waiting``. No TensorFlow here.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from typing import BinaryIO

from app.errors import DataError
from app.mountinfo import read_mountinfo

#: What a path that is not a regular file is, for the message.
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, for a message: "a FIFO (named pipe)", …"""
    return next((what for test, what in _KINDS if test(mode)), "not a file")


def _data(path: str | os.PathLike[str], st: os.stat_result, what: str) -> None:
    """Raises DataError naming ``path`` unless its status ``st`` is a regular file's, on a
    file system that holds data."""
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"{path}: {what} is {kind(st.st_mode)}, not a regular file")
    if (system := _file_system(st.st_dev)) in KERNEL_FILE_SYSTEMS:
        raise DataError(
            f"{path}: {what} is on the kernel's {system} file system (the kernel's "
            "interface, not a file of data)"
        )


#: File systems whose files are the kernel's interface, not data: they say they hold 0 or
#: 4096 bytes whatever they give, and some never end a read (``/proc/kmsg`` waits for the
#: kernel's next message; a tracing pipe, for the next event).
KERNEL_FILE_SYSTEMS = frozenset({
    "proc", "sysfs", "debugfs", "tracefs", "securityfs", "configfs", "cgroup", "cgroup2",
    "bpf", "efivarfs", "pstore", "fusectl", "binfmt_misc", "mqueue",
})  # fmt: skip


@functools.lru_cache(maxsize=64)
def _file_system(device: int) -> str | None:
    """The type of the file system mounted from ``device`` (``st_dev``) in this process's
    mount table (app/mountinfo.py); None when no mount names it."""
    name = f"{os.major(device)}:{os.minor(device)}"
    return next((m.fs_type for m in read_mountinfo() if m.device == name), None)


def missing(path: str | os.PathLike[str], detail: str = "") -> DataError:
    """The error of a data file that is not there: ``path``, and when it is a symlink, the
    target it names that is not (a dangling link exists: "missing" alone misled)."""
    if os.path.islink(path):
        return DataError(f"{path}: a symlink to {os.readlink(path)}, which does not exist")
    return DataError(f"{path}: missing data file{detail}")


def unreadable(path: str | os.PathLike[str], exc: OSError) -> DataError:
    """``<path>: cannot read: <reason>`` for an OSError met opening or reading ``path``; a
    symlink loop says so (the kernel's "Too many levels of symbolic links")."""
    if exc.errno == errno.ELOOP:
        return DataError(f"{path}: a symlink loop (a link that leads back to itself), not a file")
    return DataError(f"{path}: cannot read: {exc.strerror or exc}")


def checked(path: str | os.PathLike[str], what: str = "data file") -> os.stat_result | None:
    """The status of ``path`` (a symlink followed) when it is a regular file; None when
    nothing is there (reported where it is read). Nothing is opened. Raises DataError naming
    the file and ``what`` it was to be (a FIFO, a device, a socket, a directory, a file of
    the kernel's: :data:`KERNEL_FILE_SYSTEMS`; a symlink loop; unreadable)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise unreadable(path, exc) from None
    _data(path, st, what)
    return st


def open_fd(path: str | os.PathLike[str], what: str = "data file") -> int:
    """A descriptor of the regular file ``path`` opened for reading (close-on-exec,
    blocking reads), by the rule of the module docstring. Raises DataError (missing, not a
    regular file, unreadable)."""
    if checked(path, what) is None:
        raise missing(path)
    try:
        fd = os.open(path, _READ)
    except (FileNotFoundError, NotADirectoryError):
        raise missing(path) from None
    except OSError as exc:
        raise unreadable(path, exc) from None
    try:
        _data(path, os.fstat(fd), what)  # what was put in its place since it was checked
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def opened(path: str | os.PathLike[str], what: str = "data file", buffering: int = -1) -> BinaryIO:
    """:func:`open_fd` as a binary file object (the caller closes it: ``with``)."""
    return os.fdopen(open_fd(path, what), "rb", buffering=buffering)
