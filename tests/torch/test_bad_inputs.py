"""Bad arguments to every public entry point of the PyTorch front end: each raises ValueError or TypeError naming
the argument, what was expected and what was received, before any computation.

The oracle's bad inputs are in tests/test_reference.py, the config's in tests/test_config.py, the shared cache's and
decoding's in tests/test_cache.py and tests/test_decoding.py, the application's in tests/app/test_inputs.py.

Notation: B batch, H heads, Hkv key/value heads, Lq/Lk lengths, Dk/Dv head dims, E d_model; packed: N queries and
M keys in all, n and m of one sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from torch import nn

import multihead.torch.functional as functional
from conftest import PATHS, path_for
from multihead import DTypeError
from multihead.torch import (
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
from multihead.torch.functional import packed_attention

BAD = (ValueError, TypeError)  # what the contract allows; DTypeError is both


class Case(NamedTuple):
    call: Callable[..., Any]
    match: str  # must name the argument
    error: type[Exception] | tuple[type[Exception], ...] = BAD


@contextmanager
def nothing_runs(module: nn.Module) -> Iterator[list[str]]:
    """Record every submodule of ``module`` that runs forward."""
    ran: list[str] = []
    handles = [
        sub.register_forward_hook(lambda *_, name=name: ran.append(name))
        for name, sub in module.named_modules()
        if name
    ]
    try:
        yield ran
    finally:
        for handle in handles:
            handle.remove()


def refuse(case: Case, *args: Any) -> None:
    with pytest.raises(case.error, match=case.match):
        case.call(*args)


# --- attention(): the functional core ---------------------------------------------------------------------


def qkv(q=(2, 4, 5, 8), k=(2, 2, 7, 8), v=(2, 2, 7, 6), dtype=torch.float32) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(shape, dtype=dtype) for shape in (q, k, v))


def q_k_v(**dtypes: torch.dtype) -> tuple[torch.Tensor, ...]:
    q, k, v = qkv()
    return q.to(dtypes.get("q", q.dtype)), k.to(dtypes.get("k", k.dtype)), v.to(dtypes.get("v", v.dtype))


ATTENTION_CASES = {
    "q-none": Case(lambda: attention(None, *qkv()[1:]), r"`q` must be a torch.Tensor, received NoneType", TypeError),
    "k-string": Case(
        lambda: attention(qkv()[0], "k", qkv()[2]), r"`k` must be a torch.Tensor, received str", TypeError
    ),
    "v-numpy": Case(lambda: attention(*qkv()[:2], np.zeros((2, 2, 7, 6))), r"`v` must be a torch.Tensor", TypeError),
    "q-complex": Case(lambda: attention(*q_k_v(q=torch.complex64)), r"`q` must be a floating tensor", DTypeError),
    "v-integer": Case(lambda: attention(*q_k_v(v=torch.int32)), r"`v` must be a floating tensor", DTypeError),
    "k-float64": Case(lambda: attention(*q_k_v(k=torch.float64)), r"share one dtype.*float64", DTypeError),
    "v-float16": Case(lambda: attention(*q_k_v(v=torch.float16)), r"share one dtype.*float16", DTypeError),
    "q-list": Case(lambda: attention([[1.0]], *qkv()[1:]), r"`q` must be a torch.Tensor, received list", TypeError),
    "q-int64": Case(
        lambda: attention(*q_k_v(q=torch.long)),
        r"`q` must be a floating tensor, received dtype torch.int64",
        DTypeError,
    ),
    "q-float64": Case(
        lambda: attention(*q_k_v(q=torch.float64)),
        r"share one dtype, received torch.float64, torch.float32, torch.float32",
        DTypeError,
    ),
    "q-rank-0": Case(lambda: attention(torch.tensor(1.0), *qkv()[1:]), r"`q` must be 4-D .*q.shape=\(\)"),
    "q-rank-3": Case(
        lambda: attention(*qkv(q=(4, 5, 8))), r"`q` must be 4-D \(B, H, Lq, Dk\), received q.shape=\(4, 5, 8\)"
    ),
    "k-rank-5": Case(lambda: attention(*qkv(k=(2, 4, 7, 8, 1))), r"`k` must be 4-D .*k.shape=\(2, 4, 7, 8, 1\)"),
    "v-rank-3": Case(lambda: attention(*qkv(v=(2, 7, 6))), r"`v` must be 4-D .*v.shape=\(2, 7, 6\)"),
    "batch-v": Case(lambda: attention(*qkv(v=(1, 2, 7, 6))), r"batch size B.*v.shape=\(1, 2, 7, 6\)"),
    "batch-k": Case(
        lambda: attention(*qkv(k=(3, 2, 7, 8))),
        r"batch size B, received q.shape=\(2, 4, 5, 8\), k.shape=\(3, 2, 7, 8\)",
    ),
    "kv-heads-differ": Case(
        lambda: attention(*qkv(k=(2, 2, 7, 8), v=(2, 4, 7, 6))),
        r"same number of heads Hkv, received k.shape=\(2, 2, 7, 8\), v.shape=\(2, 4, 7, 6\)",
    ),
    "gqa-3-of-4": Case(
        lambda: attention(*qkv(k=(2, 3, 7, 8), v=(2, 3, 7, 6))), r"multiple of the key/value heads Hkv.*H=4.*Hkv=3"
    ),
    "gqa-8-of-4": Case(lambda: attention(*qkv(k=(2, 8, 7, 8), v=(2, 8, 7, 6))), r"H=4.*Hkv=8"),
    "no-kv-heads": Case(lambda: attention(*qkv(k=(2, 0, 7, 8), v=(2, 0, 7, 6))), r"Hkv=0"),
    "length-v": Case(
        lambda: attention(*qkv(v=(2, 2, 6, 6))),
        r"same length Lk, received k.shape=\(2, 2, 7, 8\), v.shape=\(2, 2, 6, 6\)",
    ),
    "head-dim-k": Case(
        lambda: attention(*qkv(k=(2, 2, 7, 9))),
        r"same head dim Dk, received q.shape=\(2, 4, 5, 8\), k.shape=\(2, 2, 7, 9\)",
    ),
    "mask-uint8": Case(lambda: attention(*qkv(), torch.ones(5, 7, dtype=torch.uint8)), r"`mask`.*uint8", DTypeError),
    "mask-int64": Case(
        lambda: attention(*qkv(), torch.ones(5, 7, dtype=torch.long)),
        r"`mask` must be boolean \(True = attend\) or floating .*received dtype torch.int64",
        DTypeError,
    ),
    "mask-complex": Case(lambda: attention(*qkv(), torch.zeros(5, 7, dtype=torch.complex64)), r"`mask`", DTypeError),
    "mask-numpy": Case(lambda: attention(*qkv(), np.ones((5, 7), bool)), r"`mask` must be a torch.Tensor", TypeError),
    "mask-list": Case(
        lambda: attention(*qkv(), [[True]]), r"`mask` must be a torch.Tensor or None, received list", TypeError
    ),
    "mask-wrong-lk": Case(
        lambda: attention(*qkv(), torch.ones(5, 6, dtype=torch.bool)),
        r"`mask` must be broadcastable to \(B, H, Lq, Lk\)=\(2, 4, 5, 7\), received mask.shape=\(5, 6\)",
    ),
    "mask-5d": Case(
        lambda: attention(*qkv(), torch.ones(1, 2, 4, 5, 7, dtype=torch.bool)), r"mask.shape=\(1, 2, 4, 5, 7\)"
    ),
    "mask-batch-grows": Case(
        lambda: attention(*qkv(), torch.ones(3, 4, 5, 7, dtype=torch.bool)), r"mask.shape=\(3, 4, 5, 7\)"
    ),
    "mask-heads-of-kv": Case(
        lambda: attention(*qkv(), torch.ones(2, 2, 5, 7, dtype=torch.bool)),
        r"`mask` must be broadcastable to \(B, H, Lq, Lk\)=\(2, 4, 5, 7\), received mask.shape=\(2, 2, 5, 7\)",
    ),
    "mask-other-device": Case(
        lambda: attention(*qkv(), torch.ones(5, 7, dtype=torch.bool, device="meta")), r"`mask` must be on"
    ),
    "k-other-device": Case(lambda: attention(qkv()[0], qkv()[1].to("meta"), qkv()[2]), r"one device.*meta"),
    "dropout-bool": Case(lambda: attention(*qkv(), dropout=True), r"`dropout` must be a float", TypeError),
    "dropout-none": Case(lambda: attention(*qkv(), dropout=None), r"`dropout` must be a float", TypeError),
    "dropout-string": Case(lambda: attention(*qkv(), dropout="0.1"), r"`dropout` must be a float", TypeError),
    "dropout-nan": Case(lambda: attention(*qkv(), dropout=float("nan")), r"`dropout` must be in \[0, 1\)", ValueError),
    "dropout-one": Case(
        lambda: attention(*qkv(), dropout=1.0), r"`dropout` must be in \[0, 1\), received 1.0", ValueError
    ),
    "dropout-negative": Case(lambda: attention(*qkv(), dropout=-0.1), r"`dropout`.*received -0.1", ValueError),
    "scale-bool": Case(lambda: attention(*qkv(), scale=True), r"`scale` must be a float", TypeError),
    "scale-string": Case(
        lambda: attention(*qkv(), scale="1"), r"`scale` must be a float or None, received '1'", TypeError
    ),
    "scale-inf": Case(lambda: attention(*qkv(), scale=float("inf")), r"`scale` must be finite", ValueError),
    "scale-nan": Case(
        lambda: attention(*qkv(), scale=float("nan")), r"`scale` must be finite, received nan", ValueError
    ),
    "scale-tensor": Case(lambda: attention(*qkv(), scale=torch.tensor(0.5)), r"`scale`", TypeError),
    "causal-none": Case(lambda: attention(*qkv(), causal=None), r"`causal` must be True or False", TypeError),
    "causal-tensor": Case(lambda: attention(*qkv(), causal=torch.tensor(True)), r"`causal`", TypeError),
    "causal-int": Case(lambda: attention(*qkv(), causal=1), r"`causal` must be True or False, received 1", TypeError),
    "return-weights-1": Case(lambda: attention(*qkv(), return_weights=1), r"`return_weights`", TypeError),
    "return-weights-string": Case(
        lambda: attention(*qkv(), return_weights="yes"), r"`return_weights` must be True or False", TypeError
    ),
    "implementation-unknown": Case(
        lambda: attention(*qkv(), implementation="flash"),
        r"`implementation` must be one of \('auto', 'fused', 'explicit'\), received 'flash'",
        ValueError,
    ),
    "implementation-capitalised": Case(
        lambda: attention(*qkv(), implementation="Fused"), r"received 'Fused'", ValueError
    ),
    "implementation-none": Case(lambda: attention(*qkv(), implementation=None), r"`implementation`.*None", ValueError),
    "implementation-fused-with-weights": Case(
        lambda: attention(*qkv(), return_weights=True, implementation="fused"),
        r"`implementation`='fused' cannot return the weights",
        ValueError,
    ),
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_refuses_before_computing(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def computed(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("attention computed before its arguments were checked")

    monkeypatch.setattr(functional, "_fused", computed)
    monkeypatch.setattr(functional, "_explicit", computed)
    refuse(ATTENTION_CASES[case])


def test_dtype_errors_are_type_and_value_errors() -> None:
    with pytest.raises(DTypeError) as caught:
        attention(*qkv(), torch.ones(5, 7, dtype=torch.int32))
    assert isinstance(caught.value, TypeError)
    assert isinstance(caught.value, ValueError)


def outcome(call: Callable[[], Any]) -> tuple[Any, Exception | None]:
    """The result of ``call()``, or the ValueError/TypeError it raised (any other exception propagates)."""
    try:
        return call(), None
    except BAD as error:
        return None, error


@PATHS
def test_attention_zero_head_dim_is_refused_or_consistent(return_weights: bool) -> None:
    """Dk = 0 makes the default scale 1/sqrt(0): refuse it clearly, or give one answer on every path."""
    q, k, v = qkv(q=(2, 4, 5, 0), k=(2, 2, 7, 0))
    result, error = outcome(
        lambda: attention(q, k, v, return_weights=return_weights, implementation=path_for(return_weights))
    )
    if error is not None:
        assert any(name in str(error) for name in ("Dk", "`q`", "`scale`")), error
    else:
        other = attention(q, k, v, return_weights=not return_weights, implementation=path_for(not return_weights))
        out, other_out = (result[0], other) if return_weights else (result, other[0])
        torch.testing.assert_close(out, other_out)


@PATHS
def test_attention_zero_query_heads_is_refused_or_empty(return_weights: bool) -> None:
    """H = 0 is a multiple of any Hkv: either an empty (B, 0, Lq, Dv) result or a clear refusal, never a crash."""
    q, k, v = qkv(q=(2, 0, 5, 8))
    result, error = outcome(
        lambda: attention(q, k, v, return_weights=return_weights, implementation=path_for(return_weights))
    )
    if error is not None:
        assert "H=0" in str(error) or "`q`" in str(error), error
    else:
        assert (result[0] if return_weights else result).shape == (2, 0, 5, 6)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@PATHS
def test_attention_legal_empty_shapes(causal: bool, return_weights: bool) -> None:
    """Lk = 0 is legal (every row attends nothing: zeros), and so are Lq = 0 and B = 0."""
    q, k, v = qkv(k=(2, 2, 0, 8), v=(2, 2, 0, 6))
    implementation = path_for(return_weights)
    result = attention(q, k, v, causal=causal, return_weights=return_weights, implementation=implementation)
    out, weights = result if return_weights else (result, None)
    assert out.shape == (2, 4, 5, 6)
    assert torch.equal(out, torch.zeros_like(out))
    if weights is not None:
        assert weights.shape == (2, 4, 5, 0)
    for shapes, expected in (
        ({"q": (2, 4, 0, 8)}, (2, 4, 0, 6)),
        ({"q": (0, 4, 5, 8), "k": (0, 2, 7, 8), "v": (0, 2, 7, 6)}, (0, 4, 5, 6)),
    ):
        result = attention(*qkv(**shapes), causal=causal, return_weights=return_weights, implementation=implementation)
        assert (result[0] if return_weights else result).shape == expected


# --- packed_attention(): sequences packed without padding ---------------------------------------------------


def packed(n: int = 7, m: int = 7, heads: int = 4, kv_heads: int = 2, dk: int = 8, dv: int = 5) -> tuple:
    """``q (N, H, Dk)``, ``k (M, Hkv, Dk)``, ``v (M, Hkv, Dv)``: with the default lengths below, two sequences."""
    return torch.randn(n, heads, dk), torch.randn(m, kv_heads, dk), torch.randn(m, kv_heads, dv)


LENGTHS = ([3, 4], [2, 5])  # query_lengths, key_lengths: sequence 0 has n=3, m=2; sequence 1 n=4, m=5


def pack(*tensors: torch.Tensor, lengths: tuple = LENGTHS, **kwargs: Any) -> torch.Tensor:
    return packed_attention(*(tensors or packed()), *lengths, **kwargs)


PACKED_CASES = {
    "q-none": Case(lambda: pack(None, *packed()[1:]), r"`q` must be a torch.Tensor, received NoneType", TypeError),
    "v-integer": Case(lambda: pack(*packed()[:2], packed()[2].long()), r"`v` must be a floating tensor", DTypeError),
    "k-float64": Case(lambda: pack(packed()[0], packed()[1].double(), packed()[2]), r"share one dtype", DTypeError),
    "q-padded-layout": Case(
        lambda: pack(torch.randn(2, 4, 4, 8), *packed()[1:]),
        r"`q` must be 3-D \(N, H, Dk\), received q.shape=\(2, 4, 4, 8\)",
    ),
    "v-2d": Case(
        lambda: pack(*packed()[:2], torch.randn(7, 5)), r"`v` must be 3-D \(M, Hkv, Dv\), received v.shape=\(7, 5\)"
    ),
    "gqa-3-of-4": Case(lambda: pack(*packed(kv_heads=3)), r"multiple of the key/value heads.*H=4.*Hkv=3"),
    "query-lengths-not-summing": Case(
        lambda: pack(lengths=([3, 3], [2, 5])),
        r"`query_lengths` must sum to N = q.shape\[0\]=7, received \[3, 3\] \(sum 6\)",
        ValueError,
    ),
    "key-lengths-not-summing": Case(
        lambda: pack(lengths=([3, 4], [2, 6])),
        r"`key_lengths` must sum to M = k.shape\[0\]=7, received \[2, 6\]",
        ValueError,
    ),
    "lengths-of-different-batches": Case(
        lambda: pack(lengths=([3, 4], [7])), r"`query_lengths` and `key_lengths`.*received 2 and 1 lengths", ValueError
    ),
    "query-lengths-negative": Case(
        lambda: pack(lengths=([8, -1], [2, 5])), r"`query_lengths` must hold non-negative ints, received \[8, -1\]"
    ),
    "query-lengths-float": Case(lambda: pack(lengths=([3.0, 4.0], [2, 5])), r"`query_lengths`.*\[3.0, 4.0\]"),
    "key-lengths-float-tensor": Case(lambda: pack(lengths=([3, 4], torch.tensor([2.0, 5.0]))), r"`key_lengths`"),
    "key-lengths-string": Case(
        lambda: pack(lengths=([3, 4], "25")), r"`key_lengths` must be a sequence of ints", TypeError
    ),
    "masks-one-too-few": Case(
        lambda: pack(masks=[None]),
        r"`masks` must be None or a sequence of 2 masks \(one per sequence\), received list of length 1",
        ValueError,
    ),
    "masks-a-tensor": Case(
        lambda: pack(masks=torch.ones(2, 4, 5, dtype=BOOL)), r"`masks`.*received Tensor", ValueError
    ),
    "mask-of-the-other-sequence": Case(
        lambda: pack(masks=[torch.ones(4, 5, dtype=BOOL), None]),
        r"`masks\[0\]` must be broadcastable to \(H, n, m\)=\(4, 3, 2\), received masks\[0\].shape=\(4, 5\)",
        ValueError,
    ),
    "mask-heads-of-kv": Case(lambda: pack(masks=[None, torch.ones(2, 4, 5, dtype=BOOL)]), r"`masks\[1\]`.*\(2, 4, 5\)"),
    "mask-integer": Case(lambda: pack(masks=[None, torch.ones(4, 5, dtype=torch.long)]), r"`masks\[1\]`", DTypeError),
    "mask-list": Case(lambda: pack(masks=[[[True]], None]), r"`masks\[0\]` must be a torch.Tensor", TypeError),
    "causal-int": Case(lambda: pack(causal=1), r"`causal` must be True or False", TypeError),
    "dropout-one": Case(lambda: pack(dropout=1.0), r"`dropout` must be in \[0, 1\)", ValueError),
    "scale-nan": Case(lambda: pack(scale=float("nan")), r"`scale` must be finite", ValueError),
    "implementation-unknown": Case(lambda: pack(implementation="varlen"), r"`implementation`.*'varlen'", ValueError),
}


@pytest.mark.parametrize("case", list(PACKED_CASES))
def test_packed_attention_refuses_before_computing(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def computed(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("attention computed before its arguments were checked")

    monkeypatch.setattr(functional, "_fused", computed)
    monkeypatch.setattr(functional, "_explicit", computed)
    refuse(PACKED_CASES[case])


def test_packed_attention_cases_are_one_argument_away_from_a_call_that_works() -> None:
    assert pack().shape == (7, 4, 5)
    assert pack(masks=[torch.ones(4, 3, 2, dtype=BOOL), None]).shape == (7, 4, 5)


PACKED_SHAPE_CASES = {
    "k-v-lengths": (lambda: pack(*packed()[:2], torch.randn(6, 2, 5)), r"k.shape=\(7, 2, 8\), v.shape=\(6, 2, 5\)"),
    "k-head-dim": (lambda: pack(packed()[0], torch.randn(7, 2, 9), packed()[2]), r"k.shape=\(7, 2, 9\)"),
}


@pytest.mark.parametrize("case", list(PACKED_SHAPE_CASES))
def test_packed_attention_shape_errors_quote_the_shapes_received(case: str) -> None:
    call, match = PACKED_SHAPE_CASES[case]
    with pytest.raises(ValueError, match=match):
        call()


# --- mask helpers -----------------------------------------------------------------------------------------

TOKENS = torch.tensor([[5, 6, 0]])

MASK_HELPER_CASES = {
    "causal-lq-bool": Case(lambda: causal_mask(True, 3), r"`lq` must be an int", TypeError),
    "causal-lk-none": Case(lambda: causal_mask(2, None), r"`lk` must be an int", TypeError),
    "causal-lk-negative": Case(lambda: causal_mask(2, -4), r"`lk` must be a non-negative int, received -4", ValueError),
    "causal-device-nonsense": Case(lambda: causal_mask(2, 3, device="nonsense"), r"`device`"),
    "padding-lengths-none": Case(lambda: padding_mask(None, 3), r"`lengths`"),
    "padding-lengths-string": Case(lambda: padding_mask("ab", 3), r"`lengths`"),
    "padding-lengths-ragged": Case(lambda: padding_mask([[1], [1, 2]], 3), r"`lengths`"),
    "padding-lengths-bool": Case(lambda: padding_mask([True, False], 3), r"`lengths` must hold integers", DTypeError),
    "padding-lengths-0d": Case(lambda: padding_mask(torch.tensor(2), 3), r"`lengths` must be 1-D", ValueError),
    "padding-max-len-bool": Case(lambda: padding_mask([1], True), r"`max_len` must be an int", TypeError),
    "padding-max-len-none": Case(lambda: padding_mask([1], None), r"`max_len` must be an int", TypeError),
    "padding-max-len-negative": Case(lambda: padding_mask([0], -1), r"`max_len` must be a non-negative", ValueError),
    "tokens-none": Case(lambda: padding_mask_from_tokens(None, 0), r"`tokens` must be a torch.Tensor", TypeError),
    "tokens-complex": Case(
        lambda: padding_mask_from_tokens(torch.zeros(1, 2, dtype=torch.complex64), 0), r"`tokens`", DTypeError
    ),
    "tokens-3d": Case(lambda: padding_mask_from_tokens(TOKENS[None], 0), r"`tokens` must be 2-D", ValueError),
    "pad-id-none": Case(lambda: padding_mask_from_tokens(TOKENS, None), r"`pad_id` must be an int", TypeError),
    "pad-id-float": Case(lambda: padding_mask_from_tokens(TOKENS, 0.0), r"`pad_id` must be an int", TypeError),
    "pad-id-bool": Case(lambda: padding_mask_from_tokens(TOKENS, False), r"`pad_id` must be an int", TypeError),
    "causal-lq-negative": Case(lambda: causal_mask(-1, 3), r"`lq` must be a non-negative int, received -1", ValueError),
    "causal-lk-float": Case(lambda: causal_mask(2, 2.0), r"`lk` must be an int", TypeError),
    "padding-lengths-beyond-max-len": Case(
        lambda: padding_mask([1, 5], 4), r"`lengths` must lie in \[0, max_len=4\], received \[1, 5\]", ValueError
    ),
    "padding-lengths-negative": Case(lambda: padding_mask([-1], 4), r"must lie in", ValueError),
    "padding-lengths-2d": Case(
        lambda: padding_mask(torch.tensor([[1]]), 4), r"1-D \(B,\), received lengths.shape=\(1, 1\)", ValueError
    ),
    "padding-lengths-float": Case(lambda: padding_mask([1.5], 4), r"integers", TypeError),
    "tokens-float": Case(lambda: padding_mask_from_tokens(torch.zeros(2, 3), 0), r"integer token ids", TypeError),
    "tokens-1d": Case(
        lambda: padding_mask_from_tokens(torch.zeros(2, dtype=torch.long), 0), r"2-D \(B, L\)", ValueError
    ),
    "tokens-list": Case(lambda: padding_mask_from_tokens([[1, 2]], 0), r"torch.Tensor", TypeError),
    "pad-id-string": Case(
        lambda: padding_mask_from_tokens(torch.zeros(1, 2, dtype=torch.long), "0"), r"`pad_id`", TypeError
    ),
}


@pytest.mark.parametrize("case", list(MASK_HELPER_CASES))
def test_mask_helpers_refuse(case: str) -> None:
    refuse(MASK_HELPER_CASES[case])


# --- MultiHeadAttention: constructor, forward, KV cache ---------------------------------------------------

CONSTRUCTOR_CASES = {
    "num-heads-bool": Case(lambda: MultiHeadAttention(16, True), r"`num_heads` must be an int", TypeError),
    "num-heads-none": Case(lambda: MultiHeadAttention(16, None), r"`num_heads` must be an int", TypeError),
    "num-heads-string": Case(lambda: MultiHeadAttention(16, "4"), r"`num_heads` must be an int", TypeError),
    "d-model-float": Case(lambda: MultiHeadAttention(16.0, 4), r"`d_model` must be an int", TypeError),
    "d-model-negative": Case(lambda: MultiHeadAttention(-16, 4), r"`d_model` must be a positive int", ValueError),
    "kv-heads-zero": Case(lambda: MultiHeadAttention(16, 4, num_kv_heads=0), r"`num_kv_heads`.*received 0", ValueError),
    "kv-heads-more": Case(
        lambda: MultiHeadAttention(16, 4, num_kv_heads=8), r"num_heads=4, num_kv_heads=8", ValueError
    ),
    "kv-heads-float": Case(lambda: MultiHeadAttention(16, 4, num_kv_heads=2.0), r"`num_kv_heads` must be an int"),
    "head-dim-float": Case(lambda: MultiHeadAttention(16, 4, head_dim=2.5), r"`head_dim` must be an int", TypeError),
    "value-head-dim-0": Case(lambda: MultiHeadAttention(16, 4, value_head_dim=0), r"`value_head_dim`", ValueError),
    "qdim-zero": Case(lambda: MultiHeadAttention(16, 4, qdim=0), r"`qdim` must be a positive int", ValueError),
    "vdim-negative": Case(lambda: MultiHeadAttention(16, 4, vdim=-5), r"`vdim` must be a positive int", ValueError),
    "dropout-bool": Case(lambda: MultiHeadAttention(16, 4, dropout=True), r"`dropout` must be a float", TypeError),
    "dropout-nan": Case(lambda: MultiHeadAttention(16, 4, dropout=float("nan")), r"`dropout`", ValueError),
    "bias-int": Case(lambda: MultiHeadAttention(16, 4, bias=1), r"`bias` must be True or False", TypeError),
    "num-heads-float": Case(lambda: MultiHeadAttention(8, 2.0), r"`num_heads` must be an int, received 2.0", TypeError),
    "num-heads-zero": Case(
        lambda: MultiHeadAttention(8, 0), r"`num_heads` must be a positive int, received 0", ValueError
    ),
    "num-heads-negative": Case(lambda: MultiHeadAttention(8, -2), r"`num_heads`.*received -2", ValueError),
    "heads-indivisible": Case(
        lambda: MultiHeadAttention(10, 3),
        r"`d_model` must be divisible by `num_heads`.*received d_model=10, num_heads=3",
        ValueError,
    ),
    "d-model-zero": Case(lambda: MultiHeadAttention(0, 2), r"`d_model` must be a positive int, received 0", ValueError),
    "kv-heads-indivisible": Case(
        lambda: MultiHeadAttention(12, 6, num_kv_heads=4),
        r"divisible by `num_kv_heads`.*num_heads=6, num_kv_heads=4",
        ValueError,
    ),
    "dropout-above-one": Case(
        lambda: MultiHeadAttention(8, 2, dropout=1.5), r"`dropout` must be in \[0, 1\), received 1.5", ValueError
    ),
    "head-dim-zero": Case(
        lambda: MultiHeadAttention(8, 2, head_dim=0), r"`head_dim` must be a positive int, received 0", ValueError
    ),
    "value-head-dim-negative": Case(
        lambda: MultiHeadAttention(8, 2, value_head_dim=-1), r"`value_head_dim`.*received -1", ValueError
    ),
    "kdim-string": Case(lambda: MultiHeadAttention(8, 2, kdim="4"), r"`kdim` must be an int, received '4'", TypeError),
    "bias-none": Case(
        lambda: MultiHeadAttention(8, 2, bias=None), r"`bias` must be True or False, received None", TypeError
    ),
    "implementation-unknown": Case(
        lambda: MultiHeadAttention(16, 4, implementation="flash"),
        r"`implementation` must be one of \('auto', 'fused', 'explicit'\), received 'flash'",
        ValueError,
    ),
    "implementation-bool": Case(
        lambda: MultiHeadAttention(16, 4, implementation=True), r"`implementation`", ValueError
    ),
    "from-torch-ours": Case(
        lambda: MultiHeadAttention.from_torch(MultiHeadAttention(16, 4)), r"`module` must be a torch.nn", TypeError
    ),
    "from-torch-linear": Case(
        lambda: MultiHeadAttention.from_torch(nn.Linear(2, 2)),
        r"torch\.nn\.MultiheadAttention, received Linear",
        TypeError,
    ),
    "from-torch-bias-kv": Case(
        lambda: MultiHeadAttention.from_torch(nn.MultiheadAttention(16, 4, add_bias_kv=True)),
        r"`module` uses add_bias_kv",
        ValueError,
    ),
}


@pytest.mark.parametrize("case", list(CONSTRUCTOR_CASES))
def test_module_constructor_refuses(case: str) -> None:
    refuse(CONSTRUCTOR_CASES[case])


def test_head_dim_lifts_divisibility_requirement() -> None:
    assert MultiHeadAttention(10, 3, head_dim=4).q_proj.weight.shape == (12, 10)


def mha() -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(16, 4, num_kv_heads=2, kdim=6, vdim=6).eval()


def self_mha(kv_heads: int = 2) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(16, 4, num_kv_heads=kv_heads).eval()


X = torch.randn(2, 5, 16)  # query (B, Lq, E)
MEMORY = torch.randn(2, 7, 6)  # key = value (B, Lk, kdim)
BOOL = torch.bool


def cross(m: MultiHeadAttention, **kwargs: Any) -> Any:
    return m(X, MEMORY, **kwargs)


def fused(m: MultiHeadAttention) -> MultiHeadAttention:
    """``m`` made to take the fused kernel."""
    m.implementation = "fused"
    return m


FORWARD_CASES = {
    "query-none": Case(lambda m: m(None), r"`query` must be a torch.Tensor, received NoneType", TypeError),
    "query-list": Case(lambda m: m([[1.0]]), r"`query` must be a torch.Tensor, received list", TypeError),
    "key-list": Case(lambda m: m(X, [[0.0] * 6]), r"`key` must be a torch.Tensor, received list", TypeError),
    "value-string": Case(lambda m: m(X, MEMORY, "v"), r"`value` must be a torch.Tensor, received str", TypeError),
    "query-integer": Case(lambda m: m(X.long(), MEMORY), r"`query`", TypeError),
    "query-float64": Case(lambda m: m(X.double(), MEMORY), r"`query`"),
    "key-float64": Case(lambda m: m(X, MEMORY.double()), r"`key`"),
    "value-float16": Case(lambda m: m(X, MEMORY, MEMORY.half()), r"`value`"),
    "query-4d": Case(lambda m: m(X[None], MEMORY), r"`query` must be 3-D", ValueError),
    "query-2d": Case(
        lambda m: m(torch.randn(5, 16)), r"`query` must be 3-D \(B, L, 16\), received query.shape=\(5, 16\)", ValueError
    ),
    "query-width": Case(
        lambda m: m(torch.randn(2, 5, 15), MEMORY),
        r"`query` must have 16 features .*query.shape=\(2, 5, 15\)",
        ValueError,
    ),
    "key-2d": Case(lambda m: m(X, MEMORY[0]), r"`key` must be 3-D .*key.shape=\(7, 6\)", ValueError),
    "key-width-of-query": Case(lambda m: m(X, X), r"`key` must have 6 features .*key.shape=\(2, 5, 16\)", ValueError),
    "value-width": Case(lambda m: m(X, MEMORY, torch.randn(2, 7, 5)), r"`value` must have 6 features", ValueError),
    "value-batch": Case(lambda m: m(X, MEMORY, MEMORY[:1]), r"batch size B.*value.shape=\(1, 7, 6\)", ValueError),
    "key-batch": Case(
        lambda m: m(X, torch.randn(3, 7, 6), torch.randn(3, 7, 6)),
        r"batch size B, received query.shape=\(2, 5, 16\), key.shape=\(3, 7, 6\)",
        ValueError,
    ),
    "value-length": Case(
        lambda m: m(X, MEMORY, torch.randn(2, 8, 6)),
        r"same length Lk, received key.shape=\(2, 7, 6\), value.shape=\(2, 8, 6\)",
        ValueError,
    ),
    "mask-list": Case(lambda m: cross(m, mask=[[True] * 7] * 5), r"`mask` must be a torch.Tensor", TypeError),
    "mask-uint8": Case(lambda m: cross(m, mask=torch.ones(5, 7, dtype=torch.uint8)), r"`mask`.*uint8", DTypeError),
    "mask-int64": Case(
        lambda m: cross(m, mask=torch.ones(5, 7, dtype=torch.int64)),
        r"`mask` must be boolean .*torch.int64",
        DTypeError,
    ),
    "mask-1d": Case(
        lambda m: cross(m, mask=torch.ones(7, dtype=BOOL)),
        r"`mask` must be 2-D \(Lq, Lk\), 3-D \(B, Lq, Lk\) or 4-D .*received mask.shape=\(7,\)",
        ValueError,
    ),
    "mask-0d": Case(lambda m: cross(m, mask=torch.tensor(True)), r"`mask` must be 2-D .*mask.shape=\(\)", ValueError),
    "mask-5d": Case(lambda m: cross(m, mask=torch.ones(1, 1, 1, 5, 7, dtype=BOOL)), r"`mask` must be 2-D", ValueError),
    "mask-3d-batch": Case(
        lambda m: cross(m, mask=torch.ones(3, 5, 7, dtype=BOOL)), r"mask.shape=\(3, 1, 5, 7\)", ValueError
    ),
    "mask-4d-kv-heads": Case(
        lambda m: cross(m, mask=torch.ones(2, 2, 5, 7, dtype=BOOL)), r"\(2, 4, 5, 7\).*mask.shape=\(2, 2, 5, 7\)"
    ),
    "mask-transposed": Case(lambda m: cross(m, mask=torch.ones(7, 5, dtype=BOOL)), r"mask.shape=\(1, 1, 7, 5\)"),
    "mask-3d-transposed": Case(
        lambda m: cross(m, mask=torch.ones(2, 7, 5, dtype=BOOL)),
        r"broadcastable to \(B, H, Lq, Lk\)=\(2, 4, 5, 7\), received mask.shape=\(2, 1, 7, 5\)",
        ValueError,
    ),
    "key-mask-list": Case(lambda m: cross(m, key_mask=[[True] * 7] * 2), r"`key_mask` must be a torch.Tensor"),
    "key-mask-int": Case(lambda m: cross(m, key_mask=torch.ones(2, 7, dtype=torch.long)), r"`key_mask`", DTypeError),
    "key-mask-float": Case(
        lambda m: cross(m, key_mask=torch.ones(2, 7)),
        r"`key_mask` must be boolean, received dtype torch.float32",
        DTypeError,
    ),
    "key-mask-1d": Case(lambda m: cross(m, key_mask=torch.ones(7, dtype=BOOL)), r"key_mask.shape=\(7,\)", ValueError),
    "key-mask-3d": Case(lambda m: cross(m, key_mask=torch.ones(2, 1, 7, dtype=BOOL)), r"key_mask.shape=\(2, 1, 7\)"),
    "key-mask-batch": Case(lambda m: cross(m, key_mask=torch.ones(1, 7, dtype=BOOL)), r"\(B, Lk\)=\(2, 7\)"),
    "key-mask-query-length": Case(
        lambda m: cross(m, key_mask=torch.ones(2, 5, dtype=BOOL)),
        r"`key_mask` must have shape \(B, Lk\)=\(2, 7\), received key_mask.shape=\(2, 5\)",
        ValueError,
    ),
    "query-mask-key-length": Case(
        lambda m: cross(m, query_mask=torch.ones(2, 7, dtype=BOOL)),
        r"`query_mask` must have shape \(B, Lq\)=\(2, 5\), received query_mask.shape=\(2, 7\)",
        ValueError,
    ),
    "query-mask-float": Case(
        lambda m: cross(m, query_mask=torch.ones(2, 5)),
        r"`query_mask` must be boolean, received dtype torch.float32",
        DTypeError,
    ),
    "query-mask-with-bad-key-mask": Case(
        lambda m: cross(m, query_mask=torch.ones(2, 5, dtype=BOOL), key_mask=torch.ones(2, 5, dtype=BOOL)),
        r"`key_mask` must have shape \(B, Lk\)=\(2, 7\)",
        ValueError,
    ),
    "causal-int": Case(lambda m: cross(m, causal=1), r"`causal` must be True or False", TypeError),
    "causal-none": Case(lambda m: cross(m, causal=None), r"`causal` must be True or False", TypeError),
    "return-weights-string": Case(lambda m: cross(m, return_weights="yes"), r"`return_weights`", TypeError),
    "weights-from-the-fused-kernel": Case(
        lambda m: fused(m)(X, MEMORY, return_weights=True),
        r"`implementation`='fused' cannot return the weights",
        ValueError,
    ),
    "cache-dict": Case(lambda m: m(X, cache={}), r"`cache` must be a KVCache", TypeError),
    "cache-decoder-cache": Case(
        lambda m: m(X, cache=DecoderCache(1, KVCache)), r"`cache` must be a KVCache", TypeError
    ),
}


@pytest.mark.parametrize("case", list(FORWARD_CASES))
def test_module_forward_refuses_before_projecting(case: str) -> None:
    m = mha()
    with nothing_runs(m) as ran:
        refuse(FORWARD_CASES[case], m)
    assert ran == [], f"submodules ran before the refusal: {ran}"


def test_module_legal_empty_shapes() -> None:
    """Lq = 0 gives an empty output; Lk = 0 attends nothing, so each row is out_proj applied to zeros."""
    m = mha()
    with torch.no_grad():
        assert m(X[:, :0], MEMORY).shape == (2, 0, 16)
        out = m(X, MEMORY[:, :0], key_mask=torch.ones(2, 0, dtype=BOOL))
    torch.testing.assert_close(out, m.out_proj.bias.expand(2, 5, 16))


def filled_cache(capacity: int | None = None, batch: int = 2, length: int = 3, kv_heads: int = 2) -> KVCache:
    cache = KVCache(capacity)
    with torch.no_grad():
        self_mha(kv_heads)(torch.randn(batch, length, 16), cache=cache, causal=True)
    return cache


def memory_cache() -> KVCache:
    cache = KVCache()
    with torch.no_grad():
        mha()(X, MEMORY, cache=cache)
    return cache


CACHE_CASES = {
    "capacity-exceeded": Case(
        lambda m: m(torch.randn(2, 2, 16), cache=filled_cache(capacity=4), causal=True), r"capacity 4", ValueError
    ),
    "batch-changed": Case(lambda m: m(torch.randn(3, 1, 16), cache=filled_cache(), causal=True), r"cache", ValueError),
    "other-module": Case(lambda m: m(torch.randn(2, 1, 16), cache=filled_cache(kv_heads=4), causal=True), r"cache"),
    "memory-batch-changed": Case(
        lambda m: m(torch.randn(3, 5, 16), torch.randn(3, 7, 6), cache=memory_cache()), r"`cache`|`query`"
    ),
    "key-mask-over-new-tokens-only": Case(
        lambda m: m(torch.randn(2, 1, 16), cache=filled_cache(), key_mask=torch.ones(2, 1, dtype=BOOL)),
        r"`key_mask` must have shape \(B, Lk\)=\(2, 4\)",
        ValueError,
    ),
}


@pytest.mark.parametrize("case", list(CACHE_CASES))
def test_cache_misuse_is_refused_before_projecting(case: str) -> None:
    m = self_mha() if case != "memory-batch-changed" else mha()
    with nothing_runs(m) as ran:
        refuse(CACHE_CASES[case], m)
    assert ran == [], f"submodules ran before the refusal: {ran}"


@pytest.mark.parametrize(
    ("capacity", "error", "match"),
    [
        (True, TypeError, r"`capacity` must be an int"),
        (2.0, TypeError, r"`capacity` must be an int"),
        ("8", TypeError, r"`capacity` must be an int"),
        (-1, ValueError, r"`capacity` must be a positive int, received -1"),
        (0, ValueError, r"`capacity` must be a positive int, received 0"),
    ],
    ids=["bool", "float", "string", "negative", "zero"],
)
def test_kv_cache_capacity_refused(capacity: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        KVCache(capacity)


def test_kv_cache_append_refuses_overflow_and_mismatched_shapes() -> None:
    cache = KVCache(capacity=2)
    cache.append(torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4))
    with pytest.raises(ValueError, match="capacity 2 exceeded: 2 cached \\+ 1 new"):
        cache.append(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    growing = KVCache()
    growing.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"received new keys of shape \(1, 3, 1, 4\)"):
        growing.append(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))


def test_refused_cache_step_leaves_the_cache_as_it_was() -> None:
    cache = filled_cache(capacity=4)
    keys, length = cache.keys.clone(), cache.length
    with pytest.raises(ValueError, match="capacity"):
        self_mha()(torch.randn(2, 2, 16), cache=cache, causal=True)
    assert cache.length == length
    torch.testing.assert_close(cache.keys, keys)


# --- Transformer parts ------------------------------------------------------------------------------------

E = 16
PARTS_CONSTRUCTOR_CASES = {
    "positional-d-model-bool": Case(lambda: PositionalEncoding(True), r"`d_model` must be an int", TypeError),
    "positional-max-len-negative": Case(lambda: PositionalEncoding(E, -1), r"`max_len` must be a positive", ValueError),
    "positional-dropout-string": Case(lambda: PositionalEncoding(E, 8, "0.1"), r"`dropout` must be a float", TypeError),
    "feed-forward-d-model-string": Case(lambda: FeedForward("16", 32), r"`d_model` must be an int", TypeError),
    "feed-forward-d-ff-zero": Case(lambda: FeedForward(E, 0), r"`d_ff` must be a positive int", ValueError),
    "feed-forward-dropout-one": Case(lambda: FeedForward(E, 32, 1.0), r"`dropout` must be in \[0, 1\)", ValueError),
    "feed-forward-activation-none": Case(lambda: FeedForward(E, 32, activation=None), r"`activation`", ValueError),
    "feed-forward-activation-tanh": Case(
        lambda: FeedForward(8, 16, activation="tanh"),
        r"`activation` must be one of \('relu', 'gelu', 'silu'\), received 'tanh'",
        ValueError,
    ),
    "encoder-layer-heads-indivisible": Case(lambda: EncoderLayer(E, 3, 32), r"d_model=16, num_heads=3", ValueError),
    "encoder-layer-heads-zero": Case(lambda: EncoderLayer(E, 0, 32), r"`num_heads` must be a positive", ValueError),
    "encoder-layer-norm-first-string": Case(lambda: EncoderLayer(E, 2, 32, norm_first="no"), r"`norm_first`"),
    "decoder-layer-d-ff-negative": Case(lambda: DecoderLayer(E, 2, -32), r"`d_ff` must be a positive", ValueError),
    "decoder-layer-activation": Case(lambda: DecoderLayer(E, 2, 32, activation="swish"), r"`activation`", ValueError),
    "encoder-layers-negative": Case(lambda: Encoder(-1, E, 2, 32), r"`num_layers`.*received -1", ValueError),
    "decoder-layers-float": Case(lambda: Decoder(1.0, E, 2, 32), r"`num_layers` must be an int", TypeError),
}


@pytest.mark.parametrize("case", list(PARTS_CONSTRUCTOR_CASES))
def test_parts_constructors_refuse(case: str) -> None:
    refuse(PARTS_CONSTRUCTOR_CASES[case])


def part(name: str) -> nn.Module:
    torch.manual_seed(0)
    return {
        "positional": lambda: PositionalEncoding(E, 10),
        "feed_forward": lambda: FeedForward(E, 32),
        "encoder_layer": lambda: EncoderLayer(E, 2, 32, 0.0),
        "encoder_layer_pre_norm": lambda: EncoderLayer(E, 2, 32, 0.0, norm_first=True),
        "decoder_layer": lambda: DecoderLayer(E, 2, 32, 0.0),
        "empty_encoder": lambda: Encoder(0, E, 2, 32, 0.0),
        "decoder": lambda: Decoder(1, E, 2, 32, 0.0),
    }[name]().eval()


H = torch.randn(2, 5, E)  # hidden states (B, L, E)
M = torch.randn(2, 6, E)  # encoder memory (B, Ls, E)

PARTS_FORWARD_CASES = {
    "positional-x-list": ("positional", Case(lambda p: p([[0.0] * E]), r"`x`", TypeError)),
    "positional-x-2d": ("positional", Case(lambda p: p(H[0]), r"`x` must be 3-D")),
    "positional-x-width": ("positional", Case(lambda p: p(H[..., :8]), r"`x`.*16")),
    "positional-x-integer": ("positional", Case(lambda p: p(H.long()), r"`x`", TypeError)),
    "positional-offset-negative": ("positional", Case(lambda p: p(H, offset=-3), r"`offset`", ValueError)),
    "positional-offset-float": ("positional", Case(lambda p: p(H, offset=1.5), r"`offset` must be an int", TypeError)),
    "positional-beyond-max-len": ("positional", Case(lambda p: p(H, offset=8), r"positions 8..12 exceed max_len=10")),
    "feed-forward-x-width": ("feed_forward", Case(lambda p: p(H[..., :8]), r"`x`.*16")),
    "feed-forward-x-list": ("feed_forward", Case(lambda p: p([[0.0] * E]), r"`x`", TypeError)),
    "feed-forward-x-integer": ("feed_forward", Case(lambda p: p(H.long()), r"`x`", TypeError)),
    "encoder-layer-x-list": ("encoder_layer", Case(lambda p: p([[0.0] * E]), r"`x`", TypeError)),
    "encoder-layer-x-width": ("encoder_layer", Case(lambda p: p(H[..., :8]), r"`x`.*16", ValueError)),
    "encoder-layer-pre-norm-x-width": ("encoder_layer_pre_norm", Case(lambda p: p(H[..., :8]), r"`x`.*16")),
    "encoder-layer-pre-norm-x-list": ("encoder_layer_pre_norm", Case(lambda p: p([[0.0] * E]), r"`x`", TypeError)),
    "decoder-layer-memory-none": ("decoder_layer", Case(lambda p: p(H, None), r"`memory`", TypeError)),
    "decoder-layer-memory-list": ("decoder_layer", Case(lambda p: p(H, [[0.0] * E]), r"`memory`", TypeError)),
    "decoder-layer-memory-width": ("decoder_layer", Case(lambda p: p(H, M[..., :8]), r"`memory`.*16", ValueError)),
    "decoder-layer-memory-batch": ("decoder_layer", Case(lambda p: p(H, M[:1]), r"`memory`", ValueError)),
    "decoder-layer-self-cache": ("decoder_layer", Case(lambda p: p(H, M, self_cache=[]), r"`self_cache`", TypeError)),
    "empty-encoder-x-width": ("empty_encoder", Case(lambda p: p(H[..., :8]), r"`x`.*16")),
    "empty-encoder-x-list": ("empty_encoder", Case(lambda p: p([[0.0] * E]), r"`x`", TypeError)),
    "empty-encoder-key-mask": ("empty_encoder", Case(lambda p: p(H, key_mask=torch.ones(3, 3)), r"`key_mask`")),
    "decoder-cache-kv-cache": ("decoder", Case(lambda p: p(H, M, cache=KVCache()), r"`cache`", TypeError)),
    "decoder-cache-too-few-layers": ("decoder", Case(lambda p: p(H, M, cache=DecoderCache(0, KVCache)), r"`cache`")),
}


@pytest.mark.parametrize("case", list(PARTS_FORWARD_CASES))
def test_parts_forward_refuses_before_computing(case: str) -> None:
    name, bad = PARTS_FORWARD_CASES[case]
    module = part(name)
    with nothing_runs(module) as ran:
        refuse(bad, module)
    assert ran == [], f"submodules ran before the refusal: {ran}"


# --- Transformer ------------------------------------------------------------------------------------------

SRC_VOCAB, TGT_VOCAB = 20, 23


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    options = dict(d_model=E, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32, dropout=0.0)
    return Transformer(SRC_VOCAB, TGT_VOCAB, max_len=30, **options).eval()


SRC = torch.randint(4, SRC_VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
TGT = torch.randint(4, TGT_VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
MEM = torch.randn(2, 6, E)


def gen(model: Transformer, src: torch.Tensor = SRC, **overrides: Any) -> torch.Tensor:
    return model.generate(src, **{"max_len": 3, "bos_id": 1, "eos_id": 2, **overrides})


TRANSFORMER_CASES = {
    # forward
    "forward-src-none": Case(lambda t: t(None, TGT), r"`src` must be a torch.Tensor", TypeError),
    "forward-src-bool": Case(lambda t: t(SRC.bool(), TGT), r"`src` must hold integer token ids", DTypeError),
    "forward-src-3d": Case(lambda t: t(SRC[None], TGT), r"`src` must be 2-D", ValueError),
    "forward-src-negative": Case(lambda t: t(-SRC, TGT), r"`src` must hold ids in \[0, 20\)", ValueError),
    "forward-src-above-vocab": Case(
        lambda t: t(torch.tensor([[3, 25]]), TGT[:1, :2]),
        r"`src` must hold ids in \[0, 20\), received ids from 3 to 25",
        ValueError,
    ),
    "forward-src-beyond-max-len": Case(lambda t: t(SRC.repeat(1, 6), TGT), r"`src`.*max_len=30", ValueError),
    "forward-tgt-float": Case(lambda t: t(SRC, TGT.float()), r"`tgt` must hold integer token ids", DTypeError),
    "forward-tgt-out-of-vocab": Case(lambda t: t(SRC, TGT + TGT_VOCAB), r"`tgt` must hold ids in \[0, 23\)"),
    "forward-tgt-list": Case(lambda t: t(SRC, TGT.tolist()), r"`tgt` must be a torch.Tensor", TypeError),
    "forward-batch-mismatch": Case(lambda t: t(SRC, TGT[:1]), r"`src`.*`tgt`|`tgt`.*`src`", ValueError),
    "forward-src-key-mask-shape": Case(
        lambda t: t(SRC, TGT, src_key_mask=torch.ones(2, 5, dtype=BOOL)), r"`src_key_mask`.*\(2, 6\)", ValueError
    ),
    "forward-src-key-mask-int": Case(
        lambda t: t(SRC, TGT, src_key_mask=torch.ones(2, 6, dtype=torch.long)), r"`src_key_mask`", DTypeError
    ),
    "forward-src-key-mask-list": Case(lambda t: t(SRC, TGT, src_key_mask=[[True] * 6] * 2), r"`src_key_mask`"),
    "forward-tgt-key-mask-shape": Case(
        lambda t: t(SRC, TGT, tgt_key_mask=torch.ones(2, 6, dtype=BOOL)), r"`tgt_key_mask`.*\(2, 5\)", ValueError
    ),
    "forward-tgt-key-mask-float": Case(lambda t: t(SRC, TGT, tgt_key_mask=torch.ones(2, 5)), r"`tgt_key_mask`"),
    # encode
    "encode-src-float": Case(lambda t: t.encode(SRC.float()), r"`src` must hold integer token ids", DTypeError),
    "encode-src-1d": Case(lambda t: t.encode(torch.tensor([3, 4])), r"`src` must be 2-D \(B, L\)", ValueError),
    "encode-src-key-mask-batch": Case(
        lambda t: t.encode(SRC, src_key_mask=torch.ones(3, 6, dtype=BOOL)), r"`src_key_mask`", ValueError
    ),
    # decode
    "decode-memory-none": Case(lambda t: t.decode(TGT, None), r"`memory`", TypeError),
    "decode-memory-list": Case(lambda t: t.decode(TGT, MEM.tolist()), r"`memory`", TypeError),
    "decode-memory-width": Case(lambda t: t.decode(TGT, MEM[..., :8]), r"`memory`.*16", ValueError),
    "decode-memory-2d": Case(lambda t: t.decode(TGT, MEM[0]), r"`memory`", ValueError),
    "decode-memory-batch": Case(lambda t: t.decode(TGT, MEM[:1]), r"`memory`", ValueError),
    "decode-memory-float64": Case(lambda t: t.decode(TGT, MEM.double()), r"`memory`"),
    "decode-memory-integer": Case(lambda t: t.decode(TGT, MEM.long()), r"`memory`", TypeError),
    "decode-memory-key-mask": Case(
        lambda t: t.decode(TGT, MEM, memory_key_mask=torch.ones(2, 5, dtype=BOOL)), r"`memory_key_mask`", ValueError
    ),
    "decode-cache-kv-cache": Case(lambda t: t.decode(TGT, MEM, cache=KVCache()), r"`cache` must be a DecoderCache"),
    "decode-return-weights-string": Case(lambda t: t.decode(TGT, MEM, return_weights="y"), r"`return_weights`"),
    # generate
    "generate-max-len-zero": Case(lambda t: gen(t, max_len=0), r"`max_len` must be a positive int", ValueError),
    "generate-max-len-float": Case(lambda t: gen(t, max_len=3.0), r"`max_len` must be an int", TypeError),
    "generate-max-len-none": Case(lambda t: gen(t, max_len=None), r"`max_len` must be an int", TypeError),
    "generate-beam-zero": Case(lambda t: gen(t, beam_size=0), r"`beam_size` must be a positive int", ValueError),
    "generate-beam-bool": Case(lambda t: gen(t, beam_size=True), r"`beam_size` must be an int", TypeError),
    "generate-beam-string": Case(lambda t: gen(t, beam_size="2"), r"`beam_size` must be an int", TypeError),
    "generate-bos-negative": Case(lambda t: gen(t, bos_id=-1), r"`bos_id` must be a non-negative int", ValueError),
    "generate-bos-out-of-vocab": Case(lambda t: gen(t, bos_id=TGT_VOCAB), r"bos_id.*tgt_vocab=23", ValueError),
    "generate-eos-out-of-vocab": Case(
        lambda t: gen(t, eos_id=99), r"`eos_id` must be < tgt_vocab=23, received eos_id=99", ValueError
    ),
    "generate-eos-string": Case(lambda t: gen(t, eos_id="2"), r"`eos_id` must be an int", TypeError),
    "generate-pad-negative": Case(lambda t: gen(t, pad_id=-1), r"`pad_id` must be a non-negative int", ValueError),
    "generate-pad-out-of-vocab": Case(lambda t: gen(t, pad_id=50), r"pad_id.*tgt_vocab=23", ValueError),
    "generate-use-cache-string": Case(lambda t: gen(t, use_cache="no"), r"`use_cache` must be True or False"),
    "generate-length-penalty-string": Case(lambda t: gen(t, beam_size=2, length_penalty="x"), r"`length_penalty`"),
    "generate-length-penalty-nan": Case(
        lambda t: gen(t, beam_size=2, length_penalty=float("nan")), r"`length_penalty`"
    ),
    "generate-src-float": Case(lambda t: gen(t, SRC.float()), r"`src` must hold integer token ids", DTypeError),
    "generate-src-out-of-vocab": Case(lambda t: gen(t, SRC + SRC_VOCAB), r"`src` must hold ids in \[0, 20\)"),
    "generate-src-list": Case(lambda t: gen(t, SRC.tolist()), r"`src` must be a torch.Tensor", TypeError),
    "generate-src-key-mask": Case(
        lambda t: gen(t, src_key_mask=torch.ones(2, 3, dtype=BOOL)), r"`src_key_mask`", ValueError
    ),
    # construction from a config
    "from-config-none": Case(lambda t: Transformer.from_config(None), r"`config`", TypeError),
    "from-config-missing-vocab": Case(lambda t: Transformer.from_config({"src_vocab": 3}), r"tgt_vocab"),
    "from-config-unknown-key": Case(
        lambda t: Transformer.from_config({"src_vocab": 3, "tgt_vocab": 3, "x": 1}), r"'x'"
    ),
    "new-cache-capacity-zero": Case(lambda t: t.new_cache(0), r"`capacity` must be a positive int", ValueError),
}


@pytest.mark.parametrize("case", list(TRANSFORMER_CASES))
def test_transformer_refuses_before_computing(case: str, model: Transformer) -> None:
    with nothing_runs(model) as ran:
        refuse(TRANSFORMER_CASES[case], model)
    assert ran == [], f"submodules ran before the refusal: {ran}"


def test_generate_beyond_the_positional_table_is_refused_up_front_or_bounded(model: Transformer) -> None:
    """max_len=40 on a 30-position model: refuse before decoding (naming max_len), or stop within the table."""
    with nothing_runs(model) as ran:
        tokens, error = outcome(lambda: gen(model, max_len=40, eos_id=TGT_VOCAB - 1))
    if error is not None:
        assert "max_len" in str(error), error
        assert ran == [], f"submodules ran before the refusal: {sorted(set(ran))}"
    else:
        assert tokens.shape[1] <= 40


def test_refused_cached_decode_leaves_the_cache_as_it_was(model: Transformer) -> None:
    cache = model.new_cache(capacity=5)
    with torch.no_grad():
        model.decode(TGT, MEM, cache=cache)
    with pytest.raises(ValueError, match="capacity"):
        model.decode(TGT[:, :1], MEM, cache=cache)
    assert [c.length for c in cache.self_attention] == [5]
