"""The ``phase`` event: a slow step of the set-up announced as it begins, with its cost.

Each of a run's set-up steps that takes seconds says, before it starts, what it does, about
how long it will take (``estimate_s``) and how to skip it when an option can (``skip``):
timing the formulations, fitting the linear baseline, starting TensorFlow. A person at the
terminal sees why nothing else moves (app/report/view.py); a log collector gets the same
record. The estimates are coarse, from the costs measured on 2 vCPUs (AMD EPYC): timing one
candidate about :data:`TRACE_SECONDS` to trace and warm it up, whatever the batch, and
:data:`CANDIDATE_SECONDS` for its rounds at a batch of 1000 (Zen 4, 2026-12-05: 5.9 s for
four at 1000, 5.6 s at 200), the ridge at :data:`RIDGE_MULTIPLY_ADDS_PER_S` per thread,
TensorFlow's import about :data:`TENSORFLOW_SECONDS`. No TensorFlow here.
"""

from __future__ import annotations

from app import logs

TRACE_SECONDS = 1.0  # per candidate, whatever the batch
CANDIDATE_SECONDS = 0.5  # per candidate's rounds at a batch of 1000 samples
#: Per BLAS thread, with reading and scoring the rows: an 18,000-row sample of 3,900
#: features (2.7e11 multiply-adds) took 5.1–6.8 s with 2 threads on AMD EPYC Zen 4
#: (2026-12-04: the seed's set, its resident set and a 40,000-row set), estimated 6.8 s
#: (was 4e9: 34 s).
RIDGE_MULTIPLY_ADDS_PER_S = 2e10
TENSORFLOW_SECONDS = 3.0


def announce(phase: str, doing: str, estimate_s: float | None, skip: str | None = None) -> None:
    """Log the ``phase`` event: "<doing>, ~N s; <skip>"."""
    cost = f", ~{estimate_s:.0f} s" if estimate_s is not None else ""
    logs.event(
        "phase",
        f"{doing}{cost}" + (f"; {skip}" if skip else ""),
        phase=phase,
        estimate_s=None if estimate_s is None else round(estimate_s, 1),
        skip=skip,
    )


def timing(candidates: list[tuple[str, str]], batch_size: int) -> None:
    """Before the formulations and precisions are timed (app/training/state/choose.py)."""
    names = ", ".join(f"{f}/{p}" for f, p in candidates)
    announce(
        "choice",
        f"timing {len(candidates)} formulations ({names})",
        len(candidates) * (TRACE_SECONDS + CANDIDATE_SECONDS * batch_size / 1000),
        "--formulation fast --precision float32 skips this (the timings are kept beside the "
        "data cache for later runs on this CPU)",
    )


def ridge(rows: int, features: int, threads: int) -> None:
    """Before the linear baseline is fitted on ``rows`` of ``features`` values
    (app/training/inputs/linear.py)."""
    work = rows * min(rows, features) * features
    announce(
        "linear_baseline",
        f"fitting the linear baseline (ridge regression on a sample of {rows:,} rows), the "
        "reference the model must beat",
        work / (RIDGE_MULTIPLY_ADDS_PER_S * max(threads, 1)),
    )


def tensorflow(threads: int) -> None:
    """Before TensorFlow is imported with the planned threads (app/training/run.py)."""
    announce(
        "tensorflow", f"starting TensorFlow with {threads} intra-op threads", TENSORFLOW_SECONDS
    )
