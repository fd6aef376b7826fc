"""Digesting a file in order while threads write its ranges, instead of reading it again after.

The parallel conversion (app/data/formats/textfile/parallel.py) writes each byte range of
the text's rows at its own offset, ranges in several threads at once. A digest is of the
bytes in file order, so a thread of its own (:class:`Follower`) reads back what is written
(``pread``: from the page cache, where the writes just put it), from offset 0, as far as
the ranges written so far reach without a gap, and feeds the digest. It works while the
parse threads wait for their reads, and it is done when they are, where a digest after the
conversion read the whole file once more (16 s of a 12.7 GB cache at 800 MB/s on a Zen 4,
docs/performance.md). A range starts where the rows before it end: the writes leave no
holes in a valid file. When they do (rows after a blank line, an error the conversion
reports), or the conversion stops, the follower gives up and says so (:meth:`digest` is
None); the caller then digests the file after.

No TensorFlow here.
"""

from __future__ import annotations

import os
import threading
from typing import Any

#: Bytes read back and digested at a time.
READ_BYTES = 8 << 20
#: Seconds the follower waits for more writes before it looks at the flags again.
WAIT_S = 0.1


class RangeSink:
    """A file-like ``write`` that puts bytes at consecutive offsets of ``fd`` (pwrite),
    from ``start``, and tells ``written`` how far it got."""

    def __init__(self, fd: int, start: int, written: Written, index: int) -> None:
        self.fd, self.start, self.offset = fd, start, start
        self.written, self.index = written, index

    def write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            count = os.pwrite(self.fd, view, self.offset)
            self.offset += count
            view = view[count:]
        self.written.moved()


class Written:
    """What the ranges have written: each range's sink once it began, and which ended."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.sinks: dict[int, RangeSink] = {}
        self.ended: set[int] = set()
        self.halted = False
        self._changed = threading.Condition()

    def begin(self, fd: int, index: int, start: int) -> RangeSink:
        """The sink of range ``index``, writing from byte ``start``."""
        sink = RangeSink(fd, start, self, index)
        with self._changed:
            self.sinks[index] = sink
            self._changed.notify_all()
        return sink

    def end(self, index: int) -> None:
        """Range ``index`` wrote all its rows."""
        with self._changed:
            self.ended.add(index)
            self._changed.notify_all()

    def halt(self) -> None:
        """No more is written (a stop, or an error): the follower gives up."""
        with self._changed:
            self.halted = True
            self._changed.notify_all()

    def moved(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def wait(self) -> None:
        with self._changed:
            self._changed.wait(WAIT_S)


class Hashing:
    """A file-like ``write`` to ``f`` that also feeds ``hasher`` (one pass: in order)."""

    def __init__(self, f: Any, hasher: Any) -> None:
        self.f, self.hasher = f, hasher

    def write(self, data: Any) -> None:
        self.f.write(data)
        self.hasher.update(data)


class Follower:
    """A thread digesting ``fd``'s bytes in order as the ranges of ``written`` are written
    (module docstring); ``hasher`` has ``update(bytes)`` and ``hexdigest()`` (hashlib's)."""

    def __init__(self, fd: int, hasher: Any, written: Written) -> None:
        self.fd, self.hasher, self.written = fd, hasher, written
        self.position = 0
        self.complete = False
        self._thread = threading.Thread(target=self._run, name="parse-digest", daemon=True)
        self._thread.start()

    def digest(self, size: int) -> str | None:
        """Wait for the thread; the digest of the file's first ``size`` bytes (all of them),
        or None when it gave up or followed another length."""
        self._thread.join()
        return self.hasher.hexdigest() if self.complete and self.position == size else None

    def stop(self) -> None:
        """Make the thread give up and wait for it."""
        self.written.halt()
        self._thread.join()

    def _run(self) -> None:
        try:
            self._follow()
        except OSError:  # unreadable: the caller reads the file after
            self.complete = False

    def _follow(self) -> None:
        buf = memoryview(bytearray(READ_BYTES))
        written = self.written
        for index in range(written.count):
            while index not in written.sinks:
                if written.halted:
                    return
                written.wait()
            sink = written.sinks[index]
            if sink.start != self.position:
                return  # a gap: rows after a blank line, which the conversion refuses
            if not self._through(sink, buf):
                return
        self.complete = True

    def _through(self, sink: RangeSink, buf: memoryview) -> bool:
        """Digest ``sink``'s range up to where it ends; False when the conversion halted."""
        written = self.written
        while True:
            ended = sink.index in written.ended  # before the offset: it is then final
            end = sink.offset
            while self.position < end:
                got = os.preadv(self.fd, [buf[: min(len(buf), end - self.position)]], self.position)
                if got <= 0:
                    return False
                self.hasher.update(buf[:got])
                self.position += got
            if ended:
                return True
            if written.halted:
                return False
            written.wait()
