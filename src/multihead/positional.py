"""The paper's sinusoidal position table, which both front ends' ``PositionalEncoding`` add to the embeddings.

    PE[pos, 2i] = sin(pos / 10000^(2i / E)),   PE[pos, 2i + 1] = cos(pos / 10000^(2i / E))

laid out ``"interleaved"`` as above, or ``"halves"``: the same sines in the first ceil(E/2) columns and the cosines
after them (Marian's, and so OPUS-MT's, layout).

Notation: L positions, E d_model.
"""

from __future__ import annotations

import numpy as np

from multihead.config import POSITION_LAYOUTS

__all__ = ["sinusoidal_positions"]


def sinusoidal_positions(max_len: int, d_model: int, layout: str = "interleaved") -> np.ndarray:
    """The table ``(max_len, d_model)`` in float64, laid out as ``layout`` says; front ends cast it to their compute
    dtype."""
    if layout not in POSITION_LAYOUTS:
        raise ValueError(f"`layout` must be one of {POSITION_LAYOUTS}, received {layout!r}")
    positions = np.arange(max_len, dtype=np.float64)[:, None]  # (L, 1)
    frequencies = 1.0 / 10000 ** (np.arange(0, d_model, 2, dtype=np.float64) / d_model)  # (ceil(E/2),)
    sines, cosines = np.sin(positions * frequencies), np.cos(positions * frequencies[: d_model // 2])
    if layout == "halves":
        return np.concatenate([sines, cosines], axis=1)  # (L, E)
    table = np.zeros((max_len, d_model))
    table[:, 0::2], table[:, 1::2] = sines, cosines
    return table
