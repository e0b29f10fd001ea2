"""A sweep of bad arguments over every public Keras entry point (runs under every Keras backend)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import keras
import numpy as np
import pytest

import multihead.keras.functional as functional
from keras_helpers import BACKEND, numpy, tensor
from multihead import DTypeError
from multihead.io import load_weights, save_weights
from multihead.keras import (
    Decoder,
    DecoderCache,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    KVCache,
    MultiHeadAttention,
    PositionalEncoding,
    Transformer,
    attention,
    causal_mask,
    padding_mask,
    padding_mask_from_tokens,
)

BAD = (ValueError, TypeError)  # what the contract allows; DTypeError is both
RNG = np.random.default_rng(0)


class Case(NamedTuple):
    call: Callable[..., Any]
    match: str  # must name the argument
    error: type[Exception] | tuple[type[Exception], ...] = BAD


def refuse(case: Case, *args: Any) -> None:
    with pytest.raises(case.error, match=case.match):
        case.call(*args)


def outcome(call: Callable[[], Any]) -> tuple[Any, Exception | None]:
    """The result of ``call()``, or the ValueError/TypeError it raised (any other exception propagates)."""
    try:
        return call(), None
    except BAD as error:
        return None, error


@contextmanager
def layers_that_run() -> Iterator[list[str]]:
    """Record every Dense, Embedding and LayerNormalization that computes anything meanwhile."""
    ran: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        for cls in (keras.layers.Dense, keras.layers.Embedding, keras.layers.LayerNormalization):

            @functools.wraps(cls.call)
            def record(self: keras.layers.Layer, *args: Any, _original: Callable = cls.call, **kwargs: Any) -> Any:
                ran.append(self.name)
                return _original(self, *args, **kwargs)

            patch.setattr(cls, "call", record)
        yield ran


def floats(*shape: int, dtype: str = "float32") -> Any:
    return tensor(RNG.normal(size=shape).astype(dtype))


def ints(*shape: int, low: int = 4, high: int = 20, dtype: str = "int32") -> Any:
    return tensor(RNG.integers(low, high, size=shape).astype(dtype))


def bools(*shape: int) -> Any:
    return tensor(np.ones(shape, bool))


# --- attention(): the functional core ---------------------------------------------------------------------


def qkv(q=(2, 4, 5, 8), k=(2, 2, 7, 8), v=(2, 2, 7, 6), dtype: str = "float32") -> tuple[Any, ...]:
    return tuple(floats(*shape, dtype=dtype) for shape in (q, k, v))


def q_k_v(**dtypes: str) -> tuple[Any, ...]:
    return tuple(floats(*shape, dtype=dtypes.get(name, "float32")) for name, shape in zip("qkv", SHAPES, strict=True))


SHAPES = ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 6))

ATTENTION_CASES = {
    "q-none": Case(lambda: attention(None, *qkv()[1:]), r"`q` must be a tensor, received NoneType", TypeError),
    "k-string": Case(lambda: attention(qkv()[0], "k", qkv()[2]), r"`k` must be a tensor, received str", TypeError),
    "v-list": Case(lambda: attention(*qkv()[:2], [[0.0]]), r"`v` must be a tensor, received list", TypeError),
    "q-integer": Case(lambda: attention(tensor(np.ones((2, 4, 5, 8), "int32")), *qkv()[1:]), r"`q`", DTypeError),
    "k-float64": Case(lambda: attention(*q_k_v(k="float64")), r"share one dtype.*float64", DTypeError),
    "v-float16": Case(lambda: attention(*q_k_v(v="float16")), r"share one dtype.*float16", DTypeError),
    "q-numpy-float64": Case(
        lambda: attention(RNG.normal(size=(2, 4, 5, 8)), *qkv()[1:]), r"share one dtype.*float64", DTypeError
    ),
    "v-rank-3": Case(lambda: attention(*qkv(v=(2, 7, 6))), r"`v` must be 4-D .*v.shape=\(2, 7, 6\)", ValueError),
    "gqa-8-of-4": Case(lambda: attention(*qkv(k=(2, 8, 7, 8), v=(2, 8, 7, 6))), r"H=4.*Hkv=8", ValueError),
    "no-kv-heads": Case(lambda: attention(*qkv(k=(2, 0, 7, 8), v=(2, 0, 7, 6))), r"Hkv=0", ValueError),
    "mask-uint8": Case(lambda: attention(*qkv(), tensor(np.ones((5, 7), "uint8"))), r"`mask`.*uint8", DTypeError),
    "mask-list": Case(lambda: attention(*qkv(), [[True]]), r"`mask` must be a tensor", TypeError),
    "mask-heads-of-kv": Case(lambda: attention(*qkv(), bools(2, 2, 5, 7)), r"mask.shape=\(2, 2, 5, 7\)", ValueError),
    "mask-5d": Case(lambda: attention(*qkv(), bools(1, 2, 4, 5, 7)), r"mask.shape=\(1, 2, 4, 5, 7\)", ValueError),
    "dropout-nan": Case(lambda: attention(*qkv(), dropout=float("nan")), r"`dropout` must be in \[0, 1\)", ValueError),
    "dropout-none": Case(lambda: attention(*qkv(), dropout=None), r"`dropout` must be a float", TypeError),
    "scale-inf": Case(lambda: attention(*qkv(), scale=float("inf")), r"`scale` must be finite", ValueError),
    "scale-bool": Case(lambda: attention(*qkv(), scale=True), r"`scale` must be a float", TypeError),
    "causal-none": Case(lambda: attention(*qkv(), causal=None), r"`causal` must be True or False", TypeError),
    "return-weights-1": Case(lambda: attention(*qkv(), return_weights=1), r"`return_weights`", TypeError),
    "training-string": Case(lambda: attention(*qkv(), training="yes"), r"`training`", TypeError),
    "seed-string": Case(lambda: attention(*qkv(), seed="x"), r"`seed`", TypeError),
    "seed-string-with-dropout": Case(lambda: attention(*qkv(), dropout=0.5, training=True, seed="x"), r"`seed`"),
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_refuses_before_computing(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def computed(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("attention computed before its arguments were checked")

    monkeypatch.setattr(functional, "_explicit", computed)
    monkeypatch.setattr(functional, "_blocked", computed)
    monkeypatch.setattr(functional, "_fused", computed)
    if BACKEND == "torch":
        from multihead import sdpa

        monkeypatch.setattr(sdpa, "fused", computed)
    refuse(ATTENTION_CASES[case])


@pytest.mark.parametrize("return_weights", [False, True], ids=["default-path", "explicit"])
def test_attention_zero_head_dim_is_refused_or_consistent(return_weights: bool) -> None:
    """Dk = 0 makes the default scale 1/sqrt(0): refuse it clearly, or give one answer on every path."""
    q, k, v = qkv(q=(2, 4, 5, 0), k=(2, 2, 7, 0))
    result, error = outcome(lambda: attention(q, k, v, return_weights=return_weights))
    if error is not None:
        assert any(name in str(error) for name in ("Dk", "`q`", "`scale`")), error
    else:
        other = attention(q, k, v, return_weights=not return_weights)
        out, other_out = (result[0], other) if return_weights else (result, other[0])
        np.testing.assert_allclose(numpy(out), numpy(other_out), atol=1e-6)


@pytest.mark.parametrize("return_weights", [False, True], ids=["default-path", "explicit"])
def test_attention_zero_query_heads_is_refused_or_empty(return_weights: bool) -> None:
    """H = 0 is a multiple of any Hkv: either an empty (B, 0, Lq, Dv) result or a clear refusal, never a crash."""
    q, k, v = qkv(q=(2, 0, 5, 8))
    result, error = outcome(lambda: attention(q, k, v, return_weights=return_weights))
    if error is not None:
        assert "H=0" in str(error) or "`q`" in str(error), error
    else:
        assert tuple((result[0] if return_weights else result).shape) == (2, 0, 5, 6)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("return_weights", [False, True], ids=["default-path", "explicit"])
def test_attention_legal_empty_shapes(causal: bool, return_weights: bool) -> None:
    """Lk = 0 is legal (every row attends nothing: zeros), and so are Lq = 0 and B = 0."""
    result = attention(*qkv(k=(2, 2, 0, 8), v=(2, 2, 0, 6)), causal=causal, return_weights=return_weights)
    out, weights = result if return_weights else (result, None)
    np.testing.assert_array_equal(numpy(out), np.zeros((2, 4, 5, 6), "float32"))
    if weights is not None:
        assert tuple(weights.shape) == (2, 4, 5, 0)
    for shapes, expected in (
        ({"q": (2, 4, 0, 8)}, (2, 4, 0, 6)),
        ({"q": (0, 4, 5, 8), "k": (0, 2, 7, 8), "v": (0, 2, 7, 6)}, (0, 4, 5, 6)),
    ):
        result = attention(*qkv(**shapes), causal=causal, return_weights=return_weights)
        assert tuple((result[0] if return_weights else result).shape) == expected


# --- mask helpers -----------------------------------------------------------------------------------------

TOKENS = tensor(np.array([[5, 6, 0]], "int32"))

MASK_HELPER_CASES = {
    "causal-lq-bool": Case(lambda: causal_mask(True, 3), r"`lq` must be an int", TypeError),
    "causal-lk-none": Case(lambda: causal_mask(2, None), r"`lk` must be an int", TypeError),
    "padding-lengths-none": Case(lambda: padding_mask(None, 3), r"`lengths`"),
    "padding-lengths-string": Case(lambda: padding_mask("ab", 3), r"`lengths`"),
    "padding-lengths-ragged": Case(lambda: padding_mask([[1], [1, 2]], 3), r"`lengths`"),
    "padding-lengths-0d": Case(lambda: padding_mask(np.int32(2), 3), r"`lengths` must be 1-D", ValueError),
    "padding-tensor-lengths-too-long": Case(
        lambda: padding_mask(tensor(np.array([1, 4], "int32")), 3),
        r"`lengths` must lie in \[0, max_len=3\]",
        ValueError,
    ),
    "padding-tensor-lengths-negative": Case(
        lambda: padding_mask(tensor(np.array([-1], "int32")), 3), r"`lengths` must lie in", ValueError
    ),
    "padding-max-len-bool": Case(lambda: padding_mask([1], True), r"`max_len` must be an int", TypeError),
    "padding-max-len-negative": Case(lambda: padding_mask([0], -1), r"`max_len` must be a non-negative", ValueError),
    "tokens-none": Case(lambda: padding_mask_from_tokens(None, 0), r"`tokens` must be a tensor", TypeError),
    "tokens-3d": Case(lambda: padding_mask_from_tokens(TOKENS[None], 0), r"`tokens` must be 2-D", ValueError),
    "pad-id-none": Case(lambda: padding_mask_from_tokens(TOKENS, None), r"`pad_id` must be an int", TypeError),
    "pad-id-float": Case(lambda: padding_mask_from_tokens(TOKENS, 0.0), r"`pad_id` must be an int", TypeError),
}


@pytest.mark.parametrize("case", list(MASK_HELPER_CASES))
def test_mask_helpers_refuse(case: str) -> None:
    refuse(MASK_HELPER_CASES[case])


# --- MultiHeadAttention: constructor, call, KV cache ------------------------------------------------------

CONSTRUCTOR_CASES = {
    "num-heads-bool": Case(lambda: MultiHeadAttention(True), r"`num_heads` must be an int", TypeError),
    "num-heads-none": Case(lambda: MultiHeadAttention(None), r"`num_heads` must be an int", TypeError),
    "num-heads-string": Case(lambda: MultiHeadAttention("4"), r"`num_heads` must be an int", TypeError),
    "d-model-float": Case(lambda: MultiHeadAttention(4, d_model=12.5), r"`d_model` must be an int", TypeError),
    "d-model-negative": Case(lambda: MultiHeadAttention(4, d_model=-16), r"`d_model` must be a positive", ValueError),
    "kv-heads-zero": Case(lambda: MultiHeadAttention(4, num_kv_heads=0), r"`num_kv_heads`.*received 0", ValueError),
    "kv-heads-more": Case(lambda: MultiHeadAttention(4, num_kv_heads=8), r"num_heads=4, num_kv_heads=8", ValueError),
    "head-dim-zero": Case(lambda: MultiHeadAttention(4, head_dim=0), r"`head_dim` must be a positive int", ValueError),
    "value-head-dim-string": Case(lambda: MultiHeadAttention(4, value_head_dim="2"), r"`value_head_dim`", TypeError),
    "dropout-nan": Case(lambda: MultiHeadAttention(4, dropout=float("nan")), r"`dropout`", ValueError),
    "dropout-bool": Case(lambda: MultiHeadAttention(4, dropout=True), r"`dropout` must be a float", TypeError),
    "use-bias-none": Case(lambda: MultiHeadAttention(4, use_bias=None), r"`use_bias` must be True or False", TypeError),
    "seed-float": Case(lambda: MultiHeadAttention(4, seed=1.5), r"`seed` must be an int or None", TypeError),
    "from-keras-none": Case(lambda: MultiHeadAttention.from_keras(None), r"`layer` must be a keras", TypeError),
    "build-unknown-width": Case(lambda: MultiHeadAttention(4).build((None, 5, None)), r"`query` must be 3-D"),
}


@pytest.mark.parametrize("case", list(CONSTRUCTOR_CASES))
def test_layer_constructor_refuses(case: str) -> None:
    refuse(CONSTRUCTOR_CASES[case])


def mha() -> MultiHeadAttention:
    """A built cross-attention layer: query width 16, key and value width 6, 4 query heads over 2 key/value heads."""
    keras.utils.set_random_seed(0)
    layer = MultiHeadAttention(4, num_kv_heads=2)
    layer.build((None, None, 16), (None, None, 6), (None, None, 6))
    return layer


X, MEMORY = floats(2, 5, 16), floats(2, 7, 6)


def cross(m: MultiHeadAttention, **kwargs: Any) -> Any:
    return m(X, MEMORY, **kwargs)


CALL_CASES = {
    "query-none": Case(lambda m: m(None), r"`query`", TypeError),
    "key-list": Case(lambda m: m(X, [[0.0] * 6]), r"`key` must be a tensor, received list", TypeError),
    "value-string": Case(lambda m: m(X, MEMORY, "v"), r"`value` must be a tensor, received str", TypeError),
    "query-integer": Case(lambda m: m(tensor(np.ones((2, 5, 16), "int32")), MEMORY), r"`query`", TypeError),
    "query-4d": Case(lambda m: m(X[None], MEMORY), r"`query` must be 3-D", ValueError),
    "key-2d": Case(lambda m: m(X, MEMORY[0]), r"`key` must be 3-D .*key.shape=\(7, 6\)", ValueError),
    "key-width-of-query": Case(lambda m: m(X, X), r"`key` must have 6 features", ValueError),
    "value-batch": Case(lambda m: m(X, MEMORY, MEMORY[:1]), r"batch size B.*value.shape=\(1, 7, 6\)", ValueError),
    "value-length": Case(lambda m: m(X, MEMORY, MEMORY[:, :3]), r"same length Lk", ValueError),
    "mask-list": Case(lambda m: cross(m, mask=[[True] * 7] * 5), r"`mask` must be a tensor", TypeError),
    "mask-uint8": Case(lambda m: cross(m, mask=tensor(np.ones((5, 7), "uint8"))), r"`mask`.*uint8", DTypeError),
    "mask-0d": Case(lambda m: cross(m, mask=tensor(np.array(True))), r"`mask` must be 2-D", ValueError),
    "mask-5d": Case(lambda m: cross(m, mask=bools(1, 1, 1, 5, 7)), r"`mask` must be 2-D", ValueError),
    "mask-3d-batch": Case(lambda m: cross(m, mask=bools(3, 5, 7)), r"mask.shape=\(3, 1, 5, 7\)", ValueError),
    "mask-4d-kv-heads": Case(lambda m: cross(m, mask=bools(2, 2, 5, 7)), r"mask.shape=\(2, 2, 5, 7\)", ValueError),
    "mask-transposed": Case(lambda m: cross(m, mask=bools(7, 5)), r"mask.shape=\(1, 1, 7, 5\)", ValueError),
    "key-mask-list": Case(lambda m: cross(m, key_mask=[[True] * 7] * 2), r"`key_mask` must be a tensor", TypeError),
    "key-mask-int": Case(lambda m: cross(m, key_mask=tensor(np.ones((2, 7), "int32"))), r"`key_mask`", DTypeError),
    "key-mask-1d": Case(lambda m: cross(m, key_mask=bools(7)), r"key_mask.shape=\(7,\)", ValueError),
    "key-mask-3d": Case(lambda m: cross(m, key_mask=bools(2, 1, 7)), r"key_mask.shape=\(2, 1, 7\)", ValueError),
    "key-mask-batch": Case(lambda m: cross(m, key_mask=bools(1, 7)), r"\(B, Lk\)=\(2, 7\)", ValueError),
    "causal-int": Case(lambda m: cross(m, causal=1), r"`causal` must be True or False", TypeError),
    "causal-none": Case(lambda m: cross(m, causal=None), r"`causal` must be True or False", TypeError),
    "return-weights-string": Case(lambda m: cross(m, return_weights="yes"), r"`return_weights`", TypeError),
    "training-string": Case(lambda m: cross(m, training="yes"), r"`training`", TypeError),
    "cache-dict": Case(lambda m: m(X, MEMORY, cache={}), r"`cache` must be a KVCache", TypeError),
    "blocked-with-weights": Case(
        lambda m: setattr(m, "implementation", "blocked") or cross(m, return_weights=True),
        r"`implementation`='blocked' cannot return the weights",
        ValueError,
    ),
}


@pytest.mark.parametrize("case", list(CALL_CASES))
def test_layer_call_refuses_before_projecting(case: str) -> None:
    m = mha()
    with layers_that_run() as ran:
        refuse(CALL_CASES[case], m)
    assert ran == [], f"sublayers ran before the refusal: {ran}"


def test_layer_mixed_float_inputs_are_refused_or_autocast() -> None:
    """A float64 key next to a float32 query: refuse it naming the key, or cast it as Keras layers do."""
    m = mha()
    key64 = floats(2, 7, 6, dtype="float64")
    result, error = outcome(lambda: m(X, key64))
    if error is not None:
        assert "`key`" in str(error), error
    else:
        expected = m(X, tensor(numpy(key64).astype("float32")))
        np.testing.assert_allclose(numpy(result), numpy(expected), atol=1e-5)


def test_layer_legal_empty_shapes() -> None:
    """Lq = 0 gives an empty output; Lk = 0 attends nothing, so each row is out_proj applied to zeros."""
    m = mha()
    assert tuple(m(X[:, :0], MEMORY).shape) == (2, 0, 16)
    out = m(X, MEMORY[:, :0], key_mask=bools(2, 0))
    np.testing.assert_allclose(numpy(out), np.broadcast_to(numpy(m.out_proj.bias), (2, 5, 16)), atol=1e-6)


def self_mha() -> MultiHeadAttention:
    keras.utils.set_random_seed(0)
    layer = MultiHeadAttention(4, num_kv_heads=2)
    layer.build((None, None, 16))
    return layer


def filled_cache(capacity: int | None = None) -> KVCache:
    cache = KVCache(capacity)
    self_mha()(floats(2, 3, 16), cache=cache, causal=True)
    return cache


CACHE_CASES = {  # (capacity of the filled cache, the bad call)
    "capacity-exceeded": (4, Case(lambda m, c: m(floats(2, 2, 16), cache=c, causal=True), r"capacity 4", ValueError)),
    "batch-changed": (None, Case(lambda m, c: m(floats(3, 1, 16), cache=c, causal=True), r"cache", ValueError)),
    "key-mask-over-new-tokens-only": (
        None,
        Case(lambda m, c: m(floats(2, 1, 16), cache=c, key_mask=bools(2, 1)), r"\(B, Lk\)=\(2, 4\)", ValueError),
    ),
}


@pytest.mark.parametrize("case", list(CACHE_CASES))
def test_cache_misuse_is_refused_before_projecting(case: str) -> None:
    capacity, bad = CACHE_CASES[case]
    m, cache = self_mha(), filled_cache(capacity)
    with layers_that_run() as ran:
        refuse(bad, m, cache)
    assert ran == [], f"sublayers ran before the refusal: {ran}"


def test_cache_capacity_of_the_wrong_kind() -> None:
    with pytest.raises(TypeError, match=r"`capacity` must be an int"):
        KVCache("8")


def test_refused_cache_step_leaves_the_cache_as_it_was() -> None:
    cache = filled_cache(4)
    keys, length = numpy(cache.keys).copy(), cache.length
    with pytest.raises(ValueError, match="capacity"):
        self_mha()(floats(2, 2, 16), cache=cache, causal=True)
    assert cache.length == length
    np.testing.assert_array_equal(numpy(cache.keys), keys)


# --- Transformer parts ------------------------------------------------------------------------------------

E = 16
H, M = floats(2, 5, E), floats(2, 6, E)


def part(name: str) -> keras.layers.Layer:
    """A part already called once on good inputs, so that every sublayer is built."""
    keras.utils.set_random_seed(0)
    layer, call = {
        "positional": (PositionalEncoding(E, 10), lambda p: p(H)),
        "feed_forward": (FeedForward(E, 32), lambda p: p(H)),
        "encoder_layer": (EncoderLayer(E, 2, 32, 0.0), lambda p: p(H)),
        "decoder_layer": (DecoderLayer(E, 2, 32, 0.0), lambda p: p(H, M)),
        "empty_encoder": (Encoder(0, E, 2, 32, 0.0), lambda p: p(H)),
        "decoder": (Decoder(1, E, 2, 32, 0.0), lambda p: p(H, M)),
    }[name]
    call(layer)
    return layer


PARTS_CALL_CASES = {
    "positional-x-list": ("positional", Case(lambda p: p([[0.0] * E]), r"`x`")),
    "positional-x-2d": ("positional", Case(lambda p: p(H[0]), r"`x` must be 3-D")),
    "positional-x-width": ("positional", Case(lambda p: p(H[..., :8]), r"`x`.*16")),
    "positional-x-integer": ("positional", Case(lambda p: p(tensor(np.ones((2, 5, E), "int32"))), r"`x`", TypeError)),
    "positional-offset-negative": ("positional", Case(lambda p: p(H, offset=-3), r"`offset`", ValueError)),
    "feed-forward-x-width": ("feed_forward", Case(lambda p: p(H[..., :8]), r"`x`.*16")),
    "feed-forward-x-list": ("feed_forward", Case(lambda p: p([[0.0] * E]), r"`x`")),
    "encoder-layer-x-width": ("encoder_layer", Case(lambda p: p(H[..., :8]), r"`x`.*16", ValueError)),
    "decoder-layer-memory-none": ("decoder_layer", Case(lambda p: p(H, None), r"`memory`", TypeError)),
    "decoder-layer-memory-list": ("decoder_layer", Case(lambda p: p(H, [[0.0] * E]), r"`memory`")),
    "decoder-layer-memory-width": ("decoder_layer", Case(lambda p: p(H, M[..., :8]), r"`memory`.*16", ValueError)),
    "empty-encoder-x-width": ("empty_encoder", Case(lambda p: p(H[..., :8]), r"`x`.*16")),
    "decoder-cache-kv-cache": ("decoder", Case(lambda p: p(H, M, cache=KVCache()), r"`cache`", TypeError)),
}


@pytest.mark.parametrize("case", list(PARTS_CALL_CASES))
def test_parts_call_refuses_before_computing(case: str) -> None:
    name, bad = PARTS_CALL_CASES[case]
    layer = part(name)
    with layers_that_run() as ran:
        refuse(bad, layer)
    assert ran == [], f"sublayers ran before the refusal: {ran}"


def test_a_refused_first_call_does_not_break_the_layer() -> None:
    """An encoder layer of width 16 first called with width 8 must refuse it and still work at width 16."""
    layer = EncoderLayer(E, 2, 32, 0.0)
    with pytest.raises(ValueError, match=r"`x`.*16"):
        layer(H[..., :8])
    assert tuple(layer(H).shape) == (2, 5, E)


# --- Transformer ------------------------------------------------------------------------------------------

SRC_VOCAB, TGT_VOCAB = 20, 23


@pytest.fixture(scope="module")
def model() -> Transformer:
    keras.utils.set_random_seed(0)
    options = dict(d_model=E, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32, dropout=0.0)
    built = Transformer(SRC_VOCAB, TGT_VOCAB, max_len=30, **options)
    built.build()
    return built


SRC, TGT, MEM = ints(2, 6), ints(2, 5, high=TGT_VOCAB), floats(2, 6, E)


def gen(model: Transformer, src: Any = SRC, **overrides: Any) -> np.ndarray:
    return model.generate(src, **{"max_len": 3, "bos_id": 1, "eos_id": 2, **overrides})


TRANSFORMER_CASES = {
    "forward-src-list": Case(lambda t: t([[4, 5]], TGT), r"`src`"),
    "forward-src-out-of-vocab": Case(
        lambda t: t(ints(2, 6, low=20, high=30), TGT), r"`src` must hold ids in \[0, 20\)"
    ),
    "forward-src-negative": Case(lambda t: t(ints(2, 6, low=-5, high=-1), TGT), r"`src` must hold ids in \[0, 20\)"),
    "forward-tgt-out-of-vocab": Case(
        lambda t: t(SRC, ints(2, 5, low=23, high=40)), r"`tgt` must hold ids in \[0, 23\)"
    ),
    "forward-tgt-float": Case(lambda t: t(SRC, floats(2, 5)), r"`tgt` must hold integer token ids", DTypeError),
    "forward-batch-mismatch": Case(lambda t: t(SRC, TGT[:1]), r"`src`.*`tgt`|`tgt`.*`src`", ValueError),
    "forward-src-key-mask-shape": Case(lambda t: t(SRC, TGT, src_key_mask=bools(2, 5)), r"`src_key_mask`"),
    "forward-tgt-key-mask-shape": Case(lambda t: t(SRC, TGT, tgt_key_mask=bools(2, 6)), r"`tgt_key_mask`"),
    "encode-src-1d": Case(lambda t: t.encode(SRC[0]), r"`src` must be 2-D", ValueError),
    "decode-memory-none": Case(lambda t: t.decode(TGT, None), r"`memory`", TypeError),
    "decode-memory-list": Case(lambda t: t.decode(TGT, [[0.0] * E]), r"`memory`"),
    "decode-memory-width": Case(lambda t: t.decode(TGT, M[..., :8]), r"`memory`.*16", ValueError),
    "decode-memory-integer": Case(lambda t: t.decode(TGT, tensor(np.ones((2, 6, E), "int32"))), r"`memory`"),
    "decode-cache-kv-cache": Case(lambda t: t.decode(TGT, MEM, cache=KVCache()), r"`cache` must be a DecoderCache"),
    "decode-cache-too-few-layers": Case(lambda t: t.decode(TGT, MEM, cache=DecoderCache(0, KVCache)), r"`cache`"),
    "generate-max-len-zero": Case(lambda t: gen(t, max_len=0), r"`max_len` must be a positive int", ValueError),
    "generate-beam-zero": Case(lambda t: gen(t, beam_size=0), r"`beam_size` must be a positive int", ValueError),
    "generate-eos-out-of-vocab": Case(lambda t: gen(t, eos_id=99), r"eos_id.*tgt_vocab=23", ValueError),
    "generate-use-cache-string": Case(lambda t: gen(t, use_cache="no"), r"`use_cache` must be True or False"),
    "generate-length-penalty-string": Case(lambda t: gen(t, beam_size=2, length_penalty="x"), r"`length_penalty`"),
    "generate-src-out-of-vocab": Case(lambda t: gen(t, ints(2, 6, low=20, high=30)), r"`src` must hold ids"),
    "generate-src-float": Case(lambda t: gen(t, floats(2, 6)), r"`src` must hold integer token ids", DTypeError),
    "generate-src-key-mask": Case(lambda t: gen(t, src_key_mask=bools(2, 3)), r"`src_key_mask`", ValueError),
    "from-config-none": Case(lambda t: Transformer.from_config(None), r"`config`", TypeError),
}


@pytest.mark.parametrize("case", list(TRANSFORMER_CASES))
def test_transformer_refuses_before_computing(case: str, model: Transformer) -> None:
    with layers_that_run() as ran:
        refuse(TRANSFORMER_CASES[case], model)
    assert ran == [], f"sublayers ran before the refusal: {ran}"


# --- weights files into Keras layers ----------------------------------------------------------------------


@pytest.fixture
def weights_file(tmp_path: Path) -> Path:
    path = tmp_path / "w.safetensors"
    save_weights(mha(), path)
    return path


def dtype_swapped(path: Path, old: str, new: str) -> None:
    """Rewrite the first ``"dtype": old`` of the safetensors header as ``new`` (same header length)."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + size].replace(f'"{old}"'.encode(), f'"{new}"'.encode(), 1)
    path.write_bytes(data[:8] + header + data[8 + size :])


