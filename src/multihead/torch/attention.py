"""Multi-head attention for PyTorch: a module around :func:`multihead.torch.attention`.

The module projects, splits heads, calls the attention function, merges heads and projects out. Two things it
adds: a cache for decoding (a :class:`~multihead.cache.StepCache` such as :class:`KVCache`: self-attention appends
to it; cross-attention projects the memory into it once), where a decoding step is the same call with one query per
row; and, for padded batches with a ``query_mask``, a packed path that projects and attends only the real tokens
(:func:`multihead.torch.packed_attention`), on the devices where that is faster (``PACKED_DEVICES``). Without
gradients its projections run in the forms :mod:`multihead.torch.layouts` lays out for inference (a decoding
session's steps with the weights its :class:`~multihead.torch.layouts.Layouts` laid out for rows of one token), as
the Transformer's feed-forward blocks and output projection do. A step over a cache holding one memory per source
(the rows of a beam-search sentence read the same) attends each source's rows as one sequence of queries.

``forward`` checks its arguments; ``_attend`` is the unchecked path the Transformer's layers call once their own
public entry point has checked theirs.

Notation: B batch, Lq query length, Lk key length, H query heads, Hkv key/value heads, Dk query/key head dim,
Dv value head dim, E = d_model (output width); packed: N real queries and M real keys in the batch; a decoding step:
N rows of one token each, reading S memory slots, at most w rows a slot (:class:`~multihead.cache.MemoryRows`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, cast

import numpy as np
import torch
from torch import nn

from multihead.cache import KVCacheBase, StepCache, attended
from multihead.checks import check_attention_call
from multihead.schema import ATTENTION
from multihead.torch.functional import IMPLEMENTATIONS, StepMask, _attention, _packed_attention
from multihead.torch.layouts import Layouts, apply_form
from multihead.torch.masks import restrict
from multihead.torch.tensors import OPS
from multihead.validation import (
    check_dropout,
    check_flag,
    check_heads,
    check_implementation,
    check_optional_positive_int,
    check_positive_int,
    resolve_head_dim,
)

__all__ = ["KVCache", "MultiHeadAttention"]

PACKED_DEVICES = frozenset({"cpu"})
"""Devices where a padded batch with a ``query_mask`` takes the packed path (only the real tokens, one sequence at a
time), which beats the padded kernel there; elsewhere (CUDA) one kernel call over the padded batch with the padding in
its mask is faster, and padded query rows are zeroed after it (docs/performance.md)."""


class Staging:
    """Memory that :class:`KVCache` moves rows through, grown to the largest move asked of it and kept: a decoder's
    self-attention caches share one (``Transformer.new_cache``), as they move their rows one after the other. Every
    step's moves then reuse the same memory, where a temporary of each move's own size (growing with the tokens
    cached) would leave the heap a hole at every step."""

    def __init__(self) -> None:
        self.memory: torch.Tensor | None = None  # (n,) flat

    def reserve(self, elements: int, like: torch.Tensor) -> None:
        """Grow, if it must, to hold ``elements`` values of ``like``'s dtype and device: to a power of two of them
        (at most ``like``'s own size), so moves that grow take a few sizes, not one per step."""
        held = self.memory
        if held is None or held.numel() < elements or held.dtype != like.dtype or held.device != like.device:
            self.memory = like.new_empty(max(elements, min(1 << (elements - 1).bit_length(), like.numel())))

    def take(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A contiguous tensor of ``shape``, ``like``'s dtype and device, its contents whatever a previous move
        left, in this memory (grown first if it must: :meth:`reserve`)."""
        elements = math.prod(shape)
        self.reserve(elements, like)
        return cast(torch.Tensor, self.memory)[:elements].view(shape)


class KVCache(KVCacheBase):
    """Projected keys and values kept between decoding steps, ``(B, Hkv, L, D)``.

    Passed as ``cache=`` to :class:`MultiHeadAttention`:

    - self-attention (no ``key`` given): each call appends the new tokens' keys and values and attends over
      everything cached so far; with ``causal=True``, decoding token by token equals one causal call on the
      whole sequence.
    - cross-attention (``key`` given): the first call projects ``key``/``value`` and keeps them; later calls
      reuse them without projecting the encoder memory again.

    Args:
        capacity: if given, keys and values are written into buffers of this length allocated on the first
            call (no reallocation per step); more tokens than that raise ``ValueError``. Default: grow by
            concatenation.
    """

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)
        self.staging = Staging()
        """What :meth:`reorder` moves rows through: this cache's own, or one that a decoder's caches share."""

    def _concat(self, cached: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return torch.cat([cached, new], dim=2)

    def _empty(self, like: torch.Tensor, length: int) -> torch.Tensor:
        return like.new_empty((like.shape[0], like.shape[1], length, like.shape[3]))

    def _write(self, buffer: torch.Tensor, new: torch.Tensor, start: int) -> torch.Tensor:
        buffer[:, :, start : start + new.shape[2]] = new
        return buffer

    def _take(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return x.index_select(0, torch.as_tensor(rows, device=x.device))

    def _take_filled(self, buffer: torch.Tensor, rows: torch.Tensor, spare: torch.Tensor | None) -> torch.Tensor:
        # Writing into the spare buffer: a new one would cost more than the copy (fresh pages at every step).
        rows = torch.as_tensor(rows, device=buffer.device)
        if spare is None or spare.shape[0] < rows.shape[0]:
            spare = buffer.new_empty((rows.shape[0], *buffer.shape[1:]))
        out = spare[: rows.shape[0]]  # (n, Hkv, capacity, D)
        torch.index_select(buffer[:, :, : self.length], 0, rows, out=out[:, :, : self.length])
        return out

    _fills_spare = True

    def _keep(self, x: torch.Tensor) -> torch.Tensor:
        # Projected keys arrive as a transposed view; matmul would copy it to contiguous memory at every step.
        return x.contiguous()

    _moves_rows = True
    shares_memory = True

    def _move_rows(self, targets: np.ndarray, sources: np.ndarray) -> None:
        if self._keys is None or self._values is None:
            return
        device = self._keys.device
        targets_t, sources_t = torch.from_numpy(targets).to(device), torch.from_numpy(sources).to(device)
        buffers = (self._keys, self._values)
        largest = max(buffers, key=torch.Tensor.numel)  # keys and values may differ in head size: room for either
        self.staging.reserve(len(sources) * math.prod(largest.shape[1:]), largest)
        for buffer in buffers:
            filled = buffer[:, :, : self.length]  # (B, Hkv, L, D), a view
            read = self.staging.take((len(sources), *filled.shape[1:]), buffer)  # (n, Hkv, L, D)
            torch.index_select(filled, 0, sources_t, out=read)
            filled.index_copy_(0, targets_t, read)


def _sequence_masks(
    mask: torch.Tensor | None, query_mask: torch.Tensor, key_mask: torch.Tensor, causal: bool
) -> tuple[list[torch.Tensor | None] | None, bool]:
    """Each sequence's part of a ``(B|1, H|1, Lq|1, Lk|1)`` mask at its real query and key positions, and whether
    :func:`packed_attention`'s own causal rule gives the causal masking of the original positions.

    It does when every sequence's real positions are prefixes whose lengths keep the batch's offset ``Lk - Lq``;
    otherwise the causal rule of the original positions is written into the masks.
    """
    offset = key_mask.shape[1] - query_mask.shape[1]
    positions = [(q.nonzero()[:, 0], k.nonzero()[:, 0]) for q, k in zip(query_mask, key_mask, strict=True)]
    prefix_causal = causal and all(
        (len(q) == 0 or int(q[-1]) == len(q) - 1) and (len(k) == 0 or int(k[-1]) == len(k) - 1)
        and len(k) - len(q) == offset
        for q, k in positions
    )  # fmt: skip
    if mask is None and not (causal and not prefix_causal):
        return None, prefix_causal
    masks: list[torch.Tensor | None] = []
    for b, (q_pos, k_pos) in enumerate(positions):
        mask_b = None
        if mask is not None:
            mask_b = mask[b if mask.shape[0] > 1 else 0]  # (H|1, Lq|1, Lk|1)
            mask_b = mask_b.index_select(1, q_pos) if mask_b.shape[1] > 1 else mask_b
            mask_b = mask_b.index_select(2, k_pos) if mask_b.shape[2] > 1 else mask_b  # (H|1, n|1, m|1)
        if causal and not prefix_causal:
            mask_b = restrict(mask_b, k_pos[None, :] <= q_pos[:, None] + offset)  # AND (n, m)
        masks.append(mask_b)
    return masks, prefix_causal


@dataclass(frozen=True)
class RealRows:
    """The real (unpadded) positions of a padded batch ``(B, L)``, which a decoding session's encoder computes alone:
    ``index (T,)``, their flat indices in ``B * L``."""

    index: torch.Tensor
    batch: int
    length: int

    @staticmethod
    def of(key_mask: torch.Tensor) -> RealRows:
        """The positions ``True`` in ``key_mask (B, L)``."""
        return RealRows(key_mask.reshape(-1).nonzero().squeeze(1), *key_mask.shape)

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """``x (B, L, W)`` at the real positions: ``(T, W)``."""
        return x.reshape(self.batch * self.length, -1).index_select(0, self.index)

    def spread(self, x: torch.Tensor) -> torch.Tensor:
        """``x (T, W)`` back at its positions: ``(B, L, W)``, zeros at the others."""
        padded = x.new_zeros(self.batch * self.length, x.shape[1]).index_copy_(0, self.index, x)
        return padded.view(self.batch, self.length, -1)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (self, cross, grouped-query), batch first.

    Args:
        d_model: output width ``E`` (and default input width).
        num_heads: query heads ``H``.
        head_dim: query/key width per head ``Dk``; default ``d_model // num_heads`` (which must divide).
        value_head_dim: value width per head ``Dv``; default ``head_dim``.
        num_kv_heads: key/value heads ``Hkv`` (grouped-query attention when ``< num_heads``; multi-query when
            1); must divide ``num_heads``. Default ``num_heads``.
        qdim, kdim, vdim: input widths of query, key and value; default ``d_model``.
        dropout: dropout on the attention probabilities, in training only.
        bias: whether the four projections have a bias.
        implementation: the attention path, as :func:`multihead.torch.attention`'s ``implementation``:
            ``"auto"`` (default), ``"fused"`` or ``"explicit"``.

    Submodules ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` are ``nn.Linear``; head ``h`` owns rows
    ``h*Dk:(h+1)*Dk`` of ``q_proj``.

    Example:
        >>> mha = MultiHeadAttention(512, 8)
        >>> x = torch.randn(64, 5, 512)
        >>> mha(x, causal=True).shape
        torch.Size([64, 5, 512])
    """

    INFERENCE_FORMS: ClassVar[dict[str, tuple[str, ...]]] = {
        **{form: (name,) for form, name in zip(("q", "k", "v", "out"), ATTENTION, strict=True)},
        "qkv": ATTENTION[:3],
    }
    """The projections' inference forms (see :mod:`multihead.torch.layouts`): each alone, and the query, key and
    value of a decoding step's self-attention as one product."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        value_head_dim: int | None = None,
        num_kv_heads: int | None = None,
        qdim: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        implementation: str = "auto",
    ) -> None:
        super().__init__()
        d_model = check_positive_int("d_model", d_model)
        num_heads, num_kv_heads = check_heads(num_heads, num_kv_heads)
        head_dim = resolve_head_dim(d_model, num_heads, check_optional_positive_int("head_dim", head_dim))
        value_head_dim = check_optional_positive_int("value_head_dim", value_head_dim) or head_dim
        qdim, kdim, vdim = (
            check_optional_positive_int(name, dim) or d_model
            for name, dim in (("qdim", qdim), ("kdim", kdim), ("vdim", vdim))
        )
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.value_head_dim = value_head_dim
        self.qdim, self.kdim, self.vdim = qdim, kdim, vdim
        self.dropout = check_dropout("dropout", dropout)
        self.implementation = check_implementation(implementation, IMPLEMENTATIONS)
        bias = check_flag("bias", bias)

        self.q_proj = nn.Linear(qdim, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(kdim, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(vdim, num_kv_heads * value_head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * value_head_dim, d_model, bias=bias)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, value_head_dim={self.value_head_dim}, dropout={self.dropout}"
            + ("" if self.implementation == "auto" else f", implementation={self.implementation!r}")
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        query_mask: torch.Tensor | None = None,
        causal: bool = False,
        return_weights: bool = False,
        cache: KVCache | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(B, Lq, qdim)``.
            key: ``(B, Lk, kdim)``; default ``query`` (self-attention).
            value: ``(B, Lk, vdim)``; default ``key``.
            mask: ``(Lq, Lk)``, ``(B, Lq, Lk)`` or broadcastable to ``(B, H, Lq, Lk)``; bool (``True`` = attend)
                or float (added to the scores).
            key_mask: ``(B, Lk)`` bool, ``True`` at real (non-pad) keys.
            query_mask: ``(B, Lq)`` bool, ``True`` at real queries; padded query rows give zero output and
                weights. On the CPU, without ``cache`` or ``return_weights``, they are not computed: each
                sequence's real queries attend only its real keys (those of ``key_mask``), so padding costs
                nothing; on a GPU one fused kernel call over the padded batch is faster. Pass both masks for a
                padded self-attention batch.
            causal: bottom-right aligned causal masking, combined with the masks by AND.
            return_weights: also return the per-head weights ``(B, H, Lq, Lk)``.
            cache: a :class:`KVCache`. Self-attention appends to it and attends over all cached tokens (``Lk``
                is then the cached length: masks cover every cached key); cross-attention projects the memory
                into it once and reuses it.

        Returns:
            ``(B, Lq, E)``, or ``(out, weights)``.
        """
        call = check_attention_call(
            self, query, key, value, mask=mask, key_mask=key_mask, query_mask=query_mask, causal=causal,
            return_weights=return_weights, cache=cache, cache_type=KVCache, implementations=IMPLEMENTATIONS, ops=OPS,
            parameter=self.q_proj.weight,
        )  # fmt: skip
        if query_mask is not None and cache is None and not return_weights and query.device.type in PACKED_DEVICES:
            return self._attend_packed(
                query, call.key, call.value, mask=call.mask, key_mask=key_mask, query_mask=query_mask, causal=causal
            )
        out, weights = self._attend(
            query, call.key, call.value, mask=call.padded_mask(), causal=causal, return_weights=return_weights,
            cache=cache, self_attention=call.self_attention,
        )  # fmt: skip
        return call.finish(out, weights)

    def _attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        *,
        mask: torch.Tensor | StepMask | None,
        causal: bool = False,
        return_weights: bool = False,
        cache: StepCache | None = None,
        self_attention: bool,
        layouts: Layouts | None = None,
        real: RealRows | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`forward` on checked arguments: the output and, with ``return_weights``, the weights (else
        ``None``). ``mask`` is 4-D ``(B|1, H|1, Lq|1, Lk|1)`` with the key padding already in it (at a decoding step,
        a :class:`~multihead.torch.functional.StepMask`); ``self_attention`` says whether a cache appends ``key`` or
        holds the memory (``key`` and ``value`` may then be ``None``). A decoding session's ``layouts`` lay out the
        projections (no gradients); its steps (one query per row, a cache) project the query, key and value of
        self-attention as one product, as does its encoder, whose ``query`` may be the ``real`` rows alone ``(T, E)``
        (projected alone, attending as the padded batch; the output ``(T, E)``)."""
        if real is not None:
            return self._attend_real(query, real, mask, layouts)
        batch, lq, _ = query.shape
        if layouts is not None and cache is not None and lq == 1 and not return_weights:
            q, k, v = self._project_step(query, key, value, cache, self_attention, layouts)
            rows = None if self_attention else cache.memory_rows
            if rows is not None:  # each memory slot's rows as the queries of one sequence
                if rows.grid is not None:
                    q = q.index_select(0, rows.grid)  # (S*w, H, 1, Dk)
                q = q.view(rows.slots, rows.width, self.num_heads, self.head_dim).transpose(1, 2)  # (S, H, w, Dk)
            out, _ = _attention(
                q, k, v, mask, causal=causal, scale=None, dropout=self.dropout if self.training else 0.0,
                return_weights=False, implementation=self.implementation,
            )  # fmt: skip  # (N, H, 1, Dv), or (S, H, w, Dv)
            if rows is not None:
                out = out.transpose(1, 2).reshape(rows.slots * rows.width, -1)  # (S*w, H*Dv)
                if rows.place is not None:
                    out = out.index_select(0, rows.place)  # (N, H*Dv)
            return layouts[self, "out"](out.reshape(batch, -1)).unsqueeze(1), None  # (N, 1, E)
        if cache is not None and not self_attention and cache.memory_rows is not None:
            raise ValueError("a cache holding one memory per source is read by a decoding session's steps only")
        if layouts is not None and cache is None and key is query and value is query:  # a session's encoder
            q, k, v = self._heads(layouts[self, "qkv"](query))
        else:
            q = apply_form(self, "q", query, layouts)  # (B, Lq, H*Dk)
            q = q.view(batch, lq, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, Lq, Dk)
            k, v = attended(cache, self_attention, lambda: self._project_given(key, value, layouts))
        out, weights = _attention(
            q, k, v, mask, causal=causal, scale=None, dropout=self.dropout if self.training else 0.0,
            return_weights=return_weights, implementation=self.implementation,
        )  # fmt: skip
        out = out.transpose(1, 2).reshape(batch, lq, self.num_heads * self.value_head_dim)  # (B, Lq, H*Dv)
        return apply_form(self, "out", out, layouts), weights  # (B, Lq, E)

    def _heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ``qkv`` form's output ``(B, L, H*Dk + Hkv*Dk + Hkv*Dv)`` as queries ``(B, H, L, Dk)``, keys ``(B, Hkv, L,
        Dk)`` and values ``(B, Hkv, L, Dv)``."""
        batch, length, _ = qkv.shape
        q, k, v = qkv.split(self._qkv_widths(), dim=2)  # (B, L, H*Dk), (B, L, Hkv*Dk), (B, L, Hkv*Dv)
        q = q.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, L, Dk)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, L, Dk)
        v = v.view(batch, length, self.num_kv_heads, self.value_head_dim).transpose(1, 2)  # (B, Hkv, L, Dv)
        return q, k, v

    def _attend_real(
        self, query: torch.Tensor, real: RealRows, mask: torch.Tensor | StepMask | None, layouts: Layouts | None
    ) -> tuple[torch.Tensor, None]:
        """A session encoder's self-attention of the ``real`` rows ``query (T, E)``: projected alone, attending as the
        padded batch (``mask``: its key padding), the output ``(T, E)``."""
        q, k, v = self._heads(real.spread(apply_form(self, "qkv", query, layouts)))
        out, _ = _attention(
            q, k, v, mask, causal=False, scale=None, dropout=0.0, return_weights=False,
            implementation=self.implementation,
        )  # fmt: skip  # (B, H, L, Dv)
        out = real.take(out.transpose(1, 2))  # (T, H*Dv)
        return apply_form(self, "out", out, layouts), None

    def _project_step(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        cache: StepCache,
        self_attention: bool,
        layouts: Layouts,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A decoding step's queries ``(N, H, 1, Dk)`` and the keys and values it attends ``(N, Hkv, L, D)``: in
        self-attention the token's own, projected with the query (one product) and appended to ``cache``."""
        rows = query.shape[0]
        x = query.reshape(rows, -1)  # (N, qdim)
        if not self_attention:
            q = layouts[self, "q"](x).view(rows, self.num_heads, 1, self.head_dim)  # (N, H, 1, Dk)
            return (q, *attended(cache, False, lambda: self._project_given(key, value, layouts)))
        q, k, v = layouts[self, "qkv"](x).split(self._qkv_widths(), dim=1)  # (N, H*Dk), (N, Hkv*Dk), (N, Hkv*Dv)
        q = q.view(rows, self.num_heads, 1, self.head_dim)  # (N, H, 1, Dk)
        k = k.view(rows, self.num_kv_heads, 1, self.head_dim)  # (N, Hkv, 1, Dk)
        v = v.view(rows, self.num_kv_heads, 1, self.value_head_dim)  # (N, Hkv, 1, Dv)
        return (q, *cache.append(k, v))

    def _qkv_widths(self) -> tuple[int, int, int]:
        """The widths of the queries, keys and values side by side in the ``qkv`` form's output."""
        kv_heads = self.num_kv_heads
        return (self.num_heads * self.head_dim, kv_heads * self.head_dim, kv_heads * self.value_head_dim)

    def _project_given(
        self, key: torch.Tensor | None, value: torch.Tensor | None, layouts: Layouts | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_project_keys_values` of a call that brings them (not a cross-attention step over cached memory)."""
        if key is None or value is None:
            raise ValueError("no keys and values to attend: give them, or a cache that holds the memory's projection")
        return self._project_keys_values(key, value, layouts)

    def _project_keys_values(
        self, key: torch.Tensor, value: torch.Tensor, layouts: Layouts | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``key (B, Lk, kdim)``, ``value (B, Lk, vdim)`` → keys ``(B, Hkv, Lk, Dk)``, values ``(B, Hkv, Lk, Dv)``."""
        batch, length, _ = key.shape
        k = apply_form(self, "k", key, layouts).view(batch, length, self.num_kv_heads, self.head_dim)
        v = apply_form(self, "v", value, layouts).view(batch, length, self.num_kv_heads, self.value_head_dim)
        return k.transpose(1, 2), v.transpose(1, 2)  # (B, Hkv, Lk, Dk), (B, Hkv, Lk, Dv)

    def _attend_packed(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        key_mask: torch.Tensor | None,
        query_mask: torch.Tensor,
        causal: bool,
    ) -> torch.Tensor:
        """Project and attend only the real queries and keys (:func:`packed_attention`); padded rows stay zero."""
        batch, lq, _ = query.shape
        lk = key.shape[1]
        key_mask = torch.ones(batch, lk, dtype=torch.bool, device=key.device) if key_mask is None else key_mask
        q_rows, k_rows = query_mask.reshape(-1).nonzero()[:, 0], key_mask.reshape(-1).nonzero()[:, 0]  # (N,), (M,)
        q = apply_form(self, "q", query.reshape(batch * lq, self.qdim).index_select(0, q_rows))  # (N, H*Dk)
        k = apply_form(self, "k", key.reshape(batch * lk, self.kdim).index_select(0, k_rows))  # (M, Hkv*Dk)
        v = apply_form(self, "v", value.reshape(batch * lk, self.vdim).index_select(0, k_rows))  # (M, Hkv*Dv)
        masks, packed_causal = _sequence_masks(mask, query_mask, key_mask, causal)
        out = _packed_attention(
            q.view(-1, self.num_heads, self.head_dim),  # (N, H, Dk)
            k.view(-1, self.num_kv_heads, self.head_dim),  # (M, Hkv, Dk)
            v.view(-1, self.num_kv_heads, self.value_head_dim),  # (M, Hkv, Dv)
            query_mask.sum(1).tolist(),
            key_mask.sum(1).tolist(),
            masks=masks,
            causal=packed_causal,
            scale=None,
            dropout=self.dropout if self.training else 0.0,
            implementation=self.implementation,
        )  # (N, H, Dv)
        packed = apply_form(self, "out", out.reshape(-1, self.num_heads * self.value_head_dim))  # (N, E)
        out = packed.new_zeros(batch * lq, self.d_model).index_copy(0, q_rows, packed)  # (B*Lq, E)
        return out.view(batch, lq, self.d_model)

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of ``torch.nn.MultiheadAttention`` with the same weights and outputs.

        Our module is always batch first; feed ``(B, L, E)`` whatever ``module.batch_first`` was. Masks follow
        our convention (``True`` = attend): pass ``mask=~attn_mask`` and ``key_mask=~key_padding_mask`` for
        PyTorch's boolean masks (where ``True`` = ignore); float masks carry over unchanged.
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"`module` must be a torch.nn.MultiheadAttention, received {type(module).__name__}")
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError(
                "`module` uses add_bias_kv or add_zero_attn, which append extra keys; "
                f"MultiHeadAttention has no equivalent (received add_bias_kv={module.bias_k is not None}, "
                f"add_zero_attn={module.add_zero_attn})"
            )
        embed = module.embed_dim
        has_bias = module.in_proj_bias is not None
        ours = cls(
            embed,
            module.num_heads,
            kdim=module.kdim,
            vdim=module.vdim,
            dropout=module.dropout,
            bias=has_bias,
        )
        if module.in_proj_weight is not None:
            q_weight, k_weight, v_weight = module.in_proj_weight.chunk(3)
        else:
            q_weight, k_weight, v_weight = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
        with torch.no_grad():
            for proj, weight in zip(
                (ours.q_proj, ours.k_proj, ours.v_proj), (q_weight, k_weight, v_weight), strict=True
            ):
                proj.weight.copy_(weight)
            ours.out_proj.weight.copy_(module.out_proj.weight)
            if has_bias:
                for proj, bias in zip(
                    (ours.q_proj, ours.k_proj, ours.v_proj), module.in_proj_bias.chunk(3), strict=True
                ):
                    proj.bias.copy_(bias)
                ours.out_proj.bias.copy_(module.out_proj.bias)
        return ours.to(device=module.out_proj.weight.device, dtype=module.out_proj.weight.dtype)
