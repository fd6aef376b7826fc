"""The mountinfo parser (proc_pid_mountinfo(5)): fields, escapes, malformed lines, this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.mountinfo import Mount, parse_mountinfo, read_mountinfo, unescape
from tests.conftest import REPO

NSFS = "612 28 0:4 net:[4026532570] /run/netns/cni-1 rw shared:290 - nsfs nsfs rw\n"
CGROUP_V1 = (
    "31 23 0:28 /docker/ab /sys/fs/cgroup/cpu,cpuacct ro,nosuid master:16 shared:3 - "
    "cgroup cgroup rw,cpu,cpuacct\n"
)
ESCAPED_V2 = "40 23 0:41 /a\\040b /mnt/with\\040space\\011tab rw - cgroup2 cgroup2 rw,nsdelegate\n"
TRUNCATED = "41 23 0:41 / /broken\n"


def test_every_mount_is_kept_with_its_escapes_decoded() -> None:
    mounts, problems = parse_mountinfo(NSFS + CGROUP_V1 + ESCAPED_V2 + TRUNCATED)
    assert [(m.root, m.mount_point, m.fs_type) for m in mounts] == [
        ("net:[4026532570]", "/run/netns/cni-1", "nsfs"),
        ("/docker/ab", "/sys/fs/cgroup/cpu,cpuacct", "cgroup"),
        ("/a b", "/mnt/with space\ttab", "cgroup2"),
    ]
    assert mounts[1].super_options == frozenset({"rw", "cpu", "cpuacct"})
    assert problems == [f"mountinfo line 4 is malformed and was skipped: {TRUNCATED.strip()!r}"]


def test_all_eleven_fields_of_the_man_page_example() -> None:
    line = "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
    ([mount], problems) = parse_mountinfo(line + "\n")
    assert mount == Mount(
        mount_id="36",
        parent_id="35",
        device="98:0",
        root="/mnt1",
        mount_point="/mnt2",
        mount_options=frozenset({"rw", "noatime"}),
        optional_fields=("master:1",),
        fs_type="ext3",
        source="/dev/root",
        super_options=frozenset({"rw", "errors=continue"}),
        line=line,
    )
    assert problems == []


def test_the_kernel_escapes_of_space_tab_newline_and_backslash() -> None:
    assert unescape("a\\134b\\012") == "a\\b\n"
    assert unescape("/mnt/cgroup\\040v1/cpu\\040and") == "/mnt/cgroup v1/cpu and"
    assert unescape("no\\escape\\04") == "no\\escape\\04"  # not three octal digits: as written
    line = "90 27 0:50 / /media/usb\\040stick rw - vfat /dev/sd\\040b1 rw\n"
    ([mount], _) = parse_mountinfo(line)
    assert (mount.mount_point, mount.source) == ("/media/usb stick", "/dev/sd b1")
    assert mount.line == line.rstrip("\n")  # the line as read, escapes and all


def test_optional_fields_are_zero_or_more_before_the_separator() -> None:
    text = (
        "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
        "50 27 0:44 / /a rw shared:1 master:2 propagate_from:3 unbindable - tmpfs tmpfs rw\n"
    )
    mounts, problems = parse_mountinfo(text)
    assert [m.optional_fields for m in mounts] == [
        (),
        ("shared:1", "master:2", "propagate_from:3", "unbindable"),
    ]
    assert [m.fs_type for m in mounts] == ["proc", "tmpfs"] and problems == []


def test_the_first_lone_dash_after_the_fixed_fields_is_the_separator() -> None:
    ([mount], _) = parse_mountinfo("60 27 0:45 / /b rw shared:7 - tmpfs - rw,size=4k\n")
    assert (mount.optional_fields, mount.fs_type, mount.source) == (("shared:7",), "tmpfs", "-")
    assert mount.super_options == frozenset({"rw", "size=4k"})


def test_missing_super_options_are_not_malformed() -> None:
    ([mount], problems) = parse_mountinfo("61 27 0:46 / /c rw - tmpfs tmpfs\n")
    assert mount.super_options == frozenset({""}) and problems == []


def test_malformed_lines_are_reported_and_the_others_kept() -> None:
    text = (
        "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
        "\n"
        "655 28 0:4 net:[4026532904] /run/netns/cni-truncated rw shared:\n"
        "70 27 0:47 / /d rw - cgroup2\n"  # the source is missing
        "71 27 - cgroup2 cgroup2 rw\n"  # the separator before the sixth field
        "72 27 0:48 / /e rw - tmpfs tmpfs rw\n"
    )
    mounts, problems = parse_mountinfo(text)
    assert [m.mount_point for m in mounts] == ["/proc", "/e"]
    assert [problem.split(" is malformed")[0] for problem in problems] == [
        "mountinfo line 3",
        "mountinfo line 4",
        "mountinfo line 5",
    ]
    assert problems[1] == (
        "mountinfo line 4 is malformed and was skipped: '70 27 0:47 / /d rw - cgroup2'"
    )
    assert parse_mountinfo("") == ([], [])


def test_an_unreadable_file_has_no_mounts(tmp_path: Path) -> None:
    assert read_mountinfo(str(tmp_path / "missing")) == []
    (tmp_path / "mountinfo").write_text(NSFS + TRUNCATED + ESCAPED_V2)
    assert [m.mount_point for m in read_mountinfo(str(tmp_path / "mountinfo"))] == [
        "/run/netns/cni-1",
        "/mnt/with space\ttab",
    ]


def test_this_machine_s_mountinfo_has_the_root_and_its_cgroup_mounts() -> None:
    """Against the live file read with plain string handling (fields 5 and 9)."""
    mounts = read_mountinfo()
    text = Path("/proc/self/mountinfo").read_text()
    assert len(mounts) == len(text.splitlines())
    assert "/" in [m.mount_point for m in mounts]
    expected = [
        unescape(line.split()[4])
        for line in text.splitlines()
        if line.split(" - ")[1].split()[0] in ("cgroup", "cgroup2")
    ]
    found = [m.mount_point for m in mounts if m.fs_type in ("cgroup", "cgroup2")]
    assert found == expected
    assert found, "this machine mounts cgroup or cgroup2 somewhere"


def test_mountinfo_is_read_as_utf_8_whatever_the_locale(tmp_path: Path) -> None:
    """The kernel writes names as they are (it escapes only space, tab, newline and
    backslash): a mount point in UTF-8 reads the same under an ASCII locale."""
    path = tmp_path / "mountinfo"
    path.write_text("90 27 0:50 / /media/donn\u00e9es rw - vfat /dev/sdb1 rw\n", encoding="utf-8")
    assert [m.mount_point for m in read_mountinfo(str(path))] == ["/media/donn\u00e9es"]
    code = (
        "import codecs, locale\n"
        "locale.setlocale(locale.LC_CTYPE, 'C')  # an ASCII locale, without UTF-8 mode\n"
        "print(codecs.lookup(locale.getencoding()).name)\n"
        "from app.mountinfo import read_mountinfo\n"
        f"print(ascii([m.mount_point for m in read_mountinfo({str(path)!r})]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "PYTHONUTF8": "0"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["ascii", ascii(["/media/donn\u00e9es"])]
