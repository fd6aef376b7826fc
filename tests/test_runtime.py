"""The runtime step sets TF's env vars before import and refuses to run after it."""

from __future__ import annotations

import json
import subprocess
import sys

SNIPPET = """
import json, os
from app.cgroups import CpuBudget
from app.plan import Overrides, make_plan
from app import runtime
plan = make_plan(CpuBudget(cpu_quota=1.0, cpuset=(0,), memory_limit=None, quota_source="t"),
                 overrides=Overrides(inter_op_threads=3))
env = {"TF_CPP_MIN_LOG_LEVEL": "0"}
done = runtime.apply(plan, env)
import tensorflow
try:
    runtime.apply(plan, {})
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
