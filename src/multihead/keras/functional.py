"""Scaled dot-product attention for Keras 3, on any backend.

    Attention(Q, K, V) = softmax(Q Kᵀ · scale + mask) V

Paths, one set of rules (those of :mod:`multihead.masks`, as the PyTorch front end follows them), tested to agree;
``implementation`` chooses:

- ``"explicit"``: matmul-softmax-matmul in ``keras.ops``; the only path that returns the weights or drops out
  (with Keras' seeded random ops);
- ``"fused"``: the backend's fused kernel: PyTorch's ``scaled_dot_product_attention`` (through
  :func:`multihead.torch.attention`) on the torch backend; TensorFlow has none;
- ``"blocked"``: keys in blocks with an online softmax (running max and sum), so the ``Lq × Lk`` score matrix never
  exists and memory grows linearly with length (Keras' own layer materialises every score);
- ``"auto"``: explicit for weights and dropout; otherwise fused where the backend has a kernel, blocked beyond
  ``KEY_BLOCK`` keys, explicit below.

The public function checks its arguments; ``_attention`` is the unchecked path the layers call.

Notation: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), Lq query length, Lk key length,
Dk query/key head dim, Dv value head dim.
"""

from __future__ import annotations

import math

import keras
from keras import backend, ops

from multihead.keras.masks import (
    Tensor,
    causal_block,
    check_mask_tensor,
    dtype_kind,
    is_tensor_like,
    open_dead_rows,
    restrict,
)
from multihead.masks import causal_diagonal
from multihead.validation import (
    DTypeError,
    check_attention_shapes,
    check_broadcastable,
    check_dropout,
    check_flag,
    check_implementation,
    check_scale,
)

__all__ = ["IMPLEMENTATIONS", "KEY_BLOCK", "attention"]

IMPLEMENTATIONS = ("auto", "explicit", "fused", "blocked")

KEY_BLOCK = 1024
"""The key length above which the blocked path is taken, and its largest block."""
BLOCK_SCORES = 2**23
"""Scores per block (32 MiB of float32): TensorFlow's loops run up to 10 iterations at once, so this bounds the
blocked path's working memory near 10 blocks' worth, whatever the length."""


def block_size(batch: int | None, heads: int, lq: int) -> int:
    """Keys per block: a power of two from 64 to ``KEY_BLOCK`` giving about ``BLOCK_SCORES`` scores per block."""
    size = KEY_BLOCK
    while size > 64 and (batch or 1) * heads * lq * size > BLOCK_SCORES:
        size //= 2
    return size


def _check_inputs(
    q: object,
    k: object,
    v: object,
    mask: object,
    causal: object,
    scale: object,
    dropout: object,
    return_weights: object,
    implementation: object,
) -> float | None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not is_tensor_like(x):
            raise TypeError(f"`{name}` must be a tensor, received {type(x).__name__}")
        if dtype_kind(x) != "float":
            raise DTypeError(f"`{name}` must be a floating tensor, received dtype {backend.standardize_dtype(x.dtype)}")
    dtypes = [backend.standardize_dtype(x.dtype) for x in (q, k, v)]
    if len(set(dtypes)) > 1:
        raise DTypeError(f"`q`, `k`, `v` must share one dtype, received {', '.join(dtypes)}")
    check_attention_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    if mask is not None:
        check_mask_tensor("mask", mask)
        target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        check_broadcastable("mask", tuple(mask.shape), target, "(B, H, Lq, Lk)")
    check_flag("causal", causal)
    check_dropout("dropout", dropout)
    check_flag("return_weights", return_weights)
    check_implementation(implementation, IMPLEMENTATIONS, return_weights=return_weights)
    if implementation == "blocked" and return_weights:
        raise ValueError("`implementation`='blocked' cannot return the weights; use 'explicit' or 'auto'")
    if implementation == "fused" and backend.backend() not in FUSED_BACKENDS:
        raise ValueError(
            f"`implementation`='fused' needs a backend with a fused attention kernel {FUSED_BACKENDS}, "
            f"received the {backend.backend()} backend"
        )
    if implementation == "blocked" and (q.shape[2] is None or k.shape[2] is None):
        raise ValueError(
            f"`implementation`='blocked' needs static lengths Lq and Lk, received q.shape={tuple(q.shape)}, "
            f"k.shape={tuple(k.shape)}"
        )
    return check_scale(scale)


