"""A text file's byte ranges read into memory, in file order, ahead of their parse.

One reader thread reads each range whole into a buffer of a small pool, and the parse
threads take them in order (app/data/formats/textfile/parallel.py): a range is read once,
its newlines are found by the reader thread, and its lines are counted and parsed in that
buffer. A range the page cache does not hold
(``mincore`` just before it is read) is read with ``O_DIRECT``, from the disk straight into
the buffer: through the page cache the kernel spent 0.58 CPU-ms a MB on 2-vCPU VMs, 16 MB
direct reads 0.03 (docs/performance.md, "The converter"), and the text no longer pushes out
of the page cache the rows the training reads next. A range is copied from the page cache
where it holds the range (a file just written, or read by another program) or where the
file system refuses ``O_DIRECT`` (``EINVAL``, at open or at a read: every range after it is
copied), and a copied range is dropped from the page cache (``DONTNEED``) once parsed.

Memory: the pool's buffers, each a range's bytes at most (app/data/formats/textfile/
parallel.py ``largest_range``). A file cut short while it is read is a DataError (a range
shorter than it was). No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from app.data.formats import files, pagecache
from app.data.formats.textfile import opener
from app.data.formats.textfile.reader import Held
from app.errors import DataError

#: ``O_DIRECT`` reads start, end and land on multiples of this (bytes): the logical block
#: size of every disk in use, and the page size.
ALIGN = 4096
#: Bytes of one read (a direct read of 16 MB cost 0.04 CPU-ms a MB on the seed's VM).
_READ_BYTES = 16 << 20
#: Below this share of a range in the page cache, it is read from the disk directly.
CACHED_SHARE = 0.5


@dataclass
class Text:
    """Range ``index``'s bytes, ``held`` in its buffer (valid in :meth:`Ahead.taken`'s
    block), and whether they were read ``direct`` (else copied from the page cache)."""

    index: int
    held: Held
    direct: bool


class Ahead:
    """Ranges ``ranges`` ([start, stop) byte pairs, in file order) of the plain file
    ``path`` read by a background thread into ``slots`` buffers; :meth:`taken` a range's
    text while it is parsed (waits for it), :meth:`close` at the end (always)."""

    def __init__(self, path: str, ranges: list[tuple[int, int]], slots: int) -> None:
        self.path, self.ranges = path, ranges
        self._fd = files.open_fd(path)
        self._direct = _open_direct(path, self._fd)
        self._free: list[np.ndarray] = []
        self._slots = slots
        self._made = 0
        self._ready: dict[int, Text | BaseException] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="read-ahead", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def taken(self, i: int) -> Iterator[Text]:
        """Range ``i``'s text, once read, for the block: then its buffer serves a later
        range, and a range copied from the page cache is dropped from it. Raises DataError
        (it could not be read, or the file is shorter than it was)."""
        with self._cond:
            while i not in self._ready:
                self._cond.wait()
            got = self._ready.pop(i)
        if isinstance(got, BaseException):
            raise got
        try:
            yield got
        finally:
            self._done(got)

    def _done(self, text: Text) -> None:
        if not text.direct:
            start, stop = self.ranges[text.index]
            with contextlib.suppress(OSError):
                os.posix_fadvise(self._fd, start, stop - start, os.POSIX_FADV_DONTNEED)
        with self._cond:
            self._free.append(text.held.buffer)
            self._cond.notify_all()

    def close(self) -> None:
        """Stop reading ahead, wait for the reader, close the file."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        os.close(self._fd)
        if self._direct is not None:
            os.close(self._direct)

    def _buffer(self) -> np.ndarray | None:
        """A free buffer (waits while all are in use); None once closed."""
        with self._cond:
            while not self._closed and not self._free and self._made >= self._slots:
                self._cond.wait()
            if self._closed:
                return None
            if self._free:
                return self._free.pop()
            self._made += 1
        pages = -(-max(b - a for a, b in self.ranges) // ALIGN)
        size = (pages + 4) * ALIGN  # the bytes read, room around them; a multiple of 8
        raw = np.empty(size + ALIGN, np.uint8)
        skip = -raw.ctypes.data % ALIGN
        return raw[skip : skip + size]

    def _run(self) -> None:
        for i in range(len(self.ranges)):
            buffer = self._buffer()
            if buffer is None:
                return
            try:
                got: Text | BaseException = self._read(i, buffer)
            except BaseException as exc:  # raised in the thread that takes range i
                got = exc
            with self._cond:
                self._ready[i] = got
                self._cond.notify_all()

    def _read(self, i: int, buffer: np.ndarray) -> Text:
        """Range ``i`` into ``buffer``: direct unless the page cache holds it."""
        start, stop = self.ranges[i]
        direct = (
            self._direct is not None
            and pagecache.cached_share(self._fd, start, stop) < CACHED_SHARE
        )
        if direct:
            try:
                data = self._read_direct(start, stop, buffer)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise opener.cannot_read(self.path, exc) from None
                self._refused()
                direct = False
        if not direct:
            data = self._read_cached(start, stop, buffer)
        if data.end - data.begin < stop - start:
            raise DataError(f"{self.path}: the file changed while it was being converted")
        return Text(i, data, direct)

    def _refused(self) -> None:
        """The file system refused a direct read: copy every range from the page cache."""
        if self._direct is not None:
            os.close(self._direct)
            self._direct = None

    def _read_direct(self, start: int, stop: int, buffer: np.ndarray) -> Held:
        """Bytes [start, stop) read with ``O_DIRECT`` (aligned reads around them) into
        ``buffer`` from offset :data:`ALIGN` on (the room before them)."""
        assert self._direct is not None
        base = start // ALIGN * ALIGN
        end = -(-stop // ALIGN) * ALIGN
        view = buffer.data.cast("B")[ALIGN:]
        pos = base
        while pos < end:
            n = min(_READ_BYTES, end - pos)
            got = os.preadv(self._direct, [view[pos - base : pos - base + n]], pos)
            pos += got
            if got < n:  # the end of the file
                break
        first = ALIGN + start - base
        return Held.of(buffer, first, first + max(min(pos, stop) - start, 0))

    def _read_cached(self, start: int, stop: int, buffer: np.ndarray) -> Held:
        """Bytes [start, stop) copied from the page cache into ``buffer`` from offset
        :data:`ALIGN` on."""
        view = buffer.data.cast("B")[ALIGN:]
        pos = start
        try:
            while pos < stop:
                n = min(stop - pos, _READ_BYTES)
                got = os.preadv(self._fd, [view[pos - start : pos - start + n]], pos)
                if got == 0:
                    break
                pos += got
        except OSError as exc:
            raise opener.cannot_read(self.path, exc) from None
        return Held.of(buffer, ALIGN, ALIGN + pos - start)


def _open_direct(path: str, fd: int) -> int | None:
    """``path`` opened again for ``O_DIRECT`` reads, or None where the file system refuses
    them or the name no longer leads to ``fd``'s file (replaced in between)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        direct = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | flag)
    except OSError:
        return None
    one, two = os.fstat(fd), os.fstat(direct)
    if (one.st_dev, one.st_ino) != (two.st_dev, two.st_ino):
        os.close(direct)
        return None
    return direct
