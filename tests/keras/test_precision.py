"""Half precision (float16, bfloat16) and determinism of ``multihead.keras`` attention, its layer and the Transformer.

Runs under every Keras backend. Errors are measured against float64 computed from the same half-precision values
(``reference.attention`` and hand-written gradients) and compared with a plain implementation (einsum -> softmax
-> einsum in the half dtype): ours may be at most 2x its error on outputs and 3x on gradients, plus a floor of
``eps * max|reference|``. Half outputs with large logits and fully masked rows are in keras/test_functional.py;
this file adds gradients, the error budgets and determinism.

Notation: B batch, H heads, Hkv key/value heads, Lq/Lk lengths, D head dim, eps the dtype's epsilon.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import keras
import numpy as np
import pytest
from keras import ops

import multihead.keras.functional as functional
from attention_cases import causal_allowed, check_error_budgets, reference_gradients
from keras_helpers import BACKEND, jax_vjp, numpy, tensor
from multihead import reference
from multihead.keras import MultiHeadAttention, attention, padding_mask
from multihead.keras.transformer import Transformer

EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7}
HALVES = pytest.mark.parametrize("dtype", list(EPS))
# The backend's kernel where "dispatch" does not already take it (JAX's; torch's is the dispatch path).
KERNEL = BACKEND in functional.FUSED_BACKENDS and BACKEND not in functional.AUTO_FUSED_BACKENDS
PATHS = ["dispatch", "explicit", "blocked", *(["fused"] if KERNEL else [])]


def halve(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype`` (NumPy has no bfloat16), as float64: the values every computation starts from."""
    return numpy(ops.cast(tensor(np.asarray(x, "float32")), dtype)).astype(np.float64)


def ours(path: str, mask: np.ndarray | None, causal: bool) -> Callable[..., object]:
    """One internal path of ``multihead.keras.attention`` as a function of backend tensors q, k, v."""

    def fn(q: object, k: object, v: object) -> object:
        dtype = keras.backend.standardize_dtype(q.dtype)
        m = None if mask is None else tensor(mask) if mask.dtype == bool else ops.cast(tensor(mask), dtype)
        if path == "blocked":
            return functional._blocked(q, k, v, m, causal, None, block=8)
        if path == "fused":
            return attention(q, k, v, m, causal=causal, implementation="fused")
        result = attention(q, k, v, m, causal=causal, return_weights=path == "explicit")
        return result[0] if path == "explicit" else result

    return fn


def plain(allowed: np.ndarray | None) -> Callable[..., object]:
    """einsum -> softmax -> einsum in the inputs' dtype, masked with ``-inf``; nothing else."""

    def fn(q: object, k: object, v: object) -> object:
        groups = q.shape[1] // k.shape[1]
        k, v = ops.repeat(k, groups, axis=1), ops.repeat(v, groups, axis=1)
        dtype = keras.backend.standardize_dtype(q.dtype)
        scores = ops.einsum("bhqd,bhkd->bhqk", q, k) * ops.cast(1 / math.sqrt(q.shape[-1]), dtype)
        if allowed is not None:
            scores = ops.where(tensor(allowed), scores, ops.cast(float("-inf"), dtype))
        return ops.einsum("bhqk,bhkd->bhqd", ops.softmax(scores, axis=-1), v)

    return fn


