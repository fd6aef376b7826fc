"""What the job writes, written so that nothing planted in its directories is followed.

The rules (docs/security.md, "Files"):

- **Directories** are opened once, each relative to its parent's descriptor, with
  ``O_DIRECTORY | O_NOFOLLOW``, and must belong to the process's effective UID. The one
  exception is a directory the operator named that is a mount point (a volume's root, such
  as the image's ``/output``, mode 2775 for arbitrary UIDs): the job does not expect to own
  it, only what it creates inside. Components of a named path above it are the operator's
  and are followed as given. A symlink, or another owner: :class:`StorageError` (exit 4)
  naming the path, nothing touched.
- **Files** are opened relative to such a descriptor with ``O_NOFOLLOW``; a new temporary
  name with ``O_CREAT | O_EXCL``. A file written in place (the run lock, the log) must be a
  regular file of ours with one link. A file is replaced by writing a temporary name,
  ``fsync`` and ``renameat``: a reader (or a run killed half-way) sees the old file or the
  new one, never a partial one, and a planted symlink under the final name is replaced,
  not followed.
- **Modes**: files are created 0o660 and directories 0o770, less the umask; the job adds
  0o007 to the umask (:func:`restrict_umask`), so nothing it or
  TensorFlow creates is readable or writable by others, whatever umask it was started with.
  A directory built under a temporary name is private (0700) until it is complete, then
  gets the directory mode. Directories inherit the setgid bit, and with it the group,
  from their parent (the kernel's rule), so files on a group-shared volume take the
  volume's group.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.errors import StorageError
from app.mountinfo import read_mountinfo

FILE_MODE = 0o660
DIR_MODE = 0o770
#: Permission bits for "others" the job never grants (added to the umask).
OTHERS = 0o007
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
PROC_FD = "/proc/self/fd"
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2  # <linux/fs.h>


def current_umask() -> int:
    """The process's umask (``Umask:`` in /proc/self/status, else read by setting it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def restrict_umask() -> int:
    """Add :data:`OTHERS` to the process umask, so that nothing the job or
    TensorFlow creates is readable or writable by others (the mode rule
    above, docs/security.md); return the new mask."""
    mask = current_umask() | OTHERS
    os.umask(mask)
    return mask


def _refused(path: Path, what: str, st: os.stat_result | None) -> StorageError | None:
    """Why ``path`` (lstat ``st``) can't be used where the job expects its own, or None."""
    if st is None:
        return None
    if stat.S_ISLNK(st.st_mode):
        return StorageError(f"{path}: {what} is a symbolic link; refusing to follow it")
    return None


def _foreign(path: Path, what: str, owner: int) -> StorageError:
    return StorageError(
        f"{path}: {what} belongs to uid {owner}, not to this run's uid {os.geteuid()}; "
        "refusing to write in it (chown it, or choose another directory)"
    )


def is_mount_point(path: Path) -> bool:
    """Whether ``path`` is the root of a mounted file system (a volume)."""
    try:
        real = os.path.realpath(path)
        return os.path.ismount(path) or any(point == real for point, _ in mounts())
    except OSError:
        return False


def mounts() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount of this mount namespace, in
    /proc/self/mountinfo's order (proc_pid_mountinfo(5)); empty without it."""
    return [(mount.mount_point, mount.fs_type) for mount in read_mountinfo()]


def file_system(path: Path) -> str:
    """The file system ``path`` is on, for messages: ``<mount point> (<type>)``."""
    real = os.path.realpath(path)
    best = ("", "unknown")
    for point, kind in mounts():
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, kind)
    return f"{best[0] or '?'} ({best[1]})"


