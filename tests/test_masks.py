"""The shared mask rules (``multihead.masks``) through the PyTorch front end's tensor operations, against the same
rules written out in NumPy.

Notation: B batch, H heads, Lq query length, Lk key length.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attention_cases import causal_allowed
from conftest import broadcast_shapes
from multihead import masks
from multihead.torch.masks import OPS


def as_numpy(x: torch.Tensor) -> np.ndarray:
    return x.numpy()


def random_bool(shape: tuple[int, ...], seed: int, keep: float = 0.6) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < keep


def random_float(shape: tuple[int, ...], seed: int, forbid: float = 0.4) -> torch.Tensor:
    """Biases with ``-inf`` where forbidden, and a few fully forbidden rows when the shape has rows."""
    generator = torch.Generator().manual_seed(seed)
    bias = torch.randn(shape, generator=generator, dtype=torch.float64)
    return bias.masked_fill(torch.rand(shape, generator=generator) < forbid, float("-inf"))


@pytest.mark.parametrize(("lq", "lk"), [(1, 1), (4, 4), (3, 8), (8, 3), (0, 3), (3, 0), (1, 7)])
def test_causal_diagonal_gives_the_bottom_right_rule(lq: int, lk: int) -> None:
    triangle = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=masks.causal_diagonal(lq, lk))
    np.testing.assert_array_equal(as_numpy(triangle), causal_allowed(lq, lk))


def test_restrict_with_nothing_to_restrict() -> None:
    mask = random_bool((2, 3), seed=0)
    allowed = random_bool((2, 3), seed=1)
    assert masks.restrict(None, None, OPS) is None
    assert masks.restrict(mask, None, OPS) is mask
    assert masks.restrict(None, allowed, OPS) is allowed


@pytest.mark.parametrize("allowed_shape", broadcast_shapes((2, 3, 4, 5))[::3], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask_shape", [(2, 1, 4, 5), (5,), (1, 3, 1, 1)], ids=lambda s: "x".join(map(str, s)))
def test_restrict_is_and_in_the_masks_kind(mask_shape: tuple[int, ...], allowed_shape: tuple[int, ...]) -> None:
    allowed = random_bool(allowed_shape, seed=2)
    bool_mask = random_bool(mask_shape, seed=3)
    float_mask = random_float(mask_shape, seed=4)

    anded = masks.restrict(bool_mask, allowed, OPS)
    assert anded.dtype == torch.bool
    np.testing.assert_array_equal(as_numpy(anded), as_numpy(bool_mask) & as_numpy(allowed))

    restricted = masks.restrict(float_mask, allowed, OPS)
    assert restricted.dtype == torch.float64
    expected = np.where(as_numpy(allowed), as_numpy(float_mask), -np.inf)  # kept biases stay, exactly
    np.testing.assert_array_equal(as_numpy(restricted), expected)


def test_open_dead_rows_without_a_mask() -> None:
    assert masks.open_dead_rows(None, OPS) == (None, None)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize(
    "shape", [(2, 3, 6, 5), (6, 5), (1, 1, 6, 1), (2, 1, 1, 5), (6, 0), (0, 5)], ids=lambda s: "x".join(map(str, s))
)
def test_open_dead_rows_opens_exactly_the_fully_masked_rows(shape: tuple[int, ...], kind: str) -> None:
    mask = random_bool(shape, seed=5, keep=0.3) if kind == "bool" else random_float(shape, seed=5, forbid=0.7)
    rows = shape[-2] > 2 and shape[-1] > 0
    if rows:
        mask[..., 1, :] = False if kind == "bool" else float("-inf")  # one row surely dead ...
        mask[..., 2, :] = True if kind == "bool" else 0.0  # ... and one surely live
    opened, live = masks.open_dead_rows(mask, OPS)

    values = as_numpy(mask)
    allowed = values if kind == "bool" else ~np.isneginf(values)
    expected_live = allowed.any(axis=-1, keepdims=True)  # (..., Lq|1, 1)
    np.testing.assert_array_equal(as_numpy(live), expected_live)
    if rows:
        assert not expected_live[..., 1, :].any()
        assert expected_live[..., 2, :].all()
    # A dead row attends every key (bool) or adds nothing to the scores (float); live rows are unchanged.
    expected = values | ~expected_live if kind == "bool" else np.where(expected_live, values, 0.0)
    assert opened.dtype == mask.dtype
    np.testing.assert_array_equal(as_numpy(opened), np.broadcast_to(expected, values.shape))
    opened_allowed = as_numpy(opened) if kind == "bool" else ~np.isneginf(as_numpy(opened))
    if shape[-1] > 0:  # after opening, no row reaches the softmax with nothing to attend
        assert opened_allowed.any(axis=-1).all()


def test_the_torch_front_end_helpers_are_the_shared_rules() -> None:
    from multihead.torch import masks as torch_masks

    mask, allowed = random_float((3, 4), seed=6, forbid=0.8), random_bool((1, 4), seed=7)
    torch.testing.assert_close(torch_masks.restrict(mask, allowed), masks.restrict(mask, allowed, OPS))
    for got, expected in zip(torch_masks.open_dead_rows(mask), masks.open_dead_rows(mask, OPS), strict=True):
        torch.testing.assert_close(got, expected)
    torch.testing.assert_close(torch_masks.causal_mask(3, 5), torch.tensor(causal_allowed(3, 5)))
