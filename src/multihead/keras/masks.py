"""Mask helpers for the Keras front end (any backend): small, composable, ``True`` = attend.

Notation: B batch, L length, Lq query length, Lk key length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from keras import ops

from multihead import masks
from multihead.checks import check_lengths, check_pad_id, check_token_ids
from multihead.keras.tensors import OPS, Tensor, causal_window, is_tensor_like
from multihead.validation import check_non_negative_int


def causal_mask(lq: int, lk: int) -> Tensor:
    """Bottom-right aligned causal mask ``(lq, lk)``: query ``i`` may attend key ``j`` iff ``j <= i + lk - lq``."""
    check_non_negative_int("lq", lq)
    check_non_negative_int("lk", lk)
    return causal_window(lq, lk)


def padding_mask(lengths: Tensor | Sequence[int], max_len: int) -> Tensor:
    """``(B, max_len)`` mask that is ``True`` at the first ``lengths[b]`` positions of row ``b`` (real tokens)."""
    check_non_negative_int("max_len", max_len)
    if not is_tensor_like(lengths):
        try:
            lengths = np.asarray(lengths)
        except ValueError as error:
            raise TypeError(f"`lengths` must be a tensor or a list of ints, received {lengths!r}") from error
        if lengths.dtype.kind in "OSU":
            raise TypeError(f"`lengths` must be a tensor or a list of ints, received {lengths.tolist()!r}")
    check_lengths(lengths, max_len, OPS)
    positions = ops.expand_dims(ops.arange(max_len), 0)  # (1, L)
    return ops.less(positions, ops.expand_dims(ops.cast(lengths, "int32"), 1))  # (B, L)


def padding_mask_from_tokens(tokens: Tensor, pad_id: int) -> Tensor:
    """``(B, L)`` mask that is ``True`` where ``tokens != pad_id`` (real tokens)."""
    check_token_ids("tokens", tokens, OPS)
    return ops.not_equal(tokens, check_pad_id(pad_id))


def restrict(mask: Tensor | None, allowed: Tensor | None) -> Tensor | None:
    """``mask`` (bool, or float added to the scores) AND the boolean ``allowed``; see :mod:`multihead.masks`."""
    return masks.restrict(mask, allowed, OPS)


def open_dead_rows(mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """See :func:`multihead.masks.open_dead_rows`."""
    return masks.open_dead_rows(mask, OPS)
