"""``multihead.keras.MultiHeadAttention``: the oracle, Keras' own layer, the Keras layer contract.

Runs under every Keras backend. Notation: B batch, Lq/Lk lengths, E d_model, H heads.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from keras_helpers import BACKEND, numpy, tensor
from multihead import DTypeError, reference
from multihead.keras import MultiHeadAttention, padding_mask

RNG = np.random.default_rng(0)


def torch_layout(layer: MultiHeadAttention) -> dict[str, np.ndarray]:
    """The layer's weights named and shaped like the PyTorch state dict, written out by hand."""
    params = {}
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        dense = getattr(layer, name)
        params[f"{name}.weight"] = numpy(dense.kernel).T.astype(np.float64)
        if dense.bias is not None:
            params[f"{name}.bias"] = numpy(dense.bias).astype(np.float64)
    return params


def randomize(layer: keras.layers.Layer) -> None:
    for weight in layer.weights:
        weight.assign(RNG.uniform(-0.5, 0.5, size=weight.shape).astype(weight.dtype))


def build(num_heads: int, shapes: tuple, **options) -> MultiHeadAttention:
    layer = MultiHeadAttention(num_heads, **options)
    layer.build(*[(None, None, d) for d in shapes])
    randomize(layer)
    return layer


CONFIGS = {
    "self": (4, (16,), {}),
    "cross": (4, (16, 12, 10), {}),
    "gqa": (6, (24,), {"num_kv_heads": 2}),
    "head-dims": (3, (10,), {"head_dim": 7, "value_head_dim": 5}),
    "d-model": (4, (9, 5, 3), {"d_model": 12}),
    "no-bias": (4, (16,), {"use_bias": False}),
}


def mask_variants(batch: int, heads: int, lq: int, lk: int) -> dict[str, dict]:
    key_mask = np.arange(lk)[None, :] < RNG.integers(1, lk + 1, size=(batch, 1))
    query_mask = np.arange(lq)[None, :] < (np.arange(batch) % (lq + 1))[:, None]  # a sequence with no real query
    return {
        "none": {},
        "2d": {"mask": RNG.random((lq, lk)) > 0.3},
        "3d": {"mask": RNG.random((batch, lq, lk)) > 0.3},
        "4d": {"mask": RNG.random((batch, heads, lq, lk)) > 0.3},
        "key-mask": {"key_mask": key_mask},
        "float+key-mask": {"mask": RNG.normal(size=(batch, lq, lk)), "key_mask": key_mask},
        "causal+key-mask": {"key_mask": key_mask, "causal": True},
        "causal+query-mask": {"key_mask": key_mask, "query_mask": query_mask, "causal": True},
    }


@pytest.mark.parametrize("variant", list(mask_variants(1, 1, 1, 1)))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_matches_reference_with_own_weights(config: str, variant: str) -> None:
    num_heads, dims, options = CONFIGS[config]
    layer = build(num_heads, dims, **options)
    batch, lq, lk = 3, 5, 7 if len(dims) > 1 else 5
    query = RNG.normal(size=(batch, lq, dims[0])).astype("float32")
    key = RNG.normal(size=(batch, lk, dims[1 % len(dims)])).astype("float32") if len(dims) > 1 else query
    value = RNG.normal(size=(batch, lk, dims[-1])).astype("float32") if len(dims) > 1 else query
    kwargs = mask_variants(batch, num_heads, lq, lk)[variant]
    call_kwargs = {
        name: tensor(x, None if np.asarray(x).dtype == bool else "float32") if name != "causal" else x
        for name, x in kwargs.items()
    }
    out, weights = layer(tensor(query), tensor(key), tensor(value), return_weights=True, **call_kwargs)
    expected, expected_weights = reference.multi_head_attention(
        query, key, value, torch_layout(layer), num_heads=num_heads, num_kv_heads=layer.num_kv_heads, **kwargs
    )
    np.testing.assert_allclose(numpy(out), expected, atol=2e-5)
    np.testing.assert_allclose(numpy(weights), expected_weights, atol=2e-6)
    np.testing.assert_allclose(
        numpy(layer(tensor(query), tensor(key), tensor(value), **call_kwargs)), numpy(out), atol=2e-6
    )


def test_keras_padding_mask_becomes_key_mask_and_carries_on() -> None:
    embed = keras.layers.Embedding(10, 16, mask_zero=True)
    tokens = tensor(np.array([[1, 2, 3, 0, 0], [4, 5, 0, 0, 0]]), "int32")
    layer = MultiHeadAttention(4)
    hidden = embed(tokens)
    implicit = layer(hidden)
    explicit = layer(hidden, key_mask=tensor(np.array([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], bool)))
    np.testing.assert_allclose(numpy(implicit), numpy(explicit), atol=1e-6)
    from keras.src.backend import get_keras_mask

    np.testing.assert_array_equal(numpy(get_keras_mask(implicit)), numpy(get_keras_mask(hidden)))


