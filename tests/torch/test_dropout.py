"""Dropout on the CPU from 16-bit random numbers: each element zeroed or scaled exactly, at the asked rate in every
position of the 64-bit words the numbers come from, with the gradient of what it computed."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from multihead.torch import Transformer
from multihead.torch.dropout import LEVELS, Dropout, dropout


def rate_bound(p: float, n: int) -> float:
    """Six standard deviations of the fraction dropped among ``n`` elements."""
    return 6 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("p", [0.1, 0.5, 1 / 3, 0.9])
def test_each_element_is_zeroed_or_scaled_at_the_asked_rate_in_every_word_position(p: float) -> None:
    torch.manual_seed(0)
    x = torch.rand(1000, 1003) + 0.5  # no zeros of its own; not a multiple of 4 elements
    out = dropout(x, p, training=True)
    dropped = out == 0
    scale = LEVELS / (LEVELS - round(p * LEVELS))
    torch.testing.assert_close(out[~dropped], x[~dropped] * scale, rtol=0, atol=0)
    assert abs(scale * (1 - p) - 1) < 1e-4  # the rate rounded to a multiple of 2⁻¹⁶
    flat = dropped.flatten()
    assert abs(flat.double().mean().item() - p) < rate_bound(p, flat.numel())
    for position in range(4):  # each 16-bit part of the words drawn (a part with a fixed bit would show here)
        part = flat[position::4]
        assert abs(part.double().mean().item() - p) < rate_bound(p, part.numel()), position


def test_the_gradient_is_the_scale_where_kept_and_zero_where_dropped() -> None:
    torch.manual_seed(1)
    x = (torch.rand(37, 41) + 0.5).requires_grad_()
    out = dropout(x, 0.25, training=True)
    out.sum().backward()
    expected = torch.where(out == 0, 0.0, LEVELS / (LEVELS - round(0.25 * LEVELS)))
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=0)


def test_the_masks_follow_the_seed_and_differ_between_calls() -> None:
    x = torch.ones(64, 64)
    torch.manual_seed(3)
    first, second = dropout(x, 0.5, training=True), dropout(x, 0.5, training=True)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.5, training=True), first)
    assert not torch.equal(first, second)


@pytest.mark.parametrize("shape", [(0,), (1,), (3, 5, 7)], ids=["empty", "one", "odd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_shapes_and_dtypes_are_kept(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = torch.ones(shape, dtype=dtype)
    out = dropout(x, 0.3, training=True)
    assert out.shape == x.shape
    assert out.dtype == dtype
    assert bool(((out == 0) | (out == out.new_tensor(LEVELS / (LEVELS - round(0.3 * LEVELS))))).all())


def test_outside_training_nothing_is_dropped_and_a_rate_below_the_resolution_is_pytorch_s() -> None:
    x = torch.randn(8, 9)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    torch.manual_seed(4)
    tiny = dropout(x, 1e-6, training=True)  # rounds to no level: PyTorch's own dropout, at the asked rate
    torch.manual_seed(4)
    torch.testing.assert_close(tiny, nn.functional.dropout(x, 1e-6, training=True), rtol=0, atol=0)


def test_the_module_is_an_nn_dropout_and_the_model_uses_it() -> None:
    module = Dropout(0.2)
    assert isinstance(module, nn.Dropout)
    assert module.p == 0.2
    assert not module.state_dict()
    x = torch.ones(16, 16)
    assert module.eval()(x) is x
    assert bool((module.train()(x) == 0).any())
    model = Transformer(11, 11, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=16)
    assert all(type(m) is Dropout for m in model.modules() if isinstance(m, nn.Dropout))
