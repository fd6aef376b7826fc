"""Data files are found by name, plain or .gz, and known by content (no TensorFlow)."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.data import synthetic
from app.data.formats import files, hdf5, npz
from app.data.formats.detect import kind, open_array
from app.data.formats.sources import ROLES, find, fingerprint
from app.data.formats.textfile import opener
from app.data.formats.textfile.parallel import split_lines
from app.errors import ConfigError, DataError
from tests.conftest import REPO, json_lines, run_cli


def _gzip_all(src: Path, dst: Path) -> None:
    dst.mkdir()
    for role in ROLES:
        with open(src / f"{role}.txt", "rb") as f, gzip.open(dst / f"{role}.txt.gz", "wb") as g:
            shutil.copyfileobj(f, g)


def test_each_role_is_found_plain_or_gzip(tiny_data: Path, tmp_path: Path) -> None:
    packed = tmp_path / "gz"
    _gzip_all(tiny_data, packed)
    assert find(tiny_data, "train_labels") == tiny_data / "train_labels.txt"
    assert find(packed, "train_labels") == packed / "train_labels.txt.gz"


def test_an_explicit_name_wins(tiny_data: Path, tmp_path: Path) -> None:
    assert find(tmp_path, "test_labels", "my.labels") == tmp_path / "my.labels"


def test_two_candidates_are_a_usage_error_and_none_is_a_data_error(
    tiny_data: Path, tmp_path: Path
) -> None:
    shutil.copy(tiny_data / "train_labels.txt", tmp_path / "train_labels.txt")
    shutil.copy(tiny_data / "train_labels.txt", tmp_path / "train_labels.txt.gz")
    with pytest.raises(ConfigError, match=r"both train_labels\.txt and train_labels\.txt\.gz"):
        find(tmp_path, "train_labels")
    with pytest.raises(DataError, match=r"test_labels\.txt: missing data file .*\.gz"):
        find(tmp_path, "test_labels")


def test_the_cli_reports_two_candidates_in_one_line_exit_2(tiny_data: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    with (
        open(data / "test_features.txt", "rb") as f,
        gzip.open(data / "test_features.txt.gz", "wb") as g,
    ):
        shutil.copyfileobj(f, g)
    proc = run_cli("train", "--data", str(data), "--output", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "test_features.txt and test_features.txt.gz" in line and "--test-features" in line


def test_the_fingerprint_follows_content_and_modification_time(tmp_path: Path) -> None:
    path = tmp_path / "x.txt"
    path.write_bytes(b"1 2 3\n" * 100_000)
    first = fingerprint(path)
    link = tmp_path / "link.txt"
    link.symlink_to(path)  # the same file by another path (as a mount shows it): the same
    assert fingerprint(link) == first
    copy = tmp_path / "copy.txt"
    shutil.copy2(path, copy)  # same bytes, same mtime, but another file: converted again
    assert fingerprint(copy) != first
    assert {k: v for k, v in fingerprint(copy).items() if k != "ctime_ns"} == {
        k: v for k, v in first.items() if k != "ctime_ns"
    }
    size = len(path.read_bytes())
    data = bytearray(path.read_bytes())
    data[size * 8 // 17 + 10] = ord("9")  # inside one of the sampled blocks
    path.write_bytes(bytes(data))
    os.utime(path, ns=(first["mtime_ns"], first["mtime_ns"]))  # even with the old mtime
    assert fingerprint(path)["sample_sha256"] != first["sample_sha256"]
    # A change between the samples is told by the modification time an edit sets, and
    # by the status change time when the modification time is put back.
    os.utime(path, ns=(first["mtime_ns"] + 1, first["mtime_ns"] + 1))
    assert fingerprint(path) != first and fingerprint(path)["bytes"] == first["bytes"]
    big = tmp_path / "big.txt"
    big.write_bytes(b"1 2 3\n" * 1_000_000)  # 6 MB: most bytes lie between the samples
    before = fingerprint(big)
    with open(big, "r+b") as f:
        f.seek(100_000)  # after the first 64 KiB sample, before the second (at 6 MB / 17)
        f.write(b"7")
    os.utime(big, ns=(before["mtime_ns"], before["mtime_ns"]))  # as `touch -r` leaves it
    after = fingerprint(big)
    assert after["sample_sha256"] == before["sample_sha256"]
    assert after["mtime_ns"] == before["mtime_ns"] and after["ctime_ns"] != before["ctime_ns"]


def _special(path: Path, kind: str) -> None:
    """Make ``path`` a FIFO, a character device (a symlink to /dev/null), a directory or a
    socket."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/null")
    elif kind == "directory":
        path.mkdir()
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()


