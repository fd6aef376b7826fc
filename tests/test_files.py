"""The one reader of kernel files under a root (app/budget/rootfiles.py): paths, and what it
records for a file that gives nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.budget.rootfiles import RootFiles
from tests.conftest import REPO

#: The start of a child Python that reads under an ASCII locale (LC_CTYPE "C", no UTF-8
#: mode); it prints the encoding Python's open() then uses.
ASCII_LOCALE = (
    "import codecs, locale\n"
    "locale.setlocale(locale.LC_CTYPE, 'C')\n"
    "print(codecs.lookup(locale.getencoding()).name)\n"
)


def test_the_default_root_is_the_live_system() -> None:
    files = RootFiles()
    assert files.is_live
    assert files.read("/proc/self/cgroup") == Path("/proc/self/cgroup").read_text()


def test_any_absolute_path_is_taken_under_the_root(tmp_path: Path) -> None:
    (tmp_path / "Xen" / "dir").mkdir(parents=True)
    (tmp_path / "Xen" / "file").write_text(" 42\n")
    files = RootFiles(tmp_path)
    assert files.read("/Xen/file") == " 42\n"
    assert files.inputs == {"/Xen/file": "42"}  # recorded stripped
    assert files.exists("/Xen/file") and files.is_dir("/Xen/dir")
    assert sorted(files.listdir("/Xen")) == ["dir", "file"]


def test_a_file_that_gives_nothing_is_recorded_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "latin1").write_bytes(b"caf\xe9\n")
    files = RootFiles(tmp_path)
    assert [files.read(p) for p in ("/missing", "/dir", "/latin1")] == [None, None, None]
    assert files.inputs == {
        "/missing": "<missing>",
        "/dir": "<unreadable: Is a directory>",  # the OS's reason
        "/latin1": "<unreadable: UnicodeDecodeError>",  # else the error's type
    }
    assert [files.status(p) for p in ("/missing", "/dir", "/latin1", "/never-read")] == [
        "missing",
        "unreadable: Is a directory",
        "unreadable: UnicodeDecodeError",
        "missing",
    ]


def test_files_are_read_as_utf_8_whatever_the_locale(tmp_path: Path) -> None:
    (tmp_path / "name").write_text("donn\u00e9es\n", encoding="utf-8")
    assert RootFiles(tmp_path).read("/name") == "donn\u00e9es\n"
    code = ASCII_LOCALE + (
        "from app.budget.rootfiles import RootFiles\n"
        f"print(ascii(RootFiles({str(tmp_path)!r}).read('/name')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "PYTHONUTF8": "0"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["ascii", ascii("donn\u00e9es\n")]
