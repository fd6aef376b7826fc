"""What a streamed chunk's reads from the disk cost: MB/s and CPU per MB, page cache or not.

``python -m benchmarks.disk_reads FILE [--seconds 20] [--memory-limit-gib 4]`` (not in CI;
root and cgroup v1 for the memory group) reads random blocks of
:data:`app.data.input.order.BLOCK_ROWS` rows of a cache's ``train_x.f32`` (rows of H×W
float32, ``--row-bytes``, default 20×195×4) in chunks of 2,000 blocks, as a streamed run
reads a chunk, for ``--seconds`` each, in a fresh process inside a fresh memory group (the
file's pages dropped from the page cache first, so every read is charged to the group):

* ``page cache``: :func:`app.data.input.stream.read_features`, the reader's own code (every
  block announced with ``WILLNEED``, then one ``preadv`` a run, one thread): reads that miss;
* ``page cache, hits``: the same code outside the group, on blocks of the file's first
  ``--hits-gib`` GiB, read into the page cache first: reads that hit;
* ``O_DIRECT ×T`` for each ``--threads`` T: the same blocks past the page cache, the
  4 KiB-aligned bytes that cover each block read into a page-aligned buffer by T threads
  (nothing copied out: a lower bound of what that reader would cost).

Prints the CPU model, then per mode MB/s, CPU (user + system, of one CPU) and CPU-ms a MB.
A miss costing what a read past the page cache costs, well above a hit, is a cost per read
(the disk's interrupts and completions), not per byte.
The figures bound what reading from the disk takes from the step on a machine with no
spare CPU (docs/performance.md, "Reading from the disk in a memory group").
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ALIGN = 4096
CHUNK_BLOCKS = 2_000


def _blocks(rng: np.random.Generator, rows: int, block_rows: int) -> np.ndarray:
    """A chunk's blocks: sorted first rows of :data:`CHUNK_BLOCKS` random blocks."""
    blocks = rows // block_rows
    return np.sort(rng.choice(blocks, min(CHUNK_BLOCKS, blocks), replace=False)) * block_rows


_OUT: dict[tuple[int, int], np.ndarray] = {}


def _page_cache(path: Path, row: int, ids: np.ndarray) -> None:
    from types import SimpleNamespace

    from app.data.input import stream

    cache = SimpleNamespace(where=lambda name: (path, 0), height=1, width=row // 4)
    # One buffer for every chunk, as the reader uses its chunks' buffers again: fresh
    # memory would add a page fault a page (1.5 CPU-ms a MB on a VM reporting free pages).
    out = _OUT.setdefault((len(ids), row), np.empty((len(ids), 1, row // 4, 1), np.float32))
    stream.read_features(cache, ids, out)  # type: ignore[arg-type]


def _direct(path: Path, row: int, ids: np.ndarray, block_rows: int, threads: int) -> None:
    starts = ids[::block_rows] * row
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    size = block_rows * row

    def work(mine: list[int]) -> None:
        buffer = mmap.mmap(-1, size + 2 * ALIGN)
        view = memoryview(buffer)
        for at in mine:
            lo = at - at % ALIGN
            os.preadv(fd, [view[: -(-(at + size - lo) // ALIGN) * ALIGN]], lo)

    pool = [threading.Thread(target=work, args=(starts[k::threads].tolist(),))
            for k in range(threads)]  # fmt: skip
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    os.close(fd)


def measure(
    path: Path, mode: str, seconds: float, row: int, block_rows: int, hits_bytes: int
) -> dict:  # fmt: skip
    """Read chunks for ``seconds`` in this process; MB/s and CPU."""
    rows = os.path.getsize(path) // row
    if mode == "page cache, hits":
        rows = min(rows, hits_bytes // row)
    rng = np.random.default_rng(0)
    done, t0 = 0, time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_SELF)
    while time.perf_counter() - t0 < seconds:
        starts = _blocks(rng, rows, block_rows)
        ids = (starts[:, None] + np.arange(block_rows)).reshape(-1)
        if mode.startswith("page cache"):
            _page_cache(path, row, ids)
        else:
            _direct(path, row, ids, block_rows, int(mode.split("×")[1]))
        done += len(ids) * row
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    mb = done / 1e6
    return {"mode": mode, "mb_per_s": round(mb / wall), "cpu": round((user + system) / wall, 3),
            "user_s": round(user, 2), "system_s": round(system, 2),
            "cpu_ms_per_mb": round(1e3 * (user + system) / mb, 3)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from app.data.input import order

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("file", type=Path, help="A cache's train_x.f32 (larger than the group).")
    p.add_argument("--seconds", type=float, default=20.0, help="Seconds each mode reads.")
    p.add_argument("--row-bytes", type=int, default=4 * 20 * 195, help="Bytes a row.")
    p.add_argument("--threads", default="4,8,16", help="O_DIRECT threads, comma-separated.")
    p.add_argument("--hits-gib", type=float, default=2.0, help="GiB read for the hits mode.")
    p.add_argument("--memory-limit-gib", type=float, default=4.0, help="The group's limit.")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        hits = int(a.hits_gib * (1 << 30))
        print(json.dumps(measure(a.file, a.child, a.seconds, a.row_bytes, order.BLOCK_ROWS, hits)))
        return 0
    from benchmarks import cgroup_run
    from benchmarks.run import machine

    reason = cgroup_run.unavailable_reason(cgroup_run.MEMORY_MOUNT, "memory")
    if reason or not a.file.is_file():
        print(f"disk_reads: {reason or f'{a.file}: no such file'}", file=sys.stderr)
        return 2
    print(json.dumps(machine()), file=sys.stderr)
    threads = [f"O_DIRECT×{t}" for t in a.threads.split(",") if t]
    for mode in ["page cache", "page cache, hits", *threads]:
        print(json.dumps(_child(a, mode), ensure_ascii=False))
    return 0


def _child(a: argparse.Namespace, mode: str) -> dict:
    """``mode`` measured in a fresh process: inside a fresh memory group with the file's
    pages dropped first, or (the hits) outside it with the blocks' range read first."""
    from benchmarks import cgroup_run

    fd = os.open(a.file, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    if mode == "page cache, hits":
        with open(a.file, "rb", buffering=0) as f:
            left = int(a.hits_gib * (1 << 30))
            while left > 0 and (got := len(f.read(min(left, 1 << 24)))):
                left -= got
    argv = [sys.executable, "-m", "benchmarks.disk_reads", str(a.file), "--child", mode,
            "--seconds", str(a.seconds), "--row-bytes", str(a.row_bytes),
            "--hits-gib", str(a.hits_gib)]  # fmt: skip
    repo = Path(__file__).resolve().parents[1]
    if mode == "page cache, hits":
        out, failcnt = subprocess.run(argv, capture_output=True, text=True, cwd=repo), None
    else:
        with cgroup_run.memory_cgroup(int(a.memory_limit_gib * (1 << 30)), "disk-reads") as g:
            out = subprocess.run(g.command(argv), capture_output=True, text=True, cwd=repo)
            failcnt = g.failcnt()
    if out.returncode != 0:  # e.g. a file system that refuses O_DIRECT (EINVAL)
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"mode": mode, "error": last}
    return {**json.loads(out.stdout.splitlines()[-1]), "failcnt": failcnt}


if __name__ == "__main__":
    raise SystemExit(main())
