"""Options declared once: a dataclass field that is also a command-line option.

:func:`option` records an option's default, help text, spelling and bounds in the
field's metadata; the command line (app/cli/options.py) generates its click options from it,
:func:`check_bounds` enforces the bounds for a value built anywhere (a test, a
benchmark), and :func:`identity_fields` lists the options that change what trained
weights mean. A configuration may hold groups of options (:func:`group`): the command line
sees their options flat (:func:`option_fields`, :func:`from_flat`, :func:`flat`). Used by
every configuration dataclass (app/config.py,
app/budget/plan.py's PlanOptions, app/cluster/spec.py's ClusterOptions). No click here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import field
from typing import Any

from app.errors import ConfigError


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    minimum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    maximum: float | None = None,
    choices: Sequence[str] | None = None,
    directory: bool = False,
    output: bool = False,
    shown_default: str | None = None,
    metavar: str | None = None,
    identity: bool = False,
) -> Any:
    """A dataclass field that is also a command-line option.

    ``flag``: the option's spelling (default ``--<field-name>``; ``"--a/--b"`` for an
    on/off pair); ``minimum``/``maximum`` inclusive and ``above``/``below`` exclusive
    bounds; ``choices``: the allowed strings; ``directory``: a path to a directory;
    ``output``: a file the command writes (app/output.py: a name that can only name a
    directory, ``out/``, is refused);
    ``shown_default``: how ``--help`` and the README show a default that isn't a plain
    value (e.g. "from the CPU budget"); ``metavar``: the value's name in ``--help``
    (default N for integers, X for other numbers, DIR for directories, TEXT);
    ``identity``: the option changes what the trained weights mean, so it is part of the
    run's identity in ``checkpoints/run.json`` and a resume must use the same value
    (:func:`identity_fields`; app/training/state/identity.py).
    """
    meta = {
        "help": help,
        "flag": flag,
        "minimum": minimum,
        "above": above,
        "below": below,
        "maximum": maximum,
        "choices": tuple(choices) if choices else None,
        "directory": directory,
        "output": output,
        "shown_default": shown_default,
        "metavar": metavar,
        "identity": identity,
    }
    return field(default=default, metadata=meta)


class Options:
    """A configuration dataclass whose fields are options (and groups of them): their
    bounds are checked whenever one is built (:func:`check_bounds`)."""

    def __post_init__(self) -> None:
        check_bounds(self)


def group(cls: type, *, required: bool = False) -> Any:
    """A dataclass field holding a group of options, dataclass ``cls`` (built with its
    defaults unless ``required``: a group with an option that has no default)."""
    if required:
        return field(metadata={"group": cls})
    return field(default_factory=cls, metadata={"group": cls})


def option_fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """The options of dataclass ``cls``, its groups' in their place, in the order of
    ``cls.ORDER`` (field names) where it has one; an option it does not list comes right
    after the one declared before it."""
    found = [
        leaf
        for f in dataclasses.fields(cls)
        for leaf in (option_fields(f.metadata["group"]) if "group" in f.metadata else (f,))
    ]
    order = {name: i for i, name in enumerate(getattr(cls, "ORDER", ()))}
    keys, last = {}, -1
    for f in found:
        last = order.get(f.name, last)
        keys[f.name] = (last, f.name not in order)
    return tuple(sorted(found, key=lambda f: keys[f.name]))


def from_flat(cls: type, values: dict[str, Any]) -> Any:
    """An instance of dataclass ``cls`` from its options by name (:func:`option_fields`);
    an option missing from ``values`` takes its default."""
    kwargs = {
        f.name: from_flat(f.metadata["group"], values) if "group" in f.metadata else values[f.name]
        for f in dataclasses.fields(cls)
        if "group" in f.metadata or f.name in values
    }
    return cls(**kwargs)


def flat(obj: Any) -> dict[str, Any]:
    """The options of dataclass instance ``obj`` by name, its groups' included, in
    :func:`option_fields`' order."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        values.update(flat(value) if "group" in f.metadata else {f.name: value})
    order = [f.name for f in option_fields(type(obj))]
    return {name: values[name] for name in order}


def identity_fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """The options of dataclass ``cls`` (its groups' included) declared with
    ``option(identity=True)``: the options that change what the weights mean (a new option
    joins by being declared so)."""
    return tuple(f for f in option_fields(cls) if f.metadata.get("identity"))


def flag_of(f: dataclasses.Field[Any]) -> str:
    """The command-line spelling of a field: ``--max-steps``, ``--standardize/--no-...``."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def check_bounds(obj: Any) -> None:
    """Raise ConfigError for the first field of ``obj`` outside its declared bounds."""
    for f in dataclasses.fields(obj):
        value, meta = getattr(obj, f.name), f.metadata
        if value is None or isinstance(value, bool) or not meta:
            continue
        name = flag_of(f).split("/")[0]
        if meta.get("choices") and value not in meta["choices"]:
            raise ConfigError(f"{name} must be one of {', '.join(meta['choices'])}, got {value!r}")
        if not isinstance(value, int | float):
            continue
        if not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value}")
        bounds = (
            ("minimum", lambda v, b: v >= b, "at least"),
            ("above", lambda v, b: v > b, "greater than"),
            ("below", lambda v, b: v < b, "less than"),
            ("maximum", lambda v, b: v <= b, "at most"),
        )
        for key, ok, words in bounds:
            bound = meta.get(key)
            if bound is not None and not ok(value, bound):
                raise ConfigError(f"{name} must be {words} {bound:g}, got {value}")