def test_padded_queries_do_not_change_real_positions() -> None:
    layer = build(4, (16,))
    x = RNG.normal(size=(1, 6, 16)).astype("float32")
    padded = layer(tensor(x), key_mask=padding_mask([4], 6))
    np.testing.assert_allclose(numpy(padded)[:, :4], numpy(layer(tensor(x[:, :4]))), atol=1e-6)


# --- Keras' own layer ------------------------------------------------------------------------------------


@pytest.mark.parametrize("use_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize(
    "value_dim",
    [
        None,
        pytest.param(
            5,
            marks=pytest.mark.skipif(
                BACKEND == "jax",
                reason="the peer cannot run it: keras.layers.MultiHeadAttention on JAX hands value_dim != key_dim to "
                "jax.nn.dot_product_attention, which refuses it, and its fallback fails to reshape",
            ),
        ),
    ],
    ids=["same-dims", "value-dim"],
)
def test_from_keras_matches_keras_multi_head_attention(value_dim: int | None, use_bias: bool) -> None:
    theirs = keras.layers.MultiHeadAttention(num_heads=4, key_dim=6, value_dim=value_dim, use_bias=use_bias)
    query = RNG.normal(size=(2, 5, 16)).astype("float32")
    key = RNG.normal(size=(2, 7, 12)).astype("float32")
    value = RNG.normal(size=(2, 7, 10)).astype("float32")
    mask = RNG.random((2, 5, 7)) > 0.3
    mask[..., 0] = True  # Keras' layer averages V on fully masked rows; keep every row alive
    theirs(tensor(query), tensor(value), key=tensor(key))
    randomize(theirs)
    expected, expected_weights = theirs(
        tensor(query), tensor(value), key=tensor(key), attention_mask=tensor(mask), return_attention_scores=True
    )
    ours = MultiHeadAttention.from_keras(theirs)
    out, weights = ours(tensor(query), tensor(key), tensor(value), mask=tensor(mask), return_weights=True)
    np.testing.assert_allclose(numpy(out), numpy(expected), atol=1e-5)
    np.testing.assert_allclose(numpy(weights), numpy(expected_weights), atol=1e-6)


def test_from_keras_refuses_what_it_cannot_copy() -> None:
    with pytest.raises(TypeError, match="received Dense"):
        MultiHeadAttention.from_keras(keras.layers.Dense(2))
    with pytest.raises(ValueError, match="must be built"):
        MultiHeadAttention.from_keras(keras.layers.MultiHeadAttention(2, 4))


# --- the Keras layer contract ----------------------------------------------------------------------------


def test_config_round_trip() -> None:
    layer = build(6, (24, 8, 8), num_kv_heads=3, head_dim=5, value_head_dim=7, dropout=0.1, use_bias=False, seed=3)
    config = layer.get_config()
    clone = MultiHeadAttention.from_config(config)
    assert clone.get_config() == config
    clone.build((None, None, 24), (None, None, 8), (None, None, 8))
    clone.set_weights(layer.get_weights())
    x, y = RNG.normal(size=(2, 3, 24)).astype("float32"), RNG.normal(size=(2, 4, 8)).astype("float32")
    np.testing.assert_array_equal(numpy(clone(tensor(x), tensor(y))), numpy(layer(tensor(x), tensor(y))))


def small_model() -> keras.Model:
    inputs = keras.Input((6, 8))
    hidden = MultiHeadAttention(2, dropout=0.1, seed=1)(inputs, causal=True)
    outputs = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(hidden))
    return keras.Model(inputs, outputs)


def test_keras_file_round_trip(tmp_path) -> None:
    model = small_model()
    x = RNG.normal(size=(4, 6, 8)).astype("float32")
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.layers[1], MultiHeadAttention)
    np.testing.assert_array_equal(numpy(loaded(tensor(x))), numpy(model(tensor(x))))


def test_small_model_trains_with_fit() -> None:
    keras.utils.set_random_seed(0)
    model = small_model()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x = RNG.normal(size=(128, 6, 8)).astype("float32")
    y = x[:, :, :2].mean(axis=(1, 2))[:, None]
    history = model.fit(x, y, epochs=8, batch_size=32, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]


def test_symbolic_inputs() -> None:
    query, memory = keras.Input((None, 16)), keras.Input((7, 12))
    out, weights = MultiHeadAttention(4, num_kv_heads=2)(query, memory, return_weights=True)
    assert tuple(out.shape) == (None, None, 16)
    assert tuple(weights.shape) == (None, 4, None, 7)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.function exists only on the TensorFlow backend")
