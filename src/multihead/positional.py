"""The sinusoidal position tables, which both front ends' ``PositionalEncoding`` add to the embeddings.

The paper's:

    PE[pos, 2i] = sin(pos / 10000^(2i / E)),   PE[pos, 2i + 1] = cos(pos / 10000^(2i / E))

laid out ``"interleaved"`` as above, or ``"halves"``: the same sines in the first ceil(E/2) columns and the cosines
after them (Marian's, and so OPUS-MT's, layout). ``"fairseq"`` (fairseq's and tensor2tensor's, which M2M100 and
NLLB-200 use): ``H = floor(E/2)`` frequencies ``10000^(-i / (H - 1))``, the sines in the first ``H`` columns, the
cosines in the next ``H``, and a zero column when ``E`` is odd. A table may start at another position than 0
(``start``): fairseq's models count positions from their pad id + 1.

Notation: L positions, E d_model, H frequencies.
"""

from __future__ import annotations

import math

import numpy as np

from multihead.config import POSITION_LAYOUTS

__all__ = ["sinusoidal_positions"]


def sinusoidal_positions(max_len: int, d_model: int, layout: str = "interleaved", start: int = 0) -> np.ndarray:
    """The table ``(max_len, d_model)`` in float64 of positions ``start .. start + max_len - 1``, laid out as
    ``layout`` says; front ends cast it to their compute dtype."""
    if layout not in POSITION_LAYOUTS:
        raise ValueError(f"`layout` must be one of {POSITION_LAYOUTS}, received {layout!r}")
    positions = np.arange(start, start + max_len, dtype=np.float64)[:, None]  # (L, 1)
    if layout == "fairseq":
        if d_model < 4:
            raise ValueError(f"the fairseq table needs `d_model` >= 4 (two frequencies), received {d_model}")
        half = d_model // 2
        frequencies = np.exp(np.arange(half, dtype=np.float64) * -(math.log(10000) / (half - 1)))  # (H,)
        angles = positions * frequencies  # (L, H)
        return np.concatenate([np.sin(angles), np.cos(angles), np.zeros((max_len, d_model % 2))], axis=1)  # (L, E)
    frequencies = 1.0 / 10000 ** (np.arange(0, d_model, 2, dtype=np.float64) / d_model)  # (ceil(E/2),)
    sines, cosines = np.sin(positions * frequencies), np.cos(positions * frequencies[: d_model // 2])
    if layout == "halves":
        return np.concatenate([sines, cosines], axis=1)  # (L, E)
    table = np.zeros((max_len, d_model))
    table[:, 0::2], table[:, 1::2] = sines, cosines
    return table
