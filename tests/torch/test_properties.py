"""Property-based tests of ``multihead.torch`` attention over random shapes, masks, head groupings and magnitudes.

Notation: B batch, H heads, Hkv key/value heads, Lq/Lk lengths, Dk/Dv head dims, E d_model, m input magnitude.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_cases import (
    Case,
    cases,
    causal_allowed,
    dead_keys,
    peak,
    permuted_keys,
    random_mask,
    restrict,
    tolerance,
    with_edges,
    with_junk,
)
from conftest import PATHS, path_for, state_dict_numpy, to_numpy
from multihead import reference
from multihead.torch import MultiHeadAttention, attention


def as_tensor(x: np.ndarray | None, dtype: torch.dtype = torch.float64) -> torch.Tensor | None:
    """A float array in ``dtype``; a bool mask stays bool."""
    if x is None:
        return None
    return torch.tensor(x) if x.dtype == bool else torch.tensor(x, dtype=dtype)


def call(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    *,
    causal: bool,
    return_weights: bool,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``multihead.torch.attention`` on arrays: ``(out, weights)``, weights ``None`` on the fused path."""
    q, k, v, mask = (as_tensor(x, dtype) for x in (q, k, v, mask))
    result = attention(
        q, k, v, mask, causal=causal, return_weights=return_weights, implementation=path_for(return_weights)
    )
    return result if return_weights else (result, None)


# --- the functional core ---------------------------------------------------------------------------------


@PATHS
@settings(max_examples=150, deadline=None)
@given(case=cases())
@with_edges()
def test_matches_reference(case: Case, return_weights: bool) -> None:
    q, k, v, mask = case.arrays()
    expected, expected_weights = reference.attention(q, k, v, mask, causal=case.causal)
    out, weights = call(q, k, v, mask, causal=case.causal, return_weights=return_weights)
    assert out.shape == expected.shape
    assert out.dtype == torch.float64
    atol = tolerance(q, k, v, mask)
    np.testing.assert_allclose(to_numpy(out), expected, rtol=0, atol=atol)
    if return_weights:
        assert weights.shape == expected_weights.shape
        np.testing.assert_allclose(to_numpy(weights), expected_weights, rtol=0, atol=atol / (1 + peak(v)))


@settings(max_examples=150, deadline=None)
@given(case=cases())
@with_edges()
def test_weights_are_distributions_over_allowed_keys(case: Case) -> None:
    q, k, v, mask = case.arrays()
    _, weights = call(q, k, v, mask, causal=case.causal, return_weights=True)
    weights = to_numpy(weights)
    allowed = case.allowed(mask)
    live = allowed.any(axis=-1)  # (B, H, Lq)
    assert np.all(weights >= 0)
    assert np.all(weights[~allowed] == 0), "weight on a forbidden key"
    assert np.all(weights[~live] == 0), "a fully masked row has weights"
    np.testing.assert_allclose(weights.sum(axis=-1)[live], 1.0, rtol=0, atol=1e-12)


@PATHS
@settings(max_examples=100, deadline=None)
@given(case=cases(), junk=st.sampled_from([1.0, 1e8, 1e100]), dead=st.sampled_from([0.0, 0.4, 1.0]))
@with_edges(junk=1e100, dead=0.4)
def test_masked_keys_and_values_cannot_change_the_output(
    case: Case, junk: float, dead: float, return_weights: bool
) -> None:
    """Keys no query of a key/value head may attend (padded by ``dead``, or masked) get random values of size
    ``junk``; the output must not move (0 · junk is exactly 0, so only rounding-free agreement passes)."""
    q, k, v, mask = case.arrays()
    mask, unused = dead_keys(case, mask, dead)  # unused: (B, Hkv, Lk)
    k_junk, v_junk = with_junk(k, unused, junk, case.seed), with_junk(v, unused, junk, case.seed + 1)
    out, weights = call(q, k, v, mask, causal=case.causal, return_weights=return_weights)
    out_junk, weights_junk = call(q, k_junk, v_junk, mask, causal=case.causal, return_weights=return_weights)
    assert torch.isfinite(out_junk).all()
    np.testing.assert_allclose(to_numpy(out_junk), to_numpy(out), rtol=0, atol=1e-13 * (1 + peak(to_numpy(out))))
    if return_weights:
        np.testing.assert_allclose(to_numpy(weights_junk), to_numpy(weights), rtol=0, atol=1e-13)


