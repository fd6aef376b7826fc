"""The command line's options, generated from the configuration dataclasses (click).

Each option is a field of a command's classes (:data:`COMMANDS`), its default, help and
bounds declared there once (:mod:`app.options`).

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
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from app import logs
from app.budget.plan import PlanOptions
from app.cluster.spec import ClusterOptions
from app.commands.bench_scaling import ScalingConfig
from app.commands.execute import ExecConfig
from app.commands.models import ModelsReport
from app.commands.plan import PlanReport
from app.config import GenerateConfig, PredictConfig, TrainConfig
from app.errors import ConfigError
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
