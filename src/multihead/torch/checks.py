"""Checks of tensor arguments for the PyTorch modules, run before any computation.

Notation: B batch, L length.
"""

from __future__ import annotations

import torch

from multihead.torch.masks import check_mask_tensor
from multihead.validation import DTypeError, check_features, check_padding_mask_shape


def check_hidden(name: str, x: object, width: int, parameter: torch.Tensor | None) -> torch.Tensor:
    """``x`` is a floating ``(B, L, width)`` tensor in ``parameter``'s dtype (any floating dtype without one).

    Under autocast the dtypes may differ: autocast casts inputs and weights itself.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, received {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise DTypeError(f"`{name}` must be a floating tensor, received dtype {x.dtype}")
    check_features(name, tuple(x.shape), width)
    if parameter is not None and x.dtype != parameter.dtype and not torch.is_autocast_enabled(x.device.type):
        raise DTypeError(f"`{name}` must have the module's dtype {parameter.dtype}, received dtype {x.dtype}")
    return x


def check_key_mask(name: str, key_mask: object, batch: int, length: int) -> torch.Tensor | None:
    """``None``, or a boolean ``(B, L)`` tensor, ``True`` at real tokens."""
    if key_mask is not None:
        check_mask_tensor(name, key_mask, allow_float=False)
        check_padding_mask_shape(name, tuple(key_mask.shape), batch, length)
    return key_mask
