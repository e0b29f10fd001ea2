"""Property-based tests of ``multihead.keras`` attention over random shapes, masks, head groupings and magnitudes.

Runs under every Keras backend. Notation: B batch, H heads, Hkv key/value heads, Lq/Lk lengths, Dk/Dv head dims,
E d_model, m input magnitude.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead.keras.functional as functional
from attention_cases import (
    Case,
    cases,
    dead_keys,
    peak,
    permuted_keys,
    random_mask,
    tolerance,
    with_edges,
    with_junk,
)
from keras_helpers import BACKEND, jax_vjp, numpy, tensor
from multihead import reference
from multihead.keras import MultiHeadAttention, attention

PATHS = ["dispatch", "explicit", "blocked"]
BLOCK = 2  # the blocked path with blocks this small runs several blocks, a partial last one, or none at all


def run(
    path: str,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    *,
    causal: bool,
    dtype: str = "float64",
) -> tuple[np.ndarray, np.ndarray | None]:
    """One internal path on arrays: ``(out, weights)``, weights only from the explicit path."""
    q, k, v = (tensor(x, dtype) for x in (q, k, v))
    mask = None if mask is None else tensor(mask, None if mask.dtype == bool else dtype)
    if path == "blocked":
        return numpy(functional._blocked(q, k, v, mask, causal, None, block=BLOCK)), None
    if path == "explicit":
        out, weights = attention(q, k, v, mask, causal=causal, return_weights=True)
        return numpy(out), numpy(weights)
    return numpy(attention(q, k, v, mask, causal=causal)), None


def gradients(fn: Callable[..., object], *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Gradients of ``sum(fn(*inputs) ** 2)`` on the active backend; zeros for inputs the loss does not reach
    (no keys), where TensorFlow answers ``None`` and torch has no graph (the blocked path's loop of zero blocks)."""
    if BACKEND == "jax":
        return tuple(np.asarray(g) for g in jax_vjp(fn, inputs)[1])
    if BACKEND == "tensorflow":
        import tensorflow as tf

        variables = [tf.Variable(x) for x in inputs]
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(fn(*variables)))
        grads = tape.gradient(loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return tuple(g.numpy() for g in grads)
    import torch

    leaves = [torch.tensor(x, requires_grad=True) for x in inputs]
    loss = fn(*leaves).square().sum()
    if not loss.requires_grad:
        return tuple(np.zeros_like(x) for x in inputs)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)
    return tuple(g.numpy() for g in grads)


def paths_for(case: Case) -> list[str]:
    # The blocked path fails on an empty batch or zero queries: see test_empty_batch_or_queries_beyond_one_block.
    return PATHS if case.batch * case.lq > 0 else PATHS[:2]


# --- the functional core ---------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(case=cases())
@with_edges()
def test_matches_reference(case: Case) -> None:
    q, k, v, mask = case.arrays()
    expected, expected_weights = reference.attention(q, k, v, mask, causal=case.causal)
    atol = tolerance(q, k, v, mask)
    for path in paths_for(case):
        out, weights = run(path, q, k, v, mask, causal=case.causal)
        assert out.shape == expected.shape, path
        assert out.dtype == np.float64, path
        np.testing.assert_allclose(out, expected, rtol=0, atol=atol, err_msg=path)
        if weights is not None:
            np.testing.assert_allclose(weights, expected_weights, rtol=0, atol=atol / (1 + peak(v)))