def output_and_gradients(
    fn: Callable[..., object], inputs: tuple[np.ndarray, ...], cotangent: np.ndarray, dtype: str
) -> list[np.ndarray]:
    """``fn(*inputs)`` and the gradients of ``sum(out * cotangent)`` w.r.t. each input, computed in ``dtype`` on
    the active backend, returned as float64."""
    if BACKEND == "jax":
        leaves = [ops.cast(tensor(x.astype("float32")), dtype) for x in inputs]
        out, grads = jax_vjp(fn, leaves, ops.cast(tensor(cotangent.astype("float32")), dtype))
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        variables = [tf.Variable(ops.cast(tensor(x.astype("float32")), dtype)) for x in inputs]
        with tf.GradientTape() as tape:
            out = fn(*variables)
            loss = tf.reduce_sum(out * ops.cast(tensor(cotangent.astype("float32")), dtype))
        grads = tape.gradient(loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    else:
        import torch

        leaves = [torch.tensor(x).to(getattr(torch, dtype)).requires_grad_() for x in inputs]
        out = fn(*leaves)
        loss = (out * torch.tensor(cotangent).to(out.dtype)).sum()
        grads = torch.autograd.grad(loss, leaves)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    return [numpy(ops.cast(x, "float32")).astype(np.float64) for x in (out, *grads)]


def check_budgets(
    got: list[np.ndarray],
    baseline: list[np.ndarray],
    expected: list[np.ndarray],
    dtype: str,
    *,
    floor_ulps: float = 1.0,
    normwise: bool = False,
) -> None:
    names = ["out", "grad q", "grad k", "grad v"]
    check_error_budgets(got, baseline, expected, names, EPS[dtype], floor_ulps=floor_ulps, normwise=normwise)


@dataclass(frozen=True)
class Setup:
    heads: int
    kv_heads: int
    lq: int
    lk: int
    causal: bool = False
    masked: bool = False  # a random bool mask, every row keeping at least one key
    magnitude: float = 1.0

    def inputs(self, dtype: str, seed: int) -> tuple[np.ndarray, ...]:
        """q, k, v, a cotangent (rounded to ``dtype``, as float64) and the mask (``None`` or bool ``(Lq, Lk)``)."""
        rng = np.random.default_rng(seed)
        q = rng.normal(size=(2, self.heads, self.lq, 32)) * self.magnitude
        k = rng.normal(size=(2, self.kv_heads, self.lk, 32)) * self.magnitude
        v = rng.normal(size=(2, self.kv_heads, self.lk, 32))
        cotangent = rng.normal(size=(2, self.heads, self.lq, 32))
        mask = None
        if self.masked:
            mask = rng.random((self.lq, self.lk)) > 0.5
            mask[np.arange(self.lq), rng.integers(self.lk, size=self.lq)] = True
        return (*(halve(x, dtype) for x in (q, k, v, cotangent)), mask)

    def allowed(self, mask: np.ndarray | None) -> np.ndarray | None:
        allowed = causal_allowed(self.lq, self.lk) if self.causal else None
        if mask is None or allowed is None:
            return mask if allowed is None else allowed
        return allowed & mask


SETUPS = {
    "full": Setup(4, 4, 32, 40),
    "causal": Setup(4, 4, 32, 32, causal=True),
    "gqa-causal-Lq<Lk": Setup(4, 2, 24, 40, causal=True),
    "masked": Setup(4, 4, 32, 40, masked=True),
}


# --- half precision --------------------------------------------------------------------------------------


def test_gradient_oracle_matches_finite_differences() -> None:
    """The hand-written float64 gradients used below, against central differences of ``reference.attention``."""
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(1, 4, 3, 5)), rng.normal(size=(1, 2, 4, 5)), rng.normal(size=(1, 2, 4, 2))
    cotangent = rng.normal(size=(1, 4, 3, 2))
    mask = np.array([[True, False, True, True], [False] * 4, [True, True, False, True]])
    grads = reference_gradients(q, k, v, mask, cotangent, causal=True)
    for index, (x, grad) in enumerate(zip((q, k, v), grads, strict=True)):
        numeric = np.zeros_like(x)
        for position in np.ndindex(x.shape):
            values = []
            for step in (1e-6, -1e-6):
                moved = [q, k, v]
                moved[index] = x.copy()
                moved[index][position] += step
                values.append((reference.attention(*moved, mask, causal=True)[0] * cotangent).sum())
            numeric[position] = (values[0] - values[1]) / 2e-6
        np.testing.assert_allclose(grad, numeric, atol=1e-8)


@HALVES
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("setup", list(SETUPS))
def test_half_precision_output_and_gradient_budget(setup: str, path: str, dtype: str) -> None:
    config = SETUPS[setup]
    q, k, v, cotangent, mask = config.inputs(dtype, seed=len(setup))
    expected = [
        reference.attention(q, k, v, mask, causal=config.causal)[0],
        *reference_gradients(q, k, v, mask, cotangent, causal=config.causal),
    ]
    got = output_and_gradients(ours(path, mask, config.causal), (q, k, v), cotangent, dtype)
    baseline = output_and_gradients(plain(config.allowed(mask)), (q, k, v), cotangent, dtype)
    check_budgets(got, baseline, expected, dtype)


def dead_row_mask(lq: int, lk: int) -> np.ndarray:
    """Every 3rd query row fully masked, the others a pattern."""
    rows, cols = np.meshgrid(np.arange(lq), np.arange(lk), indexing="ij")
    mask = (rows + 2 * cols) % 3 != 0
    mask[::3] = False
    return mask


@HALVES
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_half_precision_large_logits_and_fully_masked_rows(mask_kind: str, path: str, dtype: str) -> None:
    """Logits in the thousands (float16 holds at most 65504) and every 3rd row fully masked: finite outputs and
    gradients, zero output and zero query gradient on the masked rows, and the error budget elsewhere.

    The floor is that of keras/test_functional.py's half outputs, 4 eps * max|expected|, normwise over the whole
    gradient: rows one-hot to within e^-40 have true q/k gradients ~1e-20, far below any rounding of the rest.
    """
    config = Setup(2, 2, 12, 16, magnitude=40.0)
    q, k, v, cotangent, _ = config.inputs(dtype, seed=3)
    assert np.abs(q @ k.swapaxes(-1, -2)).max() / math.sqrt(32) > 1000
    allowed = dead_row_mask(12, 16)
    mask = allowed if mask_kind == "bool" else np.where(allowed, 0.0, -np.inf)
    dead = ~allowed.any(axis=-1)
    expected = [reference.attention(q, k, v, mask)[0], *reference_gradients(q, k, v, mask, cotangent, causal=False)]
    got = output_and_gradients(ours(path, mask, False), (q, k, v), cotangent, dtype)
    assert np.all(got[0][:, :, dead] == 0)
    assert np.all(got[1][:, :, dead] == 0)
    live = ~dead
    baseline = output_and_gradients(plain(allowed[live]), (q[:, :, live], k, v), cotangent[:, :, live], dtype)
    expected_live = [expected[0][:, :, live], expected[1][:, :, live], *expected[2:]]
    got_live = [got[0][:, :, live], got[1][:, :, live], *got[2:]]
    check_budgets(got_live, baseline, expected_live, dtype, floor_ulps=4.0, normwise=True)


