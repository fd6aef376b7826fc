"""The ``coretrain`` command line (click). The only module that imports click.

Each command is a module of :mod:`app.commands`; this module only turns the command line
into their configuration and their results into output and exit codes. Options are
generated from the configuration dataclasses (:mod:`app.config`, the commands' own,
:class:`app.budget.plan.PlanOptions`, :class:`app.cluster.spec.ClusterOptions`): each
default and help text lives there once.

Environment variables (:func:`envvars`): every option of command C reads
``CORETRAIN_<C>_<OPTION>`` (``coretrain models --format`` ←
``CORETRAIN_MODELS_FORMAT``); the short ``CORETRAIN_<OPTION>`` too where it can't mean
another command's option: always for ``train`` (the job; its deployments set them), and for
another command's option when no other command has an option of that name that is
declared differently (``--format`` of ``plan`` and ``models`` is not; the thread options
``plan``, ``train``, ``predict`` and ``exec`` share are one declaration). A short variable a command
does not read because of that is named in a one-line notice on stderr. A flag wins over
both, the per-command variable over the short one. A variable an option would read that is
set but empty (or blank: ``CORETRAIN_MAX_STEPS=``, a manifest's slip) is a usage error
naming it (exit 2), never the default.

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
import dataclasses
import functools
import logging
import os
import re
import signal
import sys
import traceback
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from app import __version__, logs
from app.budget.plan import PlanOptions
from app.cluster.spec import ClusterOptions
from app.commands import Exit
from app.commands.bench_scaling import ScalingConfig
from app.commands.execute import ExecConfig
from app.commands.models import ModelsReport
from app.commands.plan import PlanReport
from app.config import GenerateConfig, PredictConfig, TrainConfig
from app.errors import AppError, ConfigError, Preempted, StorageError, exit_code_of
from app.options import flag_of, from_flat, option_fields
from app.output import check_name
from app.report import LogOptions, ReportOptions

F = TypeVar("F", bound=Callable[..., Any])
ENV_PREFIX = "CORETRAIN_"
#: The configuration classes of each command: its options, in ``--help``'s order.
COMMANDS: dict[str, tuple[type, ...]] = {
    "plan": (PlanReport, PlanOptions),
    "generate": (GenerateConfig, LogOptions),
    "train": (TrainConfig, PlanOptions, ClusterOptions, ReportOptions),
    "models": (ModelsReport,),
    "predict": (PredictConfig, PlanOptions, LogOptions),
    "bench-scaling": (ScalingConfig,),
    "exec": (ExecConfig, PlanOptions, LogOptions),
}
#: The command that owns every short ``CORETRAIN_<OPTION>`` of its options.
OWNER = "train"


def _name(field: dataclasses.Field[Any]) -> str:
    """An option's name in a variable: its long flag, upper case (``MAX_STEPS``)."""
    return flag_of(field).split("/")[0][2:].upper().replace("-", "_")


def _declared_elsewhere(command: str, field: dataclasses.Field[Any]) -> bool:
    """Whether another command has an option of ``field``'s name declared differently."""
    return any(
        _name(other) == _name(field) and other is not field
        for name, classes in COMMANDS.items()
        if name != command
        for cls in classes
        for other in option_fields(cls)
    )


def envvars(command: str, field: dataclasses.Field[Any]) -> list[str]:
    """The environment variables an option of ``command`` reads, the first set one wins:
    ``CORETRAIN_<COMMAND>_<OPTION>``, then ``CORETRAIN_<OPTION>`` unless that could mean
    another command's option (module docstring)."""
    own, short = _own(command, field), ENV_PREFIX + _name(field)
    if command == OWNER or not _declared_elsewhere(command, field):
        return [own, short]
    return [own]


def _own(command: str, field: dataclasses.Field[Any]) -> str:
    """The per-command variable of an option: ``CORETRAIN_<COMMAND>_<OPTION>``."""
    return f"{ENV_PREFIX}{command.upper().replace('-', '_')}_{_name(field)}"


class _Option(click.Option):
    """A click option whose value may come from a variable that is set but empty: click
    takes that for unset (the default), a usage error here (module docstring)."""

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        names = [self.envvar] if isinstance(self.envvar, str) else list(self.envvar or [])
        name = next((n for n in names if n in os.environ), None)  # the one click would read
        if name is not None and not os.environ[name].strip():
            raise click.BadParameter(
                f"{name} is set but empty: give it a value, or unset it for the default",
                ctx=ctx,
                param=self,
            )
        return super().resolve_envvar_value(ctx)


