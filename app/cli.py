"""The ``coretrain`` command line (click). The only module that imports click.

Every option also reads ``CORETRAIN_<OPTION>`` (e.g. ``--max-steps`` ←
``CORETRAIN_MAX_STEPS``). Library errors (:class:`app.errors.AppError`) are
caught once here: a one-line message on stderr and the error's exit code.
TensorFlow is imported lazily, after the thread plan has been applied.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from app import __version__, logs
from app.errors import AppError, Preempted

F = TypeVar("F", bound=Callable[..., Any])


def opt(*decls: str, **kwargs: Any) -> Callable[[F], F]:
    """A click option whose environment variable is ``CORETRAIN_<LONG NAME>``."""
    long = next(d for d in decls if d.startswith("--")).split("/")[0]
    kwargs.setdefault("envvar", "CORETRAIN_" + long[2:].upper().replace("-", "_"))
    kwargs.setdefault("show_envvar", True)
    kwargs.setdefault("show_default", True)
    return click.option(*decls, **kwargs)


def plan_options(f: F) -> F:
    """Options shared by ``plan`` and ``train`` that shape the thread plan."""
    from app.budget.plan import DEFAULT_ROUNDING, PIN_MODES, ROUNDING_RULES

    for decorator in reversed(
        [
            opt(
                "--cpus",
                type=float,
                default=None,
                help="CPU budget in CPUs (may be fractional), instead of detecting it from "
                "cgroups.",
            ),
            opt(
                "--intra-op-threads",
                type=click.IntRange(min=1),
                default=None,
                help="TensorFlow intra-op threads (default: from the CPU budget; "
                "TF_NUM_INTRAOP_THREADS also sets it).",
            ),
            opt(
                "--inter-op-threads",
                type=click.IntRange(min=1),
                default=None,
                help="TensorFlow inter-op threads (default: from the CPU budget; "
                "TF_NUM_INTEROP_THREADS also sets it).",
            ),
            opt(
                "--pin",
                type=click.Choice(PIN_MODES),
                default="auto",
                help="CPU affinity: auto (no pinning; see docs/cpu-budget.md), none, cores "
                "(first N allowed CPUs), physical (one CPU per physical core), numa.",
            ),
            opt(
                "--rounding",
                type=click.Choice(ROUNDING_RULES),
                default=DEFAULT_ROUNDING,
                help="How a fractional CPU budget becomes a thread count.",
            ),
        ]
    ):
        f = decorator(f)
    return f


def build_plan(
    root: str, cpus: float | None, intra: int | None, inter: int | None, pin: str, rounding: str
) -> Any:
    """Detect the budget under ``root`` and make the plan (no TensorFlow import)."""
    from app.budget import cgroups, plan, topology

    overrides = plan.overrides_from(
        os.environ,
        cpus=cpus,
        intra_op_threads=intra,
        inter_op_threads=inter,
        pin=pin,
        rounding=rounding,
    )
    budget = cgroups.detect_budget(root)
    topo = topology.detect_topology(root, budget.cpuset)
    return plan.make_plan(budget, topo, overrides, topology.detect_cpu(root))


def cluster_options(f: F) -> F:
    """Options of ``train`` that make this process one worker of several (docs/distributed.md)."""
    from app.distributed import DEFAULT_CLUSTER_TIMEOUT, DEFAULT_HEARTBEAT_TIMEOUT

    for decorator in reversed(
        [
            opt(
                "--workers",
                type=click.IntRange(min=1),
                default=None,
                help="Train with N worker processes (MultiWorkerMirroredStrategy), e.g. the "
                "pods of an Indexed Job; --batch-size is per worker. TF_CONFIG, if set, "
                "defines the cluster instead.  [default: 1, or TF_CONFIG's]",
                show_default=False,
            ),
            opt(
                "--worker-hosts",
                default=None,
                help='Every worker\'s host[:port]: a pattern with "{index}" '
                '(e.g. "coretrain-{index}.coretrain-workers:12345") or N comma-separated '
                "hosts; the port defaults to 12345.",
            ),
            opt(
                "--worker-index",
                type=click.IntRange(min=0),
                default=None,
                help="This worker's index, 0 = chief.  [default: JOB_COMPLETION_INDEX]",
                show_default=False,
            ),
            opt(
                "--cluster-timeout",
                type=click.FloatRange(min=0, min_open=True),
                default=DEFAULT_CLUSTER_TIMEOUT,
                help="Seconds to wait for all workers to start before failing (exit 6).",
            ),
            opt(
                "--heartbeat-timeout",
                type=click.FloatRange(min=0, min_open=True),
                default=DEFAULT_HEARTBEAT_TIMEOUT,
                help="Seconds without heartbeats after which a worker counts as lost; "
                "the others then stop (exit 6).",
            ),
        ]
    ):
        f = decorator(f)
    return f


def _fail(exc: BaseException) -> None:
    """Report an error in one line on stderr (and as a log event) and exit."""
    if isinstance(exc, AppError):
        code, message = exc.exit_code, str(exc)
        status = "preempted" if isinstance(exc, Preempted) else "failed"
    else:
        code, message, status = 1, f"unexpected error: {type(exc).__name__}: {exc}", "failed"
        logs.event("traceback", "".join(traceback.format_exception(exc)), level=logging.ERROR)
    if status == "failed":
        logs.event("end", message, level=logging.ERROR, status=status, exit_code=code)
    click.echo(f"coretrain: {message}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="coretrain")
def cli() -> None:
    """Train a TensorFlow CNN using exactly the CPUs this container may use."""


@cli.command("plan")
@opt("--format", "fmt", type=click.Choice(["json", "text"]), default="json", help="Output format.")
@opt(
    "--root",
    type=click.Path(file_okay=False),
    default="/",
    help="Read /proc and /sys under this directory instead of / (support cases, tests).",
)
@plan_options
def plan_cmd(
    fmt: str,
    root: str,
    cpus: float | None,
    intra_op_threads: int | None,
    inter_op_threads: int | None,
    pin: str,
    rounding: str,
) -> None:
    """Print the CPU budget and thread plan (never imports TensorFlow)."""
    from app.budget.plan import format_text

    try:
        plan = build_plan(root, cpus, intra_op_threads, inter_op_threads, pin, rounding)
    except AppError as exc:
        _fail(exc)
    if fmt == "json":
        click.echo(json.dumps(plan.to_json(), indent=2))
    else:
        click.echo(format_text(plan))


@cli.command("generate")
@opt(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory to write the four data files into.",
)
@opt(
    "--train", "n_train", type=click.IntRange(min=1), default=3000, help="Training samples (lines)."
)
@opt("--test", "n_test", type=click.IntRange(min=1), default=600, help="Test samples (lines).")
@opt("--seed", type=int, default=0, help="Random seed.")
def generate_cmd(out: Path, n_train: int, n_test: int, seed: int) -> None:
    """Write a synthetic demo data set (20×195 spectra, 3 labels) in the seed's format."""
    from app.data import synthetic

    logs.setup()
    try:
        written = synthetic.generate(out, train=n_train, test=n_test, seed=seed)
    except AppError as exc:
        _fail(exc)
    logs.event(
        "generated",
        f"synthetic demo data in {out}",
        train=n_train,
        test=n_test,
        files={k: str(v) for k, v in written.items()},
    )


