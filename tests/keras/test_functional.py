"""``multihead.keras.attention`` against the float64 oracle, on every internal path, under the active backend.

Notation: B batch, H heads, Hkv key/value heads, Lq/Lk lengths, Dk/Dv head dims.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import multihead.keras.functional as functional
from attention_cases import reference_gradients
from conftest import broadcast_shapes
from keras_helpers import BACKEND, gradients, numpy, tensor
from multihead import DTypeError, reference
from multihead.keras import attention, causal_mask, padding_mask, padding_mask_from_tokens

RNG = np.random.default_rng(0)

SIZES = {
    "Lq<Lk": (2, 4, 4, 5, 7, 8, 8),
    "Lq>Lk": (2, 4, 4, 7, 5, 8, 8),
    "gqa-dv": (2, 6, 2, 13, 13, 16, 11),
    "mqa-hd59": (1, 4, 1, 9, 4, 59, 7),
}


def qkv(batch, heads, kv_heads, lq, lk, dk, dv, dtype="float64"):
    return (
        RNG.normal(size=(batch, heads, lq, dk)).astype(dtype),
        RNG.normal(size=(batch, kv_heads, lk, dk)).astype(dtype),
        RNG.normal(size=(batch, kv_heads, lk, dv)).astype(dtype),
    )


def random_mask(shape, kind):
    if kind == "bool":
        return RNG.random(shape) > 0.3
    return np.where(RNG.random(shape) < 0.3, -np.inf, RNG.normal(size=shape))


def paths(q, k, v, mask=None, dtype="float64", **kwargs):
    """Output of every path: the dispatching call, the explicit path, the blocked path (small blocks)."""
    q, k, v = (tensor(x, dtype) for x in (q, k, v))
    if mask is not None:
        mask = tensor(mask, None if mask.dtype == bool else dtype)
    fused = attention(q, k, v, mask, **kwargs)
    explicit, weights = attention(q, k, v, mask, return_weights=True, **kwargs)
    blocked = functional._blocked(q, k, v, mask, kwargs.get("causal", False), kwargs.get("scale"), block=3)
    return {"dispatch": numpy(fused), "explicit": numpy(explicit), "blocked": numpy(blocked)}, numpy(weights)


@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("size", list(SIZES))
def test_matches_reference(size: str, causal: bool, mask_kind: str | None) -> None:
    q, k, v = qkv(*SIZES[size])
    batch, _, _, lq, lk, _, _ = SIZES[size]
    mask = None if mask_kind is None else random_mask((batch, 1, lq, lk), mask_kind)
    expected, expected_weights = reference.attention(q, k, v, mask, causal=causal)
    outs, weights = paths(q, k, v, mask, causal=causal)
    for name, out in outs.items():
        np.testing.assert_allclose(out, expected, atol=1e-10, err_msg=name)
    np.testing.assert_allclose(weights, expected_weights, atol=1e-10)


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
@pytest.mark.parametrize("shape", broadcast_shapes(), ids=lambda s: "x".join(map(str, s)))
def test_every_mask_broadcast_shape(shape: tuple[int, ...], mask_kind: str) -> None:
    q, k, v = qkv(2, 3, 3, 4, 5, 6, 7)
    mask = random_mask(shape, mask_kind)
    expected, _ = reference.attention(q, k, v, mask, causal=True)
    outs, _ = paths(q, k, v, mask, causal=True)
    for name, out in outs.items():
        np.testing.assert_allclose(out, expected, atol=1e-10, err_msg=name)


@pytest.mark.parametrize("scale", [0.0, 0.3])
def test_scale_override(scale: float) -> None:
    q, k, v = qkv(*SIZES["Lq<Lk"])
    expected, _ = reference.attention(q, k, v, scale=scale)
    outs, _ = paths(q, k, v, scale=scale)
    for name, out in outs.items():
        np.testing.assert_allclose(out, expected, atol=1e-10, err_msg=name)


def test_float32_matches_reference() -> None:
    q, k, v = qkv(*SIZES["gqa-dv"], dtype="float32")
    mask = random_mask((2, 1, 13, 13), "bool")
    expected, _ = reference.attention(q, k, v, mask, causal=True)
    outs, _ = paths(q, k, v, mask, dtype="float32", causal=True)
    for name, out in outs.items():
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, expected, atol=2e-5, err_msg=name)


def test_causal_mask_helper() -> None:
    np.testing.assert_array_equal(numpy(causal_mask(2, 5)), [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(numpy(causal_mask(4, 4)), np.tril(np.ones((4, 4), bool)))


def test_padding_helpers() -> None:
    np.testing.assert_array_equal(numpy(padding_mask([2, 0, 3], 3)), [[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    tokens = tensor(np.array([[5, 0, 2, 0]]), "int32")
    np.testing.assert_array_equal(numpy(padding_mask_from_tokens(tokens, 0)), [[1, 0, 1, 0]])
    with pytest.raises(ValueError, match=r"must lie in \[0, max_len=3\], received \[4\]"):
        padding_mask([4], 3)
    with pytest.raises(TypeError, match="integers"):
        padding_mask(np.array([1.0]), 3)


# --- fully masked rows, precision ------------------------------------------------------------------------


def patterned_mask(lq: int, lk: int) -> np.ndarray:
    rows, cols = np.meshgrid(np.arange(lq), np.arange(lk), indexing="ij")
    mask = (rows + cols) % 3 != 0
    mask[::4] = False
    return mask


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
@pytest.mark.parametrize("path", ["dispatch", "explicit", "blocked"])
def test_fully_masked_rows_are_zero_with_zero_finite_gradients(path: str, mask_kind: str) -> None:
    q, k, v = qkv(2, 4, 2, 10, 7, 8, 5)
    mask = patterned_mask(10, 7)
    if mask_kind == "float":
        mask = np.where(mask, 0.0, -np.inf)
    mask_tensor = tensor(mask)

    def fn(q, k, v):
        if path == "blocked":
            return functional._blocked(q, k, v, mask_tensor, False, None, block=3)
        result = attention(q, k, v, mask_tensor, return_weights=path == "explicit")
        return result[0] if path == "explicit" else result

    out = numpy(fn(*(tensor(x) for x in (q, k, v))))
    dead = np.arange(10) % 4 == 0
    assert np.all(out[:, :, dead] == 0)
    grad_q, grad_k, grad_v = gradients(fn, q, k, v)
    for grad in (grad_q, grad_k, grad_v):
        assert np.isfinite(grad).all()
    assert np.all(grad_q[:, :, dead] == 0)
    assert np.abs(grad_q[:, :, ~dead]).sum() > 0


def test_causal_with_more_queries_than_keys_zeroes_leading_rows() -> None:
    q, k, v = qkv(1, 2, 2, 6, 2, 4, 4)
    outs, weights = paths(q, k, v, causal=True)
    for name, out in outs.items():
        assert np.all(out[:, :, :4] == 0), name
    assert np.all(weights[:, :, :4] == 0)


EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7}


@pytest.mark.parametrize("dtype", list(EPS))
def test_half_precision_large_logits(dtype: str) -> None:
    q, k, v = qkv(1, 2, 2, 16, 16, 64, 64, dtype="float32")
    q, k = q * 40, k * 40  # logits in the thousands: fp16 overflows at 65504 before scaling
    mask = patterned_mask(16, 16)
    halves = [numpy(keras.ops.cast(tensor(x), dtype)).astype(np.float64) for x in (q, k, v)]
    expected, _ = reference.attention(*halves, mask)
    for path, out in paths(q, k, v, mask, dtype=dtype)[0].items():
        out = out.astype(np.float64)
        assert np.isfinite(out).all(), path
        assert np.all(out[:, :, ::4] == 0), path
        np.testing.assert_allclose(out, expected, atol=4 * EPS[dtype] * np.abs(expected).max(), err_msg=path)


# --- dropout ---------------------------------------------------------------------------------------------


def test_dropout_only_in_training_and_seeded() -> None:
    p, lk = 0.3, 32
    q, k, _ = qkv(4, 4, 4, 32, lk, 8, 8, dtype="float32")
    v = np.broadcast_to(np.eye(lk, dtype="float32"), (4, 4, lk, lk))
    q, k, v = tensor(q), tensor(k), tensor(v)
    plain, weights = (numpy(x) for x in attention(q, k, v, return_weights=True))
    np.testing.assert_allclose(numpy(attention(q, k, v, dropout=p)), plain, atol=1e-6)
    dropped = numpy(attention(q, k, v, dropout=p, training=True, seed=7))
    zero = dropped == 0
    assert abs(zero.mean() - p) < 0.02
    np.testing.assert_allclose(dropped[~zero], weights[~zero] / (1 - p), rtol=1e-5)
    np.testing.assert_array_equal(numpy(attention(q, k, v, dropout=p, training=True, seed=7)), dropped)
    out, returned = attention(q, k, v, dropout=p, training=True, seed=7, return_weights=True)
    np.testing.assert_allclose(numpy(returned), weights, atol=1e-6)  # weights are returned before dropout
    np.testing.assert_array_equal(numpy(out), dropped)


# --- dispatch --------------------------------------------------------------------------------------------


def test_block_size_bounds_the_scores_per_block() -> None:
    assert functional.block_size(1, 8, 512) == functional.KEY_BLOCK
    assert functional.block_size(1, 8, 16384) == 64
    for batch, heads, lq in [(1, 8, 4096), (8, 8, 2048), (None, 4, 3000)]:
        size = functional.block_size(batch, heads, lq)
        assert (batch or 1) * heads * lq * size <= functional.BLOCK_SCORES or size == 64


@pytest.mark.skipif(BACKEND == "torch", reason="on the torch backend long sequences go to PyTorch's SDPA")
def test_long_keys_take_the_blocked_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    blocked = functional._blocked
    monkeypatch.setattr(functional, "KEY_BLOCK", 4)
    monkeypatch.setattr(functional, "_blocked", lambda *a: calls.append(a[:3]) or blocked(*a))
    q, k, v = qkv(1, 2, 2, 6, 11, 8, 8)
    expected, _ = reference.attention(q, k, v, causal=True)
    np.testing.assert_allclose(numpy(attention(tensor(q), tensor(k), tensor(v), causal=True)), expected, atol=1e-10)
    assert len(calls) == 1


def test_query_chunks_are_evened_out_to_about_block_scores() -> None:
    """TensorFlow's blocked path takes ``Lq`` in chunks of about ``BLOCK_SCORES / (B H Lk)`` rows, evened out so
    that padding the last chunk costs fewer rows than there are chunks."""
    assert functional.query_chunk(1, 8, 4096, 4096) == 256
    assert functional.query_chunk(1, 8, 1025, 4096) == 205  # 5 chunks of 256 would hold 1280 rows
    assert functional.query_chunk(8, 8, 13, 512) == 13
    for batch, heads, lq, lk in [(1, 8, 4096, 16384), (None, 4, 3000, 3000), (2, 2, 7, 100_000)]:
        chunk = functional.query_chunk(batch, heads, lq, lk)
        count = -(-lq // chunk)
        assert count * chunk - lq < count
        assert chunk <= functional.block_size(batch, heads, lk)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="query chunks with their own gradient are TensorFlow's")
@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recomputed"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize(
    ("lq", "lk", "mask_rows", "causal"),
    [(13, 29, 13, False), (13, 29, 13, True), (29, 13, 1, True), (13, 29, None, True)],
    ids=["mask", "mask-causal", "Lq>Lk-causal-row-mask", "causal"],
)
def test_query_chunks_match_the_oracle_with_gradients(
    recompute: bool, graph: bool, lq: int, lk: int, mask_rows: int | None, causal: bool
) -> None:
    """TensorFlow's blocked path, queries in chunks of 4 rows, differentiated by TensorFlow with the probabilities
    kept, or chunk by chunk with them recomputed: outputs and gradients against the float64 oracle, with grouped
    heads, Dv != Dk, Lq != Lk, a padded last chunk, masks with and without a query axis, and fully masked rows
    (from the mask, or causal with Lq > Lk)."""
    import tensorflow as tf

    q, k, v = qkv(2, 4, 2, lq, lk, 8, 5, dtype="float32")
    mask = None
    if mask_rows is not None:
        mask = RNG.random((2, 1, mask_rows, lk)) > 0.4
        if mask_rows == lq:
            mask[:, :, ::3] = False
    cotangent = RNG.normal(size=(2, 4, lq, 5)).astype("float32")

    def run(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            m = None if mask is None else tf.constant(mask)
            out = functional._blocked(q, k, v, m, causal, None, block=4, recompute=recompute)
            loss = tf.reduce_sum(out * cotangent)
        return [out, *tape.gradient(loss, [q, k, v])]

    got = [x.numpy() for x in (tf.function(run) if graph else run)(tf.constant(q), tf.constant(k), tf.constant(v))]
    expected = [
        reference.attention(q, k, v, mask, causal=causal)[0],
        *reference_gradients(q, k, v, mask, cotangent, causal=causal),
    ]
    for name, a, b in zip(["out", "grad q", "grad k", "grad v"], got, expected, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, err_msg=name)
    allowed = np.ones((2, 1, lq, lk), dtype=bool) if mask is None else np.broadcast_to(mask, (2, 1, lq, lk))
    if causal:
        allowed = allowed & (np.arange(lk) <= np.arange(lq)[:, None] + lk - lq)
    dead = np.broadcast_to(~allowed.any(-1), (2, 4, lq))  # (B, H, Lq)
    assert dead.any() == (mask_rows == lq or lq > lk)
    assert np.all(got[0][dead] == 0)
    assert np.all(got[1][dead] == 0)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="query chunks with their own gradient are TensorFlow's")
def test_query_chunks_keep_the_probabilities_up_to_kept_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default the probabilities are kept for the gradient up to ``KEPT_SCORES`` of them, and recomputed beyond
    it or when the batch size is unknown (inside a ``tf.function`` traced for any batch)."""
    import tensorflow as tf

    chosen = []
    chunks = functional._tf_query_chunks
    monkeypatch.setattr(functional, "_tf_query_chunks", lambda *a: chosen.append(a[-1]) or chunks(*a))
    q, k, v = (tf.constant(x) for x in qkv(2, 4, 4, 8, 16, 8, 8, dtype="float32"))
    kept = functional._blocked(q, k, v, None, False, None, block=4)
    monkeypatch.setattr(functional, "KEPT_SCORES", 2 * 4 * 8 * 16 - 1)
    recomputed = functional._blocked(q, k, v, None, False, None, block=4)
    monkeypatch.setattr(functional, "KEPT_SCORES", 2 * 4 * 8 * 16)
    any_batch = [tf.TensorSpec([None, 4, length, 8], tf.float32) for length in (8, 16, 16)]
    tf.function(lambda q, k, v: functional._blocked(q, k, v, None, False, None, block=4)).get_concrete_function(
        *any_batch
    )
    assert chosen == [False, True, True]
    np.testing.assert_allclose(kept.numpy(), recomputed.numpy(), atol=1e-6)


