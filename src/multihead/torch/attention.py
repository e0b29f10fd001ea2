"""Multi-head attention for PyTorch: a thin module around :func:`multihead.torch.attention`.

The module only projects, splits heads, calls the attention function, merges heads and projects out.

Notation: B batch, Lq query length, Lk key length, H query heads, Hkv key/value heads, Dk query/key head dim,
Dv value head dim, E = d_model (output width).
"""

from __future__ import annotations

import torch
from torch import nn

from multihead.cache import KVCacheBase
from multihead.torch.checks import check_hidden, check_key_mask
from multihead.torch.functional import attention
from multihead.torch.masks import check_mask_tensor, restrict
from multihead.validation import (
    check_broadcastable,
    check_dropout,
    check_flag,
    check_heads,
    check_module_inputs,
    check_optional_positive_int,
    check_positive_int,
    module_mask_shape,
    resolve_head_dim,
)

__all__ = ["KVCache", "MultiHeadAttention"]


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

    def _concat(self, cached: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return torch.cat([cached, new], dim=2)

    def _empty(self, like: torch.Tensor, length: int) -> torch.Tensor:
        return like.new_empty((like.shape[0], like.shape[1], length, like.shape[3]))

    def _write(self, buffer: torch.Tensor, new: torch.Tensor, start: int) -> torch.Tensor:
        buffer[:, :, start : start + new.shape[2]] = new
        return buffer

    def _take(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return x.index_select(0, torch.as_tensor(rows, device=x.device))


def _sequence_mask(
    mask: torch.Tensor | None, query_rows: torch.Tensor, key_rows: torch.Tensor, b: int, causal: bool
) -> tuple[torch.Tensor | None, bool]:
    """Sequence ``b``'s part of a ``(B|1, H|1, Lq|1, Lk|1)`` mask, at its real query and key positions.

    Causal alignment follows the original positions. When the real positions are prefixes whose lengths keep
    the batch's offset ``Lk - Lq``, the kernel's own causal masking is exact; otherwise it is written out.
    """
    q_pos, k_pos = query_rows.nonzero()[:, 0], key_rows.nonzero()[:, 0]  # (n,), (m,)
    if mask is not None:
        mask = mask[b if mask.shape[0] > 1 else 0]  # (H|1, Lq|1, Lk|1)
        mask = mask.index_select(1, q_pos) if mask.shape[1] > 1 else mask
        mask = mask.index_select(2, k_pos) if mask.shape[2] > 1 else mask
        mask = mask[None]  # (1, H|1, n|1, m|1)
    if not causal:
        return mask, False
    n, m = len(q_pos), len(k_pos)
    offset = len(key_rows) - len(query_rows)
    prefixes = (n == 0 or int(q_pos[-1]) == n - 1) and (m == 0 or int(k_pos[-1]) == m - 1)
    if prefixes and m - n == offset:
        return mask, True
    allowed = k_pos[None, :] <= q_pos[:, None] + offset  # (n, m)
    return restrict(mask, allowed), False


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

    Submodules ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` are ``nn.Linear``; head ``h`` owns rows
    ``h*Dk:(h+1)*Dk`` of ``q_proj``.

    Example:
        >>> mha = MultiHeadAttention(512, 8)
        >>> x = torch.randn(64, 5, 512)
        >>> mha(x, causal=True).shape
        torch.Size([64, 5, 512])
    """

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
        bias = check_flag("bias", bias)

        self.q_proj = nn.Linear(qdim, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(kdim, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(vdim, num_kv_heads * value_head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * value_head_dim, d_model, bias=bias)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, value_head_dim={self.value_head_dim}, dropout={self.dropout}"
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
            query_mask: ``(B, Lq)`` bool, ``True`` at real queries. Padded query rows are not computed: their
                output and weights are zero. Without ``cache`` or ``return_weights``, each sequence's real
                queries attend only its real keys (those of ``key_mask``), so padding costs nothing; pass both
                masks for a padded self-attention batch.
            causal: bottom-right aligned causal masking, combined with the masks by AND.
            return_weights: also return the per-head weights ``(B, H, Lq, Lk)``.
            cache: a :class:`KVCache`. Self-attention appends to it and attends over all cached tokens (``Lk``
                is then the cached length: masks cover every cached key); cross-attention projects the memory
                into it once and reuses it.

        Returns:
            ``(B, Lq, E)``, or ``(out, weights)``.
        """
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"`cache` must be a KVCache or None, received {type(cache).__name__}")
        check_flag("causal", causal)
        check_flag("return_weights", return_weights)
        self_attention = key is None
        key = query if key is None else key
        value = key if value is None else value
        for name, x, width in (("query", query, self.qdim), ("key", key, self.kdim), ("value", value, self.vdim)):
            check_hidden(name, x, width, self.q_proj.weight)
        check_module_inputs(tuple(query.shape), tuple(key.shape), tuple(value.shape), self.qdim, self.kdim, self.vdim)
        batch, lq, _ = query.shape
        reuse_memory = cache is not None and not self_attention and cache.length > 0
        if reuse_memory:
            cache.check_reuse(batch)
        elif cache is not None:
            new = lq if self_attention else key.shape[1]
            cache.check_append(batch, new, self.num_kv_heads, self.head_dim, self.value_head_dim)
        lk = cache.length if reuse_memory else key.shape[1]
        lk += cache.length if cache is not None and self_attention else 0
        if query_mask is not None:
            check_key_mask("query_mask", query_mask, batch, lq)
            if cache is None and not return_weights:
                full_mask = self._full_mask(mask, None, batch, lq, lk)
                key_mask = check_key_mask("key_mask", key_mask, batch, lk)
                return self._forward_packed(query, key, value, full_mask, key_mask, query_mask, causal)
        full_mask = restrict(
            self._full_mask(mask, key_mask, batch, lq, lk), None if query_mask is None else query_mask[:, None, :, None]
        )

        q = self.q_proj(query).view(batch, lq, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, Lq, Dk)
        if reuse_memory:
            k, v = cache.keys, cache.values
        else:
            new = key.shape[1]
            k = self.k_proj(key).view(batch, new, self.num_kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(value).view(batch, new, self.num_kv_heads, self.value_head_dim).transpose(1, 2)
            # k: (B, Hkv, new, Dk), v: (B, Hkv, new, Dv)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, Hkv, Lk, D)
        result = attention(
            q,
            k,
            v,
            full_mask,
            causal=causal,
            dropout=self.dropout if self.training else 0.0,
            return_weights=return_weights,
        )
        out, weights = result if return_weights else (result, None)
        out = out.transpose(1, 2).reshape(batch, lq, self.num_heads * self.value_head_dim)  # (B, Lq, H*Dv)
        out = self.out_proj(out)  # (B, Lq, E)
        if query_mask is not None:
            out = out.masked_fill(~query_mask[:, :, None], 0.0)
        return (out, weights) if return_weights else out

    def _forward_packed(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        key_mask: torch.Tensor | None,
        query_mask: torch.Tensor,
        causal: bool,
    ) -> torch.Tensor:
        """Project and attend only the real queries and keys, one sequence at a time; padded rows stay zero.

        N is the number of real queries in the batch, M the number of real keys; ``n``/``m`` a sequence's.
        """
        batch, lq, _ = query.shape
        lk = key.shape[1]
        key_mask = torch.ones(batch, lk, dtype=torch.bool, device=key.device) if key_mask is None else key_mask
        q_rows, k_rows = query_mask.reshape(-1).nonzero()[:, 0], key_mask.reshape(-1).nonzero()[:, 0]  # (N,), (M,)
        q = self.q_proj(query.reshape(batch * lq, self.qdim).index_select(0, q_rows))  # (N, H*Dk)
        k = self.k_proj(key.reshape(batch * lk, self.kdim).index_select(0, k_rows))  # (M, Hkv*Dk)
        v = self.v_proj(value.reshape(batch * lk, self.vdim).index_select(0, k_rows))  # (M, Hkv*Dv)
        q_counts, k_counts = query_mask.sum(1).tolist(), key_mask.sum(1).tolist()
        dropout = self.dropout if self.training else 0.0
        outs = []
        for b, q_b, k_b, v_b in zip(range(batch), q.split(q_counts), k.split(k_counts), v.split(k_counts), strict=True):
            if not q_counts[b]:
                continue
            q_b = q_b.view(1, -1, self.num_heads, self.head_dim).transpose(1, 2)  # (1, H, n, Dk)
            k_b = k_b.view(1, -1, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (1, Hkv, m, Dk)
            v_b = v_b.view(1, -1, self.num_kv_heads, self.value_head_dim).transpose(1, 2)  # (1, Hkv, m, Dv)
            mask_b, causal_b = _sequence_mask(mask, query_mask[b], key_mask[b], b, causal)
            out_b = attention(q_b, k_b, v_b, mask_b, causal=causal_b, dropout=dropout)  # (1, H, n, Dv)
            outs.append(out_b[0].transpose(0, 1).reshape(-1, self.num_heads * self.value_head_dim))  # (n, H*Dv)
        packed = self.out_proj(torch.cat(outs) if outs else q.new_empty(0, self.num_heads * self.value_head_dim))
        out = packed.new_zeros(batch * lq, self.d_model).index_copy(0, q_rows, packed)  # (B*Lq, E)
        return out.view(batch, lq, self.d_model)

    def _full_mask(
        self, mask: torch.Tensor | None, key_mask: torch.Tensor | None, batch: int, lq: int, lk: int
    ) -> torch.Tensor | None:
        """``mask`` in the 4-D functional layout, AND the key padding; validated against this call's sizes."""
        if mask is not None:
            check_mask_tensor("mask", mask)
            mask = mask.reshape(module_mask_shape(mask.shape))  # (B|1, H|1, Lq|1, Lk|1)
            check_broadcastable("mask", tuple(mask.shape), (batch, self.num_heads, lq, lk), "(B, H, Lq, Lk)")
        key_mask = check_key_mask("key_mask", key_mask, batch, lk)
        return mask if key_mask is None else restrict(mask, key_mask[:, None, None, :])  # (B, 1|H, 1|Lq, Lk)

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
