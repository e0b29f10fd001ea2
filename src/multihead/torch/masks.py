"""Mask helpers for the PyTorch front end: small, composable, ``True`` = attend.

Notation: B batch, L length, Lq query length, Lk key length.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from multihead import masks
from multihead.checks import check_lengths, check_pad_id, check_token_ids
from multihead.torch.tensors import OPS, causal_tril
from multihead.validation import check_non_negative_int


def causal_mask(lq: int, lk: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Bottom-right aligned causal mask ``(lq, lk)``: query ``i`` may attend key ``j`` iff ``j <= i + lk - lq``.

    >>> causal_mask(2, 5).int()
    tensor([[1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1]], dtype=torch.int32)
    """
    check_non_negative_int("lq", lq)
    check_non_negative_int("lk", lk)
    if device is not None:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise ValueError(f"`device` must name a torch device, received {device!r}") from error
    return causal_tril(lq, lk, device)


def padding_mask(lengths: torch.Tensor | Sequence[int], max_len: int) -> torch.Tensor:
    """``(B, max_len)`` mask that is ``True`` at the first ``lengths[b]`` positions of row ``b`` (real tokens).

    >>> padding_mask([1, 3], 4).int()
    tensor([[1, 0, 0, 0],
            [1, 1, 1, 0]], dtype=torch.int32)
    """
    check_non_negative_int("max_len", max_len)
    if not isinstance(lengths, torch.Tensor):
        try:
            lengths = torch.as_tensor(lengths)
        except (RuntimeError, TypeError, ValueError) as error:
            raise TypeError(f"`lengths` must be a tensor or a list of ints, received {lengths!r}") from error
    check_lengths(lengths, max_len, OPS)
    positions = torch.arange(max_len, device=lengths.device)  # (L,)
    return positions < lengths[:, None]  # (B, L)


def padding_mask_from_tokens(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """``(B, L)`` mask that is ``True`` where ``tokens != pad_id`` (real tokens)."""
    check_token_ids("tokens", tokens, OPS)
    return tokens != check_pad_id(pad_id)


def restrict(mask: torch.Tensor | None, allowed: torch.Tensor | None) -> torch.Tensor | None:
    """``mask`` (bool, or float added to the scores) AND the boolean ``allowed``; see :mod:`multihead.masks`."""
    return masks.restrict(mask, allowed, OPS)


def open_dead_rows(mask: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """See :func:`multihead.masks.open_dead_rows`."""
    return masks.open_dead_rows(mask, OPS)
