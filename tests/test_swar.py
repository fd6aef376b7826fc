"""The SWAR kernel's tables (app/data/textfile/swar.py), built once at import: what the
decoders of tests/test_textfile.py rely on."""

from __future__ import annotations

import pytest

from app.data.textfile import swar


@pytest.mark.parametrize("nbytes", [8, 16])
def test_the_keep_masks_keep_the_last_n_bytes_of_a_window(nbytes: int) -> None:
    masks = swar._keep_masks(nbytes)
    assert masks.dtype == swar.U64 and masks.shape == (nbytes + 1, nbytes // 8)
    for n in range(nbytes + 1):
        assert masks[n].tobytes() == bytes(nbytes - n) + b"\xff" * n
