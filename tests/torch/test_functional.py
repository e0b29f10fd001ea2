"""``multihead.torch.attention`` and ``packed_attention`` against the float64 oracle, on every path
``implementation`` chooses: the fused kernel, the explicit math, and ``"auto"``'s choice between them.

Notation: B batch, H heads, Hkv key/value heads, Lq/Lk lengths, Dk/Dv head dims; packed: N queries and M keys in
all, n and m of one sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import multihead.torch.functional as functional
from attention_cases import reference_gradients
from conftest import PATHS, TorchCalls, broadcast_shapes, path_for, randn, to_numpy
from multihead import reference
from multihead.torch import attention
from multihead.torch.functional import IMPLEMENTATIONS, packed_attention

TWO_PATHS = pytest.mark.parametrize("implementation", ["fused", "explicit"])


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
    fused = attention(q, k, v, mask, implementation="fused", **kwargs)
    explicit, weights = attention(q, k, v, mask, return_weights=True, implementation="explicit", **kwargs)
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


@TWO_PATHS
def test_default_scale_uses_head_dim_not_model_width(implementation: str) -> None:
    q, k, v = randn(1, 4, 3, 16), randn(1, 4, 3, 16), randn(1, 4, 3, 16)
    torch.testing.assert_close(
        attention(q, k, v, implementation=implementation),
        attention(q, k, v, scale=1 / math.sqrt(16), implementation=implementation),
    )


def test_gqa_equals_repeated_key_value_heads() -> None:
    q, k, v = randn(2, 8, 5, 4), randn(2, 2, 6, 4), randn(2, 2, 6, 3)
    repeated = attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), implementation="fused")
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


@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
@pytest.mark.parametrize("path", ["fused", "fused-opened-and-zeroed", "explicit"])
def test_fully_masked_rows_are_zero_with_zero_finite_gradients(path: str, mask_kind: str, dropout: float) -> None:
    """``fused``: the kernel as it runs here (CPU kernels zero such rows themselves); ``fused-opened-and-zeroed``:
    the kernel with the guard the fused path puts around kernels of other devices, which do not."""
    q, k, v = Size(2, 4, 2, 10, 7, 8, 5).tensors(torch.float64, requires_grad=True)
    mask = patterned_mask(10, 7)
    if mask_kind == "float":
        mask = torch.zeros(10, 7, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    return_weights = path == "explicit"
    if path == "fused-opened-and-zeroed":
        result = functional._fused(q, k, v, mask, False, None, dropout, guard_dead_rows=True)
    else:
        result = attention(q, k, v, mask, dropout=dropout, return_weights=return_weights, implementation=path)
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


@TWO_PATHS
def test_fully_masked_rows_do_not_change_key_value_gradients(implementation: str) -> None:
    q, k, v = Size(1, 2, 2, 8, 6, 4, 4).tensors(torch.float64, requires_grad=True)
    mask = patterned_mask(8, 6)
    live = mask.any(-1)
    attention(q, k, v, mask, implementation=implementation).sum().backward()
    grads = k.grad.clone(), v.grad.clone()
    k.grad = v.grad = None
    attention(q[:, :, live], k, v, mask[live], implementation=implementation).sum().backward()
    torch.testing.assert_close((k.grad, v.grad), grads)


@TWO_PATHS
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_a_step_mask_made_once_gives_what_the_key_mask_gives(implementation: str, dtype: torch.dtype) -> None:
    """A decoding step's key mask, made once for all its layers (``step_mask``: added to the scores, its fully masked
    rows opened and zeroed), gives the float64 oracle's output for that mask, dead rows zero: one query a row, causal,
    grouped heads, Dv != Dk."""
    q, k, v = Size(5, 6, 2, 1, 9, 8, 5).tensors(dtype)
    key_mask = torch.rand(5, 9, generator=torch.Generator().manual_seed(3)) > 0.4
    key_mask[1], key_mask[3, 4:] = False, False  # row 1 attends nothing
    expected, _ = reference.attention(
        to_numpy(q), to_numpy(k), to_numpy(v), to_numpy(key_mask[:, None, None, :]), causal=True
    )
    made = functional.step_mask(key_mask, torch.promote_types(dtype, torch.float32))
    assert made is not None
    assert functional.step_mask(None, dtype) is None
    out, _ = functional._attention(q, k, v, made, causal=True, scale=None, dropout=0.0, return_weights=False,
                                   implementation=implementation)  # fmt: skip
    assert out.dtype == dtype
    assert torch.all(out[1] == 0)
    np.testing.assert_allclose(to_numpy(out), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@PATHS
def test_causal_with_more_queries_than_keys_zeroes_leading_rows(return_weights: bool) -> None:
    q, k, v = randn(1, 2, 6, 4, requires_grad=True), randn(1, 2, 2, 4), randn(1, 2, 2, 4)
    result = attention(q, k, v, causal=True, return_weights=return_weights, implementation=path_for(return_weights))
    out = result[0] if return_weights else result
    assert torch.all(out[:, :, :4] == 0)
    assert torch.all(out[:, :, 4:] != 0)
    out.sum().backward()
    assert torch.all(q.grad[:, :, :4] == 0)


@PATHS
def test_no_keys_gives_zeros(return_weights: bool) -> None:
    q, k, v = randn(2, 2, 3, 4), randn(2, 2, 0, 4), randn(2, 2, 0, 5)
    result = attention(q, k, v, causal=True, return_weights=return_weights, implementation=path_for(return_weights))
    out = result[0] if return_weights else result
    assert out.shape == (2, 2, 3, 5)
    assert torch.all(out == 0)


# --- precision -------------------------------------------------------------------------------------------


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The tutorials' implementation, computed entirely in the inputs' dtype."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@PATHS
def test_half_precision_error_budget(return_weights: bool, dtype: torch.dtype) -> None:
    q, k, v = (x.to(dtype) for x in Size(2, 4, 4, 64, 80, 64, 64).tensors(torch.float32))
    expected, _ = reference.attention(to_numpy(q), to_numpy(k), to_numpy(v))
    result = attention(q, k, v, return_weights=return_weights, implementation=path_for(return_weights))
    out = result[0] if return_weights else result
    assert out.dtype == dtype
    ours = np.abs(to_numpy(out) - expected).max()
    plain = np.abs(to_numpy(plain_attention(q, k, v)) - expected).max()
    floor = 4 * torch.finfo(dtype).eps * np.abs(expected).max()
    assert ours <= 2 * plain + floor, (ours, plain)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@PATHS
def test_half_precision_large_logits_do_not_overflow(return_weights: bool, dtype: torch.dtype) -> None:
    q, k, v = (x.to(dtype) for x in Size(1, 2, 2, 16, 16, 64, 64).tensors(torch.float32))
    q, k = q * 40, k * 40  # logits in the thousands: fp16 overflows at 65504 before scaling
    assert (q.double() @ k.double().transpose(-1, -2)).abs().max() / 8 > 1000
    mask = patterned_mask(16, 16)
    expected, _ = reference.attention(to_numpy(q), to_numpy(k), to_numpy(v), to_numpy(mask))
    result = attention(q, k, v, mask, return_weights=return_weights, implementation=path_for(return_weights))
    out = result[0] if return_weights else result
    assert torch.isfinite(out).all()
    assert torch.all(out[:, :, ::4] == 0)
    tolerance = 4 * torch.finfo(dtype).eps * np.abs(expected).max()
    np.testing.assert_allclose(to_numpy(out), expected, atol=tolerance)


@TWO_PATHS
def test_float64_inputs_compute_in_float64(implementation: str) -> None:
    q, k, v = randn(1, 1, 3, 4), randn(1, 1, 3, 4), randn(1, 1, 3, 4)
    out = attention(q, k, v, implementation=implementation)
    q32_error = (attention(q.float(), k.float(), v.float(), implementation=implementation).double() - out).abs().max()
    assert out.dtype == torch.float64
    expected, _ = reference.attention(to_numpy(q), to_numpy(k), to_numpy(v))
    assert np.abs(to_numpy(out) - expected).max() < 1e-14 < q32_error


# --- dropout and determinism -----------------------------------------------------------------------------


@PATHS
def test_dropout_statistics(return_weights: bool) -> None:
    p, lk = 0.3, 32
    q, k = randn(4, 4, 32, 8, dtype=torch.float32), randn(4, 4, lk, 8, dtype=torch.float32)
    v = torch.eye(lk).expand(4, 4, lk, lk)  # out = the dropped, rescaled weights themselves
    _, weights = attention(q, k, v, return_weights=True)
    result = attention(q, k, v, dropout=p, return_weights=return_weights, implementation=path_for(return_weights))
    out = result[0] if return_weights else result
    if return_weights:
        torch.testing.assert_close(result[1], weights)  # weights are returned before dropout
    dropped = out == 0
    assert abs(dropped.float().mean().item() - p) < 0.02
    torch.testing.assert_close(out[~dropped], weights[~dropped] / (1 - p))


@PATHS
def test_same_seed_same_dropout_and_bitwise_repeatable(return_weights: bool) -> None:
    q, k, v = Size(2, 4, 4, 9, 9, 8, 8).tensors(torch.float32)

    def run(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        result = attention(
            q, k, v, dropout=0.4, causal=True, return_weights=return_weights, implementation=path_for(return_weights)
        )
        return result[0] if return_weights else result

    assert torch.equal(run(3), run(3))
    assert not torch.equal(run(3), run(4))
    implementation = path_for(return_weights)
    assert torch.equal(
        attention(q, k, v, implementation=implementation), attention(q, k, v, implementation=implementation)
    )


@TWO_PATHS
def test_no_dropout_when_zero(implementation: str) -> None:
    q, k, v = Size(1, 2, 2, 5, 5, 4, 4).tensors(torch.float32)
    torch.manual_seed(0)
    first = attention(q, k, v, dropout=0.0, implementation=implementation)
    torch.manual_seed(1)
    assert torch.equal(first, attention(q, k, v, dropout=0.0, implementation=implementation))


# --- gradients -------------------------------------------------------------------------------------------


@PATHS
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradcheck_float64(causal: bool, return_weights: bool) -> None:
    q, k, v = Size(1, 4, 2, 3, 5, 4, 3).tensors(torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False, True, True], [False] * 5, [True, False, True, True, False]])

    def fn(q, k, v):
        result = attention(
            q, k, v, mask, causal=causal, return_weights=return_weights, implementation=path_for(return_weights)
        )
        return result if return_weights else (result,)

    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize(("lq", "lk"), [(6, 6), (3, 7)])
@PATHS
def test_causality_through_gradients(lq: int, lk: int, return_weights: bool) -> None:
    q, k, v = (
        randn(1, 2, lq, 4, requires_grad=True),
        randn(1, 2, lk, 4, requires_grad=True),
        randn(1, 2, lk, 4, requires_grad=True),
    )
    for i in range(lq):
        result = attention(q, k, v, causal=True, return_weights=return_weights, implementation=path_for(return_weights))
        out = result[0] if return_weights else result
        (grad_k, grad_v) = torch.autograd.grad(out[:, :, i].sum(), (k, v))
        visible = i + lk - lq
        assert torch.all(grad_k[:, :, visible + 1 :] == 0)
        assert torch.all(grad_v[:, :, visible + 1 :] == 0)
        assert torch.all(grad_v[:, :, : visible + 1].abs().sum(-1) > 0)


# --- implementation: which path runs -----------------------------------------------------------------------


def kernel_ran(call: object) -> bool:
    """Whether ``call()`` ran PyTorch's fused kernel."""
    with TorchCalls() as calls:
        call()
    return calls.count(F.scaled_dot_product_attention) > 0


