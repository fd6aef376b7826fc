"""Let no one in: planted symlinks, other owners' directories, hard links, modes, Keras home.

Each end-to-end case plants something in a real output directory, runs the real
``coretrain train`` and checks that it stops with exit 4 and one line naming the path, and
that the planted link's target is byte for byte what it was. These runs stop before
TensorFlow is imported (the checks come first), so they take about a second each; the
modes test trains (slow).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from app.atomic import Dir, open_dir
from app.config import TrainConfig
from app.data import cache
from app.errors import StorageError
from app.training.admit.sources import find
from tests.conftest import REPO, TINY_TRAIN_ARGS, events, json_lines, run_cli
from tests.runs import IS_ROOT, mount_tmpfs, umount

SECRET = b"do not touch\n"


def _key(data: Path, out: Path) -> str:
    return cache.source_key(find(TrainConfig.of(data_dir=data, output_dir=out).data))


def _plant(out: Path, name: str, kind: str, victim: Path) -> Path:
    """A symlink at ``out/name`` to ``victim`` (a file or a directory, made here)."""
    link = out / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if kind == "dir":
        victim.mkdir()
        (victim / "keep.txt").write_bytes(SECRET)
    else:
        victim.write_bytes(SECRET)
    link.symlink_to(victim)
    return link


def _untouched(victim: Path) -> bool:
    if victim.is_dir():
        return [p.name for p in victim.iterdir()] == ["keep.txt"] and (
            victim / "keep.txt"
        ).read_bytes() == SECRET
    return victim.read_bytes() == SECRET


# name in the output directory (KEY: the data set's cache key) -> what the link points to
PLANTED = {
    ".lock": "file",
    "logs": "dir",
    "logs/train.jsonl": "file",
    "checkpoints": "dir",
    "model": "dir",
    "metrics.json": "file",
    "tensorboard": "dir",
    "cache": "dir",
    "cache/KEY": "dir",
    "cache/.partial-KEY": "dir",
    "cache/.partial-KEY/.owner": "file",
    "cache/.partial-KEY/train_x.f32.part": "file",
}


@pytest.mark.parametrize("pattern", sorted(PLANTED))
def test_a_planted_symlink_stops_the_run_with_exit_4_and_its_target_is_untouched(
    pattern: str, tiny_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    link = _plant(out, pattern.replace("KEY", _key(tiny_data, out)), PLANTED[pattern], victim)
    proc = run_cli("train", "--data", str(tiny_data), "--output", str(out), *TINY_TRAIN_ARGS)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 4, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"coretrain: {link}: "), proc.stderr
    assert "is a symbolic link" in lines[0]
    assert _untouched(victim)
    assert link.is_symlink()  # not replaced either: nothing was touched
    assert "progress" not in [r["event"] for r in json_lines(proc.stdout)]


@pytest.mark.skipif(not IS_ROOT, reason="only root can give a directory to another user")
@pytest.mark.parametrize("name", ["checkpoints", "logs", "logs/train.jsonl", "."])
def test_a_directory_or_file_of_another_user_stops_the_run_with_exit_4(
    name: str, tiny_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    path = out / name
    if name.endswith(".jsonl"):
        path.parent.mkdir(parents=True)
        path.write_bytes(SECRET)
    else:
        path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 12345, 12345)
    proc = run_cli("train", "--data", str(tiny_data), "--output", str(out), *TINY_TRAIN_ARGS)
    assert proc.returncode == 4, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"coretrain: {path if name != '.' else out}: ")
    assert "belongs to uid 12345" in line
    if path.is_file():
        assert path.read_bytes() == SECRET


def test_a_hard_linked_log_is_refused(tiny_data: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(SECRET)
    log = tmp_path / "out" / "logs" / "train.jsonl"
    log.parent.mkdir(parents=True)
    os.link(victim, log)
    proc = run_cli("train", "--data", str(tiny_data), "--output", str(tmp_path / "out"))
    assert proc.returncode == 4, proc.stderr
    assert "hard links" in proc.stderr and str(log) in proc.stderr
    assert victim.read_bytes() == SECRET


@pytest.mark.skipif(not IS_ROOT, reason="mounting a tmpfs and chown need root")
def test_a_volume_root_of_another_user_is_accepted_as_the_output(tmp_path: Path) -> None:
    """The image's /output (2775, another owner) is a mount point: the job writes in it. The
    run then stops at the missing data (exit 3), not at the directory (exit 4)."""
    volume = tmp_path / "volume"
    skip = mount_tmpfs(volume, "size=4m,mode=2775")
    if skip:
        pytest.skip(skip)
    (tmp_path / "no-data").mkdir()  # there, without the data files
    try:
        os.chown(volume, 12345, 0)
        proc = run_cli("train", "--data", str(tmp_path / "no-data"), "--output", str(volume))
        logs_owner = (volume / "logs").stat().st_uid
    finally:
        umount(volume)
    assert proc.returncode == 3, proc.stderr
    assert "missing data file" in proc.stderr
    assert logs_owner == os.geteuid()


# --- the primitives, in the process ----------------------------------------------------------


def test_a_replaced_file_is_renamed_over_a_planted_symlink_never_written_through(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(SECRET)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "metrics.json").symlink_to(victim)
    (tmp_path / "d" / "new.tmp").symlink_to(victim)
    with open_dir(tmp_path / "d") as d:
        d.write_json("metrics.json", {"a": 1})
        with pytest.raises(StorageError, match="symbolic link"):
            d.create("new.tmp")
    assert victim.read_bytes() == SECRET
    assert not (tmp_path / "d" / "metrics.json").is_symlink()


def test_a_message_about_a_file_reached_through_proc_names_its_real_path(tmp_path: Path) -> None:
    """TensorFlow's errors name the ``/proc/self/fd/N`` path it was given; the job's
    messages name the directory instead (and not ``/proc/self/fd/N0``'s)."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc here: the writers get the plain path")
    with open_dir(tmp_path / "checkpoints") as held:
        text = f"{held.via}/ckpt-3_temp/part-0; No space left on device; {held.via}0/x"
        assert held.named(text) == (
            f"{tmp_path}/checkpoints/ckpt-3_temp/part-0; No space left on device; {held.via}0/x"
        )


def test_a_directory_swapped_after_it_was_opened_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints"
    with open_dir(path) as held:
        assert held.still_at(path)
        path.rename(tmp_path / "moved")
        path.symlink_to(tmp_path / "moved")  # the same directory, reached through a link
        assert not held.still_at(path)
        held.write_bytes("x", b"1")  # writes through the descriptor still land in the original
    assert (tmp_path / "moved" / "x").read_bytes() == b"1"


def test_the_export_refuses_a_planted_model_symlink(tmp_path: Path) -> None:
    from app.release import export

    victim = tmp_path / "victim"
    link = _plant(tmp_path / "out", "model", "dir", victim)
    with pytest.raises(StorageError, match="symbolic link"):
        export.export(None, None, True, link)  # refused before the model is used
    assert _untouched(victim)


def test_the_publish_lock_is_not_followed(tmp_path: Path) -> None:
    from app.release import publish

    victim = tmp_path / "victim.txt"
    link = _plant(tmp_path / "models", publish.LOCK_NAME, "file", victim)
    with (
        open_dir(tmp_path / "models") as d,
        pytest.raises(StorageError, match="symbolic link"),
        publish._locked(d),
    ):
        pass
    assert _untouched(victim) and link.is_symlink()


def test_a_private_keras_home_when_home_is_unusable(tmp_path: Path) -> None:
    from app.budget import apply

    env = {"HOME": str(tmp_path / "missing")}
    made = apply.keras_home(env)
    try:
        assert made is not None and env["KERAS_HOME"] == made
        st = os.stat(made)
        assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
        assert apply.keras_home({"HOME": str(tmp_path)}) is None  # ours and writable
        assert apply.keras_home({"HOME": "/nonexistent", "KERAS_HOME": "/x"}) is None
    finally:
        shutil.rmtree(made or tmp_path / "none", ignore_errors=True)


def test_a_planted_shared_keras_config_does_not_reach_the_run(tmp_path: Path) -> None:
    """Keras falls back to /tmp/.keras without a writable home; the job's private home wins."""
    shared = tmp_path / "tmp"
    (shared / ".keras").mkdir(parents=True)
    (shared / ".keras" / "keras.json").write_text('{"floatx": "float16"}')
    code = (
        "from app.budget import apply; apply.import_tensorflow(); import keras; "
        "print(keras.config.floatx())"
    )
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(HOME="/nonexistent", TMPDIR=str(shared))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "float32"
    assert list(shared.glob("coretrain-keras-*")) == []  # removed at exit


# --- modes (slow: trains) --------------------------------------------------------------------


@pytest.mark.slow
def test_nothing_the_run_writes_is_open_to_others_even_with_umask_000(
    tiny_data: Path, tmp_path: Path
) -> None:
    out, models = tmp_path / "out", tmp_path / "models"
    models.mkdir(mode=0o750)
    # Long enough to beat the mean predictor, so a version is published and checked too.
    args = ["--data", str(tiny_data), "--output", str(out), "--max-steps", "40"]
    args += [*TINY_TRAIN_ARGS, "--publish-dir", str(models)]
    proc = subprocess.run(
        ["sh", "-c", 'umask 000 && exec "$@"', "sh", sys.executable, "-m", "app", "train", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("CORETRAIN_")},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert events(json_lines(proc.stdout), "published")
    assert (models / "1" / "saved_model.pb").is_file() and (models / "1" / "variables").is_dir()
    wide = []
    for root in (out, models):
        for path in [root, *root.rglob("*")]:
            mode = stat.S_IMODE(path.lstat().st_mode)
            limit = 0o2770 if path.is_dir() else 0o660
            if mode & 0o007 or mode & ~limit:
                wide.append(f"{oct(mode)} {path}")
    assert wide == []
    assert (out / "checkpoints").is_dir() and (out / "model" / "saved_model").is_dir()


def test_dir_helpers_keep_within_the_directory(tmp_path: Path) -> None:
    with open_dir(tmp_path / "a") as a:
        assert isinstance(a, Dir)
        tmp = a.temp_dir(".build.")
        with tmp:
            assert stat.S_IMODE(os.fstat(tmp.fd).st_mode) == 0o700
            tmp.write_bytes("f", b"x")
            a.publish(tmp, "done")
        assert stat.S_IMODE((tmp_path / "a" / "done").stat().st_mode) & 0o007 == 0
        assert (tmp_path / "a" / "done" / "f").read_bytes() == b"x"
