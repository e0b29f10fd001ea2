"""Helpers for the Keras tests, which run under every Keras backend (KERAS_BACKEND=tensorflow, torch, jax).

On JAX the tests run with 64-bit types enabled (``conftest.py`` sets ``JAX_ENABLE_X64``): without it JAX turns float64
into float32, and the float64 comparisons with the oracle would test float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import numpy as np

BACKEND = keras.backend.backend()


def tensor(x: np.ndarray, dtype: str | None = None) -> object:
    """A backend tensor with an explicit dtype (Keras would turn float64 NumPy input into float32)."""
    x = np.asarray(x)
    return keras.ops.convert_to_tensor(x, dtype=dtype or ("bool" if x.dtype == bool else str(x.dtype)))


def numpy(x: object) -> np.ndarray:
    if BACKEND == "torch":
        x = x.detach() if hasattr(x, "detach") else x
    return np.asarray(keras.ops.convert_to_numpy(x))


def jax_vjp(fn: Callable[..., object], inputs: Sequence[object], cotangent: object = None) -> tuple[object, tuple]:
    """``fn(*inputs)`` and the gradients of ``sum(out * cotangent)`` (default: of ``sum(out ** 2)``) with respect to
    each input, on JAX, as one jitted program: op by op, eager JAX compiles every operation and its transpose anew
    for every new shape."""
    import jax

    def run(*xs: object) -> tuple[object, tuple]:
        out, pullback = jax.vjp(fn, *xs)
        return out, pullback(2 * out if cotangent is None else cotangent)

    return jax.jit(run)(*inputs)


def gradients(fn: Callable[..., object], *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Gradients of ``sum(fn(*inputs) ** 2)`` with respect to each input, on the active backend."""
    if BACKEND == "jax":
        return tuple(np.asarray(g) for g in jax_vjp(fn, inputs)[1])
    if BACKEND == "tensorflow":
        import tensorflow as tf

        variables = [tf.Variable(x) for x in inputs]
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(fn(*variables)))
        return tuple(g.numpy() for g in tape.gradient(loss, variables))
    import torch

    leaves = [torch.tensor(x, requires_grad=True) for x in inputs]
    fn(*leaves).square().sum().backward()
    return tuple(leaf.grad.numpy() for leaf in leaves)
