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


@pytest.mark.parametrize(("max_len", "d_model"), [(1, 4), (9, 7), (70, 16), (300, 64)])
def test_the_fairseq_table_is_tensor2tensors(max_len: int, d_model: int) -> None:
    """``"fairseq"``: ``H = floor(E/2)`` frequencies ``10000^(-i/(H-1))``, all sines, then all cosines, a zero column
    when ``E`` is odd; against a loop over its definition, and against Transformers' M2M100 table (float32)."""
    table = positional.sinusoidal_positions(max_len, d_model, "fairseq")
    half = d_model // 2
    plain = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for i in range(half):
            angle = pos * math.exp(-i * math.log(10000) / (half - 1))
            plain[pos, i], plain[pos, half + i] = math.sin(angle), math.cos(angle)
    np.testing.assert_allclose(table, plain, rtol=0, atol=1e-11)
    m2m100 = pytest.importorskip("transformers.models.m2m_100.modeling_m2m_100")
    theirs = m2m100.M2M100SinusoidalPositionalEmbedding.get_embedding(max_len, d_model).double().numpy()
    # float32 angles: their rounding grows with the position (about 3e-5 at 300).
    np.testing.assert_allclose(table, theirs, rtol=0, atol=1e-4)


@pytest.mark.parametrize("layout", ["interleaved", "halves", "fairseq"])
def test_a_table_may_start_at_a_later_position(layout: str) -> None:
    whole = positional.sinusoidal_positions(12, 8, layout)
    np.testing.assert_array_equal(positional.sinusoidal_positions(10, 8, layout, start=2), whole[2:])


def test_the_fairseq_table_needs_two_frequencies() -> None:
    with pytest.raises(ValueError, match=r"the fairseq table needs `d_model` >= 4 \(two frequencies\), received 3"):
        positional.sinusoidal_positions(5, 3, "fairseq")
