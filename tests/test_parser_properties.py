"""Property: whatever is done to a valid data set's bytes, the run ends in exit 0 with the
right values or in exit 3 with one line naming the right file; never 1, never a traceback.

Hypothesis writes a small valid data set (H×W = 2×3, K from 1 to 3, 1–4 training and 1–3
test samples; values written as integers, decimals, exponents, nan-free; space or tab
separators, LF or CRLF, a BOM, trailing blank lines), makes one file gzip or not, then
mutates that file's bytes: a byte deleted, inserted or replaced (in the text, or in the
compressed stream), the file truncated, or the mutated text compressed again. The data go
through what ``coretrain train`` runs before TensorFlow (``app.training.run.load_data``:
the label-column bound, the size estimate, the conversion in one or two threads) and any
exception through the CLI's own error path (``app.cli._fail``): the exit code and the line
it prints.

The expected outcome comes from a reference reading of the format (docs/architecture.md,
"Data directory") written here from its rules, not from the parser: gzip by magic bytes,
a BOM at the start, lines split at LF, fields split at ASCII whitespace, each field a float
in Python's grammar without "_", rounded to float32 through float64, finite; blank lines
only at the end; K from the first line of the training labels; as many label lines as
feature lines. For a plain file the message must name the same line as the reference.

Each file and kind of change is a test of its own, so every pair is tried. The example
count is bounded (:data:`EXAMPLES` in all) and derandomized, so CI runs the same examples
in about 15 s; ``CORETRAIN_HYPOTHESIS_EXAMPLES`` raises it for a longer search.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app import cli
from app.config import TrainConfig
from app.data.formats.sources import ROLES
from app.data.formats.textfile import parallel
from app.training.inputs.load import load_data
from tests.conftest import cache_dir

EXAMPLES = int(os.environ.get("CORETRAIN_HYPOTHESIS_EXAMPLES", "300"))
H, W = 2, 3
BOM = b"\xef\xbb\xbf"
#: Bytes a mutation inserts or writes: the format's own and some it must refuse.
BYTES = b"0123456789.eE+-_ \t\r\n\x0b\x0c\x00xn\xff"


# --- the reference reading ---------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """The first problem: the file's role and its line (None: the file as a whole)."""

    role: str
    line: int | None


def _value(token: bytes) -> np.float32 | None:
    """The float32 of one field, or None when it is not a finite number of the format."""
    try:
        text = token.decode("ascii")
    except UnicodeDecodeError:
        return None
    if "_" in text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    with np.errstate(over="ignore"):
        single = np.float32(value)
    return single if np.isfinite(single) else None


def _rows(text: bytes, width: int, role: str) -> np.ndarray | Bad:
    """The rows of one decompressed file of ``width`` fields per line, or its first problem."""
    lines = text.removeprefix(BOM).split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    rows, blank = [], None
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            blank = blank or number
            continue
        if blank is not None:
            return Bad(role, blank)
        values = [_value(f) for f in fields]
        if len(fields) != width or any(v is None for v in values):
            return Bad(role, number)
        rows.append(values)
    if not rows:
        return Bad(role, None)
    return np.array(rows, np.float32)


def expected(files: dict[str, bytes]) -> dict[str, np.ndarray] | Bad:
    """What a data set reads as: its four arrays, or its first problem."""
    texts = {}
    for role in ROLES:
        raw = files[role]
        if raw[:2] == b"\x1f\x8b":
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError, zlib.error):
                return Bad(role, None)
        texts[role] = raw
    first = texts["train_labels"].removeprefix(BOM).split(b"\n", 1)[0]
    k = len(first.split())
    if k == 0:  # no label count: as the file's own problem (empty, or data after a blank)
        found = _rows(texts["train_labels"], 1, "train_labels")
        return found if isinstance(found, Bad) else Bad("train_labels", 1)
    arrays = {}
    for role in ROLES:
        found = _rows(texts[role], H * W if "features" in role else k, role)
        if isinstance(found, Bad):
            return found
        arrays[role] = found
    for split in ("train", "test"):
        if len(arrays[f"{split}_features"]) != len(arrays[f"{split}_labels"]):
            return Bad(f"{split}_labels", None)
    return arrays


# --- the data sets and what is done to them ---------------------------------------------


def _number(draw: st.DrawFn) -> bytes:
    value = draw(st.floats(-1e6, 1e6, allow_nan=False, width=32))
    style = draw(st.sampled_from(["repr", "e", "g", "int", "point"]))
    text = {
        "repr": repr(value),
        "e": f"{value:.4e}",
        "g": f"{value:g}",
        "int": str(int(value)),
        "point": f"{value:.2f}".rstrip("0"),
    }[style]
    return text.encode()


@st.composite
def data_sets(draw: st.DrawFn) -> dict[str, bytes]:
    """Four valid files (plain text)."""
    k = draw(st.integers(1, 3))
    sizes = {"train": draw(st.integers(1, 4)), "test": draw(st.integers(1, 3))}
    files = {}
    for role in ROLES:
        width = H * W if "features" in role else k
        sep = draw(st.sampled_from([b" ", b"\t", b"  "]))
        end = draw(st.sampled_from([b"\n", b"\r\n"]))
        lines = [
            sep.join(_number(draw) for _ in range(width)) for _ in range(sizes[role.split("_")[0]])
        ]
        text = end.join(lines) + draw(st.sampled_from([b"", end, end + end]))
        files[role] = (BOM if draw(st.booleans()) else b"") + text
    return files


OPS = ("none", "delete", "insert", "replace", "truncate")


