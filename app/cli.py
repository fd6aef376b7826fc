"""The ``coretrain`` command line (click). The only module that imports click.

Options are generated from the configuration dataclasses (:mod:`app.config`,
:class:`app.budget.plan.PlanOptions`, :class:`app.cluster.spec.ClusterOptions`): each
default and help text lives there once, and every option also reads
``CORETRAIN_<OPTION>`` (``--max-steps`` ← ``CORETRAIN_MAX_STEPS``). Library errors
(:class:`app.errors.AppError`) are caught once here: a one-line message on stderr and the
error's exit code. TensorFlow is imported only by ``train``, after the thread plan has
been applied.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import traceback
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from app import __version__, logs
from app.atomic import restrict_umask
from app.budget.plan import PlanOptions
from app.cluster.spec import ClusterOptions
from app.config import BFLOAT16_IN_AUTO, GenerateConfig, PredictConfig, TrainConfig
from app.errors import AppError, ModelRejected, Preempted
from app.options import check_bounds, flag_of, option

F = TypeVar("F", bound=Callable[..., Any])
ENV_PREFIX = "CORETRAIN_"


@dataclasses.dataclass(frozen=True)
class PlanReport:
    """``coretrain plan``: where to read and how to print."""

    format: str = option("json", "Output format.", choices=("json", "text"))
    root: Path = option(
        Path("/"),
        "Read /proc and /sys under this directory instead of / (support cases, tests).",
        directory=True,
    )

    def __post_init__(self) -> None:
        check_bounds(self)


def envvar(field: dataclasses.Field[Any]) -> str:
    """The environment variable of an option: ``CORETRAIN_`` + its long name."""
    return ENV_PREFIX + flag_of(field).split("/")[0][2:].upper().replace("-", "_")


def _click_type(kind: Any, meta: typing.Mapping[str, Any]) -> Any:
    """The click parameter type of a field's annotation and bounds."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    base = args[0] if args else kind
    if meta.get("choices"):
        return click.Choice(meta["choices"])
    if base is Path:
        return click.Path(file_okay=not meta.get("directory"), path_type=Path)
    if base in (int, float):
        low = meta.get("minimum") if meta.get("minimum") is not None else meta.get("above")
        high = meta.get("maximum") if meta.get("maximum") is not None else meta.get("below")
        if low is None and high is None:
            return base
        ranged = click.IntRange if base is int else click.FloatRange
        return ranged(
            min=low,
            max=high,
            min_open=meta.get("above") is not None,
            max_open=meta.get("below") is not None,
        )
    return base


def _metavar(kind: Any, meta: typing.Mapping[str, Any]) -> str | None:
    """The value's name in ``--help``: the field's own, else N, X, DIR or TEXT."""
    if meta.get("metavar"):
        return str(meta["metavar"])
    if meta.get("choices"):
        return None  # click lists the choices
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    base = args[0] if args else kind
    return {int: "N", float: "X", Path: "DIR" if meta.get("directory") else "FILE"}.get(
        base, "TEXT"
    )


def options_of(*classes: type) -> Callable[[F], F]:
    """Decorate a command with one click option per field of ``classes``."""

    def decorate(f: F) -> F:
        for cls in reversed(classes):
            hints = typing.get_type_hints(cls)
            for field in reversed(dataclasses.fields(cls)):
                meta, kind = field.metadata, hints[field.name]
                required = field.default is dataclasses.MISSING
                shown = meta.get("shown_default")
                kwargs: dict[str, Any] = {
                    "help": meta.get("help", ""),
                    "envvar": envvar(field),
                    "show_envvar": True,
                    "show_default": shown if shown is not None else not required,
                    "required": required,
                }
                if not required:
                    kwargs["default"] = field.default
                if kind is not bool:
                    kwargs["type"] = _click_type(kind, meta)
                    kwargs["metavar"] = _metavar(kind, meta)
                f = click.option(flag_of(field), field.name, **kwargs)(f)
        return f

    return decorate


def build(cls: type, values: dict[str, Any]) -> Any:
    """An instance of dataclass ``cls`` from the command's keyword arguments."""
    return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})


