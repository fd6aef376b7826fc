"""The fast path of a block of lines: the compiled parser takes what it can, the numpy path
the rest.

The compiled parser (:mod:`app.data.formats.textfile._fastparse`, built from
``app/data/formats/textfile/_fastparse.c`` by
setup.py where a C compiler is present) parses whole lines of plain decimals straight into
float32 rows and stops at the first line it can't take (another number of fields, a blank
line, a field that is not a plain decimal, nan/inf, a value outside its exact range); the
numpy path (:mod:`app.data.formats.textfile.numpy_path`) parses the block from that line on. Both
give the same values, and the errors are the precise path's. Without the compiled module
the numpy path parses every block.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from app.data.formats.textfile import numpy_path
from app.data.formats.textfile.precise import State

#: The compiled fast path (:mod:`app.data.formats.textfile._fastparse`); None: the numpy
#: path alone. Also what app/data/formats/textfile/parallel.py counts newlines and sums
#: columns with.
compiled: ModuleType | None
try:
    from app.data.formats.textfile import _fastparse as compiled
except ImportError:  # no compiler at install time: the numpy path alone
    compiled = None


def parse_block(
    state: State, u: np.ndarray, begin: int, first_line: int, ends: np.ndarray
) -> np.ndarray:
    """The samples of the lines ``u[begin:ends[-1]]`` as float32 (rows, width).

    ``u``: the reader's buffer (:func:`app.data.formats.textfile.reader.read_blocks`);
    ``first_line``: the number of the line at ``begin``; ``ends``: offsets just past each
    line. The compiled parser, when built, takes the lines it can, all of them in a
    well-formed file of plain decimals; the numpy path parses the rest from the first line
    it did not take (same values, and the precise errors). Updates ``state``; raises
    DataError.
    """
    state.infer_width(u[begin : ends[0]], first_line)  # (a blank first line: numpy path's)
    if compiled is None or state.width is None or state.blank_line is not None:
        return numpy_path.parse_block(state, u, begin, first_line, ends)
    out = _rows_out(state, len(ends))
    done = compiled.parse_lines(u, begin, int(ends[-1]), state.width, out)
    if done == len(ends):
        return out
    rest = numpy_path.parse_block(
        state, u, begin if not done else int(ends[done - 1]), first_line + done, ends[done:]
    )
    return np.concatenate([out[:done], rest]) if done else rest


def _rows_out(state: State, rows: int) -> np.ndarray:
    """A (rows, width) float32 array for the compiled path: in ``state.buffers`` if any."""
    assert state.width is not None
    held = state.buffers
    if held is None:
        return np.empty((rows, state.width), np.float32)
    if held.rows is None or held.rows.size < rows * state.width:
        held.rows = np.empty(rows * state.width, np.float32)
    return held.rows[: rows * state.width].reshape(rows, state.width)
