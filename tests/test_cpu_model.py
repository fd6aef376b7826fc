"""The CPU model and flags from /proc/cpuinfo fixtures, and TensorFlow's oneDNN rule on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.budget.topology import detect_cpu

CASES = Path(__file__).parent / "fixtures" / "cpuinfo"


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.iterdir()))
def test_model_name_and_onednn_default(case: str) -> None:
    expected = json.loads((CASES / case / "expected.json").read_text())
    cpu = detect_cpu(CASES / case)
    assert cpu.readable
    assert cpu.name == expected["name"]
    on, evidence = cpu.onednn_default()
    assert on is expected["onednn"]
    assert expected["why"] in evidence
    # Only the first processor's lines that matter are recorded, never the whole file.
    recorded = cpu.inputs["/proc/cpuinfo"]
    assert "bogomips" not in recorded.lower() and recorded.count("\n") <= 3


def test_flags_are_tokens_not_substrings(tmp_path: Path) -> None:
    # "avx512_vnni" must not be found inside a longer, different flag.
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(
        "processor\t: 0\nmodel name\t: X\nflags\t\t: avx2 avx512_vnnix xavx_vnni\n"
    )
    cpu = detect_cpu(tmp_path)
    assert cpu.onednn_default()[0] is False
    assert "avx2" in cpu.flags


def test_unreadable_cpuinfo_is_unknown_not_an_error(tmp_path: Path) -> None:
    cpu = detect_cpu(tmp_path)
    assert (cpu.readable, cpu.name, cpu.flags) == (False, "unknown", frozenset())
    assert cpu.inputs == {"/proc/cpuinfo": "<missing>"}


def test_the_live_machine_has_a_model_and_flags() -> None:
    cpu = detect_cpu("/")
    assert cpu.readable and cpu.name != "unknown" and cpu.flags
