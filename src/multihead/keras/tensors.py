"""Keras tensors on any backend: what they are (:func:`is_tensor_like`, :func:`concrete`, :func:`dtype_kind`), the
operations the shared rules need of them (:class:`multihead.checks.TensorOps`, as ``OPS``), and the layers' naming
of positional tensor arguments (:class:`NamedTensorArguments`).

Notation: Lq query length, Lk key length.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from keras import KerasTensor, backend, layers, ops

from multihead.masks import causal_diagonal

__all__ = ["OPS", "NamedTensorArguments", "Tensor", "causal_window", "concrete", "dtype_kind", "is_tensor_like"]

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
    """``"bool"``, ``"float"``, ``"int"`` or ``"other"`` for a tensor's dtype."""
    dtype = backend.standardize_dtype(x.dtype)
    if dtype == "bool":
        return "bool"
    if backend.is_float_dtype(dtype):
        return "float"
    return "int" if "int" in dtype else "other"


def causal_window(
    lq: int,
    lk: int,
    first_query: Tensor | int = 0,
    queries: int | None = None,
    first_key: Tensor | int = 0,
    keys: int | None = None,
) -> Tensor:
    """Rows ``first_query .. first_query + queries - 1`` and columns ``first_key .. first_key + keys - 1`` of the
    bottom-right causal mask ``(lq, lk)`` (by default all of them), built without the rest: ``(queries, keys)``. The
    starts may be tensors; rows and columns past the mask's edge follow the same diagonal."""
    rows = ops.expand_dims(first_query + ops.arange(lq if queries is None else queries), 1)  # (queries, 1)
    columns = ops.expand_dims(first_key + ops.arange(lk if keys is None else keys), 0)  # (1, keys)
    return ops.less_equal(columns, rows + causal_diagonal(lq, lk))


class _KerasOps:
    noun = "a tensor"

    def is_tensor(self, x: object) -> bool:
        return is_tensor_like(x)

    def kind(self, x: Tensor) -> str:
        return dtype_kind(x)

    def dtype(self, x: Tensor) -> str:
        return backend.standardize_dtype(x.dtype)

    def fits(self, x: Tensor, parameter: Tensor) -> bool:
        return True  # a layer's float dtype is its dtype policy's business: it casts its inputs

    def device(self, x: Tensor) -> None:
        return None

    def reshape(self, x: Tensor, shape: tuple[int | None, ...]) -> Tensor:
        return ops.reshape(ops.convert_to_tensor(x), shape)

    def value_range(self, x: Tensor) -> tuple[int, int] | None:
        values = concrete(x)
        return None if values is None or not values.size else (values.min(), values.max())

    def values(self, x: Tensor) -> np.ndarray | None:
        return concrete(x)

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

    def not_equal(self, x: Tensor, value: int) -> Tensor:
        return ops.not_equal(x, value)

    def any_last(self, x: Tensor) -> Tensor:
        return ops.any(x, axis=-1, keepdims=True)

    def where(self, condition: Tensor, x: Tensor, y: float) -> Tensor:
        return ops.where(condition, x, ops.cast(y, x.dtype))

    def expand(self, x: Tensor, axes: tuple[int, ...]) -> Tensor:
        x = ops.convert_to_tensor(x)
        for axis in axes:
            x = ops.expand_dims(x, axis)
        return x

    def causal(self, lq: int, lk: int, like: Tensor) -> Tensor:
        return causal_window(lq, lk)

    def first_position(self, like: Tensor) -> Tensor:
        return ops.expand_dims(ops.equal(ops.arange(ops.shape(like)[1]), 0), 0)  # (1, L)


OPS = _KerasOps()


class NamedTensorArguments(layers.Layer):
    """A base of Keras layers. Keras refuses a positional argument that is not a tensor (a list, a number) with a
    message that names no argument; this names it first. ``None`` and tuples of tensors pass on to ``call``."""

    tensor_arguments: tuple[str, ...] = ("x",)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for name, value in zip(self.tensor_arguments, args, strict=False):
            parts = value if isinstance(value, tuple) else (value,)
            if value is not None and not all(is_tensor_like(part) for part in parts):
                raise TypeError(f"`{name}` must be a tensor, received {type(value).__name__}")
        return super().__call__(*args, **kwargs)
