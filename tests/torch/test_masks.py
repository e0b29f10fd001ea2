"""Mask helpers: causal alignment, padding from lengths and from tokens. (What they refuse: test_bad_inputs.py.)"""

from __future__ import annotations

import pytest
import torch

from multihead.torch import attention, causal_mask, padding_mask, padding_mask_from_tokens


def test_causal_mask_bottom_right_lq_2_lk_5() -> None:
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(2, 5), expected)


@pytest.mark.parametrize(("lq", "lk"), [(1, 1), (4, 4), (3, 8), (8, 3), (0, 3), (3, 0)])
def test_causal_mask_rule(lq: int, lk: int) -> None:
    mask = causal_mask(lq, lk)
    assert mask.shape == (lq, lk)
    assert mask.dtype == torch.bool
    for i in range(lq):
        for j in range(lk):
            assert mask[i, j] == (j <= i + lk - lq)


def test_causal_mask_square_is_lower_triangle() -> None:
    assert torch.equal(causal_mask(5, 5), torch.ones(5, 5, dtype=torch.bool).tril())


def test_causal_flag_equals_causal_mask() -> None:
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 8)
    torch.testing.assert_close(attention(q, k, v, causal=True), attention(q, k, v, causal_mask(4, 9)))


def test_padding_mask_from_lengths() -> None:
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(padding_mask(torch.tensor([2, 4, 0]), 4), expected)
    assert torch.equal(padding_mask([2, 4, 0], 4), expected)


def test_padding_mask_from_tokens() -> None:
    tokens = torch.tensor([[5, 7, 0, 0], [3, 0, 2, 0]])
    expected = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]], dtype=torch.bool)
    assert torch.equal(padding_mask_from_tokens(tokens, pad_id=0), expected)


def test_lengths_and_tokens_agree() -> None:
    lengths = torch.tensor([3, 1, 5])
    tokens = torch.where(padding_mask(lengths, 5), torch.randint(1, 9, (3, 5)), torch.zeros((), dtype=torch.long))
    assert torch.equal(padding_mask_from_tokens(tokens, 0), padding_mask(lengths, 5))
