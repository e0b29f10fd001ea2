"""``multihead.torch.attention`` against the float64 oracle, on both internal paths.

Notation: B batch, H heads, Hkv key/value heads, Lq/Lk lengths, Dk/Dv head dims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import multihead.torch.functional as functional
from conftest import broadcast_shapes, randn, to_numpy
from multihead import reference
from multihead.torch import attention

pytestmark = pytest.mark.usefixtures("fused_kernel")  # these tests are about the fused path's results


@dataclass(frozen=True)
class Size:
    batch: int
    heads: int
    kv_heads: int
    lq: int
    lk: int
    dk: int
    dv: int

    def __str__(self) -> str:
        return f"B{self.batch}-H{self.heads}/{self.kv_heads}-Lq{self.lq}-Lk{self.lk}-Dk{self.dk}-Dv{self.dv}"

    def tensors(self, dtype: torch.dtype, requires_grad: bool = False) -> tuple[torch.Tensor, ...]:
        return (
            randn(self.batch, self.heads, self.lq, self.dk, dtype=dtype, requires_grad=requires_grad),
            randn(self.batch, self.kv_heads, self.lk, self.dk, dtype=dtype, requires_grad=requires_grad),
            randn(self.batch, self.kv_heads, self.lk, self.dv, dtype=dtype, requires_grad=requires_grad),
        )


SIZES = [
    Size(2, 4, 4, 5, 7, 8, 8),  # Lq < Lk
    Size(2, 4, 4, 7, 5, 8, 8),  # Lq > Lk
    Size(1, 3, 3, 1, 9, 59, 59),  # one query, odd head dim
    Size(2, 6, 2, 13, 13, 16, 11),  # GQA, Dv != Dk
    Size(1, 8, 1, 9, 4, 111, 7),  # MQA, Lq > Lk, head dim 111
    Size(1, 2, 2, 113, 203, 32, 32),  # flash-attention's awkward 113 x 203
]
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5}


def random_mask(shape: tuple[int, ...], kind: str, generator: torch.Generator) -> torch.Tensor:
    if kind == "bool":
        return torch.rand(shape, generator=generator) > 0.3
    bias = torch.randn(shape, generator=generator, dtype=torch.float64)
    return bias.masked_fill(torch.rand(shape, generator=generator) < 0.3, float("-inf"))


def both_paths(q, k, v, mask=None, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(fused out, explicit out, explicit weights)`` for the same call."""
    fused = attention(q, k, v, mask, **kwargs)
    explicit, weights = attention(q, k, v, mask, return_weights=True, **kwargs)
    return fused, explicit, weights


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_matches_reference(size: Size, causal: bool, mask_kind: str | None, dtype: torch.dtype) -> None:
    q, k, v = size.tensors(dtype)
    generator = torch.Generator().manual_seed(1)
    mask = None
    if mask_kind is not None:
        mask = random_mask((size.batch, 1, size.lq, size.lk), mask_kind, generator)
        mask = mask if mask.dtype == torch.bool else mask.to(dtype)
    expected, expected_weights = reference.attention(
        to_numpy(q), to_numpy(k), to_numpy(v), None if mask is None else to_numpy(mask), causal=causal
    )
    fused, explicit, weights = both_paths(q, k, v, mask, causal=causal)
    for got in (fused, explicit):
        assert got.dtype == dtype
        np.testing.assert_allclose(to_numpy(got), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    np.testing.assert_allclose(to_numpy(weights), expected_weights, atol=TOLERANCE[dtype])


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", broadcast_shapes(), ids=lambda s: "x".join(map(str, s)))
def test_every_mask_broadcast_shape(shape: tuple[int, ...], causal: bool, mask_kind: str) -> None:
    q, k, v = randn(2, 3, 4, 6), randn(2, 3, 5, 6), randn(2, 3, 5, 7)
    mask = random_mask(shape, mask_kind, torch.Generator().manual_seed(len(shape)))
    expected, expected_weights = reference.attention(
        to_numpy(q), to_numpy(k), to_numpy(v), to_numpy(mask), causal=causal
    )
    fused, explicit, weights = both_paths(q, k, v, mask, causal=causal)
    np.testing.assert_allclose(to_numpy(fused), expected, atol=1e-12)
    np.testing.assert_allclose(to_numpy(explicit), expected, atol=1e-12)
    np.testing.assert_allclose(to_numpy(weights), expected_weights, atol=1e-12)


@pytest.mark.parametrize(("lq", "lk"), [(2, 5), (5, 5), (5, 2), (1, 7)])
def test_causal_is_bottom_right_and_ands_with_mask(lq: int, lk: int) -> None:
    q, k, v = randn(1, 2, lq, 4), randn(1, 2, lk, 4), randn(1, 2, lk, 4)
    mask = torch.rand(lq, lk) > 0.4
    _, weights = attention(q, k, v, mask, causal=True, return_weights=True)
    allowed = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq) & mask
    assert torch.all(weights[..., ~allowed] == 0)
    rows = allowed.any(-1)
    torch.testing.assert_close(weights.sum(-1)[..., rows], torch.ones_like(weights.sum(-1)[..., rows]))


