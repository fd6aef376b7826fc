"""The ``coretrain`` command line (click). The only package that imports click.

Each command is a module of :mod:`app.commands`; this module only turns the command line
into their configuration and their results into output and exit codes. Options are
generated from the configuration dataclasses (:mod:`app.config`, the commands' own,
:class:`app.budget.plan.PlanOptions`, :class:`app.cluster.spec.ClusterOptions`): each
default and help text lives there once.

Options and their environment variables: :mod:`app.cli.options`.

Library errors (:class:`app.errors.AppError`) and click's usage errors are caught once
here (:func:`_fail`, :func:`main`): a one-line message on stderr and the error's exit code;
``coretrain`` with no command gets click's help on stderr as click shows it, exit 2. What a
command prints as its product (``plan``, ``models``, ``bench-scaling``, ``--help``,
``--version``) to a reader that closed the pipe ends the process with the code SIGPIPE
gives a Unix filter (141, nothing said); one that can't be written otherwise is exit 4.
TensorFlow is imported only by the commands that train or predict, after the thread plan
has been applied.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import traceback
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from app import __version__, logs
from app.budget.plan import PlanOptions
from app.cli.options import COMMANDS as COMMANDS
from app.cli.options import build, options_of
from app.cli.options import envvars as envvars
from app.cli.options import unknown_variables as unknown_variables
from app.cluster.spec import ClusterOptions
from app.commands import Exit
from app.commands.bench_scaling import ScalingConfig
from app.commands.execute import ExecConfig
from app.commands.models import ModelsReport
from app.commands.plan import PlanReport
from app.config import GenerateConfig, PredictConfig, TrainConfig
from app.errors import AppError, Preempted, StorageError, exit_code_of
from app.report import LogOptions, ReportOptions


def _fail(exc: BaseException) -> typing.NoReturn:
    """Report an error in one line on stderr, as the run's ``end`` event, and exit with its
    code: a stop before any step was trained (Preempted) ends ``preempted``, the rest
    ``failed`` (an unexpected error also logs its ``traceback``, exit 1)."""
    code = exit_code_of(exc)
    if isinstance(exc, AppError):
        message = str(exc) + _set_by_variables(str(exc))
    else:
        message = f"unexpected error: {type(exc).__name__}: {exc}"
        logs.event("traceback", "".join(traceback.format_exception(exc)), level=logging.ERROR)
    if isinstance(exc, Preempted):
        logs.event("end", message, status="preempted")
    else:
        logs.event("end", message, level=logging.ERROR, status="failed", exit_code=code)
    _exit(Exit(code, message))


def _set_by_variables(message: str) -> str:
    """For each option ``message`` names (``--batch-size``) whose value came from an
    environment variable, the variable: `` (--batch-size: from CORETRAIN_BATCH_SIZE)``, so
    that a refusal in a deployment that sets its options as variables points at what to
    change; "" when none did (or outside a command)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return ""
    notes = []
    for param in ctx.command.params:
        if param.name is None or not isinstance(param, click.Option):
            continue
        if ctx.get_parameter_source(param.name) is not click.core.ParameterSource.ENVIRONMENT:
            continue
        flag = next((o for o in param.opts if o.startswith("--")), None)
        if flag is None or not re.search(rf"{re.escape(flag)}(?![\w-])", message):
            continue
        envvar = param.envvar
        names = [envvar] if isinstance(envvar, str) else list(envvar or [])
        used = next((n for n in names if os.environ.get(n)), None)  # click's order
        if used:
            notes.append(f"{flag}: from {used}")
    return f" ({'; '.join(notes)})" if notes else ""


def _exit(result: Exit) -> typing.NoReturn:
    """End the process as ``result`` says: its message on stderr (a progress bar cleared
    first), its code."""
    logs.clear_view()
    if result.message is not None:
        logs.say(f"coretrain: {result.message}")
    sys.exit(result.code)


def _print(product: str) -> None:
    """A command's product on stdout (:func:`_unwritten` when it can't be written)."""
    try:
        click.echo(product)
    except OSError as exc:
        _unwritten(exc)


#: The exit of a command whose product's reader closed the pipe: 128 + SIGPIPE, as a shell
#: reports a Unix filter ended by it (``ls | head -1``).
CLOSED_PIPE = 128 + signal.SIGPIPE


def _unwritten(exc: OSError) -> typing.NoReturn:
    """End a command whose product (or help) could not be written to stdout: its reader
    closed the pipe, :data:`CLOSED_PIPE` with nothing said; anything else (a full disk) is
    exit 4 with one line."""
    logs.give_up(1)
    if isinstance(exc, BrokenPipeError):
        sys.exit(CLOSED_PIPE)
    _exit(Exit(StorageError.exit_code, f"stdout: {exc.strerror or exc}"))


def _guarded(run: Callable[[], Any]) -> Any:
    """``run()``, with every failure turned into a message and an exit code (:func:`_fail`)."""
    try:
        return run()
    except Exception as exc:  # the one place failures become exit codes
        _fail(exc)


