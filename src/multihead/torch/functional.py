"""Scaled dot-product attention for PyTorch: pure functions over ``(B, H, L, D)`` tensors, two internal paths.

    Attention(Q, K, V) = softmax(Q Kᵀ · scale + mask) V

``attention`` runs ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels: flash on CPU, flash /
memory-efficient / cuDNN on GPU; adapted to our rules by :mod:`multihead.sdpa`) or the explicit matmul-softmax-
matmul, as ``implementation`` says. ``"auto"`` takes the explicit math when the caller asks for the weights, which
no fused kernel returns, and for small inference calls on CPU, where it is faster; the kernel otherwise. Both paths
follow the same rules (those of :mod:`multihead.masks`) and are tested to agree. ``packed_attention`` is the same
attention over sequences packed one after another without padding (variable-length attention).

The public functions check their arguments; ``_attention`` is the unchecked path the modules call once they have
checked theirs.

Notation: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), Lq query length, Lk key length,
Dk query/key head dim, Dv value head dim; packed: N queries and M keys in all, n and m of one sequence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

from multihead import sdpa
from multihead.checks import check_attention, check_attention_options, check_functional_mask, check_qkv
from multihead.torch.masks import open_dead_rows, restrict
from multihead.torch.tensors import OPS, causal_tril
from multihead.validation import check_packed_lengths

__all__ = ["IMPLEMENTATIONS", "attention", "packed_attention"]

IMPLEMENTATIONS = ("auto", "fused", "explicit")
"""``attention``'s paths: ``"fused"`` the PyTorch kernel, ``"explicit"`` the matmul-softmax-matmul, ``"auto"`` the
faster one that can give what is asked."""


def _rank4(mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    """``mask`` as ``(B|1, H|1, Lq|1, Lk|1)``; a float mask in q's dtype."""
    if mask is None:
        return None
    mask = mask[(None,) * (4 - mask.dim())]
    return mask if mask.dtype == torch.bool else mask.to(q.dtype)