def test_float_mask_is_added_to_scores() -> None:
    q, k, v = randn(1, 1, 3, 4), randn(1, 1, 6, 4), randn(1, 1, 6, 4)
    bias = randn(3, 6)
    _, unbiased = attention(q, k, v, return_weights=True)
    _, biased = attention(q, k, v, bias, return_weights=True)
    expected = unbiased * bias.exp()
    torch.testing.assert_close(biased, expected / expected.sum(-1, keepdim=True))


@pytest.mark.parametrize("scale", [0.0, 0.3, 2.5])
def test_scale_override(scale: float) -> None:
    q, k, v = randn(2, 2, 5, 8), randn(2, 2, 6, 8), randn(2, 2, 6, 3)
    expected, _ = reference.attention(to_numpy(q), to_numpy(k), to_numpy(v), scale=scale)
    for got in both_paths(q, k, v, scale=scale)[:2]:
        np.testing.assert_allclose(to_numpy(got), expected, atol=1e-12)


def test_default_scale_uses_head_dim_not_model_width() -> None:
    q, k, v = randn(1, 4, 3, 16), randn(1, 4, 3, 16), randn(1, 4, 3, 16)
    torch.testing.assert_close(attention(q, k, v), attention(q, k, v, scale=1 / math.sqrt(16)))


def test_gqa_equals_repeated_key_value_heads() -> None:
    q, k, v = randn(2, 8, 5, 4), randn(2, 2, 6, 4), randn(2, 2, 6, 3)
    repeated = attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
    for got in both_paths(q, k, v)[:2]:
        torch.testing.assert_close(got, repeated)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fused_path_equals_explicit_path(causal: bool, dtype: torch.dtype) -> None:
    q, k, v = (x.to(dtype) for x in Size(2, 4, 2, 9, 12, 24, 16).tensors(torch.float32))
    mask = torch.rand(2, 1, 9, 12) > 0.3
    fused, explicit, _ = both_paths(q, k, v, mask, causal=causal)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(fused, explicit, atol=4 * eps, rtol=4 * eps)


# --- fully masked rows -----------------------------------------------------------------------------------


def patterned_mask(lq: int, lk: int) -> torch.Tensor:
    """Every 4th query row fully masked, the rest a checkerboard-like pattern."""
    rows, cols = torch.meshgrid(torch.arange(lq), torch.arange(lk), indexing="ij")
    mask = (rows + cols) % 3 != 0
    mask[::4] = False
    return mask


