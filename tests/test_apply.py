"""The apply step (app/budget/apply.py) sets TF's env vars before import and refuses after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES, REPO

SNIPPET = """
import json, os
from app.budget.cgroups.detect import CpuBudget
from app.budget.plan import Overrides, make_plan
from app.budget import apply
plan = make_plan(CpuBudget(cpu_quota=1.0, cpuset=(0,), memory_limit=None, quota_source="t"),
                 overrides=Overrides(inter_op_threads=3))
env = {"TF_CPP_MIN_LOG_LEVEL": "0"}
done = apply.apply(plan, env)
import tensorflow
try:
    apply.apply(plan, {})
    late = "applied"
except RuntimeError as exc:
    late = str(exc)
print(json.dumps({"env": env, "done": done, "late": late}))
"""


def test_apply_sets_thread_env_keeps_user_settings_and_refuses_after_import() -> None:
    proc = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["env"] == {
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "3",
        "TF_CPP_MIN_LOG_LEVEL": "0",  # the user's value stays
        "TF_CPU_ALLOCATOR_USE_BFC": "true",
    }
    assert "TF_CPP_MIN_LOG_LEVEL=2" not in out["done"]
    assert "before TensorFlow is imported" in out["late"]


def _run(code: str, env: dict[str, str] | None = None, path: Path | None = None) -> Any:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    full.update(env or {})
    if path is not None:  # a stand-in "tensorflow" package first on the path
        full["PYTHONPATH"] = os.pathsep.join([str(path), str(REPO)])
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, cwd=REPO
    )


IMPORT = """
from app.budget import apply
from app.budget.cgroups.detect import CpuBudget
from app.budget.plan import make_plan, overrides_from
from app.budget.topology import detect_cpu
import os
plan = make_plan(CpuBudget(cpu_quota=None, cpuset=(0,), memory_limit=None, quota_source="t"),
                 overrides=overrides_from(os.environ), cpu=detect_cpu("/"))
apply.apply(plan)
tf = apply.import_tensorflow()
print(tf.constant(2.0).numpy(), os.environ.get("TF_ENABLE_ONEDNN_OPTS"))
"""


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_importing_tensorflow_prints_nothing_on_stderr(onednn: str) -> None:
    # With oneDNN on, TensorFlow writes absl's pre-init warning and the oneDNN notice at
    # import, whatever TF_CPP_MIN_LOG_LEVEL says; both are filtered, nothing else is.
    proc = _run(IMPORT, {"TF_ENABLE_ONEDNN_OPTS": onednn})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.split() == ["2.0", onednn]


def test_apply_sets_the_planned_onednn_switch() -> None:
    from app.budget.cgroups.detect import CpuBudget
    from app.budget.plan import make_plan
    from app.budget.topology import detect_cpu

    b = CpuBudget(cpu_quota=None, cpuset=(0,), memory_limit=None, quota_source="t")
    for case, value in (("amd-epyc-zen3-milan", "0"), ("intel-xeon-sapphire-rapids", "1")):
        plan = make_plan(b, cpu=detect_cpu(FIXTURES / "cpuinfo" / case))
        assert _apply_in_subprocess(plan.onednn)["TF_ENABLE_ONEDNN_OPTS"] == value
    assert "TF_ENABLE_ONEDNN_OPTS" not in _apply_in_subprocess(None)


def _apply_in_subprocess(onednn: bool | None) -> dict[str, str]:
    code = (
        "import json\nfrom app.budget import apply\n"
        "from app.budget.cgroups.detect import CpuBudget\n"
        "from app.budget.plan import make_plan\nimport dataclasses\n"
        "b = CpuBudget(cpu_quota=None, cpuset=(0,), memory_limit=None, quota_source='t')\n"
        f"plan = dataclasses.replace(make_plan(b), onednn={onednn!r})\n"
        "env = {}\napply.apply(plan, env)\nprint(json.dumps(env))\n"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


FAKE_TF = """
import os
os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written "
            b"to STDERR\\n")
os.write(2, b"I0000 00:00:1.0  1 port.cc:153] oneDNN custom operations are on. You may see...\\n")
os.write(2, b"E0000 a real error from TensorFlow\\n")
if os.environ.get("FAKE_TF_ABORT"):
    os.write(2, b"F0000 fatal: the CPU lacks an instruction\\n")
    os.abort()
"""


@pytest.mark.parametrize("abort", [False, True])
def test_real_messages_during_the_import_reach_stderr(tmp_path: Path, abort: bool) -> None:
    for name in ("tensorflow", "keras"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(FAKE_TF if name == "tensorflow" else "")
    code = "from app.budget import apply\napply.import_tensorflow()\nprint('imported')\n"
    proc = _run(code, {"FAKE_TF_ABORT": "1"} if abort else {}, path=tmp_path)
    expected = ["E0000 a real error from TensorFlow"]
    if abort:  # the parent died inside the import; the filter process still delivered
        assert proc.returncode != 0
        expected.append("F0000 fatal: the CPU lacks an instruction")
    else:
        assert proc.returncode == 0 and proc.stdout == "imported\n"
    assert proc.stderr.splitlines() == expected


AFTER_IMPORT = """
import os
before = os.fstat(2)
from app.budget import apply
apply.import_tensorflow()
after = os.fstat(2)
print((before.st_dev, before.st_ino) == (after.st_dev, after.st_ino))
os.write(2, b"I0000 00:00:2.0  1 port.cc:153] oneDNN custom operations are on. (later)\\n")
os.write(2, b"a line after the import\\n")
"""


def test_stderr_is_the_original_again_after_the_import(tmp_path: Path) -> None:
    """The filter is for the import only: afterwards fd 2 is the process's own stderr again,
    so even a line that looks like a start-up notice reaches it, at once."""
    for name in ("tensorflow", "keras"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(FAKE_TF if name == "tensorflow" else "")
    with open(tmp_path / "stderr.txt", "w+b") as err:
        proc = subprocess.run(
            [sys.executable, "-c", AFTER_IMPORT], stdout=subprocess.PIPE, stderr=err,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])},
            cwd=REPO, timeout=60,
        )  # fmt: skip
        err.seek(0)
        lines = err.read().decode().splitlines()
    assert proc.returncode == 0
    assert proc.stdout == b"True\n"  # the same open file as before the import
    assert lines == [
        "E0000 a real error from TensorFlow",
        "I0000 00:00:2.0  1 port.cc:153] oneDNN custom operations are on. (later)",
        "a line after the import",
    ]
