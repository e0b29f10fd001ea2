"""Random attention calls for the property tests of every front end: Hypothesis strategies and framework-free helpers.

Notation: B batch, H heads, Hkv key/value heads, Lq/Lk lengths, Dk/Dv head dims, m input magnitude.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from hypothesis import example
from hypothesis import strategies as st

from conftest import broadcast_shapes

EPS64 = float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class Case:
    """One random attention call: sizes, the mask's shape and kind, causal, input magnitude, and a data seed."""

    batch: int
    heads: int
    kv_heads: int
    lq: int
    lk: int
    dk: int
    dv: int
    mask_shape: tuple[int, ...] | None = None
    mask_kind: str = "bool"
    masked: float = 0.3  # fraction of mask entries that forbid
    causal: bool = False
    magnitude: float = 1.0  # q and k are scaled by it: logits grow as its square
    seed: int = 0

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """float64 ``q (B, H, Lq, Dk)``, ``k (B, Hkv, Lk, Dk)``, ``v (B, Hkv, Lk, Dv)`` and the mask."""
        rng = np.random.default_rng(self.seed)
        q = rng.normal(size=(self.batch, self.heads, self.lq, self.dk)) * self.magnitude
        k = rng.normal(size=(self.batch, self.kv_heads, self.lk, self.dk)) * self.magnitude
        v = rng.normal(size=(self.batch, self.kv_heads, self.lk, self.dv))
        return q, k, v, random_mask(rng, self.mask_shape, self.mask_kind, self.masked)

    def allowed(self, mask: np.ndarray | None) -> np.ndarray:
        """``(B, H, Lq, Lk)`` bool: which key each query may attend, from ``mask`` and the causal rule."""
        allowed = np.ones((self.batch, self.heads, self.lq, self.lk), dtype=bool)
        if self.causal:
            allowed &= causal_allowed(self.lq, self.lk)
        if mask is not None:
            allowed &= mask if mask.dtype == bool else ~np.isneginf(mask)
        return allowed


def random_mask(rng: np.random.Generator, shape: tuple[int, ...] | None, kind: str, masked: float) -> np.ndarray | None:
    """A bool mask (``True`` = attend) or a float one (normal biases, ``-inf`` where forbidden)."""
    if shape is None:
        return None
    forbid = rng.random(shape) < masked
    if kind == "bool":
        return ~forbid
    return np.where(forbid, -np.inf, rng.normal(size=shape) * 3)


def causal_allowed(lq: int, lk: int) -> np.ndarray:
    """The contract's bottom-right causal rule, written out: query ``i`` sees key ``j`` iff ``j <= i + Lk - Lq``."""
    return np.arange(lk)[None, :] <= np.arange(lq)[:, None] + (lk - lq)


def restrict(mask: np.ndarray | None, allowed: np.ndarray) -> np.ndarray:
    """``mask`` AND ``allowed`` (bool), in ``mask``'s kind: a float mask gets ``-inf`` where not allowed."""
    if mask is None or mask.dtype == bool:
        return allowed if mask is None else mask & allowed
    return np.where(allowed, mask, -np.inf)


