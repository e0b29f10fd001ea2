"""Mask helpers for the PyTorch front end: small, composable, ``True`` = attend.

Notation: B batch, L length, Lq query length, Lk key length.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from multihead import masks
from multihead.masks import causal_diagonal
from multihead.validation import DTypeError, check_mask_dtype, check_non_negative_int


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
    return _causal_mask(lq, lk, device)


def _causal_mask(lq: int, lk: int, device: torch.device | None) -> torch.Tensor:
    """:func:`causal_mask` on checked arguments."""
    return torch.ones(lq, lk, dtype=torch.bool, device=device).tril(diagonal=causal_diagonal(lq, lk))


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
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise DTypeError(f"`lengths` must hold integers, received dtype {lengths.dtype}")
    if lengths.dim() != 1:
        raise ValueError(f"`lengths` must be 1-D (B,), received lengths.shape={tuple(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(f"`lengths` must lie in [0, max_len={max_len}], received {lengths.tolist()}")
    positions = torch.arange(max_len, device=lengths.device)  # (L,)
    return positions < lengths[:, None]  # (B, L)


def check_token_ids(name: str, tokens: object) -> None:
    """Token ids: an integer tensor ``(B, L)``."""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor of token ids, received {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise DTypeError(f"`{name}` must hold integer token ids, received dtype {tokens.dtype}")
    if tokens.dim() != 2:
        raise ValueError(f"`{name}` must be 2-D (B, L), received {name}.shape={tuple(tokens.shape)}")


def padding_mask_from_tokens(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """``(B, L)`` mask that is ``True`` where ``tokens != pad_id`` (real tokens)."""
    check_token_ids("tokens", tokens)
    if isinstance(pad_id, bool) or not isinstance(pad_id, int):
        raise TypeError(f"`pad_id` must be an int, received {pad_id!r}")
    return tokens != pad_id


def check_mask_tensor(name: str, mask: object, *, allow_float: bool = True) -> None:
    """A mask must be a tensor, boolean (``True`` = attend) or, where allowed, floating (added to the scores)."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor or None, received {type(mask).__name__}")
    kind = "bool" if mask.dtype == torch.bool else "float" if mask.dtype.is_floating_point else "other"
    check_mask_dtype(name, kind, mask.dtype, allow_float=allow_float)


class _TorchMaskOps:
    """The tensor operations of the shared mask rules (:mod:`multihead.masks`), on torch tensors."""

    def is_bool(self, mask: torch.Tensor) -> bool:
        return mask.dtype == torch.bool

    def logical_and(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a & b

    def logical_or(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a | b

    def logical_not(self, a: torch.Tensor) -> torch.Tensor:
        return ~a

    def is_neg_inf(self, x: torch.Tensor) -> torch.Tensor:
        return torch.isneginf(x)

    def any_last(self, x: torch.Tensor) -> torch.Tensor:
        return x.any(dim=-1, keepdim=True)

    def where(self, condition: torch.Tensor, x: torch.Tensor, y: float) -> torch.Tensor:
        return torch.where(condition, x, y)


OPS = _TorchMaskOps()


def restrict(mask: torch.Tensor | None, allowed: torch.Tensor | None) -> torch.Tensor | None:
    """``mask`` (bool, or float added to the scores) AND the boolean ``allowed``; see :mod:`multihead.masks`."""
    return masks.restrict(mask, allowed, OPS)


def open_dead_rows(mask: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """See :func:`multihead.masks.open_dead_rows`."""
    return masks.open_dead_rows(mask, OPS)