class Dir:
    """A directory held open: ``fd`` (O_DIRECTORY|O_NOFOLLOW) and ``path`` for messages.

    Everything below is done relative to ``fd``, so renaming or replacing the directory's
    path after it was opened changes nothing the job does through it. Use as a context
    manager (closes ``fd``).
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = Path(path), fd

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @property
    def via(self) -> str:
        """A path that reaches this very directory (``/proc/self/fd/N``), for libraries that
        take paths (TensorFlow, Keras); the plain path where /proc is not mounted."""
        return f"{PROC_FD}/{self.fd}" if os.path.isdir(PROC_FD) else str(self.path)

    def named(self, text: str) -> str:
        """``text``, a library's message about a file reached through :attr:`via`, with the
        directory's path in its place: the message names a file a person can find."""
        via = self.via
        if via == str(self.path):
            return text
        return re.sub(re.escape(via) + r"(?![0-9])", lambda _: str(self.path), text)

    def still_at(self, path: Path) -> bool:
        """Whether ``path`` (followed, as a library would) still reaches this directory and
        is not a symlink: nothing was swapped in since it was opened."""
        try:
            here, there = os.fstat(self.fd), os.stat(path)
        except OSError:
            return False
        return os.path.samestat(here, there) and not os.path.islink(path)

    def lstat(self, name: str) -> os.stat_result | None:
        """``name``'s own status (a symlink is not followed); None when it does not exist."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def check(self, name: str, what: str) -> None:
        """Raise StorageError if ``name`` is a symlink, or a directory or file not ours."""
        st = self.lstat(name)
        refused = _refused(self.path / name, what, st)
        if refused is not None:
            raise refused
        if st is not None and st.st_uid != os.geteuid():
            raise _foreign(self.path / name, what, st.st_uid)

    def sub(self, name: str, what: str = "directory", create: bool = True) -> Dir:
        """The subdirectory ``name`` (created DIR_MODE if missing and ``create``), ours.

        Raises StorageError: a symlink, not a directory, another owner, or an OS error;
        FileNotFoundError when it is missing and ``create`` is False.
        """
        return _open_at(self.fd, self.path, name, what, create, exempt_mounts=False)

    def open(self, name: str, flags: int, what: str = "file") -> int:
        """Open the file ``name`` (``flags`` + O_NOFOLLOW|O_CLOEXEC; created FILE_MODE with
        O_CREAT); return the descriptor. It must be a regular file of ours with one link;
        it is opened without blocking, so a FIFO planted under its name (whose open would
        wait for a writer or a reader) is refused, not waited on. Raises StorageError
        (FileNotFoundError when missing without O_CREAT)."""
        path = self.path / name
        flags |= os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(name, flags, FILE_MODE, dir_fd=self.fd)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise self._open_error(path, name, what, exc) from exc
        st = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(st.st_mode):
            problem = StorageError(f"{path}: {what} is not a regular file")
        elif st.st_uid != os.geteuid():
            problem = _foreign(path, what, st.st_uid)
        elif st.st_nlink != 1:
            problem = StorageError(f"{path}: {what} has {st.st_nlink} hard links; refusing it")
        if problem is not None:
            os.close(fd)
            raise problem
        os.set_blocking(fd, True)
        return fd

    def _open_error(self, path: Path, name: str, what: str, exc: OSError) -> StorageError:
        refused = _refused(path, what, self.lstat(name))
        return refused or StorageError(f"{path}: cannot open the {what}: {exc.strerror}")

    def create(self, name: str, what: str = "file") -> int:
        """Create the new file ``name`` (O_EXCL: never an existing name, nor a symlink)."""
        return self.open(name, _NEW_FILE, what)

    def write_bytes(self, name: str, data: bytes) -> None:
        """Atomically replace ``name`` with ``data`` (fsynced). Raises StorageError."""
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = self.create(tmp, "temporary file")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as exc:
            self.remove(tmp)
            raise StorageError(f"{self.path / name}: cannot write: {exc.strerror}") from exc

    def write_json(self, name: str, obj: Any) -> None:
        """Atomically write ``obj`` as indented JSON (UTF-8). Raises StorageError."""
        self.write_bytes(name, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())

    def read_bytes(self, name: str, limit: int | None = None) -> bytes:
        """The content of the regular file ``name`` (not followed if a symlink); with
        ``limit``, a file of more bytes is refused unread. Raises StorageError,
        FileNotFoundError."""
        fd = self.open(name, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            data = f.read() if limit is None else f.read(limit + 1)
        if limit is not None and len(data) > limit:
            raise StorageError(f"{self.path / name}: more than {limit} bytes; not read")
        return data

    def temp_dir(self, prefix: str, announce: Callable[[str], None] | None = None) -> Dir:
        """A new private (0700) directory ``<prefix><8 hex digits>`` in this one, to build
        output in before :meth:`publish` renames it into place; ``announce(name)`` is called
        before it is made (to record it where a later run finds it). Raises OSError."""
        while True:
            name = f"{prefix}{secrets.token_hex(4)}"
            if announce is not None:
                announce(name)
            try:
                os.mkdir(name, 0o700, dir_fd=self.fd)
            except FileExistsError:
                continue
            return self.sub(name, "temporary directory", create=False)

    def publish(self, tmp: Dir, name: str, exchange: bool = False, replace: bool = True) -> bool:
        """Give the built directory ``tmp`` (made by :meth:`temp_dir`) the directory mode and
        rename it to ``name``; with ``exchange``, swap it with an existing ``name``
        (``renameat2(RENAME_EXCHANGE)``: ``tmp``'s name then holds the old one); without
        ``replace``, never over an existing ``name``, not even an empty directory
        (``RENAME_NOREPLACE``: FileExistsError; where the kernel or file system lacks it, a
        plain rename, which fails over anything but an empty directory). Returns False when
        an exchange is not available here (nothing renamed). ``name`` must not be a symlink
        (StorageError). Raises OSError."""
        self.check(name, "directory")
        os.fchmod(tmp.fd, DIR_MODE & ~current_umask())
        if exchange:
            return _renameat2(self.fd, tmp.path.name, name, _RENAME_EXCHANGE)
        if replace or not _renameat2(self.fd, tmp.path.name, name, _RENAME_NOREPLACE):
            os.rename(tmp.path.name, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        return True

    def rename(self, src: str, dst: str) -> None:
        """``renameat`` within this directory (a symlink at ``dst`` is replaced, never
        followed). Raises OSError."""
        os.rename(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def remove(self, name: str) -> None:
        """Remove ``name``: a real directory with everything in it, anything else (a symlink
        included, never its target) unlinked; nothing when missing. Errors are ignored."""
        st = self.lstat(name)
        if st is None:
            return
        try:
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=self.fd, ignore_errors=True)
            else:
                os.unlink(name, dir_fd=self.fd)
        except OSError:
            pass

    def names(self) -> list[str]:
        """The entries' names, sorted."""
        return sorted(os.listdir(self.fd))

    def is_dir(self, name: str) -> bool:
        """Whether ``name`` is a real directory (a symlink to one is not)."""
        st = self.lstat(name)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def is_file(self, name: str) -> bool:
        """Whether ``name`` is a real regular file (a symlink to one is not)."""
        st = self.lstat(name)
        return st is not None and stat.S_ISREG(st.st_mode)


def _renameat2(dir_fd: int, a: str, b: str, flags: int) -> bool:
    """``renameat2`` of ``a`` to ``b`` in ``dir_fd`` with ``flags`` (swap them, or rename
    without replacing); False where renameat2 or the flag is unavailable
    (ENOSYS/EINVAL/EOPNOTSUPP): nothing renamed. Raises OSError (FileExistsError)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(dir_fd, os.fsencode(a), dir_fd, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), a, None, b)


def _open_at(
    parent_fd: int, parent: Path, name: str, what: str, create: bool, exempt_mounts: bool
) -> Dir:
    """Open (and with ``create`` make) the directory ``name`` in ``parent_fd`` by the rules
    of the module docstring; ``exempt_mounts``: another owner is allowed for a mount point."""
    path = parent / name
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            raise
        raise StorageError(f"{path}: {what} not writable: No such file or directory") from None
    except OSError as exc:
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except OSError:
            st = None
        refused = _refused(path, what, st)
        if refused is not None:
            raise refused from None
        raise StorageError(f"{path}: {what} not writable: {exc.strerror}") from exc
    owner = os.fstat(fd).st_uid
    if owner != os.geteuid() and not (exempt_mounts and is_mount_point(path)):
        os.close(fd)
        raise _foreign(path, what, owner)
    return Dir(path, fd)


def open_dir(
    path: Path, what: str = "output directory", below: Path | None = None, create: bool = True
) -> Dir:
    """Open ``path`` as a :class:`Dir` (created with its parents if missing and ``create``).

    ``below``: the directory the operator named that ``path`` lies in (default: ``path``
    itself); the path up to it is followed as given (the operator's), it may be a foreign
    mount point, and each component after it is opened with O_NOFOLLOW and must be ours.
    Raises StorageError naming the directory (not writable, a symlink, another owner).
    """
    path = Path(os.path.abspath(path))  # "." and ".." named lexically, symlinks as given
    top = Path(os.path.abspath(below)) if below is not None else path
    rest = path.relative_to(top).parts if top != path else ()
    try:
        if create:
            _make_top(top)
        parent_fd = os.open(top.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise StorageError(f"{path}: {what} not writable: {exc.strerror}") from exc
    try:
        current = _open_at(parent_fd, top.parent, top.name, what, create, exempt_mounts=True)
    finally:
        os.close(parent_fd)
    for part in rest:
        with current:
            current = current.sub(part, what, create)
    return current


def _make_top(top: Path) -> None:
    """Create the operator's directory and its parents; a symlink in its place is left for
    :func:`_open_at` to refuse. Raises OSError."""
    try:
        top.mkdir(parents=True, exist_ok=True)
    except OSError:
        if not top.is_symlink():
            raise


def probe_writable(d: Dir, what: str) -> None:
    """Raise StorageError unless a file can be created in ``d`` (an unnamed one where the
    file system has O_TMPFILE, else a random name removed at once)."""
    try:
        try:
            os.close(os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=d.fd))
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
            name = f".probe.{secrets.token_hex(6)}"
            os.close(os.open(name, _NEW_FILE, 0o600, dir_fd=d.fd))
            os.unlink(name, dir_fd=d.fd)
    except OSError as exc:
        raise StorageError(f"{d.path}: {what} not writable: {exc.strerror}") from exc


def write_bytes(path: Path, data: bytes, what: str = "directory") -> None:
    """Atomically replace ``path`` with ``data`` (fsynced), its directory opened by
    :func:`open_dir`. Raises StorageError."""
    path = Path(path)
    with open_dir(path.parent, what) as d:
        d.write_bytes(path.name, data)


#: The most a record a job reads back may hold (``run.json``, ``metrics.json``, a version's
#: ``coretrain.json``): they are a few KiB; a bigger one is not a record.
RECORD_BYTES = 1 << 20


def read_record(path: Path) -> Any:
    """The JSON value in ``path``, a record the job wrote beside what others may write to.
    Opened without blocking (a FIFO planted under its name is not waited for) and read
    only when it is a regular file (symlinks followed) of at most :data:`RECORD_BYTES`.
    Raises FileNotFoundError when nothing is there, OSError naming why it is not a
    record (a FIFO, a device, too big), ValueError when it is not JSON."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    parts: list[bytes] = []
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"{_KINDS.get(stat.S_IFMT(mode), 'not')} a regular file")
        size = 0
        while size <= RECORD_BYTES and (part := os.read(fd, RECORD_BYTES + 1 - size)):
            parts.append(part)
            size += len(part)
    finally:
        os.close(fd)
    if size > RECORD_BYTES:
        raise OSError(errno.EFBIG, f"over {RECORD_BYTES} bytes: not a record")
    return json.loads(b"".join(parts))


_KINDS = {stat.S_IFIFO: "a FIFO, not", stat.S_IFCHR: "a device, not", stat.S_IFBLK: "a device, not",
          stat.S_IFSOCK: "a socket, not", stat.S_IFDIR: "a directory, not"}  # fmt: skip


def write_json(path: Path, obj: Any, what: str = "directory") -> None:
    """Atomically write ``obj`` as indented JSON (UTF-8). Raises StorageError."""
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), what)