def test_inside_tf_function() -> None:
    import tensorflow as tf

    layer = build(4, (16,))
    x = tensor(RNG.normal(size=(2, 5, 16)).astype("float32"))
    key_mask = tensor(np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool))
    traced = tf.function(lambda x, m: layer(x, key_mask=m, causal=True), reduce_retracing=True)
    np.testing.assert_allclose(numpy(traced(x, key_mask)), numpy(layer(x, key_mask=key_mask, causal=True)), atol=1e-6)


def test_mixed_float16_policy() -> None:
    full = build(4, (16,))
    mixed = MultiHeadAttention(4, dtype="mixed_float16")
    mixed.build((None, None, 16))
    mixed.set_weights(full.get_weights())
    assert mixed.q_proj.kernel.dtype == "float32"
    x = RNG.normal(size=(2, 5, 16)).astype("float32")
    out = mixed(tensor(x), causal=True)
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    np.testing.assert_allclose(numpy(out).astype(np.float32), numpy(full(tensor(x), causal=True)), atol=2e-2)


def test_dropout_only_in_training_and_eval_is_deterministic() -> None:
    layer = build(4, (16,), dropout=0.5, seed=0)
    x = tensor(RNG.normal(size=(2, 9, 16)).astype("float32"))
    np.testing.assert_array_equal(numpy(layer(x)), numpy(layer(x)))
    assert not np.allclose(numpy(layer(x, training=True)), numpy(layer(x)))


def test_weights_are_trainable_sublayers() -> None:
    layer = build(4, (16,))
    assert {w.path.split("/")[-2] for w in layer.trainable_weights} == {"q_proj", "k_proj", "v_proj", "out_proj"}
    assert len(layer.trainable_weights) == 8


# --- validation ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_heads": 0}, ValueError, r"`num_heads` must be a positive int, received 0"),
        ({"num_heads": 2.5}, TypeError, r"`num_heads` must be an int, received 2.5"),
        ({"num_heads": 3, "d_model": 10}, ValueError, r"divisible by `num_heads`.*d_model=10, num_heads=3"),
        ({"num_heads": 6, "num_kv_heads": 4}, ValueError, r"num_heads=6, num_kv_heads=4"),
        ({"num_heads": 2, "dropout": 1.0}, ValueError, r"`dropout` must be in \[0, 1\), received 1.0"),
        ({"num_heads": 2, "head_dim": -1}, ValueError, r"`head_dim` must be a positive int, received -1"),
        ({"num_heads": 2, "use_bias": 1}, TypeError, r"`use_bias` must be True or False"),
        ({"num_heads": 2, "seed": "1"}, TypeError, r"`seed` must be an int or None"),
    ],
)
def test_constructor_rejects(kwargs: dict, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        MultiHeadAttention(**kwargs)


def test_build_rejects_indivisible_width() -> None:
    with pytest.raises(ValueError, match=r"d_model=10, num_heads=4"):
        MultiHeadAttention(4)(tensor(np.zeros((1, 2, 10), "float32")))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda m, x: m(tensor(np.zeros((2, 5, 15), "float32"))), ValueError, r"`query` must have 16 features"),
        (
            lambda m, x: m(x, key_mask=tensor(np.ones((2, 4), bool))),
            ValueError,
            r"`key_mask` must have shape \(B, Lk\)=\(2, 5\), received key_mask.shape=\(2, 4\)",
        ),
        (lambda m, x: m(x, key_mask=tensor(np.ones((2, 5), "float32"))), DTypeError, r"`key_mask` must be boolean"),
        (
            lambda m, x: m(x, query_mask=tensor(np.ones((2, 4), bool))),
            ValueError,
            r"`query_mask` must have shape \(B, Lq\)=\(2, 5\), received query_mask.shape=\(2, 4\)",
        ),
        (lambda m, x: m(x, query_mask=tensor(np.ones((2, 5), "int32"))), DTypeError, r"`query_mask` must be boolean"),
        (lambda m, x: m(x, mask=tensor(np.ones((5, 5), "int32"))), DTypeError, r"received dtype int32"),
        (lambda m, x: m(x, mask=tensor(np.ones((5, 4), bool))), ValueError, r"mask.shape=\(1, 1, 5, 4\)"),
        (lambda m, x: m(x, mask=tensor(np.ones((5,), bool))), ValueError, r"`mask` must be 2-D"),
        (lambda m, x: m([[1.0]]), TypeError, r"`query` must be a tensor, received list"),
    ],
)
def test_call_rejects(call, error: type[Exception], message: str) -> None:
    layer = build(4, (16,))
    with pytest.raises(error, match=message):
        call(layer, tensor(np.zeros((2, 5, 16), "float32")))