def _rank4(mask: Tensor, dtype: str) -> Tensor:
    """A mask as ``(B|1, H|1, Lq|1, Lk|1)``; a float mask in ``dtype``."""
    mask = ops.convert_to_tensor(mask)
    for _ in range(4 - len(mask.shape)):
        mask = ops.expand_dims(mask, 0)
    return mask if dtype_kind(mask) == "bool" else ops.cast(mask, dtype)


def _compute_dtype(dtype: str) -> str:
    """Scores and softmax run in float32 for half inputs, float64 for float64."""
    return "float64" if dtype == "float64" else "float32"


def _scale(q: Tensor, scale: float | None, compute: str) -> float | Tensor:
    """A Python float where possible: ``ops.cast(float, "float64")`` would round it through float32 first."""
    if scale is not None:
        return scale
    dk = q.shape[-1]
    return 1.0 / math.sqrt(dk) if dk is not None else ops.rsqrt(ops.cast(ops.shape(q)[-1], compute))


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    # Key/value head j serves query heads j*G .. (j+1)*G - 1.
    return ops.repeat(x, groups, axis=1) if groups > 1 else x  # (B, H, Lk, D)


def _explicit(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    causal: bool,
    scale: float | None,
    dropout: float,
    seed: int | keras.random.SeedGenerator | None,
) -> tuple[Tensor, Tensor]:
    dtype = backend.standardize_dtype(q.dtype)
    compute = _compute_dtype(dtype)
    lq, lk = ops.shape(q)[2], ops.shape(k)[2]
    if mask is not None:
        mask = _rank4(mask, dtype)
    if causal:
        mask = restrict(mask, causal_block(lq, lk, 0, lk))
    mask, live = open_dead_rows(mask)

    groups = q.shape[1] // k.shape[1]
    k = ops.cast(_repeat_kv(k, groups), compute)  # (B, H, Lk, Dk)
    v = ops.cast(_repeat_kv(v, groups), compute)  # (B, H, Lk, Dv)
    # einsum, not matmul: on the torch backend Keras' matmul computes float64 in float32.
    scores = ops.einsum("bhqd,bhkd->bhqk", ops.cast(q, compute), k) * _scale(q, scale, compute)  # (B, H, Lq, Lk)
    if mask is not None and dtype_kind(mask) == "bool":
        scores = ops.where(mask, scores, ops.cast(float("-inf"), compute))
    elif mask is not None:
        scores = scores + ops.cast(mask, compute)
    # A softmax over one key is exactly 1 (Keras warns on a size-1 softmax axis, which decoding hits at step 1).
    weights = ops.ones_like(scores) if scores.shape[-1] == 1 else ops.softmax(scores, axis=-1)
    if live is not None:
        weights = ops.where(live, weights, ops.zeros_like(weights))
    dropped = keras.random.dropout(weights, dropout, seed=seed) if dropout > 0.0 else weights
    out = ops.einsum("bhqk,bhkd->bhqd", dropped, v)  # (B, H, Lq, Dv)
    return ops.cast(out, dtype), ops.cast(weights, dtype)


