"""Bad arguments raise ValueError/TypeError naming the argument, the expectation and what was received, before
any computation."""

from __future__ import annotations

import pytest
import torch

import multihead.torch.functional as functional
from multihead import DTypeError
from multihead.torch import MultiHeadAttention, attention


def qkv(q=(2, 4, 5, 8), k=(2, 4, 7, 8), v=(2, 4, 7, 6), dtype=torch.float32) -> tuple[torch.Tensor, ...]:
    return torch.randn(q, dtype=dtype), torch.randn(k, dtype=dtype), torch.randn(v, dtype=dtype)


FUNCTION_CASES = {
    "q-rank": (
        lambda: attention(*qkv(q=(4, 5, 8))),
        ValueError,
        r"`q` must be 4-D \(B, H, Lq, Dk\), received q.shape=\(4, 5, 8\)",
    ),
    "k-rank": (
        lambda: attention(*qkv(k=(2, 4, 7, 8, 1))),
        ValueError,
        r"`k` must be 4-D .*k.shape=\(2, 4, 7, 8, 1\)",
    ),
    "batch": (
        lambda: attention(*qkv(k=(3, 4, 7, 8))),
        ValueError,
        r"batch size B, received q.shape=\(2, 4, 5, 8\), k.shape=\(3, 4, 7, 8\)",
    ),
    "kv-heads": (
        lambda: attention(*qkv(k=(2, 2, 7, 8))),
        ValueError,
        r"same number of heads Hkv, received k.shape=\(2, 2, 7, 8\), v.shape=\(2, 4, 7, 6\)",
    ),
    "gqa": (
        lambda: attention(*qkv(k=(2, 3, 7, 8), v=(2, 3, 7, 6))),
        ValueError,
        r"multiple of the key/value heads Hkv.*H=4.*Hkv=3",
    ),
    "length": (
        lambda: attention(*qkv(v=(2, 4, 6, 6))),
        ValueError,
        r"same length Lk, received k.shape=\(2, 4, 7, 8\), v.shape=\(2, 4, 6, 6\)",
    ),
    "head-dim": (
        lambda: attention(*qkv(k=(2, 4, 7, 9))),
        ValueError,
        r"same head dim Dk, received q.shape=\(2, 4, 5, 8\), k.shape=\(2, 4, 7, 9\)",
    ),
    "not-tensor": (
        lambda: attention([[1.0]], *qkv()[1:]),
        TypeError,
        r"`q` must be a torch.Tensor, received list",
    ),
    "integer-input": (
        lambda: attention(torch.ones(2, 4, 5, 8, dtype=torch.long), *qkv()[1:]),
        TypeError,
        r"`q` must be a floating tensor, received dtype torch.int64",
    ),
    "mixed-dtypes": (
        lambda: attention(qkv()[0].double(), *qkv()[1:]),
        TypeError,
        r"share one dtype, received torch.float64, torch.float32, torch.float32",
    ),
    "integer-mask": (
        lambda: attention(*qkv(), torch.ones(5, 7, dtype=torch.long)),
        TypeError,
        r"`mask` must be boolean \(True = attend\) or floating .*received dtype torch.int64",
    ),
    "mask-shape": (
        lambda: attention(*qkv(), torch.ones(5, 6, dtype=torch.bool)),
        ValueError,
        r"`mask` must be broadcastable to \(B, H, Lq, Lk\)=\(2, 4, 5, 7\), received mask.shape=\(5, 6\)",
    ),
    "mask-rank": (
        lambda: attention(*qkv(), torch.ones(1, 2, 4, 5, 7, dtype=torch.bool)),
        ValueError,
        r"mask.shape=\(1, 2, 4, 5, 7\)",
    ),
    "mask-grows": (
        lambda: attention(*qkv(), torch.ones(3, 4, 5, 7, dtype=torch.bool)),
        ValueError,
        r"mask.shape=\(3, 4, 5, 7\)",
    ),
    "mask-list": (
        lambda: attention(*qkv(), [[True]]),
        TypeError,
        r"`mask` must be a torch.Tensor or None, received list",
    ),
    "dropout-high": (
        lambda: attention(*qkv(), dropout=1.0),
        ValueError,
        r"`dropout` must be in \[0, 1\), received 1.0",
    ),
    "dropout-negative": (lambda: attention(*qkv(), dropout=-0.1), ValueError, r"received -0.1"),
    "dropout-type": (lambda: attention(*qkv(), dropout="0.1"), TypeError, r"`dropout` must be a float"),
    "scale-nan": (
        lambda: attention(*qkv(), scale=float("nan")),
        ValueError,
        r"`scale` must be finite, received nan",
    ),
    "scale-type": (
        lambda: attention(*qkv(), scale="1"),
        TypeError,
        r"`scale` must be a float or None, received '1'",
    ),
    "causal-type": (
        lambda: attention(*qkv(), causal=1),
        TypeError,
        r"`causal` must be True or False, received 1",
    ),
    "return-weights-type": (
        lambda: attention(*qkv(), return_weights="yes"),
        TypeError,
        r"`return_weights` must be True or False",
    ),
}


