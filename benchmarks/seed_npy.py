"""The seed's scale read in place: the same 810,901 training rows as a float32 ``.npy`` against
the text, ``coretrain train`` from a cold cache directory to the first steps.

``python -m benchmarks.seed_npy --work DIR --scratch DIR`` (not in CI). ``--work``: the
seed-scale benchmark's directory (``python -m benchmarks.seed_scale --work DIR
--build-only`` made ``DIR/data-seed``: 31.9 GB of text, read only here). ``--scratch``: where
the caches, the outputs and the ``.npy`` go (needs ~13 GB free; everything written there is
removed at the end).

The ``.npy`` holds the values the text parses to: the text repeats a block of
``build.json``'s ``block`` distinct lines, so that block is parsed (the project's parser) and
the arrays are written by repeating its rows as the text repeats its lines; the test files
and the labels are written the same way. The two runs then train the same values: the
runs' data fingerprints (``checkpoints/run.json``) are compared, and must be equal.

Each run is ``coretrain train`` with ``--max-steps`` steps (default 10), ``--formulation
plain --precision float32`` (no timing of candidates: the same step for both), in a fresh
cache directory; the report gives for each: the seconds from the ``start`` event to the
first steps (``steps_per_loop``), the conversion's or the in-place scan's seconds (``cache``
events), the bytes the process wrote (``ru_oublock`` × 512 of the children's rusage: the bytes it
dirtied, whether or not written back yet) and the bytes left in the cache directory
(``train_x.f32`` and the rest), and the ratios npy / text. The ``.npy`` files are written
to disk and dropped from the page cache before the run (:func:`drop_cached`), as the text
does not fit in it. The text's cache is removed before the ``.npy`` is built, so the disk
holds one of them at a time: the runs are one after the other (text first), not
interleaved. Prints a table on stderr and the JSON report
on stdout (also ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ROLES = ("train_features", "train_labels", "test_features", "test_labels")


def log(message: str) -> None:
    print(f"[seed-npy {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_npy(text_dir: Path, out: Path, height: int, width: int) -> dict[str, Any]:
    """The .npy arrays of the seed-scale text in ``text_dir`` (module docstring) into
    ``out``; their sizes and the seconds taken."""
    from app.data.formats import textfile

    spec = json.loads((text_dir / "build.json").read_text())["spec"]
    rows = {"train": spec["train"], "test": spec["test"]}
    out.mkdir(parents=True, exist_ok=True)
    t0, sizes = time.perf_counter(), {}
    for role in ROLES:
        n = rows[role.split("_")[0]]
        block_rows = min(spec["block"], n)
        chunks, got = [], 0
        for chunk in textfile.iter_chunks(text_dir / f"{role}.txt", chunk_rows=512):
            chunks.append(np.array(chunk[: block_rows - got]))
            got += len(chunks[-1])
            if got >= block_rows:
                break
        block = np.concatenate(chunks)
        shape = (n, height, width) if "features" in role else (n, block.shape[1])
        part = out / f".{role}.npy.part"
        array = np.lib.format.open_memmap(part, "w+", np.float32, shape)
        flat = array.reshape(n, -1)
        for start in range(0, n, block_rows):
            stop = min(start + block_rows, n)
            flat[start:stop] = block[: stop - start]
        array.flush()
        del array, flat
        os.replace(part, out / f"{role}.npy")
        sizes[role] = drop_cached(out / f"{role}.npy")
    return {"bytes": sizes, "seconds": round(time.perf_counter() - t0, 1)}


def drop_cached(path: Path) -> int:
    """Write ``path`` to disk and drop its pages from the page cache (``fsync``, then
    ``posix_fadvise(POSIX_FADV_DONTNEED)``), so that the run reads it from the disk as the
    text run reads its 31.9 GB (more than the page cache holds); its size."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _stamp(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["timestamp"]).timestamp()


def run(data: Path, out: Path, cache: Path, steps: int) -> dict[str, Any]:
    """One ``coretrain train`` (module docstring): its events' timings, bytes written,
    cache left."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    argv = [sys.executable, "-m", "app", "train", "--data", str(data), "--output", str(out),
            "--cache-dir", str(cache), "--max-steps", str(steps), "--eval-every", str(steps),
            "--checkpoint-every", str(steps), "--formulation", "plain",
            "--precision", "float32"]  # fmt: skip
    t0 = time.time()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)  # fmt: skip
    stdout, stderr = proc.communicate()
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    first: dict[str, dict[str, Any]] = {}
    for r in records:
        first.setdefault(r["event"], r)
    start = _stamp(first["start"])
    ready = [r for r in records if r["event"] == "cache" and "train_size" in r]
    began = [r for r in records if r["event"] == "cache" and r.get("reused") is False]
    left = {p.name: p.stat().st_size for p in cache.rglob("*") if p.is_file()}
    identity = json.loads((out / "checkpoints" / "run.json").read_text()).get("data", {})
    return {
        "exit": proc.returncode,
        "stderr": stderr.strip().splitlines()[-1:] if proc.returncode else [],
        "wall_s": round(time.time() - t0, 1),
        "start_to_first_steps_s": round(_stamp(first["steps_per_loop"]) - start, 1),
        "cache_s": round(_stamp(ready[0]) - _stamp(began[0]), 1) if ready and began else None,
        "cache_bytes_left": sum(left.values()),
        "cache_features_bytes": left.get("train_x.f32", 0),
        "identity": identity,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="The seed-scale benchmark's dir.")
    p.add_argument("--scratch", type=Path, required=True, help="Caches, outputs, the .npy.")
    p.add_argument("--max-steps", type=int, default=10, help="Steps of each run.")
    p.add_argument("--out", type=Path, help="Also write the JSON report here.")
    args = p.parse_args(argv)
    text_dir = args.work / "data-seed"
    args.scratch.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"cpu": _cpu_model(), "cpus": os.cpu_count(), "runs": {}}
    try:
        for name in ("text", "npy"):
            data = text_dir
            if name == "npy":
                log("building the .npy arrays from the text's repeated block ...")
                report["npy_build"] = build_npy(text_dir, args.scratch / "npy", 20, 195)
                data = args.scratch / "npy"
            log(f"{name}: coretrain train, cold cache ...")
            before = resource_children()
            result = run(data, args.scratch / f"out-{name}", args.scratch / f"cache-{name}",
                         args.max_steps)  # fmt: skip
            result["bytes_written"] = (resource_children() - before) * 512
            report["runs"][name] = result
            log(f"{name}: {json.dumps({k: v for k, v in result.items() if k != 'identity'})}")
            shutil.rmtree(args.scratch / f"cache-{name}", ignore_errors=True)
            shutil.rmtree(args.scratch / f"out-{name}", ignore_errors=True)
    finally:
        shutil.rmtree(args.scratch / "npy", ignore_errors=True)
    text, npy = report["runs"]["text"], report["runs"]["npy"]
    report["same_values"] = text["identity"] == npy["identity"]
    report["ratios_npy_over_text"] = {
        key: round(npy[key] / max(text[key], 1), 5)
        for key in ("start_to_first_steps_s", "bytes_written", "cache_features_bytes")
    }
    text_report = json.dumps(report, indent=2)
    print(text_report)
    if args.out:
        args.out.write_text(text_report)
    log(f"ratios npy/text: {report['ratios_npy_over_text']}; same values: {report['same_values']}")
    return 0


def resource_children() -> int:
    """Blocks (512 B) written so far by this process's waited-for children."""
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_oublock


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
