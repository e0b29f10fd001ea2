"""The NumPy float64 oracle: attention exactly as the paper writes it, for tests of every front end.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V

No framework imports, no speed tricks. Conventions are those of every front end: ``True`` in a mask = attend,
float masks are added to the scores, causal is bottom-right aligned, fully masked query rows give zeros.

Notation: B batch, H query heads, Hkv key/value heads, Lq query length, Lk key length, Dk query/key head dim,
Dv value head dim, E model width.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import numpy as np

from multihead.masks import causal_diagonal
from multihead.schema import ATTENTION
from multihead.validation import (
    DTypeError,
    check_attention_shapes,
    check_broadcastable,
    check_flag,
    check_heads,
    check_mask_dtype,
    check_module_inputs,
    check_padding_mask_shape,
    check_scale,
    module_mask_shape,
)

PROJECTIONS = ATTENTION  # the query, key, value and output projections


def _array(name: str, x: object) -> np.ndarray:
    """``x`` as a NumPy array; ``None`` and ragged nested sequences are refused by name."""
    if x is None:
        raise TypeError(f"`{name}` must be an array, received None")
    try:
        return np.asarray(x)
    except ValueError:  # NumPy refuses nested sequences of unequal lengths
        raise ValueError(f"`{name}` must be a rectangular array, received a ragged {type(x).__name__}") from None


def _real(name: str, x: object) -> np.ndarray:
    """``x`` as a float64 array; it must hold real numbers (ints or floats)."""
    array = _array(name, x)
    if array.dtype.kind not in "iuf":
        raise DTypeError(f"`{name}` must hold real numbers, received dtype {array.dtype}")
    return array.astype(np.float64)


def _mask_kind(mask: np.ndarray) -> str:
    if mask.dtype == np.bool_:
        return "bool"
    return "float" if np.issubdtype(mask.dtype, np.floating) else "other"


def _padding_mask(name: str, mask: object, batch: int, length: int) -> np.ndarray:
    """A boolean ``(B, L)`` mask, ``True`` at real tokens."""
    mask = _array(name, mask)
    check_mask_dtype(name, _mask_kind(mask), mask.dtype, allow_float=False)
    check_padding_mask_shape(name, mask.shape, batch, length)
    return mask


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Scaled dot-product attention in float64.

    q ``(B, H, Lq, Dk)``, k ``(B, Hkv, Lk, Dk)``, v ``(B, Hkv, Lk, Dv)``, mask broadcastable to
    ``(B, H, Lq, Lk)``. Returns ``out (B, H, Lq, Dv)`` and ``weights (B, H, Lq, Lk)``.
    """
    q, k, v = _real("q", q), _real("k", k), _real("v", v)
    check_attention_shapes(q.shape, k.shape, v.shape)
    check_flag("causal", causal)
    scale = check_scale(scale)
    batch, heads, lq, dk = q.shape
    lk = k.shape[2]
    if mask is not None:
        mask = _array("mask", mask)
        check_mask_dtype("mask", _mask_kind(mask), mask.dtype)
        check_broadcastable("mask", mask.shape, (batch, heads, lq, lk), "(B, H, Lq, Lk)")

    # Key/value head j serves query heads j*G .. (j+1)*G - 1.
    group = heads // k.shape[1]
    k = np.repeat(k, group, axis=1)  # (B, H, Lk, Dk)
    v = np.repeat(v, group, axis=1)  # (B, H, Lk, Dv)

    scale = 1.0 / np.sqrt(dk) if scale is None else scale
    scores = q @ k.swapaxes(-1, -2) * scale  # (B, H, Lq, Lk)

    allowed = np.ones((lq, lk), dtype=bool)
    if causal:
        allowed = np.tril(allowed, k=causal_diagonal(lq, lk))
    if mask is not None:
        if mask.dtype == np.bool_:
            allowed = allowed & mask
        else:
            scores = scores + mask.astype(np.float64)
    scores = np.where(allowed, scores, -np.inf)

    # Rows with no finite score attend nothing: their weights (and so their output) are zero.
    live = np.isfinite(scores).any(axis=-1, keepdims=True)
    row_max = np.where(live, scores.max(axis=-1, keepdims=True, initial=-np.inf), 0.0)
    exp = np.exp(scores - row_max)
    total = exp.sum(axis=-1, keepdims=True)
    weights = np.where(live, exp / np.where(live, total, 1.0), 0.0)
    return weights @ v, weights


