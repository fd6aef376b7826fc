"""Text ingest: MB/s and samples/s of the seed's decode_csv, pandas and the project's converter.

Each measurement runs in its own process (:mod:`benchmarks.worker`) on the same
``train_features.txt`` (4,000 samples of 3,900 fields by default, ~120 MB):

* ``decode_csv``: the seed's way, ``tf.data.TextLineDataset`` + ``tf.io.decode_csv`` with
  3,900 float columns, one line per call, ``num_parallel_calls=AUTOTUNE``, on the first
  ``--decode-csv-lines`` lines only (it is ~20× slower than the rest);
* ``pandas``: ``pandas.read_csv(sep=" ", header=None, dtype=float32)``, the C parser, when
  pandas imports in ``pandas_python`` (never a dependency of the project: skipped with a
  note otherwise). Its process runs helper threads (pandas 3.1 used ~1.7 CPUs here), so
  ``pandas_one_cpu`` also runs it with its affinity set to one CPU: one process on one
  core, like the one-thread converter;
* ``npy in place``: the same samples as a float32 ``.npy`` (written once from the text by
  the project's parser), read as the cache reads an array used in place: its rows through
  the format seam (:class:`app.data.formats.npy.NpyArray`), checked for NaN/Inf, summed
  and digested, nothing written. Its MB/s counts the *text's* bytes (the same samples), so
  it compares with the text rows directly;
* ``converter Nt``: :func:`app.data.formats.textfile.parallel.convert_file` with N threads (one
  process),
  into a temporary file; 1 is one pass. Every round starts with the text in the page cache
  (read through once first): several threads drop each range they parsed from it, so the
  round after a 2-thread one read its text from the disk (a 1-thread round, in the
  interleaved order).

MB are 10^6 bytes of text. ``cpu_s_measured`` is the measured process's CPU time (all its
threads); ``MB per CPU-s`` is therefore what one fully used core converts, an estimate that
load from other processes on the machine hardly moves (a 2-thread run's is lower than a
1-thread run's by what the threads cost each other: the GIL, memory bandwidth, caches).
``peak_rss_mb``: the process's largest resident set (ru_maxrss). A cProfile of the
one-thread converter on the first lines shows which functions bound it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import worker

MODULE = "benchmarks.ingest"


# --- workers (run in subprocesses) ----------------------------------------------------------


def _decode_csv(spec: dict[str, Any]) -> dict[str, Any]:
    import tensorflow as tf

    width, lines = spec["width"], spec["lines"]
    defaults = [[0.0]] * width

    def parse(line: tf.Tensor) -> tf.Tensor:
        return tf.stack(tf.io.decode_csv(line, record_defaults=defaults, field_delim=" "))

    ds = tf.data.TextLineDataset(spec["path"]).take(lines)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(100)
    rows, wall, cpu = worker.timed(lambda: sum(int(b.shape[0]) for b in ds))
    return {"rows": rows, "wall_s": wall, "cpu_self_s": cpu}


def _pandas(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("one_cpu"):  # before numpy starts its threads: they inherit the mask
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import numpy as np
    import pandas as pd

    def read() -> Any:
        return pd.read_csv(spec["path"], sep=" ", header=None, dtype=np.float32, engine="c")

    frame, wall, cpu = worker.timed(read)
    return {"rows": len(frame), "wall_s": wall, "cpu_self_s": cpu, "pandas": pd.__version__}


def _convert(spec: dict[str, Any]) -> dict[str, Any]:
    import resource

    from app.data.formats.textfile import parallel

    _read_through(spec["path"])  # the same start every round (module docstring)
    with tempfile.TemporaryDirectory(dir=spec.get("tmp")) as tmp:
        done, wall, cpu = worker.timed(
            lambda: parallel.convert_file(
                spec["path"], Path(tmp) / "x.f32", width=spec["width"], threads=spec["threads"]
            )
        )
    return {
        "rows": done.rows,
        "threads": done.threads,
        "ranges": done.ranges,
        "wall_s": wall,
        "cpu_self_s": cpu,
        "rss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _read_through(path: str) -> None:
    """Read the file once, so the page cache holds it: a conversion in several threads
    drops each range it parsed from the page cache (app/data/formats/textfile/parallel.py),
    and the round after it would otherwise read the text from the disk."""
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass


def _npy_in_place(spec: dict[str, Any]) -> dict[str, Any]:
    import hashlib

    import numpy as np

    from app.data.formats.base import Shape, add_sums
    from app.data.formats.npy import NpyArray

    def scan() -> int:
        array, width = NpyArray(Path(spec["path"])), spec["width"]
        digest, rows = hashlib.blake2b(digest_size=32), 0
        total, total_sq = np.zeros(width), np.zeros(width)
        for chunk in array.chunks(Shape(width), allow_nonfinite=False):
            digest.update(chunk.data)
            add_sums(chunk, total, total_sq)
            rows += len(chunk)
        return rows

    rows, wall, cpu = worker.timed(scan)
    return {"rows": rows, "wall_s": wall, "cpu_self_s": cpu}


def _make_npy(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    from app.data.formats import textfile

    rows = np.concatenate(list(textfile.iter_chunks(spec["path"], width=spec["width"])))
    np.save(spec["out"], rows, allow_pickle=False)
    return {"rows": len(rows)}


def _profile(spec: dict[str, Any]) -> dict[str, Any]:
    import cProfile
    import pstats

    from app.data.formats import textfile

    profile = cProfile.Profile()
    profile.enable()
    for _ in textfile.iter_chunks(spec["path"], width=spec["width"]):
        pass
    profile.disable()
    stats = pstats.Stats(profile)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (file, line, func), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{Path(file).name}:{line}({func})",
                "calls": calls,
                "self_s": round(tottime, 3),
                "cumulative_s": round(cumtime, 3),
            }
        )
    rows.sort(key=lambda r: -r["self_s"])
    return {"total_s": round(total, 3), "top": rows[: spec.get("top", 8)]}


def _generate(spec: dict[str, Any]) -> dict[str, Any]:
    """Write the synthetic data set (in a worker: its arrays would otherwise stay in the
    driver, whose resident set every later fork+exec'd worker's ru_maxrss includes)."""
    from app.data import synthetic

    _, wall, _ = worker.timed(
        lambda: synthetic.generate(
            Path(spec["out"]), train=spec["train"], test=spec["test"], seed=spec["seed"]
        )
    )
    return {"wall_s": round(wall, 2)}


WORKERS = {
    "decode_csv": _decode_csv,
    "pandas": _pandas,
    "convert": _convert,
    "npy_in_place": _npy_in_place,
    "make_npy": _make_npy,
    "profile": _profile,
    "generate": _generate,
}


# --- driver ---------------------------------------------------------------------------------


def head(src: Path, dst: Path, lines: int) -> int:
    """Copy the first ``lines`` lines of ``src`` to ``dst``; return their bytes."""
    size = 0
    with open(src, "rb") as f, open(dst, "wb") as out:
        for _ in range(lines):
            line = f.readline()
            if not line:
                break
            out.write(line)
            size += len(line)
    return size


def pandas_python(candidate: str | None) -> tuple[str | None, str]:
    """(interpreter that imports pandas or None, note): ``candidate`` first, then this one."""
    import subprocess

    for python in [p for p in (candidate, sys.executable) if p]:
        proc = subprocess.run([python, "-c", "import pandas"], capture_output=True, timeout=120)
        if proc.returncode == 0:
            return python, f"pandas from {python}"
    return None, "skipped: pandas is not importable (optional; pass --pandas-python)"


def _rates(result: dict[str, Any], nbytes: int) -> dict[str, Any]:
    """Add MB/s, samples/s and MB per CPU-second to one worker result."""
    if "error" in result:
        return result
    wall = result["wall_s"]
    cpu = result["cpu_self_s"]
    result.update(
        mb=round(nbytes / 1e6, 1),
        mb_per_s=round(nbytes / 1e6 / wall, 1),
        samples_per_s=round(result["rows"] / wall, 1),
        mb_per_cpu_s=round(nbytes / 1e6 / cpu, 1) if cpu > 0 else None,
        wall_s=round(wall, 3),
        cpu_s_measured=round(cpu, 3),
    )
    return result


def _median(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median wall time (all its fields), plus every round's wall time."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return results[-1]
    ok.sort(key=lambda r: r["wall_s"])
    best = dict(ok[(len(ok) - 1) // 2])
    best["rounds_wall_s"] = [r["wall_s"] for r in results if "error" not in r]
    return best


def measure(
    data_dir: Path,
    tf_env: dict[str, str],
    *,
    threads: list[int],
    pandas_py: str | None,
    rounds: int = 3,
    decode_csv_lines: int = 1000,
    width: int = 3900,
    log: Any = print,
) -> dict[str, Any]:
    """Run every ingest measurement on ``data_dir/train_features.txt``; return the report part.

    ``tf_env``: the environment (thread plan) for every worker. ``threads``: converter
    thread counts to measure (``rounds`` times each; the median round is kept).
    """
    src = data_dir / "train_features.txt"
    nbytes = src.stat().st_size
    scratch = data_dir / "scratch"
    scratch.mkdir(exist_ok=True)
    subset = scratch / f"first_{decode_csv_lines}.txt"
    subset_bytes = head(src, subset, decode_csv_lines)
    env = dict(tf_env)
    out: dict[str, Any] = {"file": str(src), "mb": round(nbytes / 1e6, 1)}

    log(f"ingest: decode_csv on the first {decode_csv_lines} lines ...")
    spec = {"kind": "decode_csv", "path": str(subset), "lines": decode_csv_lines, "width": width}
    out["decode_csv"] = _rates(worker.run(MODULE, spec, env), subset_bytes)

    python, note = pandas_python(pandas_py)
    out["pandas_note"] = note
    if python is not None:
        for name, one_cpu in (("pandas", False), ("pandas_one_cpu", True)):
            runs = []
            for r in range(rounds):
                log(f"ingest: {name}, round {r + 1}/{rounds} ...")
                spec = {"kind": "pandas", "path": str(src), "width": width, "one_cpu": one_cpu}
                runs.append(_rates(worker.run(MODULE, spec, env, python=python), nbytes))
            out[name] = _median(runs)

    # Interleaved rounds (1 thread, 2 threads, 1 thread, ...): a disturbance then hits
    # both counts alike rather than all rounds of one.
    runs: dict[str, list[dict[str, Any]]] = {f"converter_{t}t": [] for t in threads}
    npy = scratch / "train_features.npy"
    worker.run(MODULE, {"kind": "make_npy", "path": str(src), "width": width, "out": str(npy)}, env)
    runs["npy_in_place"] = []
    for r in range(rounds):
        for t in threads:
            log(f"ingest: converter, {t} thread(s), round {r + 1}/{rounds} ...")
            spec = {"kind": "convert", "path": str(src), "width": width, "threads": t}
            spec["tmp"] = str(scratch)
            runs[f"converter_{t}t"].append(_rates(worker.run(MODULE, spec, env), nbytes))
        log(f"ingest: .npy read in place, round {r + 1}/{rounds} ...")
        spec = {"kind": "npy_in_place", "path": str(npy), "width": width}
        runs["npy_in_place"].append(_rates(worker.run(MODULE, spec, env), nbytes))
    npy.unlink()
    for name, results in runs.items():
        out[name] = _median(results)
    log(f"ingest: converter with 1 thread on the first {decode_csv_lines} lines (memory) ...")
    spec = {"kind": "convert", "path": str(subset), "width": width, "threads": 1}
    spec["tmp"] = str(scratch)
    out["converter_1t_small_file"] = _rates(worker.run(MODULE, spec, env), subset_bytes)
    log("ingest: profile of the one-thread converter ...")
    spec = {"kind": "profile", "path": str(subset), "width": width}
    out["converter_profile"] = worker.run(MODULE, spec, env)
    return out


def ratios(part: dict[str, Any], threads: list[int]) -> dict[str, Any]:
    """The ingest targets as ratios (None where a side is missing)."""

    def rate(name: str, key: str) -> float | None:
        value = part.get(name, {}).get(key)
        return float(value) if isinstance(value, int | float) else None

    def div(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    one = "converter_1t"
    out = {
        "converter_1t_over_pandas": div(rate(one, "mb_per_s"), rate("pandas", "mb_per_s")),
        "converter_1t_over_pandas_per_cpu_s": div(
            rate(one, "mb_per_cpu_s"), rate("pandas", "mb_per_cpu_s")
        ),
        "converter_1t_over_pandas_one_cpu": div(
            rate(one, "mb_per_s"), rate("pandas_one_cpu", "mb_per_s")
        ),
        "converter_1t_over_decode_csv": div(rate(one, "mb_per_s"), rate("decode_csv", "mb_per_s")),
        "npy_in_place_over_converter_1t": div(
            rate("npy_in_place", "mb_per_s"), rate(one, "mb_per_s")
        ),
    }
    for t in threads:
        if t > 1:
            name = f"converter_{t}t"
            out[f"{name}_over_1t"] = div(rate(name, "mb_per_s"), rate(one, "mb_per_s"))
    return out


if __name__ == "__main__":
    if not worker.serve(WORKERS):
        sys.exit("benchmarks.ingest runs as a worker of benchmarks.run (make bench)")
    os._exit(0)  # TF's threads can hang a normal interpreter exit
