"""Parse whitespace-separated float text files into float32 chunks, with exact error positions.

Format (docs/architecture.md, "Data directory"): one sample per line, fields separated by ASCII
whitespace (space, tab, CR, LF, VT, FF: the set ``bytes.split()`` uses), each field a decimal
float (``1``, ``-2.5``, ``.5``, ``3.``, ``1e-3``, ``2.5E+02``) or ``nan`` / ``inf`` /
``infinity`` (any case, optional sign). A file may be gzip, recognised by its magic bytes
(so the ``.gz`` suffix is not required); multi-member gzip is read to the end. A UTF-8 BOM,
CRLF line ends, a last line without a newline and blank lines at the end are accepted; a
blank line followed by more data is an error naming the blank line.

Values are exactly what numpy gives for the text: the decimal is rounded once to float64
(correctly, as ``float()`` and ``np.loadtxt`` do) and that double is rounded to float32.

The modules, from the file to the values (no Python per field on the happy path):

* :mod:`~app.data.formats.textfile.opener` -- opening a file, plain or gzip; I/O errors; line limit;
* :mod:`~app.data.formats.textfile.probes` -- what a file's start says: gzip, first line, size;
* :mod:`~app.data.formats.textfile.reader` -- whole lines read in blocks into a padded buffer;
* :mod:`~app.data.formats.textfile.chunks` -- :func:`iter_chunks`: the blocks parsed, in order;
* :mod:`~app.data.formats.textfile.blocks` -- a block: the compiled parser, then the numpy path;
* :mod:`~app.data.formats.textfile.numpy_path` -- a block split into fields and decoded by numpy;
* :mod:`~app.data.formats.textfile.swar` -- the SWAR kernel decoding many fields at once;
* :mod:`~app.data.formats.textfile.precise` -- one field at a time, and every error message.

No TensorFlow here (docs/architecture.md: data.textfile never imports it).
"""

from __future__ import annotations

from app.data.formats.textfile.chunks import Span, iter_chunks
from app.data.formats.textfile.opener import MAX_LINE_BYTES
from app.data.formats.textfile.precise import parse_field
from app.data.formats.textfile.probes import first_line_fields, is_gzip, sample_lines
from app.data.formats.textfile.reader import Buffers

__all__ = [
    "MAX_LINE_BYTES",
    "Buffers",
    "Span",
    "first_line_fields",
    "is_gzip",
    "iter_chunks",
    "parse_field",
    "sample_lines",
]
