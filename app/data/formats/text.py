"""Text (whitespace-separated decimals, plain or gzip: app/data/formats/textfile/) through the
format seam: K from the first line, the cache's size from the first MiB and the file's size,
rows by the parser, a conversion in threads (app/data/formats/textfile/parallel.py). Text
is never used in place. No TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from app.data.formats import files, textfile
from app.data.formats.base import (
    CHUNK_ROWS,
    Converted,
    Io,
    Place,
    Shape,
    too_many_columns,
)
from app.data.formats.textfile import parallel
from app.errors import DataError


class TextArray:
    """A text data file, through the format seam (app/data/formats/base.py)."""

    def __init__(self, path: Path) -> None:
        self.path, self.label = path, str(path)
        st = files.checked(path)
        if st is None:
            raise files.missing(path)
        self.size = st.st_size

    def columns(self, limit: int) -> int:
        """The fields on the first line, counted without parsing more than ``limit``; a
        first line without a field is refused as the parser refuses it (an empty file, a
        blank line followed by data)."""
        k = textfile.first_line_fields(self.path, limit)
        if k is None:
            raise too_many_columns(f"{self.path}:1", limit)
        if k == 0:
            next(textfile.iter_chunks(self.path, chunk_rows=1), None)  # raises: no data
            raise DataError(
                f"{self.path}:1: blank first line (the number of labels is read from it)"
            )
        return k

    def estimate(self, shape: Shape) -> int:
        """Its lines (its size over the bytes per line of its first MiB) × width × 4."""
        sampled, lines, total = textfile.sample_lines(self.path)
        per_line = sampled / max(lines, 1)
        return int(-(-total // max(per_line, 1))) * shape.width * 4

    def in_place(self, shape: Shape) -> Place | None:
        return None

    def chunks(
        self, shape: Shape, allow_nonfinite: bool, chunk_rows: int = CHUNK_ROWS
    ) -> Iterator[np.ndarray]:
        return textfile.iter_chunks(
            self.path, width=shape.width, allow_nonfinite=allow_nonfinite,
            chunk_rows=chunk_rows, width_hint=shape.hint,
        )  # fmt: skip

    def convert(self, dst: Path, shape: Shape, allow_nonfinite: bool, io: Io) -> Converted:
        return parallel.convert_file(
            self.path, dst, width=shape.width, width_hint=shape.hint,
            allow_nonfinite=allow_nonfinite, threads=io.threads, stop=io.stop,
            progress=io.progress, written=io.written, dir_fd=io.dir_fd, hasher=io.hasher,
        )  # fmt: skip
