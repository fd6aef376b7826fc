"""A path a person names for a command's output (app/output.py): a file replaced whole, a
symlink followed and kept, a FIFO, a pipe or a device written through and never replaced,
every wait on a reader bounded and ended by SIGTERM; real FIFOs, links and devices."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.errors import ConfigError, Preempted, StorageError
from app.output import Output, is_stdout
from tests.conftest import run_cli

REPO = Path(__file__).parents[1]


def _write(path: Path, data: bytes = b"new\n", **kwargs: object) -> None:
    with Output(path, "--out", **kwargs) as sink:  # type: ignore[arg-type]
        sink.write(data)


def _reader(fifo: Path, got: list[bytes], limit: int | None = None) -> threading.Thread:
    """A thread that opens ``fifo`` and reads it to its end (``limit`` bytes, then closes)."""

    def read() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read() if limit is None else f.read(limit))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_a_file_is_replaced_whole_and_a_symlink_kept(tmp_path: Path) -> None:
    target = tmp_path / "real.txt"
    target.write_bytes(b"old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    _write(link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == b"new\n"
    assert stat.S_IMODE(target.stat().st_mode) & 0o007 == 0
    with pytest.raises(RuntimeError), Output(target, "--out") as sink:
        sink.write(b"half")
        raise RuntimeError("the producer failed")
    assert target.read_bytes() == b"new\n"  # an error leaves the old file
    _write(tmp_path / "dangling-target.txt")
    (tmp_path / "dangling").symlink_to(tmp_path / "made.txt")
    _write(tmp_path / "dangling", b"made\n")  # as a shell's > does: the target is made
    assert (tmp_path / "made.txt").read_bytes() == b"made\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dangling", "dangling-target.txt", "link.txt", "made.txt", "real.txt"
    ]  # fmt: skip


def test_a_fifo_is_written_through_to_its_reader_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pred.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _reader(fifo, got)
    data = os.urandom(1 << 20)  # more than a pipe holds: the writer waits for the reader
    _write(fifo, data, wait_s=60)
    reader.join(timeout=60)
    assert got == [data] and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_fifo_without_a_reader_is_refused_after_the_deadline(tmp_path: Path) -> None:
    fifo = tmp_path / "nobody.fifo"
    os.mkfifo(fifo)
    with pytest.raises(StorageError, match=r"no reader took the --out within 0\.3 s"):
        _write(fifo, wait_s=0.3)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_reader_that_stops_reading_or_goes_away_ends_the_write(tmp_path: Path) -> None:
    # Python ignores SIGPIPE from its start, so a write to a pipe whose reader has gone is
    # EPIPE; a test that stubs execve (tests/test_apply.py) may have left it at its default.
    before = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        _reader_stops_or_goes(tmp_path)
    finally:
        signal.signal(signal.SIGPIPE, before)


def _reader_stops_or_goes(tmp_path: Path) -> None:
    fifo = tmp_path / "slow.fifo"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that never reads
    try:
        with pytest.raises(StorageError, match=r"no reader took the --out within 0\.3 s"):
            _write(fifo, os.urandom(1 << 20), wait_s=0.3)  # the pipe fills, the wait is bounded
    finally:
        os.close(held)
    got: list[bytes] = []
    reader = _reader(fifo, got, limit=10)  # reads 10 bytes and closes
    with pytest.raises(StorageError, match="Broken pipe"):
        _write(fifo, os.urandom(1 << 20), wait_s=60)
    reader.join(timeout=60)
    assert len(got[0]) == 10


def test_devices_are_written_through_never_replaced(tmp_path: Path) -> None:
    before = os.stat("/dev/null")
    _write(Path("/dev/null"))
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert after.st_ino == before.st_ino
    with pytest.raises(StorageError, match="/dev/full: cannot write: No space left on device"):
        _write(Path("/dev/full"))
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_device_that_is_not_there_is_refused_at_once() -> None:
    """/dev/tty without a controlling terminal (a new session) is ENXIO, as a FIFO without
    a reader is: for a device it is no such device, never waited for."""
    proc = subprocess.run(
        [sys.executable, "-m", "app", "exec", "--plan-out", "/dev/tty", "--", "true"],
        capture_output=True, text=True, cwd=REPO, timeout=60, start_new_session=True,
    )  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "coretrain: /dev/tty: cannot write: No such device or address"
    )


def test_what_cannot_take_an_output_is_refused_untouched(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        _write(tmp_path)
    with pytest.raises(ConfigError, match=r"the directory .*/no/such does not exist"):
        _write(tmp_path / "no" / "such" / "p.txt")
    assert not (tmp_path / "no").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="does not exist"):
        _write(tmp_path / "file" / "p.txt")  # a file where a directory is named
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "sock"))
        with pytest.raises(StorageError, match="is a socket; refusing to write to it"):
            _write(tmp_path / "sock")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(StorageError, match="Too many levels of symbolic links"):
        _write(loop)
    if os.geteuid() == 0:  # a block device node (only root can make one): never opened
        disk = tmp_path / "disk"
        os.mknod(disk, stat.S_IFBLK | 0o600, os.makedev(7, 200))
        with pytest.raises(StorageError, match="is a block device; refusing"):
            _write(disk)
        assert stat.S_ISBLK(disk.lstat().st_mode)
    made = {"file", "loop", "sock", *(["disk"] if os.geteuid() == 0 else [])}
    assert {p.name for p in tmp_path.iterdir()} == made


def test_a_stop_request_ends_the_wait(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(Preempted, match="stopped by signal while waiting for its reader"):
        _write(fifo, wait_s=600, stop=stop.is_set)


@pytest.mark.parametrize("name", ["/dev/stdout", "/proc/self/fd/1", "by its own name"])
@pytest.mark.parametrize("mode", ["w", "a"])
def test_stdout_redirected_to_a_file_is_written_through_not_replaced(
    tmp_path: Path, name: str, mode: str
) -> None:
    """``--out /dev/stdout >> all.log`` (or ``>``): the file the shell opened is written at
    the stream's offset; what it held and what else goes to the stream stay, and it keeps
    its inode and mode."""
    log = tmp_path / "all.log"
    log.write_text("pre\n")
    os.chmod(log, 0o644)
    inode = log.stat().st_ino
    target = str(log) if name == "by its own name" else name
    script = (
        "import sys; from pathlib import Path; from app.output import Output\n"
        "print('before', flush=True)\n"
        "with Output(Path(sys.argv[1]), '--out') as sink: sink.write(b'new\\n')\n"
        "print('after', flush=True)\n"
    )
    with open(log, mode) as stdout:  # a shell's > (truncated) or >>
        proc = subprocess.run(
            [sys.executable, "-c", script, target], stdout=stdout, stderr=subprocess.PIPE,
            cwd=REPO, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert log.read_text() == ("pre\n" if mode == "a" else "") + "before\nnew\nafter\n"
    assert (log.stat().st_ino, log.stat().st_mode & 0o777) == (inode, 0o644)


def test_stdout_is_recognised_by_what_it_is(tmp_path: Path) -> None:
    script = "import sys; from app.output import is_stdout; print(is_stdout(sys.argv[1]))"
    for name, expect in (
        ("/dev/stdout", "True"),
        ("/proc/self/fd/1", "True"),
        ("/dev/null", "False"),
    ):
        proc = subprocess.run(
            [sys.executable, "-c", script, name], capture_output=True, text=True, cwd=REPO,
            timeout=60,
        )  # fmt: skip
        assert proc.stdout.strip() == expect, (name, proc.stderr)
    assert not is_stdout(tmp_path / "missing") and not is_stdout(tmp_path)
    shared = tmp_path / "stream.txt"  # the file stdout is, by another name
    with open(shared, "w") as stdout:
        code = "import sys; from app.output import is_stdout; sys.exit(is_stdout(sys.argv[1]))"
        proc = subprocess.run(
            [sys.executable, "-c", code, str(shared)], stdout=stdout, cwd=REPO, timeout=60
        )
    assert proc.returncode == 1  # True


def _waiting(proc: subprocess.Popen[str]) -> dict:
    """The ``output_waiting`` event of ``proc`` (read from its stderr, JSON lines)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        record = json.loads(line)
        if record.get("event") == "output_waiting":
            return record
    raise AssertionError(f"exited {proc.wait()} without waiting")