def _combined_mask(mask: torch.Tensor | None, causal: bool, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """``mask`` of rank 4 (bool, or float in q's dtype) with the bottom-right causal mask folded in by AND."""
    mask = _rank4(mask, q)
    if causal and q.shape[-2] > 1:  # one query (a decoding step) may attend every key
        mask = restrict(mask, causal_tril(q.shape[-2], k.shape[-2], q.device))
    return mask


@dataclass(frozen=True)
class StepMask:
    """A decoding step's mask, made once for every layer that reads it (:func:`step_mask`): ``added (B, 1, 1, Lk)``,
    added to the scores (``0`` keeps, ``-inf`` removes), every row that may attend no key opened to all of them, and
    ``dead (B, 1, 1, 1)``, ``True`` on exactly those rows, which give zeros. Valid for one query per row, where the
    causal rule masks nothing."""

    added: torch.Tensor
    dead: torch.Tensor


def step_mask(key_mask: torch.Tensor | None, dtype: torch.dtype) -> StepMask | None:
    """A decoding step's boolean key mask ``(B, Lk)`` (``True`` = attend) as the :class:`StepMask` its layers' attention
    calls share, its scores in ``dtype``; ``None`` for ``None``."""
    if key_mask is None:
        return None
    opened, live = cast(tuple[torch.Tensor, torch.Tensor], open_dead_rows(key_mask[:, None, None, :]))
    # (B, 1, 1, Lk), (B, 1, 1, 1)
    added = torch.zeros(opened.shape, dtype=dtype, device=opened.device).masked_fill_(~opened, float("-inf"))
    return StepMask(added, ~live)


def _kv_groups(q: torch.Tensor, k: torch.Tensor) -> int:
    return q.shape[1] // k.shape[1]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype attention computes in for inputs of ``dtype``: float32, or float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _in(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in ``dtype`` (no call when it is already: a decoding step makes dozens of these)."""
    return x if x.dtype == dtype else x.to(dtype)


def _explicit(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | StepMask | None,
    causal: bool,
    scale: float | None,
    dropout: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    rule: torch.Tensor | None
    dead: torch.Tensor | None
    if isinstance(mask, StepMask):
        rule, dead = mask.added, mask.dead
    else:
        rule, live = open_dead_rows(_combined_mask(mask, causal, q, k))
        dead = None if live is None else ~live
    compute = compute_dtype(q.dtype)
    groups = _kv_groups(q, k)
    k = k.repeat_interleave(groups, dim=1) if groups > 1 else k  # (B, H, Lk, Dk)
    v = v.repeat_interleave(groups, dim=1) if groups > 1 else v  # (B, H, Lk, Dv)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale

    scores = torch.matmul(_in(q, compute), _in(k, compute).transpose(-2, -1))  # (B, H, Lq, Lk)
    if rule is not None and rule.dtype != torch.bool:
        scores = torch.add(_in(rule, compute), scores, alpha=scale)  # mask + scale * scores, one pass
    else:
        scores = scores * scale
        if rule is not None:
            scores = scores.masked_fill(~rule, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if dead is not None:
        weights = weights.masked_fill(dead, 0.0)
    dropped = F.dropout(weights, p=dropout) if dropout > 0.0 else weights
    out = torch.matmul(dropped, _in(v, compute))  # (B, H, Lq, Dv)
    return _in(out, q.dtype), _in(weights, q.dtype)


def _fused(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | StepMask | None, causal: bool,
    scale: float | None, dropout: float, guard_dead_rows: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """PyTorch's kernel (:func:`multihead.sdpa.fused`); a :class:`StepMask`'s rows opened already, and zeroed after."""
    if isinstance(mask, StepMask):
        out = sdpa.fused(q, k, v, _in(mask.added, q.dtype), causal=False, scale=scale, dropout=dropout, ops=OPS,
                         guard_dead_rows=False)  # fmt: skip
        return out.masked_fill(mask.dead, 0.0)
    return sdpa.fused(
        q, k, v, _rank4(mask, q), causal=causal, scale=scale, dropout=dropout, ops=OPS, guard_dead_rows=guard_dead_rows
    )


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | StepMask | None,
    *,
    causal: bool,
    scale: float | None,
    dropout: float,
    return_weights: bool,
    implementation: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`attention` on arguments already checked: the output and, with ``return_weights``, the weights (else
    ``None``). ``mask`` may be a decoding step's :class:`StepMask`."""
    explicit = return_weights or implementation == "explicit"
    if implementation == "auto" and sdpa.small_inference(q, k, v, dropout):
        explicit = True
    if not explicit:
        return _fused(q, k, v, mask, causal, scale, dropout), None
    out, weights = _explicit(q, k, v, mask, causal, scale, dropout)
    return out, weights if return_weights else None


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
    implementation: str = "auto",
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
        return_weights: also return the per-head weights ``(B, H, Lq, Lk)`` (before dropout). No fused kernel
            returns them, so this takes the explicit path.
        implementation: ``"auto"`` (default): the explicit math for weights and for small inference calls on CPU
            (at most 128×128 scores per head, no gradients, no dropout), PyTorch's fused kernel otherwise;
            ``"fused"``: always the kernel (not with ``return_weights``); ``"explicit"``: always the math.

    Returns:
        ``out (B, H, Lq, Dv)`` in the inputs' dtype, or ``(out, weights)``. Query rows that may attend no key
        give zero output and zero weights, with zero gradients.

    Example:
        >>> q = k = v = torch.randn(2, 8, 5, 64)
        >>> attention(q, k, v, causal=True).shape
        torch.Size([2, 8, 5, 64])
    """
    scale = check_attention(
        q, k, v, mask, OPS, causal=causal, scale=scale, dropout=dropout, return_weights=return_weights,
        implementation=implementation, implementations=IMPLEMENTATIONS,
    )  # fmt: skip
    out, weights = _attention(
        q, k, v, mask, causal=causal, scale=scale, dropout=dropout, return_weights=return_weights,
        implementation=implementation,
    )  # fmt: skip
    return (out, weights) if weights is not None else out


def _packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    query_lengths: Sequence[int],
    key_lengths: Sequence[int],
    *,
    masks: Sequence[torch.Tensor | None] | None,
    causal: bool,
    scale: float | None,
    dropout: float,
    implementation: str,
) -> torch.Tensor:
    """:func:`packed_attention` on arguments already checked: one :func:`attention` call per sequence."""
    outs = []
    for index, (q_b, k_b, v_b) in enumerate(
        zip(q.split(query_lengths), k.split(key_lengths), v.split(key_lengths), strict=True)
    ):
        if not len(q_b):
            continue
        mask = None if masks is None else masks[index]
        mask = None if mask is None else mask[None]  # (1, H|1, n|1, m|1)
        # (n, H, D) -> (1, H, n, D)
        q_b, k_b, v_b = (x.transpose(0, 1)[None] for x in (q_b, k_b, v_b))
        out, _ = _attention(
            q_b, k_b, v_b, mask, causal=causal, scale=scale, dropout=dropout, return_weights=False,
            implementation=implementation,
        )  # fmt: skip  # (1, H, n, Dv)
        outs.append(out[0].transpose(0, 1))  # (n, H, Dv)
    return torch.cat(outs) if outs else q.new_empty(0, q.shape[1], v.shape[-1])


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    query_lengths: Sequence[int] | torch.Tensor,
    key_lengths: Sequence[int] | torch.Tensor,
    *,
    masks: Sequence[torch.Tensor | None] | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout: float = 0.0,
    implementation: str = "auto",
) -> torch.Tensor:
    """Attention over sequences packed one after another, without padding (variable-length attention).

    Sequence ``b`` owns the next ``query_lengths[b]`` rows of ``q`` and the next ``key_lengths[b]`` rows of ``k``
    and ``v``; its queries attend only its keys, so a batch of sequences of different lengths costs what its real
    tokens cost. Each sequence follows :func:`attention`'s rules.

    Args:
        q: ``(N, H, Dk)``, ``N = sum(query_lengths)``.
        k: ``(M, Hkv, Dk)``, ``M = sum(key_lengths)``; ``H`` a multiple of ``Hkv``.
        v: ``(M, Hkv, Dv)``.
        query_lengths, key_lengths: ``B`` non-negative ints (or 1-D integer tensors).
        masks: ``None``, or one mask per sequence (``None`` or broadcastable to ``(H, n, m)``), bool or float.
        causal: bottom-right aligned within each sequence (query ``i`` of ``n`` sees key ``j`` of ``m`` iff
            ``j <= i + m - n``), combined with the masks by AND.
        scale, dropout, implementation: as in :func:`attention`.

    Returns:
        ``out (N, H, Dv)``.

    Example:
        >>> q = k = v = torch.randn(7, 4, 16)  # sequences of 3 and 4 tokens
        >>> packed_attention(q, k, v, [3, 4], [3, 4], causal=True).shape
        torch.Size([7, 4, 16])
    """
    check_qkv(q, k, v, OPS, packed=True)
    query_lengths = check_packed_lengths("query_lengths", query_lengths, q.shape[0], "N = q.shape[0]")
    key_lengths = check_packed_lengths("key_lengths", key_lengths, k.shape[0], "M = k.shape[0]")
    if len(query_lengths) != len(key_lengths):
        raise ValueError(
            f"`query_lengths` and `key_lengths` must describe the same B sequences, "
            f"received {len(query_lengths)} and {len(key_lengths)} lengths"
        )
    if masks is not None:
        if not isinstance(masks, Sequence) or len(masks) != len(query_lengths):
            raise ValueError(
                f"`masks` must be None or a sequence of {len(query_lengths)} masks (one per sequence), "
                f"received {type(masks).__name__} of length {len(masks) if isinstance(masks, Sequence) else '?'}"
            )
        for index, (mask, n, m) in enumerate(zip(masks, query_lengths, key_lengths, strict=True)):
            if mask is not None:
                check_functional_mask(f"masks[{index}]", mask, (q.shape[1], n, m), "(H, n, m)", q.device, OPS)
    scale = check_attention_options(causal, scale, dropout, False, implementation, IMPLEMENTATIONS)
    return _packed_attention(
        q, k, v, query_lengths, key_lengths, masks=masks, causal=causal, scale=scale, dropout=dropout,
        implementation=implementation,
    )  # fmt: skip