@PATHS
@settings(max_examples=100, deadline=None)
@given(case=cases())
@with_edges()
def test_permuting_keys_with_values_and_mask_leaves_output_unchanged(case: Case, return_weights: bool) -> None:
    q, k, v, mask = case.arrays()
    perm, permuted_mask = permuted_keys(case, mask)
    out, weights = call(q, k, v, mask, causal=case.causal, return_weights=return_weights)
    permuted_out, permuted_weights = call(
        q, k[:, :, perm], v[:, :, perm], permuted_mask, causal=False, return_weights=return_weights
    )
    atol = tolerance(q, k, v, mask)
    np.testing.assert_allclose(to_numpy(permuted_out), to_numpy(out), rtol=0, atol=atol)
    if return_weights:
        np.testing.assert_allclose(to_numpy(permuted_weights), to_numpy(weights)[..., perm], rtol=0, atol=atol)


@PATHS
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@settings(max_examples=60, deadline=None)
@given(case=cases())
@with_edges()
def test_finite_inputs_give_finite_outputs_weights_and_gradients(
    case: Case, dtype: torch.dtype, return_weights: bool
) -> None:
    q, k, v, mask = case.arrays()
    q, k, v = (as_tensor(x, dtype).requires_grad_() for x in (q, k, v))
    result = attention(
        q, k, v, as_tensor(mask, dtype), causal=case.causal, return_weights=return_weights,
        implementation=path_for(return_weights),
    )  # fmt: skip
    out, weights = result if return_weights else (result, None)
    dead = torch.tensor(~case.allowed(mask).any(axis=-1))  # (B, H, Lq): fully masked rows
    assert torch.isfinite(out).all()
    assert torch.all(out[dead] == 0)
    if return_weights:
        assert torch.isfinite(weights).all()
        assert torch.all(weights[dead] == 0)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(case.seed), dtype=dtype)
    grads = torch.autograd.grad((out * cotangent).sum(), (q, k, v), materialize_grads=True)
    for name, grad in zip("qkv", grads, strict=True):
        assert torch.isfinite(grad).all(), name
    assert torch.all(grads[0][dead] == 0)


# --- the module ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleCase:
    """A random ``MultiHeadAttention`` call: self or cross attention, masks in every accepted layout, key and
    query padding."""

    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    lq: int
    lk: int
    cross: bool
    mask_shape: tuple[int, ...] | None
    mask_kind: str
    key_padding: float | None  # fraction of padded keys, or no key_mask
    query_padding: float | None  # fraction of padded queries, or no query_mask (the module's packed path)
    causal: bool
    magnitude: float  # of the query and key inputs
    seed: int

    def as_cross(self, module: MultiHeadAttention, arrays: dict) -> dict:
        """Self-attention's inputs with a separate key/value sequence (and a key mask), so that changing or
        moving keys leaves the queries alone."""
        if self.cross and arrays["key_mask"] is not None:
            return arrays
        rng = np.random.default_rng(self.seed + 1)
        return dict(
            arrays,
            key=rng.normal(size=(self.batch, self.lk, module.kdim)),
            value=rng.normal(size=(self.batch, self.lk, module.vdim)),
            key_mask=rng.random((self.batch, self.lk)) >= 0.4,
        )

    def build(self, implementation: str = "auto") -> MultiHeadAttention:
        widths = {"kdim": 5, "vdim": 3} if self.cross else {}
        module = MultiHeadAttention(
            self.heads * self.head_dim, self.heads, num_kv_heads=self.kv_heads, implementation=implementation, **widths
        )
        module = module.double()
        generator = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            for parameter in module.parameters():
                parameter.uniform_(-0.5, 0.5, generator=generator)
        return module.eval()

    def arrays(self, module: MultiHeadAttention) -> dict[str, np.ndarray | None]:
        rng = np.random.default_rng(self.seed)
        query = rng.normal(size=(self.batch, self.lq, module.qdim)) * self.magnitude
        key = rng.normal(size=(self.batch, self.lk, module.kdim)) * self.magnitude if self.cross else None
        value = rng.normal(size=(self.batch, self.lk, module.vdim)) if self.cross else None
        key_mask = None if self.key_padding is None else rng.random((self.batch, self.lk)) >= self.key_padding
        query_mask = None if self.query_padding is None else rng.random((self.batch, self.lq)) >= self.query_padding
        mask = random_mask(rng, self.mask_shape, self.mask_kind, 0.3)
        return {
            "query": query,
            "key": key,
            "value": value,
            "mask": mask,
            "key_mask": key_mask,
            "query_mask": query_mask,
        }


