"""What share of a file's bytes the page cache holds, asked of the kernel (``mincore``):
whether a read will come from memory or from the disk. Nothing is read, and a file cut short
meanwhile raises no SIGBUS (no mapped page is touched). No TensorFlow here.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


def cached_share(fd: int, start: int, stop: int) -> float:
    """Share (0..1) of bytes [start, stop) of the open file ``fd`` that the page cache holds
    now (``mincore`` on a shared mapping of them); 1 for no bytes, 0 when the kernel does not
    say (the file can't be mapped, or is shorter than ``stop``)."""
    first = start // mmap.PAGESIZE * mmap.PAGESIZE
    if stop <= start:
        return 1.0
    try:
        area = mmap.mmap(fd, stop - first, mmap.MAP_SHARED, mmap.PROT_READ, offset=first)
    except (OSError, ValueError):
        return 0.0
    pages = -(-(stop - first) // mmap.PAGESIZE)
    vec = np.zeros(pages, np.uint8)
    view = np.frombuffer(area, np.uint8)
    try:
        if _LIBC.mincore(view.ctypes.data, stop - first, vec.ctypes.data) != 0:
            return 0.0
    finally:
        del view
        area.close()
    return float(np.count_nonzero(vec & 1)) / pages