@pytest.mark.skipif(BACKEND != "torch", reason="delegation to PyTorch's SDPA exists only on the torch backend")
def test_torch_backend_delegates_to_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    from multihead import sdpa

    monkeypatch.setattr(sdpa, "SMALL_INFERENCE_SCORES", 0)  # these sizes would take the explicit math

    calls = []
    fused = sdpa.fused
    monkeypatch.setattr(sdpa, "fused", lambda *a, **kw: calls.append(True) or fused(*a, **kw))
    q, k, v = qkv(1, 2, 2, 6, 11, 8, 8)
    expected, _ = reference.attention(q, k, v, causal=True)
    np.testing.assert_allclose(numpy(attention(tensor(q), tensor(k), tensor(v), causal=True)), expected, atol=1e-10)
    assert calls == [True]


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's kernel is the torch backend's")
def test_torch_backend_small_inference_takes_the_explicit_math(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in the PyTorch front end: below 128x128 scores per head, without gradients, the math is faster."""
    from multihead import sdpa

    calls = []
    monkeypatch.setattr(sdpa, "fused", lambda *a, **kw: calls.append(True))
    q, k, v = qkv(2, 4, 2, 5, 5, 8, 8)
    expected, _ = reference.attention(q, k, v, causal=True)
    np.testing.assert_allclose(numpy(attention(tensor(q), tensor(k), tensor(v), causal=True)), expected, atol=1e-10)
    assert calls == []


# --- the backend's kernel: PyTorch's SDPA on torch, jax.nn.dot_product_attention on JAX (adapted) -----------

FUSED = pytest.mark.skipif(
    BACKEND not in functional.FUSED_BACKENDS, reason=f"the {BACKEND} backend has no fused attention kernel"
)
KERNEL_SIZES = {**SIZES, "dk<dv": (2, 4, 2, 6, 9, 5, 12)}


def kernel_mask(shape: tuple[int, ...], kind: str | None) -> np.ndarray | None:
    """A random mask with every 4th query row fully masked."""
    if kind is None:
        return None
    mask = random_mask(shape, kind)
    mask[..., ::4, :] = False if kind == "bool" else -np.inf
    return mask


@FUSED
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("size", list(KERNEL_SIZES))
def test_fused_kernel_matches_reference(size: str, causal: bool, mask_kind: str | None) -> None:
    """Bottom-right causal (Lq != Lk), grouped heads, Dv != Dk both ways, bool (True = attend) and float (added)
    masks with fully masked rows: the kernel's answers are the oracle's, in float32."""
    batch, _, _, lq, lk, _, _ = KERNEL_SIZES[size]
    q, k, v = qkv(*KERNEL_SIZES[size])
    mask = kernel_mask((batch, 1, lq, lk), mask_kind)
    expected, _ = reference.attention(q, k, v, mask, causal=causal)
    m = None if mask is None else tensor(mask, None if mask.dtype == bool else "float32")
    out = attention(*(tensor(x, "float32") for x in (q, k, v)), m, causal=causal, implementation="fused")
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    np.testing.assert_allclose(numpy(out), expected, atol=2e-6)


@FUSED
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_fused_kernel_fully_masked_rows_are_zero_with_zero_finite_gradients(mask_kind: str) -> None:
    q, k, v = qkv(2, 4, 2, 10, 7, 8, 5, dtype="float32")
    mask = patterned_mask(10, 7)
    mask_tensor = tensor(mask if mask_kind == "bool" else np.where(mask, 0.0, -np.inf).astype("float32"))

    def fn(q, k, v):
        return attention(q, k, v, mask_tensor, implementation="fused")

    out = numpy(fn(*(tensor(x) for x in (q, k, v))))
    dead = np.arange(10) % 4 == 0
    assert np.all(out[:, :, dead] == 0)
    expected, _ = reference.attention(*(x.astype(np.float64) for x in (q, k, v)), mask)
    np.testing.assert_allclose(out, expected, atol=2e-6)
    grad_q, grad_k, grad_v = gradients(fn, q, k, v)
    for grad in (grad_q, grad_k, grad_v):
        assert np.isfinite(grad).all()
    assert np.all(grad_q[:, :, dead] == 0)
    assert np.abs(grad_q[:, :, ~dead]).sum() > 0


@pytest.mark.skipif(BACKEND != "jax", reason="JAX's kernel is the one that computes the softmax in float32 only")
def test_jax_kernel_refuses_float64_and_auto_leaves_it() -> None:
    q, k, v = (tensor(x) for x in qkv(1, 2, 2, 3, 4, 8, 8))
    with pytest.raises(ValueError, match=r"'fused' on the jax backend needs float32 or half inputs.*float64"):
        attention(q, k, v, implementation="fused")
    assert "jax" not in functional.AUTO_FUSED_BACKENDS  # slower than the explicit path: see AUTO_FUSED_BACKENDS


@pytest.mark.skipif(BACKEND in functional.FUSED_BACKENDS, reason=f"the {BACKEND} backend has a fused kernel")
def test_fused_is_refused_without_a_kernel() -> None:
    q, k, v = (tensor(x, "float32") for x in qkv(1, 2, 2, 3, 4, 8, 8))
    with pytest.raises(ValueError, match=rf"needs a backend with a fused attention kernel.*the {BACKEND} backend"):
        attention(q, k, v, implementation="fused")


# --- validation ------------------------------------------------------------------------------------------


def qkv_tensors(q=(2, 4, 5, 8), k=(2, 4, 7, 8), v=(2, 4, 7, 6)):
    return tuple(tensor(np.zeros(shape, "float32")) for shape in (q, k, v))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: attention(*qkv_tensors(q=(4, 5, 8))), ValueError, r"`q` must be 4-D .*q.shape=\(4, 5, 8\)"),
        (lambda: attention(*qkv_tensors(k=(3, 4, 7, 8))), ValueError, r"batch size B"),
        (lambda: attention(*qkv_tensors(k=(2, 3, 7, 8), v=(2, 3, 7, 6))), ValueError, r"multiple of the key/value"),
        (lambda: attention(*qkv_tensors(v=(2, 4, 6, 6))), ValueError, r"same length Lk"),
        (lambda: attention(*qkv_tensors(k=(2, 4, 7, 9))), ValueError, r"same head dim Dk"),
        (lambda: attention([[1.0]], *qkv_tensors()[1:]), TypeError, r"`q` must be a tensor, received list"),
        (lambda: attention(*qkv_tensors(), tensor(np.ones((5, 7), "int32"))), DTypeError, r"received dtype int32"),
        (lambda: attention(*qkv_tensors(), tensor(np.ones((5, 6), bool))), ValueError, r"mask.shape=\(5, 6\)"),
        (lambda: attention(*qkv_tensors(), dropout=1.0), ValueError, r"`dropout` must be in \[0, 1\)"),
        (lambda: attention(*qkv_tensors(), causal="yes"), TypeError, r"`causal` must be True or False"),
    ],
)
def test_validation(call, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()
