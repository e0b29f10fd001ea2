"""Dropout whose random numbers cost a quarter of PyTorch's on the CPU.

``torch.nn.functional.dropout`` draws one random number per element on the CPU (``bernoulli_``), which on the
corpus recipe took about a third of a training step. :func:`dropout` draws 64 random bits at a time and reads them
as four 16-bit numbers, one per element: an element is kept when its number is at least ``round(p · 2¹⁶)`` (of
``0 … 2¹⁶ − 1``), so the drop probability is ``p`` rounded to a multiple of ``2⁻¹⁶`` (at most ``7.7·10⁻⁶`` away), and
the kept elements are scaled by the inverse of the keep probability so rounded, which keeps every element's
expectation exact. The mask kept for the backward pass is in ``x``'s dtype (the scale or 0), so that each way is one
product. Elsewhere (CUDA's fused kernel is fast) and where nothing is dropped it is PyTorch's own.

Notation: n elements of ``x``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Dropout", "dropout"]

LEVELS = 1 << 16
"""The random numbers' range: each element's is one of ``LEVELS``."""


def dropout(x: torch.Tensor, p: float, *, training: bool) -> torch.Tensor:
    """``x`` with each element zeroed with probability ``p`` (rounded to a multiple of ``1 / LEVELS`` on the CPU)
    and the others scaled by the inverse of the keep probability, in training; ``x`` itself otherwise."""
    if not training or p == 0.0:
        return x
    dropped = round(p * LEVELS)
    if x.device.type != "cpu" or dropped in (0, LEVELS):
        return F.dropout(x, p, training=True)
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), None)
    numbers = words.view(torch.int16)[: x.numel()].view(x.shape)  # (n,) 16 random bits each, as -2¹⁵ … 2¹⁵ − 1
    keep = numbers >= dropped - LEVELS // 2
    return x * keep.to(x.dtype).mul_(LEVELS / (LEVELS - dropped))  # one product each way (a bool mask takes two)


class Dropout(nn.Dropout):
    """``nn.Dropout`` computed by :func:`dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, training=self.training)
