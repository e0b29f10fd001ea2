"""Checks of tensor arguments for the Keras layers, run before any computation (and before any sublayer is
built, so a refused first call leaves a layer as it was).

Notation: B batch, L length.
"""

from __future__ import annotations

from typing import Any

from keras import backend

from multihead.keras.masks import Tensor, check_mask_tensor, dtype_kind, is_tensor_like
from multihead.validation import DTypeError, check_features, check_padding_mask_shape


def check_hidden(name: str, x: object, width: int) -> Tensor:
    """``x`` is a floating ``(B, L, width)`` tensor. (Its float dtype is the layer's autocast business.)"""
    if not is_tensor_like(x):
        raise TypeError(f"`{name}` must be a tensor, received {type(x).__name__}")
    if dtype_kind(x) != "float":
        raise DTypeError(f"`{name}` must be a floating tensor, received dtype {backend.standardize_dtype(x.dtype)}")
    check_features(name, tuple(x.shape), width)
    return x


def check_key_mask(name: str, key_mask: object, batch: int | None, length: int | None) -> Tensor | None:
    """``None``, or a boolean ``(B, L)`` tensor, ``True`` at real tokens."""
    if key_mask is not None:
        check_mask_tensor(name, key_mask, allow_float=False)
        check_padding_mask_shape(name, tuple(key_mask.shape), batch, length)
    return key_mask


class NamedTensorArguments:
    """A mixin for Keras layers. Keras refuses a positional argument that is not a tensor (a list, a number) with a
    message that names no argument; this names it first. ``None`` and tuples of tensors pass on to ``call``."""

    tensor_arguments: tuple[str, ...] = ("x",)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for name, value in zip(self.tensor_arguments, args, strict=False):
            parts = value if isinstance(value, tuple) else (value,)
            if value is not None and not all(is_tensor_like(part) for part in parts):
                raise TypeError(f"`{name}` must be a tensor, received {type(value).__name__}")
        return super().__call__(*args, **kwargs)
