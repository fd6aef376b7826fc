"""Time to model: whole-process wall time of ``coretrain train`` beside a plain Keras script.

``python -m benchmarks.time_to_model --work DIR [--rows 40000] [--steps 50] [--rounds 3]
[--cases cold,warm,resumed,finished]`` (not in CI; ~5 minutes on 2 vCPUs with the defaults)
generates a ``lines`` data set of ``--rows`` training rows once (``coretrain generate``), writes
its arrays as ``.npy`` for the Keras script, then runs ``--rounds`` interleaved rounds. Each
round runs, each in a fresh process, the order alternating from round to round:

* ``keras``: :mod:`benchmarks.npy_keras`, the same CNN (the seed's, plain Keras layers) for
  ``--steps`` batches of 1,000 from the ``.npy`` arrays (its best case: nothing to parse);
* ``cold``: ``coretrain train`` with an empty ``--cache-dir``: the text converted, the
  ridge fitted, the formulations timed;
* ``warm``: a new ``--output``, the shared ``--cache-dir`` already holding the data cache
  and the kept measurements (a warm-up run before the rounds puts them there);
* ``resumed``: a copy of a finished ``--steps`` run resumed to twice ``--steps`` (as many
  steps trained as the others);
* ``finished``: the finished ``--steps`` run rerun with the same options (nothing to do);
* ``tf_import``: ``python -c "import tensorflow"``, the import alone.

``--stream-steps N`` adds two cases (not beside the Keras script: their ratio is to each
other): ``resident``, the shared cache's split held in memory, and ``streamed``, the same run
in a fresh v1 memory cgroup of ``--stream-memory`` bytes (2 GiB: a quarter of it is below
the 40,000-row split, so the run streams it; :mod:`benchmarks.cgroup_run`), each ``N``
steps; reported: the median ``progress`` rate after the first window and the streamed /
resident ratio per round.

``coretrain train`` runs with its defaults (``--formulation auto --precision auto``, an
evaluation every 100 steps). Reported per case: the wall time from the launch to the first
steps (the ``steps_per_loop`` event, logged after the first two calls; the Keras script's
first batch) and to the end, the ratio to the Keras script of the same round (median over
rounds), and the phases read from the run's events: start-up (to ``start``), cache (check
or conversion), baseline, TensorFlow and the choice (to ``choice``; ``choice_measured``
seconds when timed), loading (to ``input``), tracing and the first steps. The CPU model is
printed with the report (JSON on stdout, a table on stderr).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.exec_keras import cpu_model

REPO = Path(__file__).resolve().parents[1]
CORETRAIN = [sys.executable, "-m", "app"]
CASES = ("cold", "warm", "resumed", "finished")
#: The memory cgroup's limit of the ``streamed`` case (module docstring).
STREAM_MEMORY = 2 << 30
#: Events that end each phase, in order (the phase is named by what it measures).
PHASES = (
    ("startup", "start"),
    ("cache", "cache"),
    ("baseline", "linear_baseline"),
    ("tensorflow_and_choice", "choice"),
    ("loading", "input"),
    ("tracing_first_steps", "steps_per_loop"),
    ("training_and_export", "end"),
)


def log(message: str) -> None:
    print(f"[ttm {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def prepare(work: Path, rows: int) -> tuple[Path, Path]:
    """The text data set and its ``.npy`` arrays (made once)."""
    data, npy = work / f"data-{rows}", work / f"npy-{rows}"
    if not (data / "test_labels.txt").exists():
        log(f"generating {rows} rows into {data}")
        subprocess.run(
            [*CORETRAIN, "generate", "--out", str(data), "--train", str(rows), "--test", "2000",
             "--seed", "100", "--kind", "lines"], check=True, cwd=REPO,
        )  # fmt: skip
    if not (npy / "train_y.npy").exists():
        from app.config import TrainConfig
        from app.data import cache
        from app.training.admit.sources import find

        config = TrainConfig.of(data_dir=data, output_dir=work / "npy-cache")
        made = cache.prepare(find(config.data), work / "npy-cache")
        npy.mkdir(parents=True, exist_ok=True)
        np.save(npy / "train_x.npy", np.asarray(made.features("train")))
        np.save(npy / "train_y.npy", np.asarray(made.labels("train")))
        made.release()
        shutil.rmtree(work / "npy-cache")
    return data, npy


def _stamp(record: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(record["timestamp"]).timestamp()


def coretrain(
    out: Path, data: Path, cache_dir: Path, steps: int, wrap: list[str] | None = None,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    """One ``coretrain train`` process: wall times and phases from its events."""
    args = ["train", "--data", str(data), "--output", str(out), "--cache-dir", str(cache_dir),
            "--max-steps", str(steps), *extra]  # fmt: skip
    launched = time.time()
    argv = [*(wrap or []), *CORETRAIN, *args]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    wall = time.time() - launched
    events = []
    for line in proc.stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    if proc.returncode != 0:
        raise SystemExit(f"coretrain train failed ({proc.returncode}): {proc.stderr[-500:]}")
    seen = {e.get("event"): _stamp(e) for e in events if "timestamp" in e}
    phases, last = {}, launched
    for name, event in PHASES:
        if event in seen:
            phases[name], last = round(seen[event] - last, 2), seen[event]
    measured = [e.get("seconds") for e in events if e.get("event") == "choice_measured"]
    choice = next((e for e in events if e.get("event") == "choice"), {})
    ridge = next((e for e in events if e.get("event") == "linear_baseline"), {})
    first = seen.get("steps_per_loop")
    rates = [e["examples_per_sec"] for e in events if e.get("event") == "progress"][1:]
    held = next((e.get("resident") for e in events if e.get("event") == "input"), None)
    return {
        "rate": statistics.median(rates) if rates else None,
        "resident": held,
        "wall_s": round(wall, 2),
        "first_step_s": round(first - launched, 2) if first else None,
        "phases": phases,
        "choice_source": choice.get("source"),
        "choice_timing_s": measured[0] if measured else None,
        "ridge_source": ridge.get("source"),
        "finished": any(e.get("event") == "already_finished" for e in events),
    }


def keras(npy: Path, steps: int) -> dict[str, Any]:
    """One run of the Keras script: wall times and its own stamps."""
    launched = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.npy_keras", str(npy), "--steps", str(steps)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    wall = time.time() - launched
    if proc.returncode != 0:
        raise SystemExit(f"the Keras script failed: {proc.stderr[-500:]}")
    stamps = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "wall_s": round(wall, 2),
        "first_step_s": round(stamps["first_step"] - launched, 2),
        "phases": {
            "tensorflow_import": round(stamps["imported"] - stamps["started"], 2),
            "loading": round(stamps["loaded"] - stamps["imported"], 2),
            "tracing_first_step": round(stamps["first_step"] - stamps["loaded"], 2),
            "training": round(stamps["end"] - stamps["first_step"], 2),
        },
    }


def tf_import() -> dict[str, Any]:
    launched = time.time()
    subprocess.run([sys.executable, "-c", "import tensorflow"], check=True, capture_output=True)
    return {"wall_s": round(time.time() - launched, 2)}


def one_case(case: str, work: Path, data: Path, steps: int, r: int) -> dict[str, Any]:
    """``case`` of round ``r`` (module docstring)."""
    done, shared = work / "finished-run", work / "cache-shared"
    if case == "cold":
        shutil.rmtree(work / "cache-cold", ignore_errors=True)
        shutil.rmtree(work / "out-cold", ignore_errors=True)
        return coretrain(work / "out-cold", data, work / "cache-cold", steps)
    if case == "warm":
        shutil.rmtree(work / "out-warm", ignore_errors=True)
        return coretrain(work / "out-warm", data, shared, steps)
    if case == "resumed":
        shutil.rmtree(work / "out-resumed", ignore_errors=True)
        shutil.copytree(done, work / "out-resumed", symlinks=True)
        return coretrain(work / "out-resumed", data, shared, 2 * steps)
    if case in ("resident", "streamed"):
        return stream_case(case, work, data, steps)
    return coretrain(done, data, shared, steps)  # finished


def stream_case(case: str, work: Path, data: Path, steps: int) -> dict[str, Any]:
    """``resident`` or ``streamed`` (module docstring) for ``steps`` steps."""
    from benchmarks import cgroup_run

    out = work / f"out-{case}"
    shutil.rmtree(out, ignore_errors=True)
    every = ("--eval-every", str(max(steps // 8, 1)))
    if case == "resident":
        return coretrain(out, data, work / "cache-shared", steps, extra=every)
    with cgroup_run.memory_cgroup(STREAM_MEMORY, "ttm") as group:
        found = coretrain(out, data, work / "cache-shared", steps, group.command([]), every)
        found["cgroup_peak_bytes"] = group.peak()
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    work, steps = args.work, args.steps
    work.mkdir(parents=True, exist_ok=True)
    data, npy = prepare(work, args.rows)
    log("warm-up: the shared cache, the kept measurements and a finished run")
    shutil.rmtree(work / "finished-run", ignore_errors=True)
    coretrain(work / "finished-run", data, work / "cache-shared", steps)
    cases = [c for c in args.cases.split(",") if c]
    streams = ["resident", "streamed"] if args.stream_steps else []
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = ["keras", "tf_import", *cases, *streams]
        if r % 2:
            order.reverse()
        got: dict[str, Any] = {}
        for case in order:
            if case == "keras":
                got[case] = keras(npy, steps)
            elif case == "tf_import":
                got[case] = tf_import()
            elif case in streams:
                got[case] = one_case(case, work, data, args.stream_steps, r)
            else:
                got[case] = one_case(case, work, data, steps, r)
            log(f"round {r + 1} {case}: {got[case]['wall_s']} s")
        rounds.append(got)
    found = ratios(rounds, cases)
    if streams:
        per = [r["streamed"]["rate"] / r["resident"]["rate"] for r in rounds]
        found["streamed_over_resident"] = {
            "rate": round(statistics.median(per), 3), "per_round": [round(p, 3) for p in per],
        }  # fmt: skip
    return {"cpu": cpu_model(), "rows": args.rows, "steps": steps, "rounds": rounds,
            "ratios": found}  # fmt: skip


def ratios(rounds: list[dict[str, Any]], cases: list[str]) -> dict[str, Any]:
    """Per case: the median over rounds of wall / the Keras script's wall of the round, and
    of the time to the first steps."""
    out = {}
    for case in cases:
        wall = [r[case]["wall_s"] / r["keras"]["wall_s"] for r in rounds]
        first = [
            r[case]["first_step_s"] / r["keras"]["first_step_s"]
            for r in rounds
            if r[case].get("first_step_s")
        ]
        out[case] = {
            "wall_over_keras": round(statistics.median(wall), 3),
            "per_round": [round(w, 3) for w in wall],
            "first_step_over_keras": round(statistics.median(first), 3) if first else None,
        }
    return out


def table(report: dict[str, Any]) -> str:
    lines = [f"CPU: {report['cpu']}; {report['rows']} rows, {report['steps']} steps"]
    for case, found in report["ratios"].items():
        if case == "streamed_over_resident":
            lines.append(f"streamed / resident rate {found['rate']} (rounds {found['per_round']})")
            continue
        lines.append(
            f"{case:10} wall/keras {found['wall_over_keras']:.2f} (rounds {found['per_round']})"
            f"  first step/keras {found['first_step_over_keras']}"
        )
    for r, got in enumerate(report["rounds"], 1):
        for case, found in got.items():
            lines.append(f"  round {r} {case:10} {json.dumps(found)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--stream-steps", type=int, default=0)
    report = run(parser.parse_args(argv))
    log("\n" + table(report))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
