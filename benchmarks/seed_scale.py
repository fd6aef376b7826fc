"""The seed's scale: 810,901 training samples, 15 outputs, ``coretrain train`` with defaults.

``python -m benchmarks.seed_scale --work DIR`` (not in CI; needs about 48 GB free in DIR:
31.0 GB of text for the seed-scale set, 12.7 + 0.3 GB for its binary cache, 4 GB of text
and cache for the resident comparison set) builds the data sets once by repeating a
generated block (``--block`` distinct samples, default 2,000: the synthetic spectra of
:mod:`app.data.synthetic`, with 15 label columns derived from its 3; features written with
``%.6g``, 38.2 KB a line), then runs ``coretrain train`` in fresh processes, each to the
default 3,300 steps (batch 1,000), and reports for each run:

* the conversion (first run only: the cache is built, its time and MB/s of text);
* the time to the first step (``start`` event → ``steps_per_loop``, logged after the first
  two calls into TensorFlow) and to the input decision (``input``);
* the training rate (median of the ``progress`` windows after the first; also without the
  windows' evaluations, ``train_samples_per_s``, and the run's seconds evaluating), the same run's
  chosen-step rate (the ``choice`` event's timing of the step it picked), their ratio, and
  the median ``cpu_util``;
* peak RSS (``ru_maxrss`` via ``wait4``), and the wall time from text to exported model.

Runs (``--runs``, default all, in this order): ``streamed`` (the seed-scale set, converted
from text: the cache is removed first), ``resident`` (a ``--resident-rows`` set built the
same way, small enough to be held in memory, so the run gathers its batches from memory:
the resident rate of the same code), ``memory4g`` (the seed-scale set inside a fresh
cgroup v1 memory group with ``memory.limit_in_bytes`` = 4 GiB; the cache file's pages are
dropped from the page cache first with ``posix_fadvise(DONTNEED)``, so its reads are
charged to the group and bounded by its limit), ``cpus1`` (a cpu group with a CFS quota of
1 CPU, as ``docker run --cpus 1``). The ratios the targets name are computed from one
invocation. Prints a table on stderr and the JSON report on stdout (also ``--out``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SEED_TRAIN = 810_901
SEED_TEST = 20_000
OUTPUTS = 15
GIB = 1 << 30
MEMORY_LIMIT = 4 * GIB
RUNS = ("streamed", "resident", "memory4g", "cpus1")


def log(message: str) -> None:
    print(f"[seed-scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _block_text(block: int, outputs: int, seed: int) -> tuple[bytes, bytes]:
    """``block`` samples as text: (features lines ``%.6g``, labels lines, ``outputs`` each)."""
    from app.data import synthetic

    feats, labels = synthetic.make_samples(block, np.random.default_rng(seed))
    # 15 outputs: the 3 labels and 12 smooth functions of them (the job only sees columns).
    extra = [np.sin((j + 1) * labels[:, j % 3]) * (1 + j / 10) for j in range(outputs - 3)]
    wide = np.concatenate([labels, np.stack(extra, axis=1)], axis=1)[:, :outputs]
    texts = []
    for rows, fmt in ((feats.reshape(block, -1), "%.6g"), (wide, "%.6g")):
        buf = io.BytesIO()
        np.savetxt(buf, rows, fmt=fmt)
        texts.append(buf.getvalue())
    return texts[0], texts[1]


def _repeat(path: Path, text: bytes, lines: int) -> int:
    """Write ``lines`` lines to ``path``: ``text`` (whole lines) repeated, the last copy cut
    short; atomic (temp + rename). Returns the bytes written."""
    count = text.count(b"\n")
    full, rest = divmod(lines, count)
    cut = 0
    for _ in range(rest):
        cut = text.index(b"\n", cut) + 1
    part = path.with_suffix(".part")
    with open(part, "wb") as f:
        for _ in range(full):
            f.write(text)
        f.write(text[:cut])
    os.replace(part, path)
    return path.stat().st_size


def build(out: Path, train: int, test: int, block: int, outputs: int = OUTPUTS) -> dict:
    """The data set in ``out`` (kept: rebuilt only when ``build.json`` differs)."""
    want = {"train": train, "test": test, "block": block, "outputs": outputs, "format": "%.6g"}
    record = out / "build.json"
    if record.is_file() and json.loads(record.read_text()).get("spec") == want:
        return json.loads(record.read_text())
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sizes = {}
    for split, n, seed in (("train", train, 0), ("test", test, 1)):
        fx, fy = _block_text(min(block, n), outputs, seed)
        sizes[f"{split}_features"] = _repeat(out / f"{split}_features.txt", fx, n)
        sizes[f"{split}_labels"] = _repeat(out / f"{split}_labels.txt", fy, n)
    done = {"spec": want, "bytes": sizes, "seconds": round(time.perf_counter() - t0, 1)}
    record.write_text(json.dumps(done))
    return done


def _stamp(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["timestamp"]).timestamp()


def page_cached(cache_root: Path) -> int | None:
    """Bytes of the training features file under ``cache_root`` now in the page cache
    (``fincore``); None when there is no such file or no fincore."""
    files = sorted(cache_root.glob("*/train_x.f32"))
    if not files or shutil.which("fincore") is None:
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(files[0])],
                         capture_output=True, text=True, check=False).stdout.split()  # fmt: skip
    return int(out[0]) if out and out[0].isdigit() else None


def drop_cached(cache_root: Path) -> int:
    """Drop the clean page-cache pages of every array file under ``cache_root`` (the
    float32 arrays and the training rows rounded to bfloat16; ``posix_fadvise
    (POSIX_FADV_DONTNEED)``: only these files); bytes of files touched."""
    total = 0
    for path in [*cache_root.rglob("*.f32"), *cache_root.rglob("*.bf16")]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def train(
    data: Path, out: Path, cache: Path, wrap: list[str], env: dict[str, str], extra: list[str]
) -> dict:
    """``coretrain train`` with defaults and ``extra`` (``wrap``: a cgroup's ``sh -c``
    prefix); its events and rusage."""
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, "-m", "app", "train", "--data", str(data), "--output", str(out)]
    argv += ["--cache-dir", str(cache), *extra]
    t0 = time.time()
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen([*wrap, *argv], stdout=subprocess.PIPE, stderr=errors,
                                text=True, env=env, cwd=REPO)  # fmt: skip
        assert proc.stdout is not None
        records = [json.loads(line) for line in proc.stdout if line.startswith("{")]
        _, status, usage = os.wait4(proc.pid, 0)
        errors.seek(0)
        err = errors.read()
    wall = time.time() - t0
    return {"records": records, "exit": os.waitstatus_to_exitcode(status), "wall_s": wall,
            "peak_rss_bytes": usage.ru_maxrss * 1024, "t0": t0, "stderr": err[-800:]}  # fmt: skip


def summarize(run: dict[str, Any], text_bytes: int) -> dict[str, Any]:
    """The figures of one run (see the module docstring)."""
    records = run["records"]
    first: dict[str, dict[str, Any]] = {}
    for r in records:
        first.setdefault(r["event"], r)
    progress = [r for r in records if r["event"] == "progress"]
    steady = progress[1:] or progress
    out: dict[str, Any] = {
        "exit": run["exit"],
        "wall_s": round(run["wall_s"], 1),
        "peak_rss_mb": round(run["peak_rss_bytes"] / 1e6),
    }
    if run["exit"] != 0:
        out["stderr"] = run["stderr"]
    start = _stamp(first["start"]) if "start" in first else run["t0"]
    converting = [r for r in records if r["event"] == "cache" and r.get("reused") is False]
    ready = [r for r in records if r["event"] == "cache" and "train_size" in r]
    if converting and ready:
        seconds = _stamp(ready[0]) - _stamp(converting[0])
        out["conversion_s"] = round(seconds, 1)
        out["conversion_mb_per_s"] = round(text_bytes / 1e6 / seconds)
    for name in ("input", "steps_per_loop"):
        if name in first:
            out[f"start_to_{name}_s"] = round(_stamp(first[name]) - start, 1)
    if "input" in first:
        keep = ("resident", "split_bytes", "resident_limit", "input", "message")
        out["input"] = {k: first["input"][k] for k in keep if k in first["input"]}
    if "input_loaded" in first:
        out["load_s"] = first["input_loaded"]["seconds"]
    if steady:
        out["samples_per_s"] = round(statistics.median(r["examples_per_sec"] for r in steady))
        if all("train_examples_per_sec" in r for r in steady):  # without the evaluations
            rates = [r["train_examples_per_sec"] for r in steady]
            out["train_samples_per_s"] = round(statistics.median(rates))
            out["eval_s"] = round(sum(r["eval_s"] for r in progress), 1)
        out["cpu_util"] = round(statistics.median(r["cpu_util"] for r in steady), 3)
        out["windows"] = [round(r["examples_per_sec"]) for r in progress]
    choice = first.get("choice")
    if choice:
        wall = choice.get("wall_timings") or choice["timings"]  # wall ms (CPU ms: timings)
        ms = wall[f"{choice['formulation']}/{choice['precision']}"]
        out["chosen"] = f"{choice['formulation']}/{choice['precision']}"
        batch = first["start"]["config"]["batch_size"] if "start" in first else 1000
        step_rate = out["chosen_step_samples_per_s"] = round(batch * 1000 / ms)
        if out.get("samples_per_s"):
            out["over_chosen_step"] = round(out["samples_per_s"] / step_rate, 3)
    if "end" in first:
        out["end_status"] = first["end"].get("status")
        out["final_step"] = first["end"].get("final_step")
    return out


def _env() -> dict[str, str]:
    """The environment a user's ``coretrain train`` would see (no CORETRAIN_/TF_NUM_*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORETRAIN_", "TF_NUM"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def one_run(name: str, args: argparse.Namespace, sets: dict[str, dict]) -> dict[str, Any]:
    """Run ``name`` (one of :data:`RUNS`) and summarise it."""
    from benchmarks import cgroup_run

    which = "resident" if name == "resident" else "seed"
    data, cache = args.work / f"data-{which}", args.work / f"cache-{which}"
    text = sum(sets[which]["bytes"].values())
    if name in ("streamed", "resident") and not args.keep_cache:
        shutil.rmtree(cache, ignore_errors=True)  # converted from text by this run
    extra: dict[str, Any] = {}
    with ExitStack() as stack:
        wrap: list[str] = []
        group: Any = None
        if name == "memory4g":
            extra["dropped_from_page_cache_bytes"] = drop_cached(cache)
            group = stack.enter_context(cgroup_run.memory_cgroup(MEMORY_LIMIT, "seed-scale"))
            wrap = group.command([])
        elif name == "cpus1":
            group = stack.enter_context(cgroup_run.cpu_cgroup(1.0, "seed-scale"))
            wrap = group.command([])
        extra["page_cached_at_start_bytes"] = page_cached(cache)
        extra["loadavg_at_start"] = [round(v, 2) for v in os.getloadavg()]
        log(f"{name}: coretrain train on {data.name} ...")
        steps = ["--max-steps", str(args.max_steps)] if args.max_steps else []
        run = train(data, args.work / f"out-{name}", cache, wrap, _env(), steps)
        if name == "memory4g":
            extra.update(cgroup_peak_bytes=group.peak(), cgroup_failcnt=group.failcnt())
    return {"run": name, **summarize(run, text), **extra}