MODULE_MASK_LAYOUTS = ["(Lq, Lk)", "(B, Lq, Lk)", "(B, H, Lq, Lk)", "(1, H, 1, Lk)", "(B, 1, Lq, 1)"]


@st.composite
def module_cases(draw: st.DrawFn) -> ModuleCase:
    kv_heads, groups = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    heads = kv_heads * groups
    batch, lq = draw(st.integers(0, 3)), draw(st.integers(0, 5))
    cross = draw(st.booleans())
    lk = draw(st.integers(0, 5)) if cross else lq
    layout = draw(st.none() | st.sampled_from(MODULE_MASK_LAYOUTS))
    shapes = {
        "(Lq, Lk)": (lq, lk),
        "(B, Lq, Lk)": (batch, lq, lk),
        "(B, H, Lq, Lk)": (batch, heads, lq, lk),
        "(1, H, 1, Lk)": (1, heads, 1, lk),
        "(B, 1, Lq, 1)": (batch, 1, lq, 1),
    }
    return ModuleCase(
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=draw(st.integers(1, 4)),
        lq=lq,
        lk=lk,
        cross=cross,
        mask_shape=None if layout is None else shapes[layout],
        mask_kind=draw(st.sampled_from(["bool", "float"])),
        key_padding=draw(st.none() | st.sampled_from([0.3, 1.0])),
        query_padding=draw(st.none() | st.sampled_from([0.3, 1.0])),
        causal=draw(st.booleans()),
        magnitude=draw(st.sampled_from([1.0, 30.0])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def module_call(module: MultiHeadAttention, arrays: dict, causal: bool, **kwargs) -> tuple[torch.Tensor, ...]:
    tensors = {
        name: as_tensor(x) if name.endswith("mask") or x is None else torch.tensor(x) for name, x in arrays.items()
    }
    return module(
        tensors["query"],
        tensors["key"],
        tensors["value"],
        mask=tensors["mask"],
        key_mask=tensors["key_mask"],
        query_mask=tensors["query_mask"],
        causal=causal,
        **kwargs,
    )


def module_oracle(module: MultiHeadAttention, arrays: dict, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    return reference.multi_head_attention(
        arrays["query"],
        arrays["key"],
        arrays["value"],
        state_dict_numpy(module),
        num_heads=module.num_heads,
        num_kv_heads=module.num_kv_heads,
        mask=arrays["mask"],
        key_mask=arrays["key_mask"],
        query_mask=arrays["query_mask"],
        causal=causal,
    )


@pytest.mark.parametrize(("batch", "lq"), [(0, 3), (2, 0), (0, 0)], ids=["B0", "Lq0", "B0-Lq0"])
def test_oracle_module_empty_inputs(batch: int, lq: int) -> None:
    """``reference.multi_head_attention`` shapes an empty batch or query sequence like the module does."""
    module = MultiHeadAttention(6, 2).double()
    arrays = {"query": np.ones((batch, lq, 6)), "key": np.ones((batch, 4, 6)), "value": None, "mask": None}
    out, weights = module_oracle(module, {**arrays, "key_mask": None, "query_mask": None}, causal=False)
    assert out.shape == (batch, lq, 6)
    assert weights.shape == (batch, 2, lq, 4)


@pytest.mark.parametrize(("batch", "lq", "lk"), [(0, 3, 4), (2, 0, 4), (2, 3, 0)], ids=["B0", "Lq0", "Lk0"])
def test_module_query_mask_with_empty_sizes(batch: int, lq: int, lk: int) -> None:
    """An empty batch, query or key sequence with a ``query_mask`` gives what it gives without one (zeros at the
    padded queries), as the module does for these sizes without it."""
    module = MultiHeadAttention(6, 2, implementation="fused").double()
    query, memory = torch.randn(batch, lq, 6, dtype=torch.float64), torch.randn(batch, lk, 6, dtype=torch.float64)
    query_mask = torch.arange(lq).expand(batch, lq) % 2 == 0  # (B, Lq)
    expected = module(query, memory).masked_fill(~query_mask[..., None], 0.0)
    torch.testing.assert_close(module(query, memory, query_mask=query_mask), expected)


@PATHS
@settings(max_examples=60, deadline=None)
@given(case=module_cases())
def test_module_matches_reference(case: ModuleCase, return_weights: bool) -> None:
    module = case.build(path_for(return_weights))
    arrays = case.arrays(module)
    result = module_call(module, arrays, case.causal, return_weights=return_weights)
    out, weights = result if return_weights else (result, None)
    assert torch.isfinite(out).all()
    expected, expected_weights = module_oracle(module, arrays, case.causal)
    assert out.shape == expected.shape
    # Projected q, k grow with m (scores up to ~1e4 at m=30); float64 rounding of such scores is ~1e-12 m².
    atol = 1e-12 * (1 + case.magnitude**2)
    np.testing.assert_allclose(to_numpy(out), expected, rtol=1e-12, atol=atol)
    if return_weights:
        np.testing.assert_allclose(to_numpy(weights), expected_weights, rtol=0, atol=atol)


@PATHS
@settings(max_examples=60, deadline=None)
@given(case=module_cases(), junk=st.sampled_from([1e3, 1e30]))
def test_module_padded_keys_and_queries_cannot_change_the_output(
    case: ModuleCase, junk: float, return_weights: bool
) -> None:
    module = case.build(path_for(return_weights))
    arrays = case.as_cross(module, case.arrays(module))
    padded = ~arrays["key_mask"]  # (B, Lk)
    junk_arrays = dict(
        arrays,
        key=with_junk(arrays["key"], padded, junk, case.seed),
        value=with_junk(arrays["value"], padded, junk, case.seed + 1),
    )
    if arrays["query_mask"] is not None:  # padded queries cannot change anything either
        junk_arrays["query"] = with_junk(arrays["query"], ~arrays["query_mask"], junk, case.seed + 2)
    expected = module_call(module, arrays, case.causal, return_weights=return_weights)
    got = module_call(module, junk_arrays, case.causal, return_weights=return_weights)
    assert torch.isfinite(got[0] if return_weights else got).all()
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(case=module_cases())
def test_module_permuting_key_positions_leaves_output_unchanged(case: ModuleCase) -> None:
    module = case.build()
    arrays = case.as_cross(module, case.arrays(module)) if not case.cross else case.arrays(module)
    perm = np.random.default_rng(case.seed + 2).permutation(case.lk)
    mask, key_mask = arrays["mask"], arrays["key_mask"]
    if case.causal:  # causal follows key positions: written out as a mask, it moves with them
        mask = restrict(mask, causal_allowed(case.lq, case.lk))
    permuted = dict(
        arrays,
        key=arrays["key"][:, perm],
        value=arrays["value"][:, perm],
        mask=mask[..., perm] if mask is not None and mask.shape[-1] == case.lk else mask,
        key_mask=None if key_mask is None else key_mask[:, perm],
    )
    out, weights = module_call(module, arrays, case.causal, return_weights=True)
    permuted_out, permuted_weights = module_call(module, permuted, False, return_weights=True)
    torch.testing.assert_close(permuted_out, out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(permuted_weights, weights[..., perm], rtol=1e-10, atol=1e-10)