@settings(max_examples=40, deadline=None)
@given(case=cases())
@with_edges()
def test_weights_are_distributions_over_allowed_keys(case: Case) -> None:
    q, k, v, mask = case.arrays()
    _, weights = run("explicit", q, k, v, mask, causal=case.causal)
    allowed = case.allowed(mask)
    live = allowed.any(axis=-1)  # (B, H, Lq)
    assert weights.shape == allowed.shape
    assert np.all(weights >= 0)
    assert np.all(weights[~allowed] == 0), "weight on a forbidden key"
    assert np.all(weights[~live] == 0), "a fully masked row has weights"
    np.testing.assert_allclose(weights.sum(axis=-1)[live], 1.0, rtol=0, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(case=cases(), junk=st.sampled_from([1.0, 1e8, 1e100]), dead=st.sampled_from([0.0, 0.4, 1.0]))
@with_edges(junk=1e100, dead=0.4)
def test_masked_keys_and_values_cannot_change_the_output(case: Case, junk: float, dead: float) -> None:
    """Keys no query of a key/value head may attend (padded by ``dead``, or masked) get random values of size
    ``junk``; the output must not move."""
    q, k, v, mask = case.arrays()
    mask, unused = dead_keys(case, mask, dead)  # unused: (B, Hkv, Lk)
    k_junk, v_junk = with_junk(k, unused, junk, case.seed), with_junk(v, unused, junk, case.seed + 1)
    for path in paths_for(case):
        out, weights = run(path, q, k, v, mask, causal=case.causal)
        out_junk, weights_junk = run(path, q, k_junk, v_junk, mask, causal=case.causal)
        assert np.isfinite(out_junk).all(), path
        np.testing.assert_allclose(out_junk, out, rtol=0, atol=1e-13 * (1 + peak(out)), err_msg=path)
        if weights is not None:
            np.testing.assert_allclose(weights_junk, weights, rtol=0, atol=1e-13)


@settings(max_examples=30, deadline=None)
@given(case=cases())
@with_edges()
def test_permuting_keys_with_values_and_mask_leaves_output_unchanged(case: Case) -> None:
    q, k, v, mask = case.arrays()
    perm, permuted_mask = permuted_keys(case, mask)
    atol = tolerance(q, k, v, mask)
    for path in paths_for(case):
        out, weights = run(path, q, k, v, mask, causal=case.causal)
        permuted_out, permuted_weights = run(path, q, k[:, :, perm], v[:, :, perm], permuted_mask, causal=False)
        np.testing.assert_allclose(permuted_out, out, rtol=0, atol=atol, err_msg=path)
        if weights is not None:
            np.testing.assert_allclose(permuted_weights, weights[..., perm], rtol=0, atol=atol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(max_examples=15, deadline=None)
@given(case=cases(max_len=5))
@with_edges()
def test_finite_inputs_give_finite_outputs_and_gradients(case: Case, dtype: str) -> None:
    q, k, v, mask = case.arrays()
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    mask_tensor = None if mask is None else tensor(mask, None if mask.dtype == bool else dtype)
    dead = ~case.allowed(mask).any(axis=-1)  # (B, H, Lq): fully masked rows
    for path in paths_for(case):

        def fn(q, k, v, path=path):
            if path == "blocked":
                return functional._blocked(q, k, v, mask_tensor, case.causal, None, block=BLOCK)
            result = attention(q, k, v, mask_tensor, causal=case.causal, return_weights=path == "explicit")
            return result[0] if path == "explicit" else result

        out = numpy(fn(*(tensor(x) for x in (q, k, v))))
        assert np.isfinite(out).all(), path
        assert np.all(out[dead] == 0), path
        grad_q, grad_k, grad_v = gradients(fn, q, k, v)
        for name, grad in zip("qkv", (grad_q, grad_k, grad_v), strict=True):
            assert np.isfinite(grad).all(), (path, name)
        assert np.all(grad_q[dead] == 0), path


@pytest.mark.parametrize(("batch", "lq"), [(0, 3), (1, 0)], ids=["B0", "Lq0"])
def test_empty_batch_or_queries_beyond_one_block(batch: int, lq: int) -> None:
    """An empty batch or zero queries give an empty output, also with more keys than ``KEY_BLOCK`` (where the
    TensorFlow backend takes the blocked path)."""
    q = tensor(np.zeros((batch, 2, lq, 4), "float32"))
    k = v = tensor(np.ones((batch, 2, functional.KEY_BLOCK + 1, 4), "float32"))
    out = attention(q, k, v)
    assert tuple(out.shape) == (batch, 2, lq, 4)


# --- the layer -------------------------------------------------------------------------------------------


def torch_layout(layer: MultiHeadAttention) -> dict[str, np.ndarray]:
    """The layer's weights named and shaped like the PyTorch state dict (the oracle's layout)."""
    params = {}
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        dense = getattr(layer, name)
        params[f"{name}.weight"] = numpy(dense.kernel).T
        if dense.bias is not None:
            params[f"{name}.bias"] = numpy(dense.bias)
    return params


@st.composite
def layer_cases(draw: st.DrawFn) -> dict:
    kv_heads, groups = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    heads = kv_heads * groups
    batch, lq, lk = draw(st.integers(0, 2)), draw(st.integers(0, 5)), draw(st.integers(0, 5))
    mask_shape = draw(st.sampled_from([None, (lq, lk), (batch, lq, lk), (batch, heads, lq, lk), (1, heads, 1, lk)]))
    return {
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": draw(st.integers(1, 3)),
        "batch": batch,
        "lq": lq,
        "lk": lk,
        "mask_shape": mask_shape,
        "mask_kind": draw(st.sampled_from(["bool", "float"])),
        "padded": draw(st.sampled_from([0.0, 0.4, 1.0])),
        "query_padding": draw(st.sampled_from([None, 0.4, 1.0])),
        "causal": draw(st.booleans()),
        "magnitude": draw(st.sampled_from([1.0, 30.0])),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


def build_layer(case: dict) -> tuple[MultiHeadAttention, dict[str, np.ndarray | None]]:
    """A float64 cross-attention layer with random weights, random inputs (query/key scaled by m) and masks."""
    rng = np.random.default_rng(case["seed"])
    batch, lq, lk, m = case["batch"], case["lq"], case["lk"], case["magnitude"]
    layer = MultiHeadAttention(
        case["heads"], head_dim=case["head_dim"], num_kv_heads=case["kv_heads"], d_model=4, dtype="float64"
    )
    layer.build((None, None, 6), (None, None, 5), (None, None, 3))
    for weight in layer.weights:
        weight.assign(rng.uniform(-0.5, 0.5, size=weight.shape))
    arrays = {
        "query": rng.normal(size=(batch, lq, 6)) * m,
        "key": rng.normal(size=(batch, lk, 5)) * m,
        "value": rng.normal(size=(batch, lk, 3)),
        "mask": random_mask(rng, case["mask_shape"], case["mask_kind"], 0.3),
        "key_mask": rng.random((batch, lk)) >= case["padded"],
        "query_mask": None if case["query_padding"] is None else rng.random((batch, lq)) >= case["query_padding"],
    }
    return layer, arrays


def layer_call(layer: MultiHeadAttention, arrays: dict, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    mask, query_mask = arrays["mask"], arrays["query_mask"]
    out, weights = layer(
        *(tensor(arrays[name]) for name in ("query", "key", "value")),
        mask=None if mask is None else tensor(mask),
        key_mask=tensor(arrays["key_mask"]),
        query_mask=None if query_mask is None else tensor(query_mask),
        causal=causal,
        return_weights=True,
    )
    return numpy(out), numpy(weights)


# On the torch backend Keras' ops.matmul, and so Dense, computes float64 in float32 (it rounds through
# float32 and casts back), so the layer's projections carry float32 rounding there.
LAYER_EPS = float(np.finfo(np.float32 if BACKEND == "torch" else np.float64).eps)


def layer_tolerance(params: dict[str, np.ndarray], arrays: dict, heads: int, kv_heads: int) -> float:
    """``tolerance`` at the layer's precision, for the projected q, k, v, then through ``out_proj`` (whose largest
    row sum bounds how much it can grow an error)."""

    def project(name: str, x: np.ndarray, count: int) -> np.ndarray:
        y = x @ params[f"{name}.weight"].T + params.get(f"{name}.bias", 0.0)
        return y.reshape(*y.shape[:-1], count, y.shape[-1] // count)  # (B, L, heads, D)

    q = project("q_proj", arrays["query"], heads)
    k = project("k_proj", arrays["key"], kv_heads)
    v = project("v_proj", arrays["value"], kv_heads)
    growth = 1 + np.abs(params["out_proj.weight"]).sum(axis=1).max()
    return tolerance(q, k, v, arrays["mask"], eps=LAYER_EPS) * growth


@settings(max_examples=20, deadline=None)
@given(case=layer_cases())
def test_layer_matches_reference(case: dict) -> None:
    layer, arrays = build_layer(case)
    out, weights = layer_call(layer, arrays, case["causal"])
    assert np.isfinite(out).all()
    assert out.shape == (case["batch"], case["lq"], 4)
    assert weights.shape == (case["batch"], case["heads"], case["lq"], case["lk"])
    params = torch_layout(layer)
    expected, expected_weights = reference.multi_head_attention(
        arrays["query"],
        arrays["key"],
        arrays["value"],
        params,
        num_heads=case["heads"],
        num_kv_heads=case["kv_heads"],
        mask=arrays["mask"],
        key_mask=arrays["key_mask"],
        query_mask=arrays["query_mask"],
        causal=case["causal"],
    )
    atol = layer_tolerance(params, arrays, case["heads"], case["kv_heads"])
    np.testing.assert_allclose(out, expected, rtol=0, atol=atol)
    np.testing.assert_allclose(weights, expected_weights, rtol=0, atol=atol)


@settings(max_examples=20, deadline=None)
@given(case=layer_cases(), junk=st.sampled_from([1e3, 1e30]))
def test_layer_padded_keys_and_queries_cannot_change_the_output(case: dict, junk: float) -> None:
    layer, arrays = build_layer(case)
    padded = ~arrays["key_mask"]  # (B, Lk)
    junk_arrays = dict(
        arrays,
        key=with_junk(arrays["key"], padded, junk, case["seed"]),
        value=with_junk(arrays["value"], padded, junk, case["seed"] + 1),
    )
    if arrays["query_mask"] is not None:  # padded queries cannot change anything either
        junk_arrays["query"] = with_junk(arrays["query"], ~arrays["query_mask"], junk, case["seed"] + 2)
    out, weights = layer_call(layer, arrays, case["causal"])
    junk_out, junk_weights = layer_call(layer, junk_arrays, case["causal"])
    assert np.isfinite(junk_out).all()
    np.testing.assert_allclose(junk_out, out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(junk_weights, weights, rtol=0, atol=1e-13)