def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets' ratios from one invocation's rows: the i-th run of each name over the
    i-th ``resident`` run (``--runs resident,streamed,resident,streamed`` interleaves them,
    so a disturbance of the shared machine hits both of a pair), and their median; of the
    ``progress`` rates, and (``_training``) of the rates without the evaluations, which
    differ between the sets: 10 % of each set's rows are evaluated every 100 steps."""
    out: dict[str, Any] = {}
    for field, suffix in (("samples_per_s", ""), ("train_samples_per_s", "_training")):
        rates: dict[str, list[float]] = {}
        for r in rows:
            if r.get(field):
                rates.setdefault(r["run"], []).append(r[field])
        for name in ("streamed", "memory4g"):
            mine, resident = rates.get(name, []), rates.get("resident", [])
            pairs = [round(a / b, 3) for a, b in zip(mine, resident, strict=False)]
            if pairs:
                out[f"{name}_over_resident{suffix}"] = statistics.median(pairs)
                out[f"{name}_over_resident{suffix}_rounds"] = pairs
    return out


def table(report: dict[str, Any]) -> str:
    head = f"{'run':10} {'samples/s':>9} {'train':>7} {'step':>7} {'/step':>6} {'cpu':>5}"
    head += f" {'RSS MB':>7}"
    head += f" {'wall s':>7} {'1st step s':>10} {'conv s':>7} {'MB/s':>5}  input"
    lines = [head]
    for r in report["rows"]:
        lines.append(
            f"{r['run']:10} {r.get('samples_per_s', '-'):>9} "
            f"{r.get('train_samples_per_s', '-'):>7} "
            f"{r.get('chosen_step_samples_per_s', '-'):>7} {r.get('over_chosen_step', '-'):>6} "
            f"{r.get('cpu_util', '-'):>5} {r.get('peak_rss_mb', '-'):>7} {r['wall_s']:>7} "
            f"{r.get('start_to_steps_per_loop_s', '-'):>10} {r.get('conversion_s', '-'):>7} "
            f"{r.get('conversion_mb_per_s', '-'):>5}  {r.get('input', {}).get('message', '')}"
        )
    lines.append(json.dumps(report["ratios"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="Where the data, caches, outputs go.")
    p.add_argument("--runs", default=",".join(RUNS), help=f"Comma-separated, of {RUNS}.")
    p.add_argument("--train", type=int, default=SEED_TRAIN, help="Training samples.")
    p.add_argument("--test", type=int, default=SEED_TEST, help="Test samples.")
    p.add_argument("--resident-rows", type=int, default=100_000,
                   help="Training samples of the resident comparison set.")  # fmt: skip
    p.add_argument("--block", type=int, default=2_000, help="Distinct samples repeated.")
    p.add_argument("--max-steps", type=int, help="Steps (default: the job's, 3,300).")
    p.add_argument("--keep-cache", action="store_true", help="Reuse caches (no conversion).")
    p.add_argument("--build-only", action="store_true", help="Build the data sets and stop.")
    p.add_argument("--out", type=Path, help="Also write the JSON report here.")
    args = p.parse_args(argv)
    from benchmarks.run import machine

    runs = [r for r in args.runs.split(",") if r]
    log("building the data sets (kept for the next run) ...")
    sets = {"seed": build(args.work / "data-seed", args.train, args.test, args.block)}
    if "resident" in runs:
        sets["resident"] = build(
            args.work / "data-resident", args.resident_rows, args.test, args.block
        )
    for which, done in sets.items():
        log(f"{which}: {sum(done['bytes'].values()) / 1e9:.2f} GB of text ({done['seconds']} s)")
    if args.build_only:
        return 0
    report: dict[str, Any] = {"machine": machine(), "sets": sets, "rows": []}
    report["started"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    for name in runs:
        row = one_run(name, args, sets)
        report["rows"].append(row)
        log(json.dumps({k: v for k, v in row.items() if k != "windows"}))
    report["ratios"] = ratios(report["rows"])
    report["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
    report["platform"] = platform.platform()
    print(table(report), file=sys.stderr)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