def _show_help(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--help``: the help as click shows it, on stdout by the products' rule (:func:`_print`:
    into a closed pipe, 141 quietly; click's own gave exit 1)."""
    if value and not ctx.resilient_parsing:
        _print(ctx.get_help())
        ctx.exit()


def _show_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--version``, by the products' rule too."""
    if value and not ctx.resilient_parsing:
        _print(f"coretrain, version {__version__}")
        ctx.exit()


def _help_by_rule(option: click.Option | None) -> click.Option | None:
    """Click's help option of a command, showing the help by :func:`_show_help`."""
    if option is not None:
        option.callback = _show_help
    return option


class _Command(click.Command):
    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        return _help_by_rule(super().get_help_option(ctx))


class _Group(click.Group):
    command_class = _Command

    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        return _help_by_rule(super().get_help_option(ctx))


@click.group(
    cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.option(
    "--version", is_flag=True, expose_value=False, is_eager=True, callback=_show_version,
    help="Show the version and exit.",
)  # fmt: skip
def cli() -> None:
    """Train a TensorFlow CNN using exactly the CPUs this container may use."""


@cli.command("plan")
@options_of("plan")
def plan_cmd(**values: Any) -> None:
    """Print the CPU budget and thread plan (never imports TensorFlow)."""
    from app.commands import plan

    _print(_guarded(lambda: plan.run(build(PlanReport, values), build(PlanOptions, values))))


@cli.command("generate")
@options_of("generate")
def generate_cmd(**values: Any) -> None:
    """Write a synthetic data set (20×195 spectra; --kind demo: 3 labels, lines: 15) in the
    seed's format."""
    from app.commands import generate

    _guarded(lambda: generate.run(build(GenerateConfig, values), build(LogOptions, values)))


@cli.command("train")
@options_of("train")
def train_cmd(**values: Any) -> None:
    """Train the CNN on --data, writing checkpoints, model, logs and metrics to --output."""
    from app.commands import train

    def run() -> Exit:
        config, report = build(TrainConfig, values), build(ReportOptions, values)
        return train.run(config, build(PlanOptions, values), build(ClusterOptions, values), report)

    _exit(_guarded(run))


@cli.command("models")
@click.argument(
    "directory", type=click.Path(exists=True, file_okay=False, readable=True, path_type=Path)
)
@options_of("models")
def models_cmd(directory: Path, **values: Any) -> None:
    """List the model versions published in DIRECTORY (--publish-dir), newest last."""
    from app.commands import models

    _print(_guarded(lambda: models.run(directory, build(ModelsReport, values))))


@cli.command("predict")
@options_of("predict")
def predict_cmd(**values: Any) -> None:
    """Predict labels for a features file with a trained or published model."""
    from app.commands import predict

    def run() -> None:
        log = build(LogOptions, values)
        predict.run(build(PredictConfig, values), build(PlanOptions, values), log)

    _guarded(run)


@cli.command("bench-scaling")
@options_of("bench-scaling")
def bench_scaling_cmd(**values: Any) -> None:
    """Measure how training scales with threads and worker processes on this machine."""
    from app.commands import bench_scaling as scaling

    _print(_guarded(lambda: scaling.run(build(ScalingConfig, values))))


@cli.command("exec", context_settings={"allow_interspersed_args": False})
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
@options_of("exec")
def exec_cmd(command: tuple[str, ...], **values: Any) -> None:
    """Run COMMAND with each runtime's thread variables (TensorFlow, OpenMP, BLAS, numexpr,
    Go, JVM) and the affinity planned for this container's CPUs, in place of coretrain
    (same PID), or as a child with --report. Exit: COMMAND's own; 127 not found, 126 not
    executable."""
    from app.commands import execute

    def run() -> Exit:
        config, log = build(ExecConfig, values), build(LogOptions, values)
        return execute.run(config, build(PlanOptions, values), command, log)

    _exit(_guarded(run))


def _help_on_stderr(exc: click.exceptions.NoArgsIsHelpError) -> typing.NoReturn:
    """``coretrain`` with no command: the help on stderr, as click shows it (lines as they
    are: it is not a message), and click's exit code for it (2). A stderr that can't take
    it is given up."""
    try:
        exc.show()
    except OSError:
        logs.give_up(2)
    sys.exit(exc.exit_code)


def main() -> None:
    """Console-script entry point. A usage error is one line on stderr too (exit 2), but
    for no command at all: the help (:func:`_help_on_stderr`); help or a version that
    can't be written is :func:`_unwritten`. Once the exit code is known, SIGTERM and
    SIGINT are ignored (:func:`_decided`)."""
    logs.standard_streams()
    try:
        code = cli.main(prog_name="coretrain", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # no command: click's help, as it shows it
        _help_on_stderr(exc)
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "coretrain"
        message = f"{exc.format_message()} (see {where} --help)"
        if ctx is not None and ctx.command.name == "train":  # a night that never started
            from app.commands import train

            train.refused(ctx.params, exc.exit_code)
        _exit(Exit(exc.exit_code, message))
    except click.Abort:  # Ctrl-C at a prompt; there are none, but click may raise it
        sys.exit(130)
    finally:
        _decided()
    sys.exit(code if isinstance(code, int) else 0)


def _decided() -> None:
    """The process's exit code is decided: SIGTERM and SIGINT are ignored from here on.
    Python puts the default handlers back while it finalizes (TensorFlow's teardown takes
    a moment), and a signal then would end a completed run as killed (143, no message);
    an ignored handler is left as it is."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            signal.signal(sig, signal.SIG_IGN)