@cli.command("train")
@opt(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory with train/test feature and label files (read only).",
)
@opt(
    "--output",
    "output_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for checkpoints/, model/, logs/, metrics.json, cache/.",
)
@opt(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Binary data cache directory [default: OUTPUT/cache].",
)
@opt("--train-features", default="train_features.txt", help="File name in --data.")
@opt("--train-labels", default="train_labels.txt", help="File name in --data.")
@opt("--test-features", default="test_features.txt", help="File name in --data.")
@opt("--test-labels", default="test_labels.txt", help="File name in --data.")
@opt("--height", type=int, default=20, help="Feature rows H (a line holds H×W floats).")
@opt("--width", type=int, default=195, help="Feature columns W.")
@opt(
    "--max-steps",
    type=int,
    default=3300,
    help="Train up to this absolute step (one step = one batch); a rerun resumes.",
)
@opt("--batch-size", type=int, default=1000, help="Samples per step.")
@opt("--eval-every", type=int, default=100, help="Evaluate the test RMSE every N steps.")
@opt("--checkpoint-every", type=int, default=100, help="Save a checkpoint every N steps.")
@opt("--keep-checkpoints", type=int, default=3, help="Checkpoints kept on disk.")
@opt(
    "--target-loss",
    type=float,
    default=0.01,
    help="Stop early once the test RMSE (raw label units) is below this.",
)
@opt("--learning-rate", type=float, default=0.1, help="Initial SGD learning rate.")
@opt("--lr-decay", type=float, default=0.8, help="Learning-rate factor per decay period.")
@opt("--lr-decay-steps", type=int, default=200, help="Steps per decay period (staircase).")
@opt("--momentum", type=float, default=0.8, help="SGD momentum.")
@opt("--keep-prob", type=float, default=0.5, help="Dropout keep probability in training.")
@opt("--seed", type=int, default=0, help="Seed for initialisation, data order and dropout.")
@opt(
    "--standardize/--no-standardize",
    default=True,
    help="Standardise features and labels with training-set statistics.",
)
@opt(
    "--allow-nonfinite/--reject-nonfinite",
    default=False,
    help="Accept NaN/Inf tokens in the data files (in the training files only with "
    "--no-standardize: the statistics would be NaN).",
)
@opt(
    "--formulation",
    type=click.Choice(["fast", "plain"]),
    default="fast",
    help="CNN implementation (same function and checkpoint layout).",
)
@plan_options
@cluster_options
def train_cmd(
    cpus: float | None,
    intra_op_threads: int | None,
    inter_op_threads: int | None,
    pin: str,
    rounding: str,
    workers: int | None,
    worker_hosts: str | None,
    worker_index: int | None,
    cluster_timeout: float,
    heartbeat_timeout: float,
    **options: Any,
) -> None:
    """Train the CNN on --data, writing checkpoints, model, logs and metrics to --output."""
    from app import distributed, lock
    from app.budget import apply as runtime
    from app.config import TrainConfig
    from app.signals import StopRequest

    logs.setup()
    stop = StopRequest().install()
    cluster = None
    try:
        cluster = distributed.resolve(
            os.environ,
            workers=workers,
            worker_index=worker_index,
            hosts=worker_hosts,
            cluster_timeout=cluster_timeout,
            heartbeat_timeout=heartbeat_timeout,
        )
        if cluster is not None:
            logs.setup(worker=cluster.index)  # every record carries the worker index
        config = TrainConfig(**options)
        held = lock.acquire(distributed.worker_dir(config.output_dir, cluster))
        plan = build_plan("/", cpus, intra_op_threads, inter_op_threads, pin, rounding)
        runtime.apply(plan)
        runtime.import_tensorflow()
        from app.train import train

        train(config, plan, stop, cluster)
        held.close()
    except Exception as exc:  # one place turns every failure into a message + exit code
        if cluster is not None:
            distributed.report_failure(cluster, exc)  # the others stop instead of waiting
        _fail(exc)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="coretrain")
