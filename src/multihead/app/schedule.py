"""The learning-rate schedule of "Attention Is All You Need", with its peak and warm-up chosen by the user.

    lr(step) = peak · min(step / warmup, sqrt(warmup / step))

It rises linearly for ``warmup`` steps to ``peak``, then decays with the inverse square root of the step. (The
paper writes the peak as ``d_model^-0.5 · warmup^-0.5``, tuned for 100k GPU steps; a CPU run of a few hundred
steps wants a higher peak and a shorter warm-up.) Both training loops read it step by step.
"""

from __future__ import annotations

import math

__all__ = ["learning_rate"]


def learning_rate(step: int, *, peak: float, warmup: int) -> float:
    """The rate for optimizer step ``step`` (counted from 1)."""
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))
