"""The output directory (app/training/state/workspace.py): one that can't be written is refused
before training with exit 4 and one line naming it.

These runs stop before TensorFlow is imported. Who owns the files a run writes (a
non-root UID without a home) is checked in tests/test_inputs.py, by the run it shares
with the accepted input formats.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import json_lines, run_cli
from tests.runs import mount_tmpfs, umount


@pytest.mark.parametrize("how", ["file_in_the_way", "read_only_mount", "under_proc"])
def test_output_not_writable_exits_4_before_training(how: str, tmp_path: Path) -> None:
    """Root ignores file modes, so: a regular file where a directory should be, a
    read-only tmpfs mount (needs root), and a path under /proc (nothing can be created)."""
    if how == "file_in_the_way":  # the parent: an existing --output file is click's exit 2
        (tmp_path / "volume").write_text("not a directory\n")
        out = tmp_path / "volume" / "out"
        reason = "Not a directory"
    elif how == "read_only_mount":
        mnt = tmp_path / "ro"
        skip = mount_tmpfs(mnt, "ro,size=64k")
        if skip:
            pytest.skip(skip)
        out = mnt / "out"
        reason = "Read-only file system"
    else:
        out = Path("/proc/coretrain-test/out")
        reason = "No such file or directory"
    try:
        proc = run_cli("train", "--data", str(tmp_path), "--output", str(out))
    finally:
        if how == "read_only_mount":
            umount(tmp_path / "ro")
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"coretrain: {out}: output directory not writable: {reason}"]
    names = [r["event"] for r in json_lines(proc.stdout)]
    assert "start" not in names and "progress" not in names  # refused before TensorFlow
