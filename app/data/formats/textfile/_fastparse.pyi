"""Type stub of the compiled module built from _fastparse.c."""

from typing_extensions import Buffer

def parse_lines(text: Buffer, begin: int, stop: int, width: int, out: Buffer, /) -> int:
    """Whole lines of ``text[begin:stop]`` parsed into the float32 buffer ``out``: their count."""

def add_column_sums(values: Buffer, width: int, sums: Buffer, sums_sq: Buffer, /) -> None:
    """Add the float32 rows' column sums and sums of squares (float64) to the two buffers."""

def newline_offsets(text: Buffer, out: Buffer, /) -> int:
    """Offsets of ``text``'s ``b"\\n"`` bytes written to the int64 buffer ``out`` (as many as
    it holds); how many there are in all."""