@pytest.mark.parametrize("case", list(FUNCTION_CASES))
def test_attention_rejects_before_computing(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    call, error, message = FUNCTION_CASES[case]

    def computed(*args, **kwargs):
        raise AssertionError("computation started before validation")

    monkeypatch.setattr(functional, "_fused", computed)
    monkeypatch.setattr(functional, "_explicit", computed)
    with pytest.raises(error, match=message):
        call()


def test_dtype_errors_are_type_and_value_errors() -> None:
    with pytest.raises(DTypeError) as caught:
        attention(*qkv(), torch.ones(5, 7, dtype=torch.int32))
    assert isinstance(caught.value, TypeError)
    assert isinstance(caught.value, ValueError)


CONSTRUCTOR_CASES = {
    "indivisible": (
        {"d_model": 10, "num_heads": 3},
        ValueError,
        r"`d_model` must be divisible by `num_heads`.*received d_model=10, num_heads=3",
    ),
    "zero-heads": (
        {"d_model": 8, "num_heads": 0},
        ValueError,
        r"`num_heads` must be a positive int, received 0",
    ),
    "negative-heads": ({"d_model": 8, "num_heads": -2}, ValueError, r"received -2"),
    "float-heads": ({"d_model": 8, "num_heads": 2.0}, TypeError, r"`num_heads` must be an int, received 2.0"),
    "zero-width": (
        {"d_model": 0, "num_heads": 2},
        ValueError,
        r"`d_model` must be a positive int, received 0",
    ),
    "kv-heads": (
        {"d_model": 12, "num_heads": 6, "num_kv_heads": 4},
        ValueError,
        r"divisible by `num_kv_heads`.*num_heads=6, num_kv_heads=4",
    ),
    "dropout": (
        {"d_model": 8, "num_heads": 2, "dropout": 1.5},
        ValueError,
        r"`dropout` must be in \[0, 1\), received 1.5",
    ),
    "head-dim": (
        {"d_model": 8, "num_heads": 2, "head_dim": 0},
        ValueError,
        r"`head_dim` must be a positive int, received 0",
    ),
    "value-head-dim": (
        {"d_model": 8, "num_heads": 2, "value_head_dim": -1},
        ValueError,
        r"`value_head_dim`.*received -1",
    ),
    "kdim": ({"d_model": 8, "num_heads": 2, "kdim": "4"}, TypeError, r"`kdim` must be an int, received '4'"),
    "bias": (
        {"d_model": 8, "num_heads": 2, "bias": None},
        TypeError,
        r"`bias` must be True or False, received None",
    ),
}


@pytest.mark.parametrize("case", list(CONSTRUCTOR_CASES))
def test_constructor_rejects(case: str) -> None:
    kwargs, error, message = CONSTRUCTOR_CASES[case]
    with pytest.raises(error, match=message):
        MultiHeadAttention(**kwargs)


def test_head_dim_lifts_divisibility_requirement() -> None:
    assert MultiHeadAttention(10, 3, head_dim=4).q_proj.weight.shape == (12, 10)


def module() -> MultiHeadAttention:
    return MultiHeadAttention(16, 4, kdim=6, vdim=5)


FORWARD_CASES = {
    "query-rank": (
        lambda m: m(torch.randn(5, 16)),
        ValueError,
        r"`query` must be 3-D \(B, L, 16\), received query.shape=\(5, 16\)",
    ),
    "query-width": (
        lambda m: m(torch.randn(2, 5, 15), torch.randn(2, 7, 6), torch.randn(2, 7, 5)),
        ValueError,
        r"`query` must have 16 features .*query.shape=\(2, 5, 15\)",
    ),
    "key-width": (
        lambda m: m(torch.randn(2, 5, 16), torch.randn(2, 7, 16), torch.randn(2, 7, 5)),
        ValueError,
        r"`key` must have 6 features .*key.shape=\(2, 7, 16\)",
    ),
    "value-width": (
        lambda m: m(torch.randn(2, 5, 16), torch.randn(2, 7, 6), torch.randn(2, 7, 6)),
        ValueError,
        r"`value` must have 5 features",
    ),
    "batch": (
        lambda m: m(torch.randn(2, 5, 16), torch.randn(3, 7, 6), torch.randn(3, 7, 5)),
        ValueError,
        r"batch size B, received query.shape=\(2, 5, 16\), key.shape=\(3, 7, 6\)",
    ),
    "length": (
        lambda m: m(torch.randn(2, 5, 16), torch.randn(2, 7, 6), torch.randn(2, 8, 5)),
        ValueError,
        r"same length Lk, received key.shape=\(2, 7, 6\), value.shape=\(2, 8, 5\)",
    ),
    "not-tensor": (lambda m: m([[1.0]]), TypeError, r"`query` must be a torch.Tensor, received list"),
    "key-mask-shape": (
        lambda m: m(*inputs(), key_mask=torch.ones(2, 5, dtype=torch.bool)),
        ValueError,
        r"`key_mask` must have shape \(B, Lk\)=\(2, 7\), received key_mask.shape=\(2, 5\)",
    ),
    "key-mask-dtype": (
        lambda m: m(*inputs(), key_mask=torch.ones(2, 7)),
        TypeError,
        r"`key_mask` must be boolean, received dtype torch.float32",
    ),
    "query-mask-shape": (
        lambda m: m(*inputs(), query_mask=torch.ones(2, 7, dtype=torch.bool)),
        ValueError,
        r"`query_mask` must have shape \(B, Lq\)=\(2, 5\), received query_mask.shape=\(2, 7\)",
    ),
    "query-mask-dtype": (
        lambda m: m(*inputs(), query_mask=torch.ones(2, 5)),
        TypeError,
        r"`query_mask` must be boolean, received dtype torch.float32",
    ),
    "query-mask-with-bad-key-mask": (
        lambda m: m(*inputs(), query_mask=torch.ones(2, 5, dtype=torch.bool), key_mask=torch.ones(2, 5).bool()),
        ValueError,
        r"`key_mask` must have shape \(B, Lk\)=\(2, 7\)",
    ),
    "mask-rank": (
        lambda m: m(*inputs(), mask=torch.ones(7, dtype=torch.bool)),
        ValueError,
        r"`mask` must be 2-D \(Lq, Lk\), 3-D \(B, Lq, Lk\) or 4-D .*received mask.shape=\(7,\)",
    ),
    "mask-shape": (
        lambda m: m(*inputs(), mask=torch.ones(2, 7, 5, dtype=torch.bool)),
        ValueError,
        r"broadcastable to \(B, H, Lq, Lk\)=\(2, 4, 5, 7\), received mask.shape=\(2, 1, 7, 5\)",
    ),
    "integer-mask": (
        lambda m: m(*inputs(), mask=torch.ones(5, 7, dtype=torch.int64)),
        TypeError,
        r"`mask` must be boolean .*torch.int64",
    ),
}


def inputs() -> tuple[torch.Tensor, ...]:
    return torch.randn(2, 5, 16), torch.randn(2, 7, 6), torch.randn(2, 7, 5)


@pytest.mark.parametrize("case", list(FORWARD_CASES))
def test_forward_rejects_before_computing(case: str) -> None:
    call, error, message = FORWARD_CASES[case]
    m = module()
    projected = []
    for proj in (m.q_proj, m.k_proj, m.v_proj, m.out_proj):
        proj.register_forward_hook(lambda *_: projected.append(True))
    with pytest.raises(error, match=message):
        call(m)
    assert not projected
