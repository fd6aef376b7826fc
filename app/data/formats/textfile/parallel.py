"""Convert one text data file into raw float32 rows, in several threads when it pays.

A plain-text file is cut into byte ranges that begin at line starts (:func:`split_lines`,
a few per thread, and none over :func:`largest_range`). One thread reads the ranges into
memory in file order, ahead of their parse (app/data/formats/textfile/ahead.py: from the
disk with ``O_DIRECT`` where the page cache does not hold them, so the text costs the
kernel almost nothing and does not push out of the page cache the rows just written,
which the training reads next). A thread that takes a range counts its lines in memory (a
newline count), then, once the ranges before it are counted, parses the same bytes by
:func:`app.data.formats.textfile.iter_chunks` and writes its rows straight into the
destination (``pwrite``) from the row its first line will have: a valid file has one row
per line, blank lines only at its end. The file is read once, and rows are written from
the first range on (a first pass counting the whole file kept a 32 GB conversion at 0 MB/s
for its first 20 s). Ranges are handed out one at a time,
in file order, through a shared counter, and the calling thread works too, so a thread on a
busier CPU holds nobody up. The result is bit for bit the one of reading the file in one pass; the
column sums used for the statistics are added in another order (equal to float64
rounding).

Threads, not processes: the parse itself runs in compiled code that releases the GIL
(:mod:`app.data.formats.textfile._fastparse`; as do file reads, writes and numpy's reductions), so
threads
parse in parallel without a worker process to start (a fresh interpreter importing numpy
costs ~0.3 CPU-s, as much as parsing 60 MB) or to watch. Without the compiled parser the
numpy path holds the GIL more, and more threads gain less.

Errors name the right ``file:line``: a range is parsed with its lines numbered from 1,
and the line number of its start (and the blank-line state the lines before it leave)
become known once the ranges before it are parsed. The first range in file order that
failed -- or that holds data after a blank line that ended an earlier range -- is parsed
again with that state, which raises exactly the DataError one pass gives. Newlines are
therefore counted only when there is an error to report.

gzip files are read in one pass: a compressed stream can't be entered in the middle.

Stop requests and failures: every thread polls ``stop`` and a shared halt flag between
chunks; on a stop request or an error (the ``written`` callback's included: the cache's
size bound, app/data/cache/bounds.py) every thread abandons its range at the next chunk, the
calling thread waits for them, removes the destination, and raises. The destination is a
new file (``O_CREAT | O_EXCL | O_NOFOLLOW``): an existing name or a planted symlink is
never written through.
Nothing is left behind and nothing writes to the output directory after the call returns.
No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.atomic import FILE_MODE
from app.data.formats import files, textfile
from app.data.formats.base import Converted
from app.data.formats.textfile import ahead as readahead
from app.data.formats.textfile import blocks, follow, opener
from app.data.formats.textfile.reader import Held
from app.errors import DataError, InputTooLarge, Preempted

__all__ = [
    "MIN_RANGE_BYTES",
    "RANGES_PER_THREAD",
    "Converted",
    "convert_file",
    "split_lines",
]

#: Ranges per thread (none under MIN_RANGE_BYTES): enough that the threads end together.
#: Handed out one at a time, the last range runs alone while the other threads wait, half a
#: range on average: with 4 a thread, 2 threads converted a 122 MB text 1.54× as fast as
#: one (median of 10 interleaved rounds, Zen 4), with 16 (29 ranges of 4 MiB) 1.91×, at no
#: more CPU time (0.27 against 0.31 CPU-s: smaller ranges touch less fresh memory);
#: docs/performance.md, "The converter". A text of several GB is cut by MAX_RANGE_BYTES.
RANGES_PER_THREAD = 16
#: Files are not cut into ranges smaller than this (bytes): below it a range's fixed
#: costs outweigh the parallel parse.
MIN_RANGE_BYTES = 4 << 20
#: Nor into ranges larger than this (bytes): the text read ahead is in memory (threads + 1
#: ranges at once).
MAX_RANGE_BYTES = 64 << 20
#: Nor so large that the text read ahead passes this (bytes) with many threads.
READ_AHEAD_BYTES = 256 << 20
#: A new file, opened to be read too: the digest reads the rows back (follow.py).
_NEW_FILE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_SCAN_BYTES = 1 << 16  # read at a time when looking for the end of a line


def split_lines(
    path: str | os.PathLike[str], parts: int, min_bytes: int = MIN_RANGE_BYTES
) -> list[tuple[int, int]]:
    """Cut a file into at most ``parts`` byte ranges ``[start, stop)`` at line starts.

    The ranges cover the file in order, each at least about ``min_bytes`` long (bytes)
    and starting just after a newline (or at 0); cut points are near equal shares of the
    size, moved forward to the next line start. One range for a small file, and for a
    file without newlines past the first cut. Raises DataError when the file can't be
    read; ValueError for ``parts < 1`` or ``min_bytes < 1``.
    """
    if parts < 1 or min_bytes < 1:
        raise ValueError(f"parts and min_bytes must be >= 1, got {parts} and {min_bytes}")
    name = os.fspath(path)
    try:
        with files.opened(name) as f:
            size = os.fstat(f.fileno()).st_size
            count = max(1, min(parts, size // min_bytes))
            cuts = [0]
            for i in range(1, count):
                target = max(size * i // count, cuts[-1] + 1)
                cut = _line_start(f, target, size)
                if cut >= size:
                    break
                cuts.append(cut)
    except OSError as exc:
        raise opener.cannot_read(name, exc) from None
    return list(zip(cuts, [*cuts[1:], size], strict=True))


def _line_start(f: Any, offset: int, size: int) -> int:
    """The first line start at or after ``offset`` (``size`` when there is none)."""
    pos = offset - 1  # a newline just before offset makes offset itself a line start
    f.seek(pos)
    while pos < size:
        block = f.read(_SCAN_BYTES)
        if not block:
            break
        found = block.find(b"\n")
        if found >= 0:
            return pos + found + 1
        pos += len(block)
    return size


def convert_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    width: int,
    width_hint: str = "",
    allow_nonfinite: bool = False,
    threads: int = 1,
    stop: Callable[[], bool] = lambda: False,
    min_range_bytes: int | None = None,
    progress: Callable[[int], None] | None = None,
    written: Callable[[int], None] | None = None,
    dir_fd: int | None = None,
    hasher: Callable[[], Any] | None = None,
) -> Converted:
    """Parse the text file ``src`` into the new file ``dst``: rows of ``width`` native
    float32, in order.

    ``threads``: threads that parse (the calling one included; 1 reads in one pass, as do
    gzip files and files under ``2 * min_range_bytes``, default :data:`MIN_RANGE_BYTES`);
    the caller sizes it from the CPU budget (:attr:`app.budget.plan.ThreadPlan.intra_op_threads`).
    ``stop`` is polled between chunks of 512 lines, by every thread. ``width_hint`` and
    ``allow_nonfinite`` as in :func:`app.data.formats.textfile.iter_chunks`. ``progress`` is called
    with the bytes of ``src`` parsed since its last call, from any of the threads (it must
    be thread-safe); ``written`` likewise with the bytes of ``dst`` written by each chunk,
    and it may raise to stop the conversion. ``dir_fd``: a directory descriptor ``dst``'s
    name is created in (app/atomic.py), instead of the path. ``hasher``: makes a digest
    (hashlib's ``update``/``hexdigest``) fed ``dst``'s bytes in order as they are written
    (app/data/formats/textfile/follow.py), returned as ``Converted.checksum`` (None when
    it could not follow them: the caller digests the file).

    Memory per thread: one chunk of lines and its rows (textfile's bound), and a range of
    the text read ahead (:func:`largest_range`), never the file.

    Raises DataError (``file:line: problem``, the same message as one pass), Preempted
    when ``stop`` returns True, whatever ``written`` raises, OSError when ``dst`` can't be
    created (it exists: EEXIST) or written. On any of them ``dst`` is removed.
    """
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    out = Path(dst)
    name = out.name if dir_fd is not None else out
    ranges = _ranges(src, threads, min_range_bytes)
    fd = os.open(name, _NEW_FILE, FILE_MODE, dir_fd=dir_fd)
    done = False
    job = _Job(
        os.fspath(src), tuple(ranges), width, width_hint, allow_nonfinite, progress, written,
        hasher,
    )  # fmt: skip
    try:
        with os.fdopen(fd, "wb") as f:
            result = (
                _one_pass(job, f, stop) if len(ranges) == 1 else _in_ranges(job, f, threads, stop)
            )
        done = True
        return result
    finally:
        if not done:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)


def _ranges(
    src: str | os.PathLike[str], threads: int, min_range_bytes: int | None
) -> list[tuple[int, int]]:
    """The byte ranges ``src`` is parsed in: one, ``[(0, 0)]`` (a pass over the whole file),
    for one thread or a gzip file; else :func:`split_lines` into a few per thread, none over
    :func:`largest_range`."""
    if threads == 1 or textfile.is_gzip(src):
        return [(0, 0)]
    min_bytes = MIN_RANGE_BYTES if min_range_bytes is None else min_range_bytes
    st = files.checked(src)  # there: is_gzip opened it
    size = st.st_size if st is not None else 0
    parts = max(threads * RANGES_PER_THREAD, -(-size // largest_range(threads, min_bytes)))
    return split_lines(src, parts, min_bytes)


def largest_range(threads: int, min_bytes: int = MIN_RANGE_BYTES) -> int:
    """Bytes a range of a conversion in ``threads`` threads is cut under: the
    ``threads + 1`` ranges in memory at once (app/data/formats/textfile/ahead.py) hold
    at most :data:`READ_AHEAD_BYTES`, and a range at most :data:`MAX_RANGE_BYTES`, at
    least ``min_bytes``."""
    return min(MAX_RANGE_BYTES, max(min_bytes, READ_AHEAD_BYTES // (threads + 1)))


def _one_pass(job: _Job, f: Any, stop: Callable[[], bool]) -> Converted:
    hashing = follow.Hashing(f, job.hasher()) if job.hasher is not None else None
    result = _write_rows(job, hashing or f, None, stop, textfile.Buffers())
    if result.status == "stopped":
        raise Preempted(f"{job.src}: stopped by signal during cache conversion")
    checksum = hashing.hasher.hexdigest() if hashing is not None else None
    return Converted(
        result.rows, result.sums, result.sums_sq, threads=1, ranges=1, checksum=checksum
    )


@dataclass
class _Result:
    """One range (or the whole file) parsed: how it went and what it held.

    ``status``: "ok", "data_error" (parse it again to get the message) or "stopped".
    ``lines``, ``rows``, ``blank_line`` as in :class:`app.data.formats.textfile.Span` (numbered
    from the range's first line).
    """

    status: str
    rows: int = 0
    lines: int = 0
    blank_line: int | None = None
    sums: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sums_sq: np.ndarray = field(default_factory=lambda: np.zeros(0))


def _write_rows(
    job: _Job,
    f: Any,
    span: textfile.Span | None,
    stopped: Callable[[], bool],
    buffers: textfile.Buffers,
    text: Held | None = None,
) -> _Result:
    """Parse ``job.src`` (or its span) into the open file ``f``; DataError only without a
    span. ``buffers``: the calling thread's (see :class:`app.data.formats.textfile.Buffers`);
    ``text``: the span's bytes, read already (app/data/formats/textfile/ahead.py)."""
    rows, width = 0, job.width
    total = np.zeros(width, np.float64)
    total_sq = np.zeros(width, np.float64)
    try:
        for chunk in textfile.iter_chunks(
            job.src, width=width, allow_nonfinite=job.allow_nonfinite, width_hint=job.hint,
            span=span, buffers=buffers, progress=job.progress, text=text,
        ):  # fmt: skip
            if stopped():
                return _Result("stopped")
            chunk = np.ascontiguousarray(chunk, np.float32)
            if job.written is not None:
                job.written(chunk.nbytes)
            f.write(chunk.data)
            if blocks.compiled is not None:  # the same sums, without holding the GIL
                blocks.compiled.add_column_sums(chunk, width, total, total_sq)
            else:  # float64 sums without a float64 copy of the chunk
                total += chunk.sum(axis=0, dtype=np.float64)
                total_sq += np.einsum("ij,ij->j", chunk, chunk, dtype=np.float64)
            rows += len(chunk)
    except InputTooLarge:
        raise
    except DataError:
        if span is None:
            raise
        return _Result("data_error")
    if span is None:
        return _Result("ok", rows, sums=total, sums_sq=total_sq)
    return _Result("ok", span.rows, span.lines, span.blank_line, total, total_sq)


# --- ranges -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    """Everything a thread needs to parse the file or any of its ranges."""

    src: str
    ranges: tuple[tuple[int, int], ...]
    width: int
    hint: str
    allow_nonfinite: bool
    progress: Callable[[int], None] | None = None
    written: Callable[[int], None] | None = None
    hasher: Callable[[], Any] | None = None


class _Counter:
    """The next range to hand out, shared by the threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0

    def take(self, count: int) -> int | None:
        """The next range, or None when all are handed out (or handing out ended)."""
        with self._lock:
            if self._next >= count:
                return None
            self._next += 1
            return self._next - 1

    def end(self, count: int) -> None:
        """Hand out no more ranges."""
        with self._lock:
            self._next = count


def _in_threads(
    threads: int, count: int, task: Callable[[int, _Counter], Any], halt: threading.Event
) -> dict[int, Any]:
    """``task(i, counter)`` for i in 0..count-1, handed out one at a time to ``threads``
    threads (the calling one included) until done or ``halt`` is set; the results by i.
    Returns once every thread has ended; re-raises the first exception of any."""
    counter = _Counter()
    results: dict[int, Any] = {}
    failed: list[BaseException] = []

    def work() -> None:
        try:
            while not halt.is_set() and (i := counter.take(count)) is not None:
                results[i] = task(i, counter)
        except BaseException as exc:  # re-raised by the calling thread
            failed.append(exc)
            halt.set()

    helpers = [
        threading.Thread(target=work, name=f"parse-{k}", daemon=True)
        for k in range(min(threads, count) - 1)
    ]
    for helper in helpers:
        helper.start()
    try:
        work()
    finally:
        for helper in helpers:
            helper.join()
    if failed:
        raise failed[0]
    return results


class _Counts:
    """The lines of each range as they are counted; a range's first row once all the ranges
    before it are counted."""

    def __init__(self, halt: threading.Event) -> None:
        self._known: dict[int, int] = {}
        self._changed = threading.Condition()
        self._halt = halt

    def put(self, i: int, lines: int) -> int:
        """Record that range ``i`` has ``lines`` lines; return them."""
        with self._changed:
            self._known[i] = lines
            self._changed.notify_all()
        return lines

    def before(self, i: int) -> int | None:
        """The lines of ranges 0..i-1 (the row range ``i`` starts at), waited for; None
        when the conversion is halted meanwhile."""
        with self._changed:
            while not self._halt.is_set() and any(k not in self._known for k in range(i)):
                self._changed.wait(0.1)
            return None if self._halt.is_set() else sum(self._known[k] for k in range(i))


def _in_ranges(job: _Job, f: Any, threads: int, stop: Callable[[], bool]) -> Converted:
    """One task per range, spread over the threads: count the range's lines, wait for the
    ranges before it to be counted, then parse it straight into the file ``f`` at the row
    its first line will have (module docstring), so there are no part files to join."""
    name, ranges, width = job.src, list(job.ranges), job.width
    halt = threading.Event()
    local = threading.local()  # each thread's memory, reused across its ranges
    last = len(ranges) - 1
    counted = _Counts(halt)
    written = follow.Written(len(ranges))

    def parse(i: int, counter: _Counter) -> _Result:
        if not hasattr(local, "buffers"):
            local.buffers = textfile.Buffers()
        with ahead.taken(i) as text:
            lines = counted.put(i, text.held.lines(i == last))
            first_row = counted.before(i)
            if first_row is None:  # halted while the ranges before it were counted
                return _Result("stopped")
            start, end = ranges[i]
            sink = written.begin(f.fileno(), i, first_row * width * 4)
            result = _write_rows(
                job, sink, textfile.Span(start, end), lambda: halt.is_set() or stop(),
                local.buffers, text.held,
            )  # fmt: skip
        if result.status == "data_error":
            counter.end(len(ranges))  # the ranges before it still finish
        elif result.status == "stopped":
            halt.set()
        elif result.lines != lines:  # the same bytes: never written at the wrong rows
            raise AssertionError(f"{name}: range {start}-{end}: {lines} lines counted, "
                                 f"{result.lines} parsed")  # fmt: skip
        else:
            written.end(i)
        return result

    ahead = readahead.Ahead(name, ranges, threads + 1)
    follower = None
    try:
        if job.hasher is not None:
            follower = follow.Follower(f.fileno(), job.hasher(), written)
        results: dict[int, _Result] = _in_threads(threads, len(ranges), parse, halt)
        if stop() or halt.is_set():
            raise Preempted(f"{name}: stopped by signal during cache conversion")
        rows = _check_in_order(job, results)
    except BaseException:
        if follower is not None:
            follower.stop()
        raise
    finally:
        ahead.close()
    f.truncate(rows * width * 4)  # rows past a trailing run of blank lines: none
    checksum = follower.digest(rows * width * 4) if follower is not None else None
    sums = np.sum([results[i].sums for i in range(len(ranges))], axis=0)
    sums_sq = np.sum([results[i].sums_sq for i in range(len(ranges))], axis=0)
    helpers = min(threads, len(ranges))
    return Converted(rows, sums, sums_sq, threads=helpers, ranges=len(ranges), checksum=checksum)


def _check_in_order(job: _Job, results: dict[int, _Result]) -> int:
    """Walk the ranges in file order with the state one pass would have; return the rows.

    Parses the first range that failed, or that holds data after a blank line ending an
    earlier range, again with its real first line and blank-line state: that raises the
    DataError of one pass. Raises DataError for a file without data lines.
    """
    line, blank, rows = 1, None, 0
    for i, (start, stop) in enumerate(job.ranges):
        result = results[i]
        if result.status != "ok" or (blank is not None and result.rows):
            span = textfile.Span(start, stop, first_line=line, blank_line=blank)
            for _ in textfile.iter_chunks(
                job.src,
                width=job.width,
                allow_nonfinite=job.allow_nonfinite,
                width_hint=job.hint,
                span=span,
            ):
                pass
            raise AssertionError(f"{job.src}: range {start}-{stop} parsed the second time")
        if blank is None and result.blank_line is not None:
            blank = line + result.blank_line - 1
        line += result.lines
        rows += result.rows
    if rows == 0:
        raise DataError(f"{job.src}: empty file (no data lines)")
    return rows