@st.composite
def cases(draw: st.DrawFn, max_len: int = 6) -> Case:
    """Sizes from 0 (B, Lq, Lk) or 1 (H, Hkv, Dk, Dv) up, GQA groups of 1 to 3, every broadcastable mask shape."""
    kv_heads, groups = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    batch, lq, lk = draw(st.integers(0, 2)), draw(st.integers(0, max_len)), draw(st.integers(0, max_len))
    full = (batch, kv_heads * groups, lq, lk)
    return Case(
        batch=batch,
        heads=kv_heads * groups,
        kv_heads=kv_heads,
        lq=lq,
        lk=lk,
        dk=draw(st.integers(1, 6)),
        dv=draw(st.integers(1, 6)),
        mask_shape=draw(st.none() | st.sampled_from(broadcast_shapes(full))),
        mask_kind=draw(st.sampled_from(["bool", "float"])),
        masked=draw(st.sampled_from([0.0, 0.3, 0.7, 1.0])),
        causal=draw(st.booleans()),
        magnitude=draw(st.sampled_from([1.0, 1e2, 1e3])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


# Edge cases every run sees, whatever Hypothesis draws.
EDGES = [
    Case(2, 2, 1, 3, 0, 4, 5, causal=True),  # no keys: every row fully masked
    Case(2, 4, 2, 0, 5, 4, 3, mask_shape=(2, 1, 0, 5)),  # no queries
    Case(0, 2, 2, 3, 4, 4, 4, mask_shape=(4,), mask_kind="float"),  # empty batch
    Case(1, 3, 1, 6, 2, 3, 2, causal=True, magnitude=1e3),  # Lq > Lk, causal: leading rows fully masked
    Case(1, 2, 2, 2, 7, 3, 3, causal=True, mask_shape=(2, 7), magnitude=1e2),  # Lq < Lk, causal and a mask
    Case(2, 6, 2, 1, 1, 1, 1, mask_shape=(2, 6, 1, 1), masked=0.5, seed=3),  # one key, some rows masked
    Case(1, 2, 2, 4, 6, 5, 2, mask_shape=(1, 4, 6), mask_kind="float", masked=1.0),  # everything masked
    # One key, so blocks of two are half padding (-inf scores), and a float mask: a NaN gradient once came through
    # the running max of the Keras blocked path on JAX.
    Case(2, 1, 1, 3, 1, 1, 1, mask_shape=(1,), mask_kind="float", masked=0.0),
]


def with_edges(**fixed: object) -> Callable[[Callable], Callable]:
    """Add every edge case as an explicit example; ``fixed`` gives the test's other drawn arguments."""

    def decorate(test: Callable) -> Callable:
        for case in EDGES:
            test = example(case=case, **fixed)(test)
        return test

    return decorate


def peak(x: np.ndarray) -> float:
    """``max |x|``, 0 for an empty array."""
    return float(np.abs(x).max(initial=0.0))


def tolerance(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, eps: float = EPS64) -> float:
    """What rounding at ``eps`` may make two correct computations differ by.

    A score is a ``Dk``-term dot product, at most ``S = max|q| max|k| sqrt(Dk)`` (+ the largest finite float-mask
    entry) in magnitude; each carries a few ``eps·S`` of rounding. A softmax weight moves by at most twice the
    largest score error, and ``P V`` turns that into at most ``2 max|v|`` times as much. 64 ulps covers the
    dot-product length and the exp/normalisation without hiding a real error (a wrong rule moves weights by O(1)).
    """
    largest = peak(q) * peak(k) * np.sqrt(q.shape[-1])
    if mask is not None and mask.dtype != bool:
        largest += peak(mask[np.isfinite(mask)])
    return 64 * eps * (1 + largest) * (1 + peak(v))


def dead_keys(case: Case, mask: np.ndarray | None, dead: float) -> tuple[np.ndarray | None, np.ndarray]:
    """``mask`` with a fraction ``dead`` of each sequence's keys padded out, and ``unused`` ``(B, Hkv, Lk)``: the
    keys no query of a key/value head may attend (padded, or masked for every query of its group)."""
    rng = np.random.default_rng(case.seed + 1)
    mask = restrict(mask, rng.random((case.batch, 1, 1, case.lk)) >= dead)  # (B|1, H|1, Lq|1, Lk)
    groups = case.heads // case.kv_heads
    allowed = case.allowed(mask).reshape(case.batch, case.kv_heads, groups, case.lq, case.lk)
    return mask, ~allowed.any(axis=(2, 3))


def with_junk(x: np.ndarray, where: np.ndarray, magnitude: float, seed: int) -> np.ndarray:
    """``x`` with random values of size ``magnitude`` at ``where`` (a boolean index of its leading axes)."""
    x = x.copy()
    x[where] = np.random.default_rng(seed).normal(size=x[where].shape) * magnitude
    return x


def permuted_keys(case: Case, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """A permutation of the keys, and the mask (causal rule folded in, since it follows key positions) whose key
    axis is permuted the same way: a non-causal call with it must equal the original call."""
    perm = np.random.default_rng(case.seed + 2).permutation(case.lk)
    if case.causal:
        mask = restrict(mask, causal_allowed(case.lq, case.lk))
    if mask is not None and mask.shape[-1] == case.lk:
        mask = mask[..., perm]
    return perm, mask


def reference_gradients(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, cotangent: np.ndarray, *, causal: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 gradients of ``sum(reference.attention(q, k, v, mask)[0] * cotangent)`` w.r.t. q, k, v, by hand:
    ``dV = Pᵀ dO``, ``dS = P ∘ (dP - rowsum(dP ∘ P))`` with ``dP = dO Vᵀ``, ``dQ = scale dS K``, ``dK = scale dSᵀ Q``;
    key/value heads sum over the query heads they serve. Fully masked rows have ``P = 0``, so no gradient."""
    from multihead import reference

    q, k, v, cotangent = (np.asarray(x, dtype=np.float64) for x in (q, k, v, cotangent))
    _, weights = reference.attention(q, k, v, mask, causal=causal)  # (B, H, Lq, Lk)
    batch, kv_heads, lk, _ = k.shape
    groups = q.shape[1] // kv_heads
    k_rep, v_rep = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)  # (B, H, Lk, D)
    scale = 1.0 / np.sqrt(q.shape[-1])
    d_weights = cotangent @ v_rep.swapaxes(-1, -2)  # (B, H, Lq, Lk)
    d_scores = weights * (d_weights - (d_weights * weights).sum(axis=-1, keepdims=True))
    grad_q = scale * d_scores @ k_rep
    grad_k = (scale * d_scores.swapaxes(-1, -2) @ q).reshape(batch, kv_heads, groups, lk, q.shape[-1]).sum(axis=2)
    grad_v = (weights.swapaxes(-1, -2) @ cotangent).reshape(batch, kv_heads, groups, lk, v.shape[-1]).sum(axis=2)
    return grad_q, grad_k, grad_v


def check_error_budgets(
    got: list[np.ndarray],
    baseline: list[np.ndarray],
    expected: list[np.ndarray],
    names: list[str],
    eps: float,
    *,
    floor_ulps: float = 1.0,
    normwise: bool = False,
) -> None:
    """The flash-attention rule for half precision, on float64 arrays (output first, then gradients): the output
    within 2x the plain same-dtype error, each gradient within 3x, plus ``floor_ulps * eps * max|expected|``; where
    the plain implementation overflowed, the floor alone. ``normwise`` takes a gradient's floor from the whole
    gradient (w.r.t. all inputs together) rather than from that input's part alone."""

    def max_error(values: np.ndarray, exact: np.ndarray) -> float:
        return float(np.abs(values - exact).max()) if np.isfinite(values).all() else np.inf

    gradient_peak = max(np.abs(x).max() for x in expected[1:])
    for index, (ours, plain, exact, name) in enumerate(zip(got, baseline, expected, names, strict=True)):
        assert np.isfinite(ours).all(), f"{name} is not finite"
        peak = gradient_peak if normwise and index > 0 else np.abs(exact).max()
        floor = floor_ulps * eps * peak
        plain_error = max_error(plain, exact)
        budget = floor if np.isinf(plain_error) else (2 if index == 0 else 3) * plain_error + floor
        error = max_error(ours, exact)
        assert error <= budget, f"{name}: error {error:.3g} > budget {budget:.3g} (plain {plain_error:.3g})"
