"""Type stub of the compiled module built from _fastparse.c."""

from typing_extensions import Buffer

def parse_lines(text: Buffer, begin: int, stop: int, width: int, out: Buffer, /) -> int:
    """Whole lines of ``text[begin:stop]`` parsed into the float32 buffer ``out``: their count."""