class _OutputFile(click.Path):
    """A file a command writes (``option(output=True)``): its name is checked as typed,
    before a :class:`Path` drops a trailing slash (app/output.py ``check_name``)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            try:
                check_name(value, param.opts[0] if param is not None else "output")
            except ConfigError as exc:
                self.fail(str(exc), param, ctx)
        return super().convert(value, param, ctx)


def _click_type(kind: Any, meta: typing.Mapping[str, Any]) -> Any:
    """The click parameter type of a field's annotation and bounds."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    base = args[0] if args else kind
    if meta.get("choices"):
        return click.Choice(meta["choices"])
    if base is Path:
        kind = _OutputFile if meta.get("output") else click.Path
        return kind(file_okay=not meta.get("directory"), path_type=Path)
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


#: Options read before the others (click's eager ones): a value the command line refuses
#: after them is still pushed as the night's failure (:func:`main`).
EAGER = ("metrics_push", "metrics_job", "output_dir")


def _option(command: str, field: dataclasses.Field[Any], kind: Any) -> Callable[[F], F]:
    """The click option of one dataclass field of ``command``."""
    meta = field.metadata
    required = field.default is dataclasses.MISSING
    shown = meta.get("shown_default")
    kwargs: dict[str, Any] = {
        "help": meta.get("help", ""),
        "envvar": envvars(command, field),
        "show_envvar": True,
        "show_default": shown if shown is not None else not required,
        "required": required,
        "is_eager": field.name in EAGER,
    }
    if not required:
        kwargs["default"] = field.default
    if kind is not bool:
        kwargs["type"] = _click_type(kind, meta)
        kwargs["metavar"] = _metavar(kind, meta)
    return click.option(flag_of(field), field.name, cls=_Option, **kwargs)


def options_of(command: str) -> Callable[[F], F]:
    """Decorate ``command``'s function with one click option per field of its classes
    (:data:`COMMANDS`), and with the notice of short variables it does not read."""

    def decorate(f: F) -> F:
        for cls in reversed(COMMANDS[command]):
            hints = _hints(cls)
            for field in reversed(option_fields(cls)):
                f = _option(command, field, hints[field.name])(f)
        skipped = {
            ENV_PREFIX + _name(field): _own(command, field)
            for cls in COMMANDS[command]
            for field in option_fields(cls)
            if len(envvars(command, field)) == 1
        }

        @functools.wraps(f)
        def noticed(*args: Any, **kwargs: Any) -> Any:
            for short, own in skipped.items():
                if short in os.environ:
                    logs.say(
                        f"coretrain {command}: {short} is not read (another command has an "
                        f"option of that name); set {own} instead"
                    )
            for name in sorted(unknown_variables(os.environ)):
                logs.say(
                    f"coretrain {command}: {name} matches no option of any command, and is "
                    f"ignored (coretrain {command} --help lists the variables)"
                )
            return f(*args, **kwargs)

        return typing.cast(F, noticed)

    return decorate


@functools.cache
def _every_variable() -> frozenset[str]:
    """Every variable an option of some command reads, and the short name of every option
    (one a command does not read has a notice of its own)."""
    return frozenset(
        name
        for command, classes in COMMANDS.items()
        for cls in classes
        for field in option_fields(cls)
        for name in (*envvars(command, field), ENV_PREFIX + _name(field))
    )


def unknown_variables(environ: typing.Mapping[str, str]) -> list[str]:
    """The ``CORETRAIN_…`` variables of ``environ`` that no option of any command reads (a
    misspelt option, or one coretrain no longer has), named in a notice on stderr. One
    meant for another command is not among them: an image or a ConfigMap may set a
    command's variables for every command run in it."""
    return [n for n in environ if n.startswith(ENV_PREFIX) and n not in _every_variable()]


def _hints(cls: type) -> dict[str, Any]:
    """The annotations of dataclass ``cls``'s fields and its groups' (app.options.group)."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if "group" in field.metadata:
            hints.update(_hints(field.metadata["group"]))
    return hints


def build(cls: type, values: dict[str, Any]) -> Any:
    """An instance of dataclass ``cls`` (its groups built too) from the command's keyword
    arguments."""
    return from_flat(cls, values)


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
