"""PyTorch's fused attention kernel, ``torch.nn.functional.scaled_dot_product_attention``, under our rules.

Used by the PyTorch front end and by the Keras front end on its torch backend (whose tensors are torch tensors), so
that neither imports the other. The kernel's own causal flag is top-left aligned and, on some devices, it leaves
fully masked rows undefined: :func:`multihead.masks.for_kernel` adapts both, with the caller's mask operations.

Notation: B batch, H query heads, Hkv key/value heads, Lq query length, Lk key length, Dk/Dv head dims.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from multihead.masks import MaskOps, for_kernel

__all__ = ["KERNELS_ZERO_DEAD_ROWS", "SMALL_INFERENCE_SCORES", "fused", "small_inference"]

# PyTorch's CPU SDPA kernels (torch >= 2.5) already give zero output and zero, finite gradients for rows that
# attend nothing (tested: the fully masked rows tests run on the fused path). Elsewhere we open and zero those
# rows ourselves, which costs a pass over the mask and one over the output.
KERNELS_ZERO_DEAD_ROWS = frozenset({"cpu"})

# PyTorch's CPU SDPA kernel has a fixed cost that dominates small calls, and the explicit math stays ahead up to
# about 128x128 scores per head (forward, no gradients; docs/performance.md). With gradients the kernel's backward
# wins at every size measured, so only inference takes this turn.
SMALL_INFERENCE_SCORES = 128 * 128


def small_inference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float) -> bool:
    """Whether a call is small inference on the CPU, where the explicit math is faster than the kernel."""
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    small = q.shape[-2] * k.shape[-2] <= SMALL_INFERENCE_SCORES
    return small and not needs_grad and dropout == 0.0 and q.device.type == "cpu"


def fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    causal: bool,
    scale: float | None,
    dropout: float,
    ops: MaskOps,
    guard_dead_rows: bool | None = None,
) -> torch.Tensor:
    """The kernel on ``q (B, H, Lq, Dk)``, ``k (B, Hkv, Lk, Dk)``, ``v (B, Hkv, Lk, Dv)`` and a rank-4 ``mask``
    (bool, or float in q's dtype): ``(B, H, Lq, Dv)``. ``guard_dead_rows`` (default: unless the device's kernel
    zeroes them itself) opens fully masked rows before the kernel and zeroes them after."""
    if guard_dead_rows is None:
        guard_dead_rows = q.device.type not in KERNELS_ZERO_DEAD_ROWS
    mask, kernel_causal, live = for_kernel(mask, causal, q, k, ops, guard_dead_rows=guard_dead_rows)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=kernel_causal, scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )  # fmt: skip  # (B, H, Lq, Dv)
    return out if live is None else ops.where(live, out, 0.0)
