"""tools/lock_requirements.py (``make lock``): platform tags, markers, hashes, the pin check.

The download itself needs the package index; these tests feed the tool wheel files made
here. The lock in the repository is checked by tests/test_manifests.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tool() -> Iterator[ModuleType]:
    """The script as a module (registered while loading: its dataclass needs that)."""
    name = "lock_requirements"
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]


def _wheel(directory: Path, name: str, content: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(content)
    return path


def test_platform_tags_rank_newer_glibc_first_with_the_legacy_names(tool: ModuleType) -> None:
    x86 = tool.platform_tags("x86_64")
    assert x86[0] == "manylinux_2_36_x86_64"
    assert x86[-1] == "linux_x86_64"
    for glibc, legacy in ((17, "manylinux2014"), (12, "manylinux2010"), (5, "manylinux1")):
        at = x86.index(f"manylinux_2_{glibc}_x86_64")
        assert x86[at + 1] == f"{legacy}_x86_64"
    assert "manylinux_2_37_x86_64" not in x86  # newer than bookworm's glibc 2.36
    arm = tool.platform_tags("aarch64")
    assert "manylinux2014_aarch64" in arm
    assert not any(t.startswith(("manylinux1_", "manylinux2010_")) for t in arm)


def test_each_platform_gets_its_tensorflow_package(tool: ModuleType) -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "dependencies"
    ]
    x86 = tool.requirements_for("x86_64", deps)
    arm = tool.requirements_for("aarch64", deps)
    assert any(r.startswith("tensorflow-cpu==") for r in x86)
    assert not any(r.startswith("tensorflow==") for r in x86)
    assert any(r.startswith("tensorflow==") for r in arm)
    assert not any(r.startswith("tensorflow-cpu") for r in arm)
    assert all(";" not in r for r in x86 + arm), "markers are evaluated, not passed on"
    assert x86[-2:] == arm[-2:] == ["setuptools", "wheel"]


def test_lock_lists_both_platforms_hashes_and_marks_single_platform_packages(
    tool: ModuleType, tmp_path: Path
) -> None:
    pins = {"numpy": "2.4.6", "tensorflow-cpu": "2.21.0", "tensorflow": "2.21.0", "six": "1.17.0"}
    x86 = [
        _wheel(tmp_path / "x", "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl", b"np-x86"),
        _wheel(tmp_path / "x", "tensorflow_cpu-2.21.0-cp311-cp311-manylinux_2_27_x86_64.whl", b"t"),
        _wheel(tmp_path / "x", "six-1.17.0-py2.py3-none-any.whl", b"six"),
        _wheel(tmp_path / "x", "libclang-18.1.1-py2.py3-none-manylinux2010_x86_64.whl", b"c"),
    ]
    arm = [
        _wheel(tmp_path / "a", "numpy-2.4.6-cp311-cp311-manylinux_2_27_aarch64.whl", b"np-arm"),
        _wheel(tmp_path / "a", "tensorflow-2.21.0-cp311-cp311-manylinux_2_27_aarch64.whl", b"t2"),
        _wheel(tmp_path / "a", "six-1.17.0-py2.py3-none-any.whl", b"six"),
    ]
    locked: dict = {}
    tool.collect(locked, "x86_64", x86, pins)
    tool.collect(locked, "aarch64", arm, pins)
    text = tool.render(locked)

    def sha(data: bytes) -> str:
        return "--hash=sha256:" + hashlib.sha256(data).hexdigest()

    entries = [e.strip() for e in text.split("\n\n", 1)[1].replace("\\\n", " ").splitlines()]
    by_name = {e.split("==")[0]: e.split() for e in entries}
    assert sorted(by_name) == ["numpy", "six", "tensorflow", "tensorflow-cpu"]  # no libclang
    assert sorted(by_name["numpy"][1:]) == sorted([sha(b"np-x86"), sha(b"np-arm")])
    assert by_name["six"][1:] == [sha(b"six")]  # one wheel for both platforms, listed once
    marked = 'tensorflow-cpu==2.21.0 ; platform_machine == "x86_64"'
    assert " ".join(by_name["tensorflow-cpu"][:5]) == marked
    assert (
        " ".join(by_name["tensorflow"][:5]) == 'tensorflow==2.21.0 ; platform_machine == "aarch64"'
    )
    assert "libclang (declared by TensorFlow for its source tooling" in text.split("Left out: ")[1]


def test_an_unpinned_version_stops_the_run(tool: ModuleType, tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "six-1.16.0-py2.py3-none-any.whl", b"six")
    with pytest.raises(SystemExit, match=re.escape("constraints.txt pins six to '1.17.0'")):
        tool.collect({}, "x86_64", [wheel], {"six": "1.17.0"})
    with pytest.raises(SystemExit, match="pins six to None"):
        tool.collect({}, "x86_64", [wheel], {})


def test_constraints_must_be_exact_pins(tool: ModuleType, tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text("# header\nPyYAML==6.0.4\ntyping_extensions==4.16.0  # why\n")
    assert tool.read_constraints(good) == {"pyyaml": "6.0.4", "typing-extensions": "4.16.0"}
    bad = tmp_path / "bad.txt"
    bad.write_text("numpy>=2\n")
    with pytest.raises(SystemExit, match="not an exact pin"):
        tool.read_constraints(bad)