# --- determinism -----------------------------------------------------------------------------------------


def layer_outputs_and_gradients(layer: keras.layers.Layer, call: Callable[[], object]) -> list[np.ndarray]:
    """``call()``'s output and the gradients of ``mean(out ** 2)`` w.r.t. every trainable weight of ``layer``."""
    weights = layer.trainable_weights
    if BACKEND == "jax":
        import jax

        def loss(values: list[object]) -> tuple[object, object]:
            # Keras variables on JAX are read through a stateless scope to be differentiated.
            with keras.StatelessScope(state_mapping=list(zip(weights, values, strict=True))):
                out = call()
            return ops.mean(ops.square(ops.cast(out, "float32"))), out

        (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))([w.value for w in weights])
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            out = call()
            loss = tf.reduce_mean(tf.square(tf.cast(out, "float32")))
        grads = tape.gradient(loss, weights)
    else:
        import torch

        out = call()
        grads = torch.autograd.grad(out.float().square().mean(), [w.value for w in weights])
    return [numpy(out), *(numpy(g) for g in grads)]


def assert_bitwise_equal(first: list[np.ndarray], second: list[np.ndarray]) -> None:
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


def seeded_layer(seed: int, dtype: str = "float32") -> MultiHeadAttention:
    """The same weights whatever ``seed`` (which only seeds the dropout)."""
    layer = MultiHeadAttention(4, num_kv_heads=2, dropout=0.3, seed=seed, dtype=dtype)
    layer.build((None, None, 16))
    rng = np.random.default_rng(0)
    for weight in layer.weights:
        weight.assign(rng.uniform(-0.5, 0.5, size=weight.shape).astype("float32"))
    return layer


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("return_weights", [False, True], ids=["no-weights", "weights"])
def test_layer_eval_forward_backward_is_bitwise_repeatable(return_weights: bool, dtype: str) -> None:
    layer = seeded_layer(1, dtype)
    x = tensor(np.random.default_rng(1).normal(size=(3, 9, 16)).astype("float32"))
    key_mask = padding_mask([9, 4, 0], 9)

    def call() -> object:
        result = layer(x, key_mask=key_mask, causal=True, return_weights=return_weights)
        return result[0] if return_weights else result

    first = layer_outputs_and_gradients(layer, call)
    assert len(first) == 1 + len(layer.trainable_weights)
    assert_bitwise_equal(layer_outputs_and_gradients(layer, call), first)


def test_layer_same_seed_same_dropout() -> None:
    """Layers with the same weights and ``seed`` drop the same weights in training, gradients included; another
    seed drops others."""
    x = tensor(np.random.default_rng(2).normal(size=(2, 9, 16)).astype("float32"))

    def run(seed: int) -> list[np.ndarray]:
        layer = seeded_layer(seed)
        return layer_outputs_and_gradients(layer, lambda: layer(x, causal=True, training=True))

    first = run(5)
    assert_bitwise_equal(run(5), first)
    assert not np.array_equal(run(6)[0], first[0])
    evaluated = seeded_layer(5)(x, causal=True)
    assert not np.allclose(first[0], numpy(evaluated))  # the dropout really acted


def tiny_transformer(seed: int) -> Transformer:
    keras.utils.set_random_seed(seed)
    model = Transformer(13, 11, d_model=16, num_heads=4, num_encoder_layers=1, num_decoder_layers=1, d_ff=32,
                        dropout=0.2)  # fmt: skip
    model.build()
    return model


def test_transformer_repeatable_in_eval_and_seeded_in_training() -> None:
    rng = np.random.default_rng(3)
    src, tgt = tensor(rng.integers(0, 13, (2, 7)), "int32"), tensor(rng.integers(0, 11, (2, 5)), "int32")
    src_key_mask = padding_mask([7, 3], 7)

    def run(model: Transformer, training: bool) -> np.ndarray:
        return numpy(model(src, tgt, src_key_mask=src_key_mask, training=training))

    model = tiny_transformer(0)
    evaluated = run(model, False)
    np.testing.assert_array_equal(run(model, False), evaluated)
    trained = run(tiny_transformer(0), True)
    np.testing.assert_array_equal(run(tiny_transformer(0), True), trained)
    assert not np.allclose(trained, evaluated)  # the dropout really acted
    reseeded = tiny_transformer(1)  # other dropout seeds, the same weights
    reseeded.set_weights(model.get_weights())
    np.testing.assert_array_equal(run(reseeded, False), evaluated)
    assert not np.array_equal(run(reseeded, True), trained)