@pytest.mark.parametrize("guarded", [False, True], ids=["kernel-zeroes", "opened-and-zeroed"])
@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
def test_fully_masked_rows_are_zero_with_zero_finite_gradients(
    return_weights: bool, mask_kind: str, dropout: float, guarded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if guarded:  # what the fused path does on devices whose kernels do not zero such rows themselves
        monkeypatch.setattr(functional, "KERNELS_ZERO_DEAD_ROWS", frozenset())
    q, k, v = Size(2, 4, 2, 10, 7, 8, 5).tensors(torch.float64, requires_grad=True)
    mask = patterned_mask(10, 7)
    if mask_kind == "float":
        mask = torch.zeros(10, 7, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    result = attention(q, k, v, mask, dropout=dropout, return_weights=return_weights)
    out = result[0] if return_weights else result
    dead = torch.arange(10) % 4 == 0
    assert torch.all(out[:, :, dead] == 0)
    assert torch.isfinite(out).all()
    if return_weights:
        assert torch.all(result[1][:, :, dead] == 0)
    out.square().sum().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    assert torch.all(q.grad[:, :, dead] == 0)
    assert q.grad[:, :, ~dead].abs().sum() > 0


def test_fully_masked_rows_do_not_change_key_value_gradients() -> None:
    q, k, v = Size(1, 2, 2, 8, 6, 4, 4).tensors(torch.float64, requires_grad=True)
    mask = patterned_mask(8, 6)
    live = mask.any(-1)
    attention(q, k, v, mask).sum().backward()
    grads = k.grad.clone(), v.grad.clone()
    k.grad = v.grad = None
    attention(q[:, :, live], k, v, mask[live]).sum().backward()
    torch.testing.assert_close((k.grad, v.grad), grads)


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
def test_causal_with_more_queries_than_keys_zeroes_leading_rows(return_weights: bool) -> None:
    q, k, v = randn(1, 2, 6, 4, requires_grad=True), randn(1, 2, 2, 4), randn(1, 2, 2, 4)
    result = attention(q, k, v, causal=True, return_weights=return_weights)
    out = result[0] if return_weights else result
    assert torch.all(out[:, :, :4] == 0)
    assert torch.all(out[:, :, 4:] != 0)
    out.sum().backward()
    assert torch.all(q.grad[:, :, :4] == 0)


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
def test_no_keys_gives_zeros(return_weights: bool) -> None:
    q, k, v = randn(2, 2, 3, 4), randn(2, 2, 0, 4), randn(2, 2, 0, 5)
    result = attention(q, k, v, causal=True, return_weights=return_weights)
    out = result[0] if return_weights else result
    assert out.shape == (2, 2, 3, 5)
    assert torch.all(out == 0)


# --- precision -------------------------------------------------------------------------------------------


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The tutorials' implementation, computed entirely in the inputs' dtype."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
def test_half_precision_error_budget(return_weights: bool, dtype: torch.dtype) -> None:
    q, k, v = (x.to(dtype) for x in Size(2, 4, 4, 64, 80, 64, 64).tensors(torch.float32))
    expected, _ = reference.attention(to_numpy(q), to_numpy(k), to_numpy(v))
    result = attention(q, k, v, return_weights=return_weights)
    out = result[0] if return_weights else result
    assert out.dtype == dtype
    ours = np.abs(to_numpy(out) - expected).max()
    plain = np.abs(to_numpy(plain_attention(q, k, v)) - expected).max()
    floor = 4 * torch.finfo(dtype).eps * np.abs(expected).max()
    assert ours <= 2 * plain + floor, (ours, plain)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
def test_half_precision_large_logits_do_not_overflow(return_weights: bool, dtype: torch.dtype) -> None:
    q, k, v = (x.to(dtype) for x in Size(1, 2, 2, 16, 16, 64, 64).tensors(torch.float32))
    q, k = q * 40, k * 40  # logits in the thousands: fp16 overflows at 65504 before scaling
    assert (q.double() @ k.double().transpose(-1, -2)).abs().max() / 8 > 1000
    mask = patterned_mask(16, 16)
    expected, _ = reference.attention(to_numpy(q), to_numpy(k), to_numpy(v), to_numpy(mask))
    result = attention(q, k, v, mask, return_weights=return_weights)
    out = result[0] if return_weights else result
    assert torch.isfinite(out).all()
    assert torch.all(out[:, :, ::4] == 0)
    tolerance = 4 * torch.finfo(dtype).eps * np.abs(expected).max()
    np.testing.assert_allclose(to_numpy(out), expected, atol=tolerance)


def test_float64_inputs_compute_in_float64() -> None:
    q, k, v = randn(1, 1, 3, 4), randn(1, 1, 3, 4), randn(1, 1, 3, 4)
    q32_error = (attention(q.float(), k.float(), v.float()).double() - attention(q, k, v)).abs().max()
    assert attention(q, k, v).dtype == torch.float64
    expected, _ = reference.attention(to_numpy(q), to_numpy(k), to_numpy(v))
    assert np.abs(to_numpy(attention(q, k, v)) - expected).max() < 1e-14 < q32_error


# --- dropout and determinism -----------------------------------------------------------------------------


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
def test_dropout_statistics(return_weights: bool) -> None:
    p, lk = 0.3, 32
    q, k = randn(4, 4, 32, 8, dtype=torch.float32), randn(4, 4, lk, 8, dtype=torch.float32)
    v = torch.eye(lk).expand(4, 4, lk, lk)  # out = the dropped, rescaled weights themselves
    _, weights = attention(q, k, v, return_weights=True)
    result = attention(q, k, v, dropout=p, return_weights=return_weights)
    out = result[0] if return_weights else result
    if return_weights:
        torch.testing.assert_close(result[1], weights)  # weights are returned before dropout
    dropped = out == 0
    assert abs(dropped.float().mean().item() - p) < 0.02
    torch.testing.assert_close(out[~dropped], weights[~dropped] / (1 - p))


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
def test_same_seed_same_dropout_and_bitwise_repeatable(return_weights: bool) -> None:
    q, k, v = Size(2, 4, 4, 9, 9, 8, 8).tensors(torch.float32)

    def run(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        result = attention(q, k, v, dropout=0.4, causal=True, return_weights=return_weights)
        return result[0] if return_weights else result

    assert torch.equal(run(3), run(3))
    assert not torch.equal(run(3), run(4))
    assert torch.equal(attention(q, k, v), attention(q, k, v))


def test_no_dropout_when_zero() -> None:
    q, k, v = Size(1, 2, 2, 5, 5, 4, 4).tensors(torch.float32)
    torch.manual_seed(0)
    first = attention(q, k, v, dropout=0.0)
    torch.manual_seed(1)
    assert torch.equal(first, attention(q, k, v, dropout=0.0))


# --- gradients -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradcheck_float64(causal: bool, return_weights: bool) -> None:
    q, k, v = Size(1, 4, 2, 3, 5, 4, 3).tensors(torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False, True, True], [False] * 5, [True, False, True, True, False]])

    def fn(q, k, v):
        result = attention(q, k, v, mask, causal=causal, return_weights=return_weights)
        return result if return_weights else (result,)

    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize(("lq", "lk"), [(6, 6), (3, 7)])
@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
def test_causality_through_gradients(lq: int, lk: int, return_weights: bool) -> None:
    q, k, v = (
        randn(1, 2, lq, 4, requires_grad=True),
        randn(1, 2, lk, 4, requires_grad=True),
        randn(1, 2, lk, 4, requires_grad=True),
    )
    for i in range(lq):
        result = attention(q, k, v, causal=True, return_weights=return_weights)
        out = result[0] if return_weights else result
        (grad_k, grad_v) = torch.autograd.grad(out[:, :, i].sum(), (k, v))
        visible = i + lk - lq
        assert torch.all(grad_k[:, :, visible + 1 :] == 0)
        assert torch.all(grad_v[:, :, visible + 1 :] == 0)
        assert torch.all(grad_v[:, :, : visible + 1].abs().sum(-1) > 0)


def test_small_inference_takes_the_explicit_math(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small calls without gradients skip the kernel (faster there) and give what the kernel gives."""
    q, k, v = randn(2, 4, 5, 8), randn(2, 2, 7, 8), randn(2, 2, 7, 6)
    mask = torch.rand(2, 1, 5, 7) > 0.5
    fused = attention(q, k, v, mask, causal=True)
    monkeypatch.setattr(functional, "SMALL_INFERENCE_SCORES", 128 * 128)
    monkeypatch.setattr(functional, "_fused", lambda *args: pytest.fail("the kernel ran for a small inference call"))
    torch.testing.assert_close(attention(q, k, v, mask, causal=True), fused)
    with pytest.raises(pytest.fail.Exception):
        attention(q.requires_grad_(), k, v, mask, causal=True)  # gradients: the kernel's backward is faster
