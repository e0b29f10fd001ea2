"""The NumPy oracle against hand-computed cases: the tests of everything else stand on it. Also what it refuses:
the same bad inputs as the front ends, with the same messages."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest

from multihead import DTypeError, reference


def test_single_query_two_keys_by_hand() -> None:
    q = np.array([[[[1.0, 0.0]]]])  # (1, 1, 1, 2)
    k = np.array([[[[1.0, 0.0], [0.0, 1.0]]]])  # (1, 1, 2, 2)
    v = np.array([[[[10.0], [20.0]]]])  # (1, 1, 2, 1)
    out, weights = reference.attention(q, k, v)
    # scores = [1, 0] / sqrt(2); softmax -> [e^a, 1] / (e^a + 1) with a = 1/sqrt(2)
    a = math.exp(1 / math.sqrt(2))
    expected = np.array([a / (a + 1), 1 / (a + 1)])
    np.testing.assert_allclose(weights[0, 0, 0], expected, rtol=1e-15)
    np.testing.assert_allclose(out[0, 0, 0, 0], 10 * expected[0] + 20 * expected[1], rtol=1e-15)


def test_equal_scores_average_values() -> None:
    q = np.zeros((1, 1, 3, 4))
    k = np.ones((1, 1, 4, 4))
    v = np.arange(8.0).reshape(1, 1, 4, 2)
    out, weights = reference.attention(q, k, v)
    np.testing.assert_allclose(weights, np.full((1, 1, 3, 4), 0.25))
    np.testing.assert_allclose(out[0, 0], np.tile([3.0, 4.0], (3, 1)))


def test_causal_is_bottom_right() -> None:
    q = np.zeros((1, 1, 2, 3))
    k = np.zeros((1, 1, 5, 3))
    v = np.eye(5).reshape(1, 1, 5, 5)
    _, weights = reference.attention(q, k, v, causal=True)
    np.testing.assert_allclose(weights[0, 0], [[0.25, 0.25, 0.25, 0.25, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]])


def test_causal_with_more_queries_than_keys_masks_leading_rows() -> None:
    q = np.ones((1, 1, 4, 2))
    k = np.ones((1, 1, 2, 2))
    v = np.array([[[[1.0], [3.0]]]])
    out, weights = reference.attention(q, k, v, causal=True)
    np.testing.assert_array_equal(weights[0, 0], [[0, 0], [0, 0], [1, 0], [0.5, 0.5]])
    np.testing.assert_array_equal(out[0, 0, :, 0], [0, 0, 1, 2])


def test_float_mask_is_added_and_minus_inf_removes() -> None:
    q = np.zeros((1, 1, 1, 2))
    k = np.zeros((1, 1, 3, 2))
    v = np.array([[[[1.0], [2.0], [4.0]]]])
    mask = np.array([0.0, math.log(2.0), -np.inf])
    _, weights = reference.attention(q, k, v, mask)
    np.testing.assert_allclose(weights[0, 0, 0], [1 / 3, 2 / 3, 0.0], rtol=1e-15)


def test_fully_masked_rows_are_zero() -> None:
    q = np.ones((1, 1, 2, 2))
    k = np.ones((1, 1, 3, 2))
    v = np.ones((1, 1, 3, 2))
    mask = np.array([[True, False, True], [False, False, False]])
    out, weights = reference.attention(q, k, v, mask)
    np.testing.assert_array_equal(weights[0, 0, 1], 0.0)
    np.testing.assert_array_equal(out[0, 0, 1], 0.0)
    np.testing.assert_allclose(weights[0, 0, 0], [0.5, 0.0, 0.5])


def test_grouped_query_heads_share_key_value_heads_in_order() -> None:
    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, 6, 3, 4))
    k = rng.normal(size=(2, 2, 5, 4))
    v = rng.normal(size=(2, 2, 5, 3))
    out, _ = reference.attention(q, k, v)
    for head in range(6):
        single, _ = reference.attention(
            q[:, head : head + 1], k[:, head // 3 : head // 3 + 1], v[:, head // 3 : head // 3 + 1]
        )
        np.testing.assert_allclose(out[:, head : head + 1], single, rtol=1e-13)


def test_scale_override() -> None:
    q = np.array([[[[2.0, 0.0]]]])
    k = np.array([[[[1.0, 0.0], [0.0, 0.0]]]])
    v = np.array([[[[1.0], [0.0]]]])
    _, weights = reference.attention(q, k, v, scale=0.5)
    np.testing.assert_allclose(weights[0, 0, 0, 0], math.e / (math.e + 1), rtol=1e-15)


def test_multi_head_attention_is_project_split_attend_merge_project() -> None:
    rng = np.random.default_rng(1)
    batch, length, width, heads = 2, 4, 6, 3
    x = rng.normal(size=(batch, length, width))
    params = {f"{name}.weight": rng.normal(size=(width, width)) for name in ("q_proj", "k_proj", "v_proj", "out_proj")}
    params["v_proj.bias"] = rng.normal(size=width)
    out, weights = reference.multi_head_attention(x, None, None, params, num_heads=heads)

    q, k, v = (x @ params[f"{n}_proj.weight"].T for n in "qkv")
    v = v + params["v_proj.bias"]
    per_head = []
    for h in range(heads):
        cols = slice(2 * h, 2 * h + 2)
        scores = q[:, :, cols] @ k[:, :, cols].transpose(0, 2, 1) / math.sqrt(2)
        w = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
        np.testing.assert_allclose(weights[:, h], w, rtol=1e-12)
        per_head.append(w @ v[:, :, cols])
    np.testing.assert_allclose(out, np.concatenate(per_head, -1) @ params["out_proj.weight"].T, rtol=1e-12)


def test_multi_head_key_mask_equals_explicit_mask() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 5, 4))
    params = {f"{name}.weight": rng.normal(size=(4, 4)) for name in ("q_proj", "k_proj", "v_proj", "out_proj")}
    key_mask = np.array([[True, True, True, False, False], [True, True, True, True, True]])
    implicit, _ = reference.multi_head_attention(x, x, x, params, num_heads=2, key_mask=key_mask)
    explicit, _ = reference.multi_head_attention(x, x, x, params, num_heads=2, mask=key_mask[:, None, :].repeat(5, 1))
    np.testing.assert_allclose(implicit, explicit, rtol=1e-15)


# --- bad inputs ---------------------------------------------------------------------------------------------


class Case(NamedTuple):
    call: Callable[[], Any]
    match: str  # must name the argument
    error: type[Exception] | tuple[type[Exception], ...] = (ValueError, TypeError)  # DTypeError is both


RNG = np.random.default_rng(0)
RQ, RK, RV = RNG.normal(size=(2, 4, 5, 8)), RNG.normal(size=(2, 2, 7, 8)), RNG.normal(size=(2, 2, 7, 6))
RX, RM = RNG.normal(size=(2, 5, 16)), RNG.normal(size=(2, 7, 6))
# A module of d_model 16, 4 query heads over 2 key/value heads of 4 dims, keys and values 6 wide.
PARAMS = {
    f"{name}.{kind}": RNG.normal(size=shape[:1] if kind == "bias" else shape)
    for name, shape in {"q_proj": (16, 16), "k_proj": (8, 6), "v_proj": (8, 6), "out_proj": (16, 16)}.items()
    for kind in ("weight", "bias")
}


def ref_mha(query: Any = RX, key: Any = RM, value: Any = None, params: Any = PARAMS, **kwargs: Any) -> Any:
    return reference.multi_head_attention(query, key, value, params, **{"num_heads": 4, "num_kv_heads": 2, **kwargs})


def zeros_qkv(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    return np.zeros(q), np.zeros(k), np.zeros(v)


REFERENCE_CASES = {
    "q-string": Case(lambda: reference.attention("q", RK, RV), r"`q`"),
    "q-ragged": Case(lambda: reference.attention([[1.0], [1.0, 2.0]], RK, RV), r"`q`"),
    "k-rank": Case(lambda: reference.attention(RQ, RK[0], RV), r"`k` must be 4-D", ValueError),
    "all-rank-3": Case(lambda: reference.attention(*zeros_qkv((2, 3, 4), (2, 3, 4), (2, 3, 4))), "4-D", ValueError),
    "head-dim": Case(
        lambda: reference.attention(*zeros_qkv((2, 1, 3, 4), (2, 1, 3, 5), (2, 1, 3, 4))),
        "same head dim Dk",
        ValueError,
    ),
    "batch": Case(
        lambda: reference.attention(*zeros_qkv((2, 1, 3, 4), (1, 1, 3, 4), (2, 1, 3, 4))), "batch size", ValueError
    ),
    "heads-3-of-2": Case(
        lambda: reference.attention(*zeros_qkv((2, 3, 3, 4), (2, 2, 3, 4), (2, 2, 3, 4))),
        "multiple of the key/value heads",
        ValueError,
    ),
    "gqa": Case(lambda: reference.attention(RQ, RK[:, :1].repeat(3, 1), RV[:, :1].repeat(3, 1)), r"Hkv=3"),
    "mask-int": Case(
        lambda: reference.attention(RQ, RK, RV, np.ones((5, 7), int)), r"`mask` must be boolean", DTypeError
    ),
    "mask-shape": Case(lambda: reference.attention(RQ, RK, RV, np.ones((7, 5), bool)), r"mask.shape=\(7, 5\)"),
    "causal-string": Case(lambda: reference.attention(RQ, RK, RV, causal="no"), r"`causal`", TypeError),
    "causal-int": Case(lambda: reference.attention(RQ, RK, RV, causal=1), r"`causal`", TypeError),
    "scale-string": Case(lambda: reference.attention(RQ, RK, RV, scale="1"), r"`scale`", TypeError),
    "scale-nan": Case(lambda: reference.attention(RQ, RK, RV, scale=float("nan")), r"`scale`", ValueError),
    "mha-num-heads-zero": Case(lambda: ref_mha(num_heads=0), r"`num_heads` must be a positive int", ValueError),
    "mha-kv-heads-indivisible": Case(lambda: ref_mha(num_kv_heads=3), r"num_kv_heads=3", ValueError),
    "mha-num-heads-mismatch": Case(lambda: ref_mha(num_heads=3, num_kv_heads=None), r"num_heads"),
    "mha-query-none": Case(lambda: ref_mha(query=None), r"`query`"),
    "mha-query-2d": Case(lambda: ref_mha(query=RX[0]), r"`query` must be 3-D", ValueError),
    "mha-query-width": Case(lambda: ref_mha(query=RX[..., :8]), r"`query`.*16", ValueError),
    "mha-key-batch": Case(lambda: ref_mha(key=RM[:1]), r"`query`.*`key`.*batch|batch.*query.shape", ValueError),
    "mha-params-none": Case(lambda: ref_mha(params=None), r"`params`", TypeError),
    "mha-params-missing": Case(lambda: ref_mha(params={"q_proj.weight": PARAMS["q_proj.weight"]}), r"k_proj.weight"),
    "mha-params-wrong-shape": Case(
        lambda: ref_mha(params={**PARAMS, "q_proj.weight": PARAMS["q_proj.weight"][:12]}), r"q_proj.weight"
    ),
    "mha-key-mask-float": Case(lambda: ref_mha(key_mask=np.ones((2, 7))), r"`key_mask` must be boolean", DTypeError),
    "mha-key-mask-shape": Case(lambda: ref_mha(key_mask=np.ones((2, 5), bool)), r"`key_mask`.*\(2, 5\)", ValueError),
    "mha-mask-1d": Case(lambda: ref_mha(mask=np.ones(7, bool)), r"`mask` must be 2-D", ValueError),
    "mha-causal-string": Case(lambda: ref_mha(causal="yes"), r"`causal`", TypeError),
}


def test_reference_parameters_are_those_of_a_working_module() -> None:
    """The refusals below are each one bad argument away from a call that works."""
    out, weights = ref_mha()
    assert out.shape == (2, 5, 16)
    assert weights.shape == (2, 4, 5, 7)
    assert reference.attention(RQ, RK, RV)[0].shape == (2, 4, 5, 6)


@pytest.mark.parametrize("case", list(REFERENCE_CASES))
def test_reference_refuses_what_the_front_ends_refuse(case: str) -> None:
    bad = REFERENCE_CASES[case]
    with pytest.raises(bad.error, match=bad.match):
        bad.call()