def _check_params(params: object, num_heads: int, num_kv_heads: int) -> dict[str, np.ndarray]:
    """The projections' weights and biases as float64 arrays, their shapes checked against the head counts."""
    if not isinstance(params, Mapping):
        raise TypeError(f"`params` must be a mapping of parameter names to arrays, received {type(params).__name__}")
    arrays = {}
    for projection in PROJECTIONS:
        name = f"{projection}.weight"
        if name not in params:
            raise ValueError(f"`params` must hold {name!r}, received the keys {list(params)}")
        arrays[name] = _real(f"params['{name}']", params[name])
        if arrays[name].ndim != 2:
            raise ValueError(f"`params['{name}']` must be 2-D (out, in), received shape {arrays[name].shape}")
        if params.get(f"{projection}.bias") is not None:
            bias = arrays[f"{projection}.bias"] = _real(f"params['{projection}.bias']", params[f"{projection}.bias"])
            if bias.shape != arrays[name].shape[:1]:
                raise ValueError(
                    f"`params['{projection}.bias']` must have shape {arrays[name].shape[:1]} to match "
                    f"`params['{name}']` {arrays[name].shape}, received shape {bias.shape}"
                )
    q_shape, k_shape, v_shape, out_shape = (arrays[f"{projection}.weight"].shape for projection in PROJECTIONS)
    for projection, shape, heads, label in zip(
        PROJECTIONS[:3], (q_shape, k_shape, v_shape), (num_heads, num_kv_heads, num_kv_heads),
        ("num_heads", "num_kv_heads", "num_kv_heads"), strict=True,
    ):  # fmt: skip
        name = f"{projection}.weight"
        if shape[0] % heads:
            raise ValueError(
                f"`params['{name}']` must have a multiple of {label}={heads} rows (one block per head), "
                f"received shape {shape}"
            )
    if q_shape[0] // num_heads != k_shape[0] // num_kv_heads:
        raise ValueError(
            f"`params['q_proj.weight']` {q_shape} gives {num_heads} query heads of dim {q_shape[0] // num_heads}, "
            f"`params['k_proj.weight']` {k_shape} gives {num_kv_heads} key heads of dim {k_shape[0] // num_kv_heads}; "
            f"the head dims must match"
        )
    value_width = num_heads * (v_shape[0] // num_kv_heads)  # H * Dv
    if out_shape[1] != value_width:
        raise ValueError(
            f"`params['out_proj.weight']` must have H*Dv={value_width} columns for `params['v_proj.weight']` "
            f"{v_shape}, received shape {out_shape}"
        )
    return arrays


def _linear(x: np.ndarray, params: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    """``x Wᵀ + b`` with ``W`` stored ``(out, in)`` as in the PyTorch state dict."""
    out = x @ params[f"{name}.weight"].T
    bias = params.get(f"{name}.bias")
    return out if bias is None else out + bias


def multi_head_attention(
    query: np.ndarray,
    key: np.ndarray | None,
    value: np.ndarray | None,
    params: Mapping[str, np.ndarray],
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    mask: np.ndarray | None = None,
    key_mask: np.ndarray | None = None,
    query_mask: np.ndarray | None = None,
    causal: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention: project, split heads, attend, concatenate, project.

    query ``(B, Lq, qdim)``, key ``(B, Lk, kdim)`` (default: query), value ``(B, Lk, vdim)`` (default: key).
    ``params`` holds ``q_proj.weight`` ``(H*Dk, qdim)``, ``k_proj.weight`` ``(Hkv*Dk, kdim)``, ``v_proj.weight``
    ``(Hkv*Dv, vdim)``, ``out_proj.weight`` ``(E, H*Dv)`` and optional ``*.bias``. ``mask`` is ``(Lq, Lk)``,
    ``(B, Lq, Lk)`` or ``(B, H, Lq, Lk)``-broadcastable; ``key_mask`` ``(B, Lk)`` is ``True`` at real keys;
    ``query_mask`` ``(B, Lq)`` is ``True`` at real queries (padded query rows give zero output and weights).
    Returns ``out (B, Lq, E)`` and per-head ``weights (B, H, Lq, Lk)``.
    """
    num_heads, num_kv_heads = check_heads(num_heads, num_kv_heads)
    check_flag("causal", causal)
    params = _check_params(params, num_heads, num_kv_heads)
    query = _real("query", query)
    key = query if key is None else _real("key", key)
    value = key if value is None else _real("value", value)
    qdim, kdim, vdim = (params[f"{name}_proj.weight"].shape[1] for name in "qkv")
    check_module_inputs(query.shape, key.shape, value.shape, qdim, kdim, vdim)
    batch, lq, _ = query.shape
    lk = key.shape[1]
    full_mask = None
    if mask is not None:
        mask = _array("mask", mask)
        check_mask_dtype("mask", _mask_kind(mask), mask.dtype)
        full_mask = mask.reshape(cast(tuple[int, ...], module_mask_shape(mask.shape)))  # (B|1, H|1, Lq|1, Lk|1)
        check_broadcastable("mask", full_mask.shape, (batch, num_heads, lq, lk), "(B, H, Lq, Lk)")
    if key_mask is not None:
        keys = _padding_mask("key_mask", key_mask, batch, lk)[:, None, None, :]  # (B, 1, 1, Lk)
        if full_mask is None or full_mask.dtype == np.bool_:
            full_mask = keys if full_mask is None else full_mask & keys
        else:
            full_mask = np.where(keys, full_mask, -np.inf)
    if query_mask is not None:
        query_mask = _padding_mask("query_mask", query_mask, batch, lq)

    def split_heads(x: np.ndarray, heads: int) -> np.ndarray:
        b, length, width = x.shape
        return x.reshape(b, length, heads, width // heads).transpose(0, 2, 1, 3)  # (B, heads, L, D)

    q_proj, k_proj, v_proj, out_proj = PROJECTIONS
    q = split_heads(_linear(query, params, q_proj), num_heads)  # (B, H, Lq, Dk)
    k = split_heads(_linear(key, params, k_proj), num_kv_heads)  # (B, Hkv, Lk, Dk)
    v = split_heads(_linear(value, params, v_proj), num_kv_heads)  # (B, Hkv, Lk, Dv)

    out, weights = attention(q, k, v, full_mask, causal=causal)  # (B, H, Lq, Dv)
    out = out.transpose(0, 2, 1, 3).reshape(batch, lq, out.shape[1] * out.shape[3])  # (B, Lq, H*Dv)
    out = _linear(out, params, out_proj)  # (B, Lq, E)
    if query_mask is not None:
        out = np.where(query_mask[:, :, None], out, 0.0)
        weights = np.where(query_mask[:, None, :, None], weights, 0.0)
    return out, weights


def sinusoidal_positions(max_len: int, d_model: int) -> np.ndarray:
    """The paper's positional encodings ``(max_len, d_model)``, one entry at a time as section 3.5 writes them.

    ``PE[pos, 2i] = sin(pos / 10000^(2i/d_model))`` and ``PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model))``. The
    models compute their own table (``multihead.positional``); this copy is the tests' independent check of it.
    """
    table = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for dim in range(d_model):
            angle = pos / 10000 ** ((dim - dim % 2) / d_model)
            table[pos, dim] = np.sin(angle) if dim % 2 == 0 else np.cos(angle)
    return table
