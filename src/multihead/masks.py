"""Mask rules every front end follows, written once over a few tensor operations each front end supplies.

- Polarity: ``True`` = this query may attend this key. Float masks are added to the scores (``-inf`` removes).
- Masks combine by AND (:func:`restrict`); for a float mask, AND sets ``-inf`` where the boolean one is ``False``.
- Causal is bottom-right aligned: query ``i`` may attend key ``j`` iff ``j <= i + (Lk - Lq)``. With ``Lq == Lk``
  that is the usual lower triangle; when ``Lq`` new queries follow ``Lk - Lq`` cached keys it is exactly what
  decoding needs. With ``Lq > Lk`` the first ``Lq - Lk`` queries see no key.
- A fully masked query row (no key allowed) gives zero output and zero weights, with zero gradients. The attention
  paths open such rows to every key before the softmax (:func:`open_dead_rows`: no row of ``-inf`` ever reaches
  it, whose backward would give NaN) and zero them afterwards with the returned ``live`` mask.

Notation: Lq query length, Lk key length.
"""

from __future__ import annotations

from typing import Any, Protocol

Tensor = Any

__all__ = ["MaskOps", "causal_diagonal", "open_dead_rows", "restrict"]


def causal_diagonal(lq: int, lk: int) -> int:
    """The diagonal offset of the bottom-right causal triangle (``tril(..., diagonal=...)``)."""
    return lk - lq


class MaskOps(Protocol):
    """The tensor operations the mask rules need, on one front end's tensors."""

    def is_bool(self, mask: Tensor) -> bool: ...

    def logical_and(self, a: Tensor, b: Tensor) -> Tensor: ...

    def logical_or(self, a: Tensor, b: Tensor) -> Tensor: ...

    def logical_not(self, a: Tensor) -> Tensor: ...

    def is_neg_inf(self, x: Tensor) -> Tensor: ...

    def any_last(self, x: Tensor) -> Tensor:
        """``any`` over the last axis, keeping it (size 1)."""
        ...

    def where(self, condition: Tensor, x: Tensor, y: float) -> Tensor:
        """``x`` where ``condition``, else the scalar ``y`` (in ``x``'s dtype)."""
        ...


def restrict(mask: Tensor | None, allowed: Tensor | None, ops: MaskOps) -> Tensor | None:
    """``mask`` AND the boolean ``allowed``; either may be ``None``, and shapes broadcast."""
    if allowed is None:
        return mask
    if mask is None:
        return allowed
    if ops.is_bool(mask):
        return ops.logical_and(mask, allowed)
    return ops.where(allowed, mask, float("-inf"))


def open_dead_rows(mask: Tensor | None, ops: MaskOps) -> tuple[Tensor | None, Tensor | None]:
    """Open every fully masked row of ``mask`` to all keys; return it with ``live`` ``(..., Lq|1, 1)``, which is
    ``False`` on exactly those rows so that the caller can zero them. ``(None, None)`` when there is no mask."""
    if mask is None:
        return None, None
    allowed = mask if ops.is_bool(mask) else ops.logical_not(ops.is_neg_inf(mask))
    live = ops.any_last(allowed)  # (..., Lq|1, 1)
    if ops.is_bool(mask):
        return ops.logical_or(mask, ops.logical_not(live)), live
    return ops.where(live, mask, 0.0), live
