"""The paper's sinusoidal position table, which both front ends' ``PositionalEncoding`` add to the embeddings.

    PE[pos, 2i] = sin(pos / 10000^(2i / E)),   PE[pos, 2i + 1] = cos(pos / 10000^(2i / E))

Notation: L positions, E d_model.
"""

from __future__ import annotations

import numpy as np

__all__ = ["sinusoidal_positions"]


def sinusoidal_positions(max_len: int, d_model: int) -> np.ndarray:
    """The table ``(max_len, d_model)`` in float64; front ends cast it to their compute dtype."""
    positions = np.arange(max_len, dtype=np.float64)[:, None]  # (L, 1)
    frequencies = 1.0 / 10000 ** (np.arange(0, d_model, 2, dtype=np.float64) / d_model)  # (ceil(E/2),)
    table = np.zeros((max_len, d_model))
    table[:, 0::2] = np.sin(positions * frequencies)
    table[:, 1::2] = np.cos(positions * frequencies[: d_model // 2])
    return table
