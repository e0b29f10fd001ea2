"""The models' sinusoidal position table (``multihead.positional``) against the oracle's independent copy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from multihead import positional, reference


@pytest.mark.parametrize(("max_len", "d_model"), [(1, 1), (3, 2), (50, 7), (20, 59), (64, 512), (2048, 6)])
def test_sinusoidal_positions_equal_the_oracles(max_len: int, d_model: int) -> None:
    table = positional.sinusoidal_positions(max_len, d_model)
    assert table.shape == (max_len, d_model)
    assert table.dtype == np.float64
    # Angles reach max_len radians; float64 rounding of an angle of 2048 is ~5e-13.
    np.testing.assert_allclose(table, reference.sinusoidal_positions(max_len, d_model), rtol=0, atol=1e-11)


def test_sinusoidal_positions_by_hand() -> None:
    table = positional.sinusoidal_positions(5, 4)
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0]  # sin 0, cos 0 at every frequency
    assert table[3, 2] == pytest.approx(math.sin(3 / 10000 ** (2 / 4)), rel=1e-15)
    assert table[3, 3] == pytest.approx(math.cos(3 / 10000 ** (2 / 4)), rel=1e-15)