def test_a_sigterm_ends_a_commands_wait_for_a_reader_with_143(tmp_path: Path) -> None:
    """``coretrain exec --plan-out FIFO`` with no reader (the command starts no TensorFlow):
    SIGTERM mid-wait is exit 143, one line, within 5 s; the FIFO is still a FIFO."""
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORETRAIN_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "exec", "--plan-out", str(fifo), "--", "true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
    )  # fmt: skip
    try:
        assert _waiting(proc)["path"] == str(fifo)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 143
        rest = [line for line in proc.stderr.read().splitlines() if not line.startswith("{")]
        assert rest == [f"coretrain: {fifo}: stopped by signal while waiting for its reader"]
    finally:
        proc.kill()
        proc.wait()
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_an_output_on_a_read_only_file_system_is_one_line_exit_4(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    ro = tmp_path / "ro"
    ro.mkdir()
    probe = subprocess.run(
        [str(unshare), "-rm", "sh", "-c", f"mount -t tmpfs -o ro none {ro}"],
        capture_output=True, text=True, timeout=60,
    ) if unshare else None  # fmt: skip
    if probe is None or probe.returncode != 0:
        pytest.skip("needs util-linux unshare and user namespaces to mount a read-only tmpfs")
    command = f'mount -t tmpfs -o ro none {ro} && exec "$@"'
    proc = subprocess.run(
        [str(unshare), "-rm", "sh", "-c", command, "sh", sys.executable, "-m", "app", "exec",
         "--plan-out", str(ro / "plan.json"), "--", "true"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("{")]
    assert lines == [f"coretrain: {ro / 'plan.json'}: cannot write: Read-only file system"]


def test_generate_writes_each_file_by_the_rule(tmp_path: Path) -> None:
    """``generate --out DIR``: a FIFO under one of its names is written through to its
    reader (not replaced), a symlink followed to its target."""
    out = tmp_path / "data"
    out.mkdir()
    fifo = out / "test_labels.txt"
    os.mkfifo(fifo)
    elsewhere = tmp_path / "elsewhere.txt"
    (out / "train_labels.txt").symlink_to(elsewhere)
    got: list[bytes] = []
    reader = _reader(fifo, got)
    proc = run_cli("generate", "--out", str(out), "--train", "5", "--test", "4")
    assert proc.returncode == 0, proc.stderr
    reader.join(timeout=60)
    assert len(got[0].splitlines()) == 4 and stat.S_ISFIFO(fifo.lstat().st_mode)
    assert (out / "train_labels.txt").is_symlink() and len(elsewhere.read_text().splitlines()) == 5


def test_generate_replaces_the_set_whole_or_not_at_all(tmp_path: Path) -> None:
    """The last of the four files can't be written (a socket; as root, a symlink to another
    UID's file too): exit 4 and the other three are the set that was there, byte for byte,
    no temporary left (each had been replaced before the last one failed)."""
    out = tmp_path / "data"
    assert run_cli("generate", "--out", str(out), "--train", "5", "--test", "4").returncode == 0
    old = {p.name: p.read_bytes() for p in out.iterdir()}
    last = out / "test_labels.txt"
    last.unlink()
    cases = ["a socket", *(["another uid's file"] if os.geteuid() == 0 else [])]
    for case in cases:
        with socket.socket(socket.AF_UNIX) as server:
            if case == "a socket":
                server.bind(str(last))
            else:
                last.unlink()
                (tmp_path / "theirs.txt").write_bytes(b"theirs\n")
                os.chown(tmp_path / "theirs.txt", 4321, 4321)
                last.symlink_to(tmp_path / "theirs.txt")
            proc = run_cli("generate", "--out", str(out), "--seed", "2", "--train", "5",
                           "--test", "4")  # fmt: skip
        assert proc.returncode == 4, (case, proc.stderr)
        assert proc.stderr.splitlines()[-1].startswith(f"coretrain: {last}: data file ")
        kept = {p.name: p.read_bytes() for p in out.iterdir() if p != last}
        assert kept == {n: b for n, b in old.items() if n != last.name}, case
    if os.geteuid() == 0:
        assert (tmp_path / "theirs.txt").read_bytes() == b"theirs\n" and last.is_symlink()


def test_a_set_is_renamed_only_once_every_file_is_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fails the last of four fsyncs (EIO; a full disk on a file system that
    reports it there): no file of the set is replaced, none left half written."""
    from app import output

    names = [tmp_path / f"{i}.txt" for i in range(4)]
    for name in names:
        name.write_bytes(b"old\n")
    real, calls = os.fsync, []

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 4:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StorageError, match="cannot write: Input/output error"):
        output.write_set(((name, b"new\n") for name in names), "data file")
    assert len(calls) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [n.name for n in names]
    assert [name.read_bytes() for name in names] == [b"old\n"] * 4


def test_generate_feeds_fifos_to_a_reader_that_reads_them_in_turn(tmp_path: Path) -> None:
    """Two of the files are FIFOs that one reader opens one after the other: each is
    written and closed as it comes (not held open until the whole set is written)."""
    out = tmp_path / "data"
    out.mkdir()
    fifos = [out / "train_labels.txt", out / "test_labels.txt"]
    for fifo in fifos:
        os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.extend(f.read_bytes() for f in fifos))
    reader.start()
    proc = run_cli("generate", "--out", str(out), "--train", "5", "--test", "4")
    reader.join(timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [len(g.splitlines()) for g in got] == [5, 4]
    assert all(stat.S_ISFIFO(f.lstat().st_mode) for f in fifos)


def test_bench_scalings_report_is_written_by_the_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report of ``bench-scaling --out`` (its measurements stubbed: minutes of training)
    into a FIFO's reader, and through a symlink to its target."""
    from app.bench import step_scaling

    monkeypatch.setattr(step_scaling, "_measure_step", lambda spec: {"samples_per_s": 1.0})
    monkeypatch.setattr(step_scaling, "_processes", lambda cpus, batch: [])
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _reader(fifo, got)
    report = step_scaling.run(max_threads=1, out=fifo)
    reader.join(timeout=60)
    assert json.loads(got[0]) == report and stat.S_ISFIFO(fifo.lstat().st_mode)
    (tmp_path / "link.json").symlink_to(tmp_path / "report.json")
    step_scaling.run(max_threads=1, out=tmp_path / "link.json")
    assert json.loads((tmp_path / "report.json").read_text()) == report


_KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from app.output import Output

sink = Output(Path(sys.argv[1]), "--out").__enter__()
sink.write(b"half of the new content")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writer_killed_mid_file_leaves_the_old_file_and_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "pred.txt"
    target.write_bytes(b"old\n")
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(target)], capture_output=True, timeout=60,
        cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["pred.txt"]  # the temporary had no name
    assert target.read_bytes() == b"old\n"


def test_another_uids_file_is_never_replaced(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file of another UID")
    theirs = tmp_path / "theirs.txt"
    theirs.write_bytes(b"theirs\n")
    os.chown(theirs, 4321, 4321)
    with pytest.raises(StorageError, match="belongs to uid 4321, not to this run's uid 0"):
        _write(theirs)
    assert theirs.read_bytes() == b"theirs\n" and theirs.stat().st_uid == 4321


def test_an_output_name_ending_in_a_slash_names_a_directory(tmp_path: Path) -> None:
    """``exec --plan-out exist.txt/`` fails as a shell's ``> exist.txt/`` does: exit 2 in
    one line, the file untouched, nothing made (a Path of the name drops the slash, and the
    file it then named was replaced, exit 0)."""
    exist = tmp_path / "exist.txt"
    exist.write_bytes(b"kept\n")
    for typed in (f"{exist}/", f"{exist}/.", f"{tmp_path}/new.json/", f"{tmp_path}/new.json/.."):
        proc = run_cli("exec", "--plan-out", typed, "--", "true")
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.splitlines()
        assert f": {typed}: --plan-out names a directory (ends in /" in line, line
    assert [p.name for p in tmp_path.iterdir()] == ["exist.txt"]
    assert exist.read_bytes() == b"kept\n"


@pytest.mark.parametrize(
    ("command", "flag"), [("predict", "--out"), ("exec", "--plan-out"), ("bench-scaling", "--out")]
)
def test_every_output_option_refuses_a_directorys_name(command: str, flag: str) -> None:
    """Each option a command writes a file to (by :class:`Output`) checks the name as typed."""
    import click

    from app.cli import cli

    with pytest.raises(click.BadParameter, match=f"out.json/: {flag} names a directory"):
        cli.commands[command].make_context(command, [flag, "out.json/"])


def test_a_directory_option_takes_a_trailing_slash(tmp_path: Path) -> None:
    proc = run_cli("generate", "--out", f"{tmp_path}/data/", "--train", "5", "--test", "4")
    assert proc.returncode == 0, proc.stderr
    assert len((tmp_path / "data" / "train_labels.txt").read_text().splitlines()) == 5