@pytest.mark.parametrize("requires_grad", [False, True], ids=["inference", "gradients"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", ["gqa-masked", "causal-Lq<Lk", "causal-Lq>Lk"])
def test_every_implementation_matches_reference(case: str, implementation: str, requires_grad: bool) -> None:
    size, causal, masked = {
        "gqa-masked": (Size(2, 6, 2, 13, 9, 59, 11), False, True),
        "causal-Lq<Lk": (Size(1, 4, 4, 5, 12, 8, 8), True, True),
        "causal-Lq>Lk": (Size(1, 3, 1, 9, 4, 111, 7), True, False),
    }[case]
    q, k, v = size.tensors(torch.float64, requires_grad=requires_grad)
    mask = random_mask((size.batch, 1, size.lq, size.lk), "bool", torch.Generator().manual_seed(2)) if masked else None
    out = attention(q, k, v, mask, causal=causal, implementation=implementation)
    expected, _ = reference.attention(
        to_numpy(q), to_numpy(k), to_numpy(v), None if mask is None else to_numpy(mask), causal=causal
    )
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-12, rtol=0)
    if requires_grad:
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        grads = torch.autograd.grad((out * cotangent).sum(), (q, k, v))
        mask_array = None if mask is None else to_numpy(mask)
        expected_grads = reference_gradients(*map(to_numpy, (q, k, v)), mask_array, to_numpy(cotangent), causal=causal)
        for grad, expected_grad in zip(grads, expected_grads, strict=True):
            np.testing.assert_allclose(to_numpy(grad), expected_grad, atol=1e-12, rtol=0)


def test_auto_takes_the_explicit_math_for_small_inference_on_cpu() -> None:
    """Small calls without gradients skip the kernel (faster there) and give what the kernel gives."""
    q, k, v = randn(2, 4, 5, 8), randn(2, 2, 7, 8), randn(2, 2, 7, 6)
    mask = torch.rand(2, 1, 5, 7) > 0.5
    assert not kernel_ran(lambda: attention(q, k, v, mask, causal=True))
    assert not kernel_ran(lambda: attention(q, k, v, mask, causal=True, implementation="auto"))
    auto = attention(q, k, v, mask, causal=True)
    assert torch.equal(auto, attention(q, k, v, mask, causal=True, implementation="explicit"))
    torch.testing.assert_close(auto, attention(q, k, v, mask, causal=True, implementation="fused"))


@pytest.mark.parametrize(
    "call",
    ["gradients", "dropout", "above-128x128-scores"],
)
def test_auto_takes_the_kernel_otherwise(call: str) -> None:
    """With gradients the kernel's backward is faster at every size; dropout and large score matrices too."""
    q, k, v = randn(2, 4, 5, 8), randn(2, 2, 7, 8), randn(2, 2, 7, 6)
    run = {
        "gradients": lambda: attention(q.requires_grad_(), k, v, causal=True),
        "dropout": lambda: attention(q, k, v, dropout=0.1),
        "above-128x128-scores": lambda: attention(randn(1, 1, 129, 8), randn(1, 1, 128, 8), randn(1, 1, 128, 8)),
    }[call]
    assert kernel_ran(run)


def test_auto_takes_the_explicit_math_for_the_weights() -> None:
    q, k, v = randn(2, 4, 5, 8, requires_grad=True), randn(2, 2, 7, 8), randn(2, 2, 7, 6)
    assert not kernel_ran(lambda: attention(q, k, v, return_weights=True))


def test_an_explicit_choice_is_always_followed() -> None:
    small = randn(2, 4, 5, 8), randn(2, 2, 7, 8), randn(2, 2, 7, 6)
    large = randn(1, 2, 150, 8, requires_grad=True), randn(1, 2, 150, 8), randn(1, 2, 150, 8)
    assert kernel_ran(lambda: attention(*small, implementation="fused"))
    assert not kernel_ran(lambda: attention(*large, implementation="explicit"))
    assert not kernel_ran(lambda: attention(*large, dropout=0.2, implementation="explicit"))


# --- packed_attention: sequences packed one after another, without padding ---------------------------------


@dataclass(frozen=True)
class Packing:
    name: str
    query_lengths: tuple[int, ...]
    key_lengths: tuple[int, ...]
    heads: int = 4
    kv_heads: int = 2
    dk: int = 7
    dv: int = 5

    def __str__(self) -> str:
        return self.name

    def tensors(self, requires_grad: bool = False) -> tuple[torch.Tensor, ...]:
        """float64 ``q (N, H, Dk)``, ``k (M, Hkv, Dk)``, ``v (M, Hkv, Dv)``."""
        n, m = sum(self.query_lengths), sum(self.key_lengths)
        return (
            randn(n, self.heads, self.dk, requires_grad=requires_grad),
            randn(m, self.kv_heads, self.dk, requires_grad=requires_grad),
            randn(m, self.kv_heads, self.dv, requires_grad=requires_grad),
        )


PACKINGS = [
    Packing("ragged", (3, 1, 6), (5, 4, 2)),  # n < m, n < m, n > m
    Packing("empty-sequences", (0, 4, 2, 0), (3, 0, 2, 0)),  # queries without keys, keys without queries, nothing
    Packing("nothing-at-all", (0, 0), (0, 0)),
    Packing("mqa-one-sequence", (9,), (9,), heads=6, kv_heads=1, dk=59, dv=11),
]


def sequences(x: torch.Tensor, lengths: tuple[int, ...]) -> list[torch.Tensor]:
    """A packed ``(N, H, D)`` tensor as one ``(1, H, n, D)`` tensor per sequence."""
    return [part.transpose(0, 1)[None] for part in x.split(list(lengths))]


def reference_packed(
    packing: Packing, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masks: list | None, causal: bool
) -> np.ndarray:
    """The oracle run on each sequence alone, packed again: ``(N, H, Dv)``."""
    outs = []
    parts = zip(
        sequences(q, packing.query_lengths),
        sequences(k, packing.key_lengths),
        sequences(v, packing.key_lengths),
        strict=True,
    )
    for index, (q_b, k_b, v_b) in enumerate(parts):
        mask = None if masks is None or masks[index] is None else to_numpy(masks[index])[None]
        out, _ = reference.attention(to_numpy(q_b), to_numpy(k_b), to_numpy(v_b), mask, causal=causal)
        outs.append(out[0].transpose(1, 0, 2))  # (n, H, Dv)
    return np.concatenate(outs) if outs else np.zeros((0, packing.heads, packing.dv))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("packing", PACKINGS, ids=str)
def test_packed_equals_each_sequence_alone(packing: Packing, implementation: str, causal: bool) -> None:
    q, k, v = packing.tensors()
    out = packed_attention(
        q, k, v, packing.query_lengths, packing.key_lengths, causal=causal, implementation=implementation
    )
    assert out.shape == (sum(packing.query_lengths), packing.heads, packing.dv)
    np.testing.assert_allclose(to_numpy(out), reference_packed(packing, q, k, v, None, causal), atol=1e-12, rtol=0)
    alone = [
        attention(q_b, k_b, v_b, causal=causal, implementation=implementation)[0].transpose(0, 1)
        for q_b, k_b, v_b in zip(
            sequences(q, packing.query_lengths),
            sequences(k, packing.key_lengths),
            sequences(v, packing.key_lengths),
            strict=True,
        )
    ]
    torch.testing.assert_close(out, torch.cat(alone), atol=1e-12, rtol=0)


MASK_SHAPES = ["(H, n, m)", "(n, m)", "(1, n, 1)", "(m,)", "none", "(H, 1, m)"]


def sequence_mask(layout: str, heads: int, n: int, m: int, kind: str, seed: int) -> torch.Tensor | None:
    shape = {
        "(H, n, m)": (heads, n, m),
        "(n, m)": (n, m),
        "(1, n, 1)": (1, n, 1),
        "(m,)": (m,),
        "(H, 1, m)": (heads, 1, m),
    }
    if layout == "none":
        return None
    return random_mask(shape[layout], kind, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("implementation", ["fused", "explicit"])
@pytest.mark.parametrize("packing", PACKINGS[:2], ids=str)
def test_packed_masks_are_per_sequence(packing: Packing, implementation: str, causal: bool, mask_kind: str) -> None:
    """Each sequence its own mask, of its own broadcast shape (and kind), ANDed with the causal rule."""
    q, k, v = packing.tensors()
    masks = [
        sequence_mask(MASK_SHAPES[index % len(MASK_SHAPES)], packing.heads, n, m, mask_kind, seed=index)
        for index, (n, m) in enumerate(zip(packing.query_lengths, packing.key_lengths, strict=True))
    ]
    out = packed_attention(
        q, k, v, packing.query_lengths, packing.key_lengths, masks=masks, causal=causal, implementation=implementation
    )
    expected = reference_packed(packing, q, k, v, masks, causal)
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-12, rtol=0)
    assert np.isfinite(to_numpy(out)).all()


@pytest.mark.parametrize("implementation", ["fused", "explicit"])
def test_packed_equals_the_padded_batch(implementation: str) -> None:
    """The same sequences padded into ``(B, H, L, D)`` with a key padding mask give the same rows."""
    packing = PACKINGS[0]
    q, k, v = packing.tensors()
    lq, lk = max(packing.query_lengths), max(packing.key_lengths)

    def padded(x: torch.Tensor, lengths: tuple[int, ...], length: int) -> torch.Tensor:
        parts = [F.pad(part, (0, 0, 0, length - part.shape[2])) for part in sequences(x, lengths)]
        return torch.cat(parts)  # (B, H|Hkv, length, D)

    key_mask = torch.arange(lk)[None, :] < torch.tensor(packing.key_lengths)[:, None]  # (B, Lk)
    dense = attention(
        padded(q, packing.query_lengths, lq),
        padded(k, packing.key_lengths, lk),
        padded(v, packing.key_lengths, lk),
        key_mask[:, None, None, :],
        implementation=implementation,
    )  # (B, H, Lq, Dv)
    real = torch.cat([dense[b, :, :n].transpose(0, 1) for b, n in enumerate(packing.query_lengths)])
    out = packed_attention(q, k, v, packing.query_lengths, packing.key_lengths, implementation=implementation)
    torch.testing.assert_close(out, real, atol=1e-12, rtol=0)


def test_packed_gqa_equals_repeated_key_value_heads() -> None:
    packing = PACKINGS[0]
    q, k, v = packing.tensors()
    groups = packing.heads // packing.kv_heads
    lengths = packing.query_lengths, packing.key_lengths
    repeated = packed_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), *lengths)
    torch.testing.assert_close(packed_attention(q, k, v, *lengths, causal=False), repeated)


