"""Scaled dot-product attention for PyTorch: one pure function, two internal paths.

    Attention(Q, K, V) = softmax(Q Kᵀ · scale + mask) V

``attention`` dispatches to ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels: flash on CPU,
flash / memory-efficient / cuDNN on GPU) and uses the explicit matmul-softmax-matmul when the caller asks for the
weights, which no fused kernel returns, and for small inference calls on CPU, where it is faster. Both paths
follow the same rules and are tested to agree.

Notation: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), Lq query length, Lk key length,
Dk query/key head dim, Dv value head dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from multihead.torch.masks import causal_mask, check_mask_tensor, restrict
from multihead.validation import (
    DTypeError,
    check_attention_shapes,
    check_broadcastable,
    check_dropout,
    check_flag,
    check_scale,
)

__all__ = ["attention"]


def _check_inputs(
    q: object, k: object, v: object, mask: object, causal: object, scale: object, dropout: object
) -> float | None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, received {type(x).__name__}")
        if not x.dtype.is_floating_point:
            raise DTypeError(f"`{name}` must be a floating tensor, received dtype {x.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise DTypeError(f"`q`, `k`, `v` must share one dtype, received {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"`q`, `k`, `v` must be on one device, received {q.device}, {k.device}, {v.device}")
    check_attention_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    if mask is not None:
        check_mask_tensor("mask", mask)
        target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        check_broadcastable("mask", tuple(mask.shape), target, "(B, H, Lq, Lk)")
        if mask.device != q.device:
            raise ValueError(f"`mask` must be on the inputs' device {q.device}, received {mask.device}")
    check_flag("causal", causal)
    check_dropout("dropout", dropout)
    return check_scale(scale)


def _combined_mask(mask: torch.Tensor | None, causal: bool, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """``mask`` of rank 4 (bool, or float in q's dtype) with the bottom-right causal mask folded in by AND."""
    if mask is not None:
        mask = mask[(None,) * (4 - mask.dim())]  # (B|1, H|1, Lq|1, Lk|1)
        mask = mask if mask.dtype == torch.bool else mask.to(q.dtype)
    if causal:
        mask = restrict(mask, causal_mask(q.shape[-2], k.shape[-2], device=q.device))
    return mask


def _open_dead_rows(mask: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Open every fully masked row to all keys; return the mask and ``live`` ``(..., Lq|1, 1)``, which is
    ``False`` on exactly those rows, so the caller can zero them. ``(None, None)`` when nothing is masked.

    No kernel then sees a row without a finite score: a float mask's ``-inf`` row would give NaN in the explicit
    softmax's backward, and GPU kernels that keep a ``-inf`` log-sum-exp turn it into NaN gradients.
    """
    if mask is None:
        return None, None
    allowed = mask if mask.dtype == torch.bool else ~torch.isneginf(mask)
    live = allowed.any(dim=-1, keepdim=True)  # (..., Lq|1, 1)
    if mask.dtype == torch.bool:
        return mask | ~live, live
    return mask.masked_fill(~live, 0.0), live


# PyTorch's CPU SDPA kernels (torch >= 2.5) already give zero output and zero, finite gradients for rows that
# attend nothing (tested: the fully masked rows tests run on the fused path). Elsewhere we open and zero those
# rows ourselves, which costs a pass over the mask and one over the output (11% of a padded B=16 L=512 batch).
KERNELS_ZERO_DEAD_ROWS = frozenset({"cpu"})


# PyTorch's CPU SDPA kernel has a fixed cost that dominates small calls: 2.05 ms against 0.52 ms for the explicit
# math at B=64, H=8, L=5 (forward, no gradients), and the explicit math stays ahead up to about 128x128 scores per
# head. With gradients the kernel's backward wins at every size measured, so only inference takes this turn.
SMALL_INFERENCE_SCORES = 128 * 128


def _small_inference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float) -> bool:
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    small = q.shape[-2] * k.shape[-2] <= SMALL_INFERENCE_SCORES
    return small and not needs_grad and dropout == 0.0 and q.device.type == "cpu"


def _kv_groups(q: torch.Tensor, k: torch.Tensor) -> int:
    return q.shape[1] // k.shape[1]


def _explicit(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float | None,
    dropout: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    mask, live = _open_dead_rows(_combined_mask(mask, causal, q, k))
    compute = torch.promote_types(q.dtype, torch.float32)
    groups = _kv_groups(q, k)
    k = k.repeat_interleave(groups, dim=1) if groups > 1 else k  # (B, H, Lk, Dk)
    v = v.repeat_interleave(groups, dim=1) if groups > 1 else v  # (B, H, Lk, Dv)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale

    scores = torch.matmul(q.to(compute), k.to(compute).transpose(-2, -1)) * scale  # (B, H, Lq, Lk)
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask.to(compute)
    weights = torch.softmax(scores, dim=-1)
    if live is not None:
        weights = weights.masked_fill(~live, 0.0)
    dropped = F.dropout(weights, p=dropout) if dropout > 0.0 else weights
    out = torch.matmul(dropped, v.to(compute))  # (B, H, Lq, Dv)
    return out.to(q.dtype), weights.to(q.dtype)


def _fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float | None,
    dropout: float,
) -> torch.Tensor:
    # SDPA's own is_causal is top-left aligned; it equals our bottom-right rule only when Lq == Lk.
    use_kernel_causal = causal and mask is None and q.shape[-2] == k.shape[-2]
    mask = _combined_mask(mask, causal and not use_kernel_causal, q, k)
    live = None
    if q.device.type not in KERNELS_ZERO_DEAD_ROWS:
        mask, live = _open_dead_rows(mask)
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        dropout_p=dropout,
        is_causal=use_kernel_causal,
        scale=scale,
        enable_gqa=_kv_groups(q, k) > 1,
    )  # (B, H, Lq, Dv)
    return out if live is None else out.masked_fill(~live, 0.0)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    dropout: float = 0.0,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
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
        dropout: probability of dropping an attention weight. Applied whenever it is > 0: a module passes 0
            outside training.
        return_weights: also return the per-head weights ``(B, H, Lq, Lk)`` (before dropout). This takes the
            explicit path, since no fused kernel returns them.

    Returns:
        ``out (B, H, Lq, Dv)`` in the inputs' dtype, or ``(out, weights)``. Query rows that may attend no key
        give zero output and zero weights, with zero gradients.

    Example:
        >>> q = k = v = torch.randn(2, 8, 5, 64)
        >>> attention(q, k, v, causal=True).shape
        torch.Size([2, 8, 5, 64])
    """
    scale = _check_inputs(q, k, v, mask, causal, scale, dropout)
    check_flag("return_weights", return_weights)
    if return_weights:
        return _explicit(q, k, v, mask, causal, scale, dropout)
    if _small_inference(q, k, v, dropout):
        return _explicit(q, k, v, mask, causal, scale, dropout)[0]
    return _fused(q, k, v, mask, causal, scale, dropout)