#: Every reader of a data file, each opening it its own way (app/data/formats/files.py is
#: the one place they open it).
READERS = {
    "format": lambda p: kind(p),
    "fingerprint": lambda p: fingerprint(p),
    "array": lambda p: open_array(p),
    "text": lambda p: opener.open_data(str(p)),
    "ranges": lambda p: split_lines(p, 2, 1),
    "npz": lambda p: npz.members(p),
    "hdf5": lambda p: hdf5.members(p),
}
KINDS = [("fifo", "a FIFO (named pipe)"), ("device", "a character device"),
         ("socket", "a socket"), ("directory", "a directory")]  # fmt: skip


@pytest.fixture
def no_wait() -> Iterator[None]:
    """A read that waits (a FIFO opened for reading waits for a writer) fails the test
    after 20 s instead of hanging the suite (SIGALRM interrupts the wait)."""

    def waited(signum: int, frame: object) -> None:
        raise AssertionError("the reader waited on the file")

    before = signal.signal(signal.SIGALRM, waited)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, before)


@pytest.mark.parametrize(("made", "named"), KINDS)
@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_refuses_a_data_file_that_is_not_a_regular_file(
    tmp_path: Path, made: str, named: str, reader: str, no_wait: None
) -> None:
    path = tmp_path / "train_labels.txt"
    _special(path, made)
    with pytest.raises(DataError) as caught:
        READERS[reader](path)
    assert str(caught.value) == f"{path}: data file is {named}, not a regular file"


@pytest.mark.skipif(not os.path.exists("/proc/kmsg"), reason="no /proc/kmsg (Linux)")
@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_refuses_a_file_of_the_kernels_interface(reader: str, no_wait: None) -> None:
    """/proc and /sys files say they hold 0 or 4096 bytes whatever they give, and
    /proc/kmsg's read waits for the kernel's next message (as root): never data."""
    for path in (Path("/proc/kmsg"), Path("/proc/self/environ")):
        with pytest.raises(DataError) as caught:
            READERS[reader](path)
        assert str(caught.value) == (
            f"{path}: data file is on the kernel's proc file system (the kernel's interface, "
            "not a file of data)"
        )


def test_a_fifo_put_in_place_after_the_check_is_opened_without_waiting_and_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_wait: None
) -> None:
    """The status is taken again from the descriptor: a FIFO swapped in after the check is
    opened at once (O_NONBLOCK) and refused, never read."""
    regular = tmp_path / "regular"
    regular.write_bytes(b"1 2 3\n")
    fifo = tmp_path / "x.txt"
    os.mkfifo(fifo)
    monkeypatch.setattr(files, "checked", lambda path, what="": os.stat(regular))
    with pytest.raises(DataError) as caught:
        files.open_fd(fifo)
    assert str(caught.value) == f"{fifo}: data file is a FIFO (named pipe), not a regular file"


def test_a_fifo_or_a_device_given_as_data_is_named_as_one(tmp_path: Path, no_wait: None) -> None:
    fifo = tmp_path / "data"
    os.mkfifo(fifo)
    with pytest.raises(DataError) as caught:
        find(fifo, "train_labels")
    assert str(caught.value) == f"{fifo}: --data is a FIFO (named pipe), not a regular file"
    with pytest.raises(DataError) as caught:
        find(Path("/dev/zero"), "train_labels")
    assert str(caught.value) == "/dev/zero: --data is a character device, not a regular file"


def test_a_symlink_loop_is_named_as_one(tmp_path: Path) -> None:
    loop = tmp_path / "train_labels.txt"
    loop.symlink_to(loop)
    assert find(tmp_path, "train_labels") == loop
    with pytest.raises(DataError) as caught:
        fingerprint(loop)
    assert str(caught.value) == (
        f"{loop}: a symlink loop (a link that leads back to itself), not a file"
    )


