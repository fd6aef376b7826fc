"""The README's option tables are the CLI's options: same flags, variables, defaults, help.

Every option is generated from the configuration dataclasses (app/config.py and friends),
so their defaults and help texts exist once; this test keeps the README in step with
them. ``python -m tests.test_readme_options`` prints the tables to paste.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from app.cli import cli

README = Path(__file__).resolve().parents[1] / "README.md"
COMMANDS = ("train", "plan", "generate", "predict", "exec")


def _default(param: click.Option) -> str:
    if param.required:
        return "required"
    if isinstance(param.show_default, str):
        return param.show_default
    if param.is_flag and param.secondary_opts:
        return (param.opts if param.default else param.secondary_opts)[0]
    return "" if param.default is None else str(param.default)


def _flag(param: click.Option) -> str:
    spelled = "/".join([*param.opts, *param.secondary_opts])
    if param.is_flag:
        return spelled
    if isinstance(param.type, click.Choice):
        return f"{spelled} {'|'.join(param.type.choices)}"
    return f"{spelled} {param.metavar}"


def expected_rows(command: str) -> list[str]:
    rows = []
    for param in cli.commands[command].params:
        if not isinstance(param, click.Option) or param.name == "help":
            continue
        help_text = (param.help or "").replace("|", "\\|")
        flag = _flag(param).replace("|", "\\|")
        env = ", ".join(f"`{name}`" for name in param.envvar)
        rows.append(f"| `{flag}` | {env} | {_default(param)} | {help_text} |")
    return rows


def readme_rows(command: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = re.search(rf"### `{command}` options\n\n(.*?)\n\n", text, re.S)
    assert section, f"README has no '### `{command}` options' table"
    return [line for line in section.group(1).splitlines() if line.startswith("| `")]


def test_readme_lists_every_option_of_every_command_as_the_cli_has_it() -> None:
    for command in COMMANDS:
        assert readme_rows(command) == expected_rows(command), (
            f"README's `{command}` table is out of date; run python -m tests.test_readme_options"
        )


def test_the_table_generator_reads_the_real_defaults() -> None:
    rows = {row.split("`")[1].split()[0]: row for row in expected_rows("train")}
    assert "| 3300 |" in rows["--max-steps"]
    assert "| required |" in rows["--data"]
    variables = "`CORETRAIN_TRAIN_STANDARDIZE`, `CORETRAIN_STANDARDIZE`"
    assert f"| {variables} | --standardize |" in rows["--standardize/--no-standardize"]


if __name__ == "__main__":
    for name in COMMANDS:
        print(f"### `{name}` options\n\n| option | env | default | meaning |\n|---|---|---|---|")
        print("\n".join(expected_rows(name)) + "\n")
