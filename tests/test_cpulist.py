"""The kernel's CPU list syntax (app/budget/cpulist.py): "0-3,8,10-11" both ways."""

from __future__ import annotations

import pytest

from app.budget.cpulist import format_cpulist, parse_cpulist


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8,10-11\n", (0, 1, 2, 3, 8, 10, 11)),
        ("", ()),
        ("\n", ()),
        ("5", (5,)),
        ("3,1,1-2", (1, 2, 3)),
    ],
)
def test_parse_cpulist(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize(
    "text", ["a", "1-", "-1", "3-1", "0-7:2", "1,,2", "1 2", "+1", "0-+3", "1_0"]
)
def test_parse_cpulist_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)


def test_format_cpulist() -> None:
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10, 2]) == "0-3,8,10-11"
    assert format_cpulist([]) == ""
    assert format_cpulist([4]) == "4"
