"""Mask helpers for the Keras front end (any backend): small, composable, ``True`` = attend.

Notation: B batch, L length, Lq query length, Lk key length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from keras import KerasTensor, backend, ops

from multihead import masks
from multihead.masks import causal_diagonal
from multihead.validation import DTypeError, check_mask_dtype, check_non_negative_int

Tensor = Any  # a backend tensor, a NumPy array or a symbolic KerasTensor


def is_tensor_like(x: object) -> bool:
    return ops.is_tensor(x) or isinstance(x, (np.ndarray, KerasTensor))


def concrete(x: Tensor) -> np.ndarray | None:
    """The values of ``x`` when it has some now (eager), ``None`` for a symbolic or graph tensor."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, KerasTensor):
        return None
    if backend.backend() == "tensorflow":
        import tensorflow as tf

        if not tf.executing_eagerly():
            return None
    if backend.backend() == "jax":
        import jax

        if isinstance(x, jax.core.Tracer):  # inside jit or grad: values exist only when the program runs
            return None
    return np.asarray(ops.convert_to_numpy(x))


def dtype_kind(x: Tensor) -> str:
    """``"bool"``, ``"float"`` or ``"other"`` for a tensor's dtype."""
    dtype = backend.standardize_dtype(x.dtype)
    if dtype == "bool":
        return "bool"
    return "float" if backend.is_float_dtype(dtype) else "other"


def check_mask_tensor(name: str, mask: object, *, allow_float: bool = True) -> None:
    """A mask must be a tensor, boolean (``True`` = attend) or, where allowed, floating (added to the scores)."""
    if not is_tensor_like(mask):
        raise TypeError(f"`{name}` must be a tensor or None, received {type(mask).__name__}")
    check_mask_dtype(name, dtype_kind(mask), backend.standardize_dtype(mask.dtype), allow_float=allow_float)


def causal_mask(lq: int, lk: int) -> Tensor:
    """Bottom-right aligned causal mask ``(lq, lk)``: query ``i`` may attend key ``j`` iff ``j <= i + lk - lq``."""
    check_non_negative_int("lq", lq)
    check_non_negative_int("lk", lk)
    return causal_window(lq, lk)


def causal_window(
    lq: int,
    lk: int,
    first_query: Tensor | int = 0,
    queries: int | None = None,
    first_key: Tensor | int = 0,
    keys: int | None = None,
) -> Tensor:
    """Rows ``first_query .. first_query + queries - 1`` and columns ``first_key .. first_key + keys - 1`` of
    ``causal_mask(lq, lk)`` (by default all of them), built without the rest: ``(queries, keys)``. The starts may
    be tensors; rows and columns past the mask's edge follow the same diagonal."""
    rows = ops.expand_dims(first_query + ops.arange(lq if queries is None else queries), 1)  # (queries, 1)
    columns = ops.expand_dims(first_key + ops.arange(lk if keys is None else keys), 0)  # (1, keys)
    return ops.less_equal(columns, rows + causal_diagonal(lq, lk))


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
    if "int" not in backend.standardize_dtype(lengths.dtype):
        raise DTypeError(f"`lengths` must hold integers, received dtype {backend.standardize_dtype(lengths.dtype)}")
    if len(lengths.shape) != 1:
        raise ValueError(f"`lengths` must be 1-D (B,), received lengths.shape={tuple(lengths.shape)}")
    values = concrete(lengths)
    if values is not None and values.size and (values.min() < 0 or values.max() > max_len):
        raise ValueError(f"`lengths` must lie in [0, max_len={max_len}], received {values.tolist()}")
    positions = ops.expand_dims(ops.arange(max_len), 0)  # (1, L)
    return ops.less(positions, ops.expand_dims(ops.cast(lengths, "int32"), 1))  # (B, L)


def check_token_ids(name: str, tokens: object) -> None:
    """Token ids: an integer tensor ``(B, L)``."""
    if not is_tensor_like(tokens):
        raise TypeError(f"`{name}` must be a tensor of token ids, received {type(tokens).__name__}")
    dtype = backend.standardize_dtype(tokens.dtype)
    if "int" not in dtype:
        raise DTypeError(f"`{name}` must hold integer token ids, received dtype {dtype}")
    if len(tokens.shape) != 2:
        raise ValueError(f"`{name}` must be 2-D (B, L), received {name}.shape={tuple(tokens.shape)}")


def padding_mask_from_tokens(tokens: Tensor, pad_id: int) -> Tensor:
    """``(B, L)`` mask that is ``True`` where ``tokens != pad_id`` (real tokens)."""
    check_token_ids("tokens", tokens)
    if isinstance(pad_id, bool) or not isinstance(pad_id, int):
        raise TypeError(f"`pad_id` must be an int, received {pad_id!r}")
    return ops.not_equal(tokens, pad_id)


class _KerasMaskOps:
    """The tensor operations of the shared mask rules (:mod:`multihead.masks`), in ``keras.ops``."""

    def is_bool(self, mask: Tensor) -> bool:
        return dtype_kind(mask) == "bool"

    def logical_and(self, a: Tensor, b: Tensor) -> Tensor:
        return ops.logical_and(a, b)

    def logical_or(self, a: Tensor, b: Tensor) -> Tensor:
        return ops.logical_or(a, b)

    def logical_not(self, a: Tensor) -> Tensor:
        return ops.logical_not(a)

    def is_neg_inf(self, x: Tensor) -> Tensor:
        return ops.logical_and(ops.isinf(x), ops.less(x, 0))

    def any_last(self, x: Tensor) -> Tensor:
        return ops.any(x, axis=-1, keepdims=True)

    def where(self, condition: Tensor, x: Tensor, y: float) -> Tensor:
        return ops.where(condition, x, ops.cast(y, x.dtype))


OPS = _KerasMaskOps()


def restrict(mask: Tensor | None, allowed: Tensor | None) -> Tensor | None:
    """``mask`` (bool, or float added to the scores) AND the boolean ``allowed``; see :mod:`multihead.masks`."""
    return masks.restrict(mask, allowed, OPS)


def open_dead_rows(mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """See :func:`multihead.masks.open_dead_rows`."""
    return masks.open_dead_rows(mask, OPS)