def _fail(exc: BaseException) -> None:
    """Report an error in one line on stderr (and as a log event) and exit."""
    if isinstance(exc, AppError):
        code, message = exc.exit_code, str(exc)
    else:
        code, message = 1, f"unexpected error: {type(exc).__name__}: {exc}"
        logs.event("traceback", "".join(traceback.format_exception(exc)), level=logging.ERROR)
    if not isinstance(exc, Preempted | ModelRejected):  # those logged their own end event
        logs.event("end", message, level=logging.ERROR, status="failed", exit_code=code)
    click.echo(f"coretrain: {message}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="coretrain")
def cli() -> None:
    """Train a TensorFlow CNN using exactly the CPUs this container may use."""


@cli.command("plan")
@options_of(PlanReport, PlanOptions)
def plan_cmd(**values: Any) -> None:
    """Print the CPU budget and thread plan (never imports TensorFlow)."""
    from app.budget import detect_plan
    from app.budget.plan import format_text

    try:
        report = build(PlanReport, values)
        plan = detect_plan(str(report.root), build(PlanOptions, values))
    except AppError as exc:
        _fail(exc)
    if report.format == "json":
        click.echo(json.dumps(plan.to_json(), indent=2))
    else:
        click.echo(format_text(plan))


@cli.command("generate")
@options_of(GenerateConfig)
def generate_cmd(**values: Any) -> None:
    """Write a synthetic data set (20×195 spectra; --kind demo: 3 labels, lines: 15) in the
    seed's format."""
    from app.data import synthetic

    logs.setup()
    restrict_umask()
    try:
        config = build(GenerateConfig, values)
        written = synthetic.generate(
            config.out, train=config.train, test=config.test, seed=config.seed, kind=config.kind
        )
    except AppError as exc:
        _fail(exc)
    logs.event(
        "generated",
        f"synthetic {config.kind} data in {config.out}",
        kind=config.kind,
        train=config.train,
        test=config.test,
        files={k: str(v) for k, v in written.items()},
    )


@cli.command("train")
@options_of(TrainConfig, PlanOptions, ClusterOptions)
def train_cmd(**values: Any) -> None:
    """Train the CNN on --data, writing checkpoints, model, logs and metrics to --output."""
    from app import lock
    from app.budget import apply, detect_plan
    from app.cluster import spec
    from app.errors import Replan
    from app.signals import StopRequest
    from app.training import workspace
    from app.training.run import REPLAN_AT_ENV

    logs.setup()
    restrict_umask()
    stop = StopRequest().install()
    try:
        cluster = spec.resolve(os.environ, build(ClusterOptions, values))
        if cluster is not None:
            logs.setup(worker=cluster.index)  # every record carries the worker index
        config = build(TrainConfig, values)
        ws = workspace.for_run(config, cluster)
        held = lock.acquire(ws.own, below=ws.output)
        bfloat16 = config.precision == "bfloat16" or (
            config.precision == "auto" and BFLOAT16_IN_AUTO
        )
        plan = detect_plan("/", build(PlanOptions, values), bfloat16=bfloat16)
        apply.apply(plan)
        from app.training.run import train

        try:
            train(config, plan, stop, cluster)
        except Replan as replan:  # a new thread plan needs a new process: same PID, same lock
            env = {REPLAN_AT_ENV: str(replan.at), lock.HELD_FD_ENV: str(held.fileno())}
            apply.restart(env, keep_fds=(held.fileno(),))
        held.close()
    except Exception as exc:  # one place turns every failure into a message + exit code
        _fail(exc)


@dataclasses.dataclass(frozen=True)
class ModelsReport:
    """``coretrain models``: how to print the published versions."""

    format: str = option("table", "Output format.", choices=("table", "json"))


@cli.command("models")
@click.argument(
    "directory", type=click.Path(exists=True, file_okay=False, readable=True, path_type=Path)
)
@options_of(ModelsReport)
def models_cmd(directory: Path, **values: Any) -> None:
    """List the model versions published in DIRECTORY (--publish-dir), newest last."""
    from app.training.versions import listing

    report = build(ModelsReport, values)
    rows = listing(directory)
    if report.format == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no published versions in {directory}")
        return
    click.echo(f"{'version':>7}  {'published_at':25}  {'test_rmse':>10}  {'steps':>6}  data")
    for row in rows:
        rmse = "-" if row["test_rmse"] is None else f"{row['test_rmse']:.6g}"
        mark = "  (served)" if row["champion"] else ""
        click.echo(
            f"{row['version']:>7}  {row['published_at'] or '-':25}  {rmse:>10}  "
            f"{row['final_step'] or '-':>6}  {row['data'] or '-'}{mark}"
        )


@cli.command("predict")
@options_of(PredictConfig, PlanOptions)
def predict_cmd(**values: Any) -> None:
    """Predict labels for a features file with a trained or published model."""
    from app.budget import apply, detect_plan

    logs.setup()
    restrict_umask()
    try:
        config = build(PredictConfig, values)
        apply.apply(detect_plan("/", build(PlanOptions, values)))
        apply.import_tensorflow()
        from app.predict import predict

        predict(config)
    except Exception as exc:  # one place turns every failure into a message + exit code
        _fail(exc)


@dataclasses.dataclass(frozen=True)
class ScalingConfig:
    """``coretrain bench-scaling``: how far to measure and where to write the report."""

    max_threads: int | None = option(
        None, "Measure up to this many threads.", minimum=1, shown_default="the CPU budget's"
    )
    batch_size: int = option(1000, "Samples per training step.", minimum=1)
    out: Path | None = option(None, "Also write the JSON report here.", shown_default="none")

    def __post_init__(self) -> None:
        check_bounds(self)


@cli.command("bench-scaling")
@options_of(ScalingConfig)
def bench_scaling_cmd(**values: Any) -> None:
    """Measure how training scales with threads and worker processes on this machine."""
    from app import scaling

    config = build(ScalingConfig, values)
    scaling.run(config.max_threads, config.batch_size, config.out)


def main() -> None:
    """Console-script entry point. A usage error is one line on stderr too (exit 2)."""
    try:
        code = cli.main(prog_name="coretrain", standalone_mode=False)
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "coretrain"
        click.echo(f"coretrain: {exc.format_message()} (see {where} --help)", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:  # Ctrl-C at a prompt; there are none, but click may raise it
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