def test_packed_lengths_may_be_tensors() -> None:
    packing = PACKINGS[0]
    q, k, v = packing.tensors()
    as_lists = packed_attention(q, k, v, list(packing.query_lengths), list(packing.key_lengths), causal=True)
    as_tensors = packed_attention(
        q, k, v, torch.tensor(packing.query_lengths), torch.tensor(packing.key_lengths), causal=True
    )
    assert torch.equal(as_tensors, as_lists)


@pytest.mark.parametrize("implementation", ["fused", "explicit"])
@pytest.mark.parametrize("packing", [PACKINGS[1], PACKINGS[3]], ids=str)
def test_packed_gradients_match_the_oracle(packing: Packing, implementation: str) -> None:
    """Gradients w.r.t. the packed q, k, v equal the hand-derived float64 ones of each sequence alone; queries that
    have no key get none."""
    q, k, v = packing.tensors(requires_grad=True)
    masks = [
        sequence_mask("(n, m)", packing.heads, n, m, "bool", seed=index)
        for index, (n, m) in enumerate(zip(packing.query_lengths, packing.key_lengths, strict=True))
    ]
    out = packed_attention(
        q, k, v, packing.query_lengths, packing.key_lengths, masks=masks, causal=True, implementation=implementation
    )
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    grads = torch.autograd.grad((out * cotangent).sum(), (q, k, v), materialize_grads=True)
    expected = [[], [], []]
    parts = zip(
        sequences(q, packing.query_lengths),
        sequences(k, packing.key_lengths),
        sequences(v, packing.key_lengths),
        sequences(cotangent, packing.query_lengths),
        masks,
        strict=True,
    )
    for q_b, k_b, v_b, cot_b, mask in parts:
        arrays = [to_numpy(x) for x in (q_b, k_b, v_b)]
        for index, grad in enumerate(reference_gradients(*arrays, to_numpy(mask), to_numpy(cot_b), causal=True)):
            expected[index].append(grad[0].transpose(1, 0, 2))  # (n|m, H|Hkv, D)
    for grad, parts_of_expected in zip(grads, expected, strict=True):
        np.testing.assert_allclose(to_numpy(grad), np.concatenate(parts_of_expected), atol=1e-12, rtol=0)
    offsets = np.cumsum((0, *packing.query_lengths))
    for b, m in enumerate(packing.key_lengths):
        if m == 0:
            assert torch.all(grads[0][offsets[b] : offsets[b + 1]] == 0)


def test_packed_attention_is_part_of_the_front_end() -> None:
    import multihead.torch

    assert multihead.torch.packed_attention is packed_attention
    assert "packed_attention" in multihead.torch.__all__