@st.composite
def mutated(draw: st.DrawFn, role: str, op: str) -> tuple[dict[str, bytes], str]:
    """A valid data set with the file of ``role`` changed by ``op``; what was done."""
    files = draw(data_sets())
    packing = draw(st.sampled_from(["plain", "gzip-then-mutate", "mutate-then-gzip"]))
    raw = files[role]
    if packing == "gzip-then-mutate":
        raw = gzip.compress(raw, mtime=0)
    # The edges (the first byte, a line's start or end) are where the format's rules change.
    edges = [0, *(i + 1 for i, b in enumerate(raw) if b == 10)]
    at = draw(st.one_of(st.sampled_from(edges), st.integers(0, max(len(raw) - 1, 0))))
    byte = bytes([draw(st.sampled_from(BYTES))])
    if op == "delete":
        raw = raw[:at] + raw[at + 1 :]
    elif op == "insert":
        raw = raw[:at] + byte + raw[at:]
    elif op == "replace":
        raw = raw[:at] + byte + raw[at + 1 :]
    elif op == "truncate":
        raw = raw[:at]
    if packing == "mutate-then-gzip":
        raw = gzip.compress(raw, mtime=0)
    return {**files, role: raw}, f"{role}: {op} {byte!r} at {at} ({packing})"


# --- the run ------------------------------------------------------------------------------


def _run(files: dict[str, bytes], threads: int, root: Path) -> tuple[int, str, object]:
    """Exit code, stderr and the data cache (exit 0) of the run's data step on ``files``."""
    data = root / "data"
    data.mkdir()
    for role, content in files.items():
        (data / f"{role}.txt").write_bytes(content)
    config = TrainConfig.of(data_dir=data, output_dir=root / "out", height=H, width=W)
    plan = SimpleNamespace(intra_op_threads=threads)
    err = io.StringIO()
    try:
        return 0, "", load_data(config, cache_dir(config), plan, lambda: False)  # type: ignore[arg-type]
    except Exception as exc:  # what the CLI does with it
        with contextlib.redirect_stderr(err), mock.patch.object(cli.logs, "event"):
            try:
                cli._fail(exc)
            except SystemExit as done:
                return int(done.code or 0), err.getvalue(), exc
    raise AssertionError("unreachable")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("role", ROLES)
@settings(
    max_examples=max(EXAMPLES // (len(ROLES) * len(OPS)), 1),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data(), threads=st.sampled_from([1, 2]))
def test_a_mutated_data_set_is_read_right_or_refused_naming_the_file(
    role: str, op: str, data: st.DataObject, threads: int
) -> None:
    files, change = data.draw(mutated(role, op))
    want = expected(files)
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(parallel, "MIN_RANGE_BYTES", 16),  # small files in several ranges
    ):
        code, err, result = _run(files, threads, Path(tmp))
        event(f"exit {code}")
        if isinstance(want, Bad):
            _check_refused(code, err, result, want, Path(tmp) / "data", files, change)
            return
        assert code == 0, f"{change}: exit {code}, {err!r}; expected the data to be read"
        got = {
            "train_features": result.features("train").reshape(-1, H * W),  # type: ignore[attr-defined]
            "train_labels": result.labels("train"),  # type: ignore[attr-defined]
            "test_features": result.features("test").reshape(-1, H * W),  # type: ignore[attr-defined]
            "test_labels": result.labels("test"),  # type: ignore[attr-defined]
        }
        for role in ROLES:
            assert got[role].shape == want[role].shape, change
            assert np.array_equal(got[role].view(np.uint32), want[role].view(np.uint32)), change


def _check_refused(
    code: int, err: str, result: object, want: Bad, data: Path, files: dict[str, bytes],
    change: str,
) -> None:  # fmt: skip
    """Exit 3, one line naming the reference's file (and line, for a plain file)."""
    assert code == 3, f"{change}: exit {code}, {err!r}, {result!r}; expected {want}"
    (line,) = err.splitlines()
    path = data / f"{want.role}.txt"
    assert line.startswith(f"coretrain: {path}:"), f"{change}: {line!r}; expected {want}"
    if files[want.role][:2] != b"\x1f\x8b" and want.line is not None:
        assert line.startswith(f"coretrain: {path}:{want.line}: "), f"{change}: {line!r}"


def test_the_reference_reads_what_the_format_allows() -> None:
    """The oracle itself, on cases whose answer is written out."""
    ok = expected(
        {
            "train_features": BOM + b"1 2 3 4 5 6\r\n-1e-3\t.5 3. +7 0 -0\n\n",
            "train_labels": b"1 2\n3 4",
            "test_features": gzip.compress(b"1 2 3 4 5 6\n"),
            "test_labels": b"9 9\n",
        }
    )
    assert isinstance(ok, dict)
    row = np.array([-0.001, 0.5, 3.0, 7.0, 0.0, -0.0], np.float32)
    assert ok["train_features"][1].view(np.uint32).tolist() == row.view(np.uint32).tolist()
    assert re.fullmatch(r"\[\[1\.0, 2\.0\], \[3\.0, 4\.0\]\]", str(ok["train_labels"].tolist()))
    bad = {
        b"1 2 3 4 5 6\n\n1 2 3 4 5 6\n": Bad("train_features", 2),
        b"1 2 3 4 5 1_0\n": Bad("train_features", 1),
        b"1 2 3 4 5 1e39\n": Bad("train_features", 1),
        b"1 2 3 4 5\n": Bad("train_features", 1),
        b"": Bad("train_features", None),
    }
    for text, problem in bad.items():
        files = {"train_features": text, "train_labels": b"1\n", "test_features": b"1 2 3 4 5 6\n",
                 "test_labels": b"1\n"}  # fmt: skip
        assert expected(files) == problem, text
