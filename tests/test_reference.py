"""The NumPy oracle against hand-computed cases: the tests of everything else stand on it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from multihead import reference


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


@pytest.mark.parametrize(
    ("q", "k", "v", "message"),
    [
        ((2, 1, 3, 4), (2, 1, 3, 5), (2, 1, 3, 4), "same head dim Dk"),
        ((2, 1, 3, 4), (1, 1, 3, 4), (2, 1, 3, 4), "batch size"),
        ((2, 3, 3, 4), (2, 2, 3, 4), (2, 2, 3, 4), "multiple of the key/value heads"),
        ((2, 3, 4), (2, 3, 4), (2, 3, 4), "4-D"),
    ],
)
def test_shape_errors(q: tuple, k: tuple, v: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        reference.attention(np.zeros(q), np.zeros(k), np.zeros(v))


def test_integer_mask_is_rejected() -> None:
    with pytest.raises(TypeError, match="boolean"):
        reference.attention(
            np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 2, 2)), np.ones((2, 2), int)
        )