def _blocked(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float | None, block: int
) -> Tensor:
    """Keys in blocks of ``block`` with an online softmax; needs static ``Lq`` and ``Lk``.

    Per query row it keeps the running max ``m`` of the scores seen so far, the running sum ``l`` of
    ``exp(score - m)`` and the running ``acc = Σ exp(score - m) · v``, rescaling both when ``m`` grows. A row
    that has seen no allowed key keeps ``m = -inf`` and ``l = acc = 0``, so a fully masked row ends at zero.

    The blocks run in a ``fori_loop``, not an unrolled Python loop: in a TensorFlow graph nothing would order
    unrolled blocks, and the executor computes them all at once, which is the whole score matrix again. Keys are
    padded to a whole number of blocks; the padding is masked.
    """
    dtype = backend.standardize_dtype(q.dtype)
    compute = _compute_dtype(dtype)
    lq, lk = q.shape[2], k.shape[2]
    count = -(-lk // block)
    padding = count * block - lk

    def pad_keys(x: Tensor, axis: int, value: float | bool) -> Tensor:
        widths = [[0, 0]] * len(x.shape)
        widths[axis] = [0, padding]
        return ops.pad(x, widths, constant_values=value) if padding else x

    groups = q.shape[1] // k.shape[1]
    k = pad_keys(ops.cast(_repeat_kv(k, groups), compute), 2, 0.0)  # (B, H, count*block, Dk)
    v = pad_keys(ops.cast(_repeat_kv(v, groups), compute), 2, 0.0)  # (B, H, count*block, Dv)
    q = ops.cast(q, compute) * _scale(q, scale, compute)  # (B, H, Lq, Dk)
    if mask is not None:
        mask = _rank4(mask, dtype)
        if mask.shape[-1] != 1:
            mask = pad_keys(mask, 3, False if dtype_kind(mask) == "bool" else float("-inf"))  # (.., count*block)
    minus_inf = ops.cast(float("-inf"), compute)
    batch, heads = ops.shape(q)[0], ops.shape(q)[1]
    queries = ops.expand_dims(ops.arange(lq), 1)  # (Lq, 1)

    def step(index: Tensor, state: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        m, total, acc = state
        start = index * block
        k_block = ops.slice(k, (0, 0, start, 0), (batch, heads, block, k.shape[3]))
        v_block = ops.slice(v, (0, 0, start, 0), (batch, heads, block, v.shape[3]))
        scores = ops.einsum("bhqd,bhkd->bhqk", q, k_block)  # (B, H, Lq, block)
        keys = ops.expand_dims(start + ops.arange(block), 0)  # (1, block)
        allowed = keys < lk
        if causal:
            allowed = ops.logical_and(allowed, keys <= queries + causal_diagonal(lq, lk))  # (Lq, block)
        if mask is not None:
            block_mask = mask
            if mask.shape[-1] != 1:
                block_mask = ops.slice(mask, (0, 0, 0, start), (*mask.shape[:3], block))
            if dtype_kind(block_mask) == "bool":
                allowed = ops.logical_and(allowed, block_mask)
            else:
                scores = scores + ops.cast(block_mask, compute)
        scores = ops.where(allowed, scores, minus_inf)
        block_max = ops.max(scores, axis=-1, keepdims=True)
        m_new = ops.where(block_max > m, block_max, m)  # not ops.maximum: on torch it returns float32
        # While a row has seen only masked keys its max is -inf; shift by 0 instead so exp gives 0, not NaN.
        shift = ops.where(ops.isinf(m_new), ops.zeros_like(m_new), m_new)
        p = ops.exp(scores - shift)  # (B, H, Lq, block)
        rescale = ops.exp(m - shift)
        total = total * rescale + ops.sum(p, axis=-1, keepdims=True)
        acc = acc * rescale + ops.einsum("bhqk,bhkd->bhqd", p, v_block)
        return m_new, total, acc

    row_shape = (batch, heads, lq, 1)
    state = (
        ops.full(row_shape, float("-inf"), dtype=compute),  # m: (B, H, Lq, 1)
        ops.zeros(row_shape, dtype=compute),  # total: (B, H, Lq, 1)
        ops.zeros((batch, heads, lq, v.shape[3]), dtype=compute),  # acc: (B, H, Lq, Dv)
    )
    _, total, acc = ops.fori_loop(0, count, step, state)
    out = acc / ops.where(total > 0, total, ops.ones_like(total))  # (B, H, Lq, Dv)
    return ops.cast(out, dtype)


FUSED_BACKENDS = ("torch",)
"""Backends with a fused attention kernel of exactly our semantics."""


def _attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    causal: bool,
    scale: float | None,
    dropout: float,
    return_weights: bool,
    seed: int | keras.random.SeedGenerator | None,
    implementation: str,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`attention` on checked arguments; ``dropout`` is 0 outside training."""
    path = implementation
    if implementation == "auto":
        if return_weights or dropout > 0.0:
            path = "explicit"
        elif backend.backend() in FUSED_BACKENDS:
            path = "fused"
        else:
            long_keys = q.shape[2] is not None and k.shape[2] is not None and k.shape[2] > KEY_BLOCK
            path = "blocked" if long_keys else "explicit"
    if path == "explicit":
        out, weights = _explicit(q, k, v, mask, causal, scale, dropout, seed)
        return (out, weights) if return_weights else out
    # The blocked loop needs at least one score per block; nor does a kernel have work: an empty batch or query
    # sequence takes the explicit math.
    if q.shape[0] == 0 or q.shape[2] == 0:
        return _explicit(q, k, v, mask, causal, scale, 0.0, None)[0]
    if path == "fused":
        return _fused(q, k, v, mask, causal, scale)
    return _blocked(q, k, v, mask, causal, scale, block_size(q.shape[0], q.shape[1], q.shape[2]))


def _fused(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float | None) -> Tensor:
    """The backend's fused kernel (see ``FUSED_BACKENDS``)."""
    from multihead.torch.functional import _attention as torch_attention

    mask = None if mask is None else _rank4(mask, backend.standardize_dtype(q.dtype))
    q, k, v = (ops.convert_to_tensor(x) for x in (q, k, v))
    return torch_attention(q, k, v, mask, causal, scale, 0.0, False, "auto")


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    dropout: float = 0.0,
    return_weights: bool = False,
    training: bool = False,
    seed: int | keras.random.SeedGenerator | None = None,
    implementation: str = "auto",
) -> Tensor | tuple[Tensor, Tensor]:
    """Scaled dot-product attention.

    Args:
        q: ``(B, H, Lq, Dk)``.
        k: ``(B, Hkv, Lk, Dk)``; ``H`` must be a multiple of ``Hkv`` (grouped-query attention: key/value head
            ``j`` serves query heads ``j*H/Hkv .. (j+1)*H/Hkv - 1``).
        v: ``(B, Hkv, Lk, Dv)``.
        mask: broadcastable to ``(B, H, Lq, Lk)``. Boolean: ``True`` = attend. Floating: added to the scores
            (``0`` keeps, ``-inf`` removes). Integer masks are rejected.
        causal: bottom-right aligned causal masking (query ``i`` sees key ``j`` iff ``j <= i + Lk - Lq``),
            combined with ``mask`` by AND.
        scale: multiplies the scores; default ``1/sqrt(Dk)``.
        dropout: probability of dropping an attention weight, applied only when ``training`` is true.
        return_weights: also return the per-head weights ``(B, H, Lq, Lk)`` (before dropout).
        training: whether dropout applies.
        seed: an int or a ``keras.random.SeedGenerator`` for the dropout.
        implementation: ``"auto"`` (default), ``"explicit"``, ``"fused"`` or ``"blocked"`` (see the module's
            docstring). Only ``"explicit"`` (and ``"auto"``) return weights or drop out.

    Returns:
        ``out (B, H, Lq, Dv)`` in the inputs' dtype, or ``(out, weights)``. Query rows that may attend no key
        give zero output and zero weights, with zero gradients.

    Example:
        >>> import numpy as np
        >>> q = k = v = np.random.randn(2, 8, 5, 64).astype("float32")
        >>> tuple(attention(q, k, v, causal=True).shape)
        (2, 8, 5, 64)
    """
    scale = _check_inputs(q, k, v, mask, causal, scale, dropout, return_weights, implementation)
    check_flag("training", training)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, keras.random.SeedGenerator))):
        raise TypeError(f"`seed` must be None, an int or a keras.random.SeedGenerator, received {seed!r}")
    dropout = dropout if training else 0.0
    if dropout > 0.0 and implementation in ("fused", "blocked"):
        raise ValueError(f"`implementation`={implementation!r} cannot drop out; use 'explicit' or 'auto'")
    return _attention(q, k, v, mask, causal, scale, dropout, return_weights, seed, implementation)