def test_a_fifo_among_the_data_files_is_exit_3_in_one_line_before_it_is_opened(
    tiny_data: Path, tmp_path: Path
) -> None:
    """Opening a FIFO for reading blocks until a writer comes (forever, SIGTERM or not):
    the run refuses it from its status, and nothing ever opened it (a writer would find a
    reader)."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    (data / "test_labels.txt").unlink()
    os.mkfifo(data / "test_labels.txt")
    proc = run_cli("train", "--data", str(data), "--output", str(tmp_path / "o"), timeout=120)
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line == (
        f"coretrain: {data / 'test_labels.txt'}: data file is a FIFO (named pipe), "
        "not a regular file"
    )
    with pytest.raises(OSError, match="No such device or address"):  # ENXIO: no reader
        os.close(os.open(data / "test_labels.txt", os.O_WRONLY | os.O_NONBLOCK))


def test_a_dangling_symlink_is_named_as_one(tmp_path: Path) -> None:
    data = tmp_path / "data"
    synthetic.generate(data, train=20, test=5, seed=0)
    (data / "train_labels.txt").unlink()
    (data / "train_labels.txt").symlink_to("/mnt/gone/labels.txt")
    proc = run_cli("train", "--data", str(data), "--output", str(tmp_path / "o"))
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip() == (
        f"coretrain: {data / 'train_labels.txt'}: a symlink to /mnt/gone/labels.txt, which "
        "does not exist"
    )


# --- what no check can see: a FIFO put in place after its check ------------------------------

#: The command line with the check of the files named ``fifo`` blind (they look absent, as a
#: regular file's place looks before a FIFO is put there) and ticks of ``sys.argv[1]`` s.
_BLIND = """
import sys
from app import signals
from app.data.formats import files
checked = files.checked
files.checked = lambda p, what="data file": None if str(p).endswith("fifo") else checked(p, what)
signals.TICK_SECONDS = float(sys.argv.pop(1))
from app.cli import main
main()
"""


def _hdf5_on_a_fifo(tmp_path: Path) -> Path:
    """The tiny data set's shape as an HDF5 file whose training labels are kept in the
    external raw file ``fifo`` (a FIFO): HDF5 opens it by name when it reads them."""
    import h5py
    import numpy as np

    os.mkfifo(tmp_path / "fifo")
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f["train_features"] = np.zeros((20, 440), np.float32)
        f["test_features"] = np.zeros((5, 440), np.float32)
        f["test_labels"] = np.zeros((5, 3), np.float32)
        raw = [(str(tmp_path / "fifo"), 0, 240)]
        f.create_dataset("train_labels", shape=(20, 3), dtype="<f4", external=raw)
    return path


def _blind(tmp_path: Path, tick: float) -> subprocess.Popen[str]:
    path = _hdf5_on_a_fifo(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORETRAIN_")}
    argv = [sys.executable, "-c", _BLIND, str(tick), "train", "--data", str(path),
            "--output", str(tmp_path / "o"), "--height", "8", "--width", "55"]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)  # fmt: skip


def test_a_fifo_hdf5_opens_after_its_check_fails_the_run_instead_of_hanging_it(
    tmp_path: Path,
) -> None:
    """HDF5 opens the FIFO by name and waits for a writer, holding the GIL: the wait's
    ticks interrupt the open, so the run ends with exit 3 naming the file (it hung, holding
    the output lock, and a SIGTERM was only logged)."""
    proc = _blind(tmp_path, 0.2)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr
    (line,) = stderr.splitlines()
    assert line.startswith(f"coretrain: {tmp_path / 'd.h5'}:train_labels: cannot read: ")


def _waiting_on_a_fifo(pid: int) -> bool:
    """Whether the main thread of ``pid`` waits in a FIFO's open for a writer."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text() == "wait_for_partner"
    except OSError:
        return False


def test_a_sigterm_ends_a_wait_in_hdf5s_open_of_a_fifo_at_once_with_143(tmp_path: Path) -> None:
    """Ticks far apart, so the run waits in the open until the signal comes: it ends the
    wait and the run as a stop, 143, one line."""
    proc = _blind(tmp_path, 3600)
    while not _waiting_on_a_fifo(proc.pid):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    (line,) = stderr.splitlines()
    assert line == (
        f"coretrain: {tmp_path / 'd.h5'}:train_labels: stopped by SIGTERM while waiting for it"
    )
    assert [r["status"] for r in json_lines(stdout) if r["event"] == "end"] == ["preempted"]