@pytest.mark.parametrize("damage", ["truncated", "integer-dtype", "directory"])
def test_built_layer_refuses_damaged_weights_unchanged(weights_file: Path, damage: str) -> None:
    if damage == "truncated":
        weights_file.write_bytes(weights_file.read_bytes()[:-7])
    elif damage == "integer-dtype":
        dtype_swapped(weights_file, "F32", "I32")  # same size: only the header says what the bytes are
    else:
        weights_file.unlink()
        weights_file.mkdir()
    layer = mha()
    before = [numpy(w).copy() for w in layer.weights]
    with pytest.raises((ValueError, FileNotFoundError), match=r"w.safetensors"):
        load_weights(layer, weights_file)
    for weight, old in zip(layer.weights, before, strict=True):
        np.testing.assert_array_equal(numpy(weight), old)


@pytest.mark.parametrize(
    "options", [{"num_heads": 3}, {"num_heads": 4, "num_kv_heads": 1}], ids=["three-heads", "one-kv-head"]
)
def test_unbuilt_layer_stays_unbuilt_after_a_refused_load(weights_file: Path, options: dict) -> None:
    layer = MultiHeadAttention(**options)
    with pytest.raises(ValueError, match=r"has shape .* the model expects"):
        load_weights(layer, weights_file)
    assert not layer.built
