"""Mask rules every front end follows, written once over a few tensor operations each front end supplies.

- Polarity: ``True`` = this query may attend this key. Float masks are added to the scores (``-inf`` removes).
- Masks combine by AND (:func:`restrict`); for a float mask, AND sets ``-inf`` where the boolean one is ``False``.
- Causal is bottom-right aligned: query ``i`` may attend key ``j`` iff ``j <= i + (Lk - Lq)``. With ``Lq == Lk``
  that is the usual lower triangle; when ``Lq`` new queries follow ``Lk - Lq`` cached keys it is exactly what
  decoding needs. With ``Lq > Lk`` the first ``Lq - Lk`` queries see no key.
- A fully masked query row (no key allowed) gives zero output and zero weights, with zero gradients. The attention
  paths open such rows to every key before the softmax (:func:`open_dead_rows`: no row of ``-inf`` ever reaches
  it, whose backward would give NaN) and zero them afterwards with the returned ``live`` mask.
- Padding: a ``(B, L)`` key mask (``True`` at real tokens) enters the attention as ``(B, 1, 1, Lk)``, a query mask
  as ``(B, 1, Lq, 1)`` (:func:`padded`); padded query rows come out as zeros (:func:`zero_padded_queries`).
- Fused kernels take a causal flag that is top-left aligned: it agrees with ours only when ``Lq == Lk``
  (:func:`for_kernel`).

Notation: B batch, H heads, Lq query length, Lk key length, L length.
"""

from __future__ import annotations

from typing import Any, Protocol

Tensor = Any

__all__ = [
    "MaskOps",
    "causal_diagonal",
    "for_kernel",
    "key_layout",
    "open_dead_rows",
    "padded",
    "padding_from_tokens",
    "restrict",
    "zero_padded_queries",
]


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

    def not_equal(self, x: Tensor, value: int) -> Tensor: ...

    def any_last(self, x: Tensor) -> Tensor:
        """``any`` over the last axis, keeping it (size 1)."""
        ...

    def where(self, condition: Tensor, x: Tensor, y: float) -> Tensor:
        """``x`` where ``condition``, else the scalar ``y`` (in ``x``'s dtype)."""
        ...

    def expand(self, x: Tensor, axes: tuple[int, ...]) -> Tensor:
        """``x`` with axes of size 1 inserted at ``axes`` (positions in the result, ascending)."""
        ...

    def causal(self, lq: int, lk: int, like: Tensor) -> Tensor:
        """The bottom-right causal mask ``(lq, lk)``, on ``like``'s device."""
        ...

    def first_position(self, like: Tensor) -> Tensor:
        """``(1, L)`` bool, ``True`` at the first position only, for ``like (B, L)``."""
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


def key_layout(key_mask: Tensor | None, ops: MaskOps) -> Tensor | None:
    """A ``(B, Lk)`` key mask in the attention's layout ``(B, 1, 1, Lk)``."""
    return None if key_mask is None else ops.expand(key_mask, (1, 2))


def padded(mask: Tensor | None, key_mask: Tensor | None, query_mask: Tensor | None, ops: MaskOps) -> Tensor | None:
    """A 4-D ``mask`` AND the key padding ``(B, Lk)`` AND the query padding ``(B, Lq)``: ``(B|1, H|1, Lq|1, Lk|1)``."""
    mask = restrict(mask, key_layout(key_mask, ops), ops)
    return restrict(mask, None if query_mask is None else ops.expand(query_mask, (1, 3)), ops)


def zero_padded_queries(out: Tensor, query_mask: Tensor | None, ops: MaskOps) -> Tensor:
    """``out (B, Lq, E)`` with the rows of padded queries set to zero."""
    return out if query_mask is None else ops.where(ops.expand(query_mask, (2,)), out, 0.0)


def padding_from_tokens(tokens: Tensor, key_mask: Tensor | None, pad_id: int | None, ops: MaskOps) -> Tensor | None:
    """``key_mask`` when given, else ``tokens != pad_id`` when the model has a pad id, else ``None``."""
    if key_mask is None and pad_id is not None:
        return ops.not_equal(tokens, pad_id)
    return key_mask


def target_padding_from_tokens(
    tokens: Tensor, key_mask: Tensor | None, pad_id: int | None, ops: MaskOps
) -> Tensor | None:
    """:func:`padding_from_tokens` for target tokens: their first position, the decoder's start token, is always real
    (Marian's start token is its pad)."""
    if key_mask is not None or pad_id is None:
        return key_mask
    return ops.logical_or(ops.not_equal(tokens, pad_id), ops.first_position(tokens))  # (B, Lt)


def for_kernel(
    mask: Tensor | None, causal: bool, q: Tensor, k: Tensor, ops: MaskOps, *, guard_dead_rows: bool = True
) -> tuple[Tensor | None, bool, Tensor | None]:
    """What a fused kernel is given for a rank-4 ``mask`` and ``causal`` over ``q (B, H, Lq, Dk)`` and
    ``k (B, Hkv, Lk, Dk)``: ``(mask, kernel_causal, live)``.

    Kernels' own causal flag is top-left aligned: it is ours when ``Lq == Lk`` and there is no mask (alone it leaves
    no row dead); otherwise our causal rule goes into the mask, where the dead rows it makes can be found. With
    ``guard_dead_rows`` fully masked rows are opened (:func:`open_dead_rows`) and ``live`` says which rows the
    caller must zero; a kernel that gives such rows zeros with finite gradients itself needs no guard.
    """
    lq, lk = q.shape[2], k.shape[2]
    kernel_causal = causal and mask is None and lq == lk
    if causal and not kernel_causal and lq > 1:  # one query (a decoding step) may attend every key
        mask = restrict(mask, ops.causal(lq, lk, q), ops)
    live = None
    if guard_dead_rows:
        mask, live = open_dead_rows(mask, ops)
    return mask, kernel_causal, live
