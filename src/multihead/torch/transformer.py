"""The encoder-decoder Transformer ("Attention Is All You Need") on :class:`MultiHeadAttention`, for PyTorch.

Post-norm as in the paper (``x = LayerNorm(x + Sublayer(x))``) by default; pre-norm
(``x = x + Sublayer(LayerNorm(x))``, with a final LayerNorm after each stack) with ``norm_first=True``.

Notation: B batch, Ls source length, Lt target length, E d_model, V vocabulary size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from multihead.cache import DecoderCache, check_decoder_cache
from multihead.config import ACTIVATIONS, TransformerConfig, config_fields
from multihead.decoding import beam_search, check_generation_args, greedy_search
from multihead.positional import sinusoidal_positions
from multihead.torch.attention import KVCache, MultiHeadAttention
from multihead.torch.checks import check_hidden, check_key_mask
from multihead.torch.masks import check_token_ids, padding_mask_from_tokens
from multihead.validation import (
    check_dropout,
    check_flag,
    check_non_negative_int,
    check_positions,
    check_positive_int,
    check_same_batch,
)

__all__ = [
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "PositionalEncoding",
    "Transformer",
]

LAYER_NORM_EPS = 1e-5


class PositionalEncoding(nn.Module):
    """Adds the paper's sinusoidal position encodings to ``(B, L, E)`` inputs, then dropout.

    ``offset`` shifts the positions (the first new token's position when decoding with a cache).
    """

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.max_len = check_positive_int("max_len", max_len)
        self.dropout = nn.Dropout(check_dropout("dropout", dropout))
        table = torch.from_numpy(sinusoidal_positions(max_len, d_model)).float()
        self.register_buffer("table", table, persistent=False)  # derived, so never saved

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        check_hidden("x", x, self.d_model, None)  # the table follows x's dtype
        check_non_negative_int("offset", offset)
        length = x.shape[1]
        if offset + length > self.max_len:
            raise ValueError(
                f"positions {offset}..{offset + length - 1} exceed max_len={self.max_len}; "
                "build the model with a larger max_len"
            )
        return self.dropout(x + self.table[offset : offset + length].to(x.dtype))


class FeedForward(nn.Module):
    """Position-wise feed-forward block: ``linear2(dropout(activation(linear1(x))))``."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {ACTIVATIONS}, received {activation!r}")
        self.activation = activation
        self.linear1 = nn.Linear(check_positive_int("d_model", d_model), check_positive_int("d_ff", d_ff))
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(check_dropout("dropout", dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_hidden("x", x, self.linear1.in_features, self.linear1.weight)
        hidden = F.relu(self.linear1(x)) if self.activation == "relu" else F.gelu(self.linear1(x))
        return self.linear2(self.dropout(hidden))


class _Block(nn.Module):
    """What the encoder and decoder layers share: self-attention, feed-forward, their LayerNorms, and residual
    connections with LayerNorm before (``norm_first``) or after."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.norm_first = check_flag("norm_first", norm_first)
        self.dropout = nn.Dropout(check_dropout("dropout", dropout))
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model, eps=LAYER_NORM_EPS)
        self.norm2 = nn.LayerNorm(d_model, eps=LAYER_NORM_EPS)

    def check_input(self, x: object, key_mask: object, key_mask_name: str, cached: int = 0) -> None:
        """``x (B, L, E)`` and its ``(B, cached + L)`` key mask."""
        check_hidden("x", x, self.self_attn.d_model, self.self_attn.q_proj.weight)
        check_key_mask(key_mask_name, key_mask, x.shape[0], cached + x.shape[1])

    def residual(self, x: torch.Tensor, norm: nn.LayerNorm, sublayer) -> torch.Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))


class EncoderLayer(_Block):
    """Self-attention then feed-forward, each with a residual connection and LayerNorm."""

    def forward(self, x: torch.Tensor, *, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        self.check_input(x, key_mask, "key_mask")
        x = self.residual(x, self.norm1, lambda h: self.self_attn(h, key_mask=key_mask))
        return self.residual(x, self.norm2, self.feed_forward)


class DecoderLayer(_Block):
    """Causal self-attention, cross-attention over the encoder memory, feed-forward; residuals and LayerNorm."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
    ) -> None:
        super().__init__(d_model, num_heads, d_ff, dropout, activation, norm_first)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.norm3 = nn.LayerNorm(d_model, eps=LAYER_NORM_EPS)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        *,
        tgt_key_mask: torch.Tensor | None = None,
        memory_key_mask: torch.Tensor | None = None,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``x (B, Lt, E)``, ``memory (B, Ls, E)``; with ``return_weights`` also the cross-attention weights
        ``(B, H, Lt, Ls)``."""
        for name, cache in (("self_cache", self_cache), ("cross_cache", cross_cache)):
            if cache is not None and not isinstance(cache, KVCache):
                raise TypeError(f"`{name}` must be a KVCache or None, received {type(cache).__name__}")
        self.check_input(x, tgt_key_mask, "tgt_key_mask", 0 if self_cache is None else self_cache.length)
        check_memory(memory, x, memory_key_mask, self.cross_attn.q_proj.weight)
        check_flag("return_weights", return_weights)
        x = self.residual(
            x, self.norm1, lambda h: self.self_attn(h, key_mask=tgt_key_mask, causal=True, cache=self_cache)
        )
        cross_weights = []

        def cross(h: torch.Tensor) -> torch.Tensor:
            out = self.cross_attn(h, memory, key_mask=memory_key_mask, cache=cross_cache, return_weights=return_weights)
            if return_weights:
                cross_weights.append(out[1])
                return out[0]
            return out

        x = self.residual(x, self.norm2, cross)
        x = self.residual(x, self.norm3, self.feed_forward)
        return (x, cross_weights[0]) if return_weights else x


def check_memory(memory: object, x: torch.Tensor, memory_key_mask: object, parameter: torch.Tensor | None) -> None:
    """The encoder output ``(B, Ls, E)`` for the decoder's ``x (B, Lt, E)``, and its ``(B, Ls)`` key mask."""
    check_hidden("memory", memory, x.shape[-1], parameter)
    check_same_batch(("x", "memory"), (tuple(x.shape), tuple(memory.shape)))
    check_key_mask("memory_key_mask", memory_key_mask, memory.shape[0], memory.shape[1])


class _Stack(nn.Module):
    """A stack of ``num_layers`` blocks, with a final LayerNorm when ``norm_first``."""

    layer_type: type[_Block]

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        check_non_negative_int("num_layers", num_layers)
        self.d_model = d_model
        self.layers = nn.ModuleList(
            self.layer_type(d_model, num_heads, d_ff, dropout, activation, norm_first) for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model, eps=LAYER_NORM_EPS) if norm_first else None


class Encoder(_Stack):
    """A stack of :class:`EncoderLayer`, with a final LayerNorm when ``norm_first``."""

    layer_type = EncoderLayer

    def forward(self, x: torch.Tensor, *, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        check_hidden("x", x, self.d_model, next(self.parameters(), None))
        check_key_mask("key_mask", key_mask, x.shape[0], x.shape[1])
        for layer in self.layers:
            x = layer(x, key_mask=key_mask)
        return x if self.norm is None else self.norm(x)


class Decoder(_Stack):
    """A stack of :class:`DecoderLayer`, with a final LayerNorm when ``norm_first``."""

    layer_type = DecoderLayer

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        *,
        tgt_key_mask: torch.Tensor | None = None,
        memory_key_mask: torch.Tensor | None = None,
        cache: DecoderCache | None = None,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """``x (B, Lt, E)``; with ``return_weights`` also each layer's cross-attention weights ``(B, H, Lt, Ls)``."""
        check_decoder_cache(cache, len(self.layers))
        parameter = next(self.parameters(), None)
        check_hidden("x", x, self.d_model, parameter)
        check_key_mask("tgt_key_mask", tgt_key_mask, x.shape[0], x.shape[1] + (0 if cache is None else cache.length))
        check_memory(memory, x, memory_key_mask, parameter)
        check_flag("return_weights", return_weights)
        cross_weights = []
        for index, layer in enumerate(self.layers):
            x = layer(
                x,
                memory,
                tgt_key_mask=tgt_key_mask,
                memory_key_mask=memory_key_mask,
                self_cache=None if cache is None else cache.self_attention[index],
                cross_cache=None if cache is None else cache.cross_attention[index],
                return_weights=return_weights,
            )
            if return_weights:
                x, weights = x
                cross_weights.append(weights)
        x = x if self.norm is None else self.norm(x)
        return (x, cross_weights) if return_weights else x


class Transformer(nn.Module):
    """Encoder-decoder Transformer for sequence-to-sequence tasks.

    Embeddings are scaled by ``sqrt(d_model)`` and summed with sinusoidal positions, as in the paper; the decoder's
    self-attention is causal. Key masks are ``(B, L)`` bool, ``True`` at real tokens; when ``pad_id`` is set and
    a mask is not given, it is ``tokens != pad_id``.

    Example:
        >>> model = Transformer(20, 20, d_model=32, num_heads=4, num_encoder_layers=1, num_decoder_layers=1,
        ...                     d_ff=64).eval()
        >>> src = torch.randint(3, 20, (2, 7))
        >>> model(src, torch.randint(3, 20, (2, 5))).shape
        torch.Size([2, 5, 20])
        >>> model.generate(src, max_len=6, bos_id=1, eos_id=2).shape[0]
        2
    """

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        *,
        d_model: int = 512,
        num_heads: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        d_ff: int = 2048,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        max_len: int = 512,
        pad_id: int | None = None,
    ) -> None:
        super().__init__()
        config = TransformerConfig(
            src_vocab, tgt_vocab, d_model, num_heads, num_encoder_layers, num_decoder_layers, d_ff, dropout,
            activation, norm_first, max_len, pad_id,
        )  # fmt: skip
        self.config = config
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.positional = PositionalEncoding(d_model, max_len, dropout)
        stack = (d_model, num_heads, d_ff, dropout, activation, norm_first)
        self.encoder = Encoder(num_encoder_layers, *stack)
        self.decoder = Decoder(num_decoder_layers, *stack)
        self.output_proj = nn.Linear(d_model, tgt_vocab)
        # Embeddings start at std d_model^-1/2, so after the sqrt(d_model) scaling they have unit variance, like
        # the positional encodings. (nn.Embedding's default N(0, 1) would drown the positions 11-fold at E=128.)
        for embedding in (self.src_embed, self.tgt_embed):
            nn.init.normal_(embedding.weight, std=d_model**-0.5)

    @classmethod
    def from_config(cls, config: TransformerConfig | Mapping[str, Any]) -> Transformer:
        """From a :class:`TransformerConfig` or a dict of its fields."""
        values = config_fields(config)
        return cls(values.pop("src_vocab"), values.pop("tgt_vocab"), **values)

    def _check_tokens(self, name: str, tokens: object, vocab: int, offset: int = 0) -> torch.Tensor:
        """Token ids ``(B, L)`` in ``[0, vocab)``, at positions ``offset .. offset + L - 1`` within ``max_len``."""
        check_token_ids(name, tokens)
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
            raise ValueError(
                f"`{name}` must hold ids in [0, {vocab}), received ids from {int(tokens.min())} to {int(tokens.max())}"
            )
        check_positions(name, offset, tokens.shape[1], self.config.max_len)
        return tokens

    def _key_mask(self, tokens: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor | None:
        if key_mask is None and self.config.pad_id is not None:
            return padding_mask_from_tokens(tokens, self.config.pad_id)
        return key_mask

    def _embed(self, embedding: nn.Embedding, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return self.positional(embedding(tokens) * math.sqrt(self.config.d_model), offset)  # (B, L, E)

    def _check_source(self, src: object, src_key_mask: object) -> torch.Tensor:
        src = self._check_tokens("src", src, self.config.src_vocab)
        check_key_mask("src_key_mask", src_key_mask, src.shape[0], src.shape[1])
        return src

    def encode(self, src: torch.Tensor, *, src_key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``src (B, Ls)`` token ids → memory ``(B, Ls, E)``."""
        src = self._check_source(src, src_key_mask)
        key_mask = self._key_mask(src, src_key_mask)
        return self.encoder(self._embed(self.src_embed, src), key_mask=key_mask)

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        *,
        memory_key_mask: torch.Tensor | None = None,
        tgt_key_mask: torch.Tensor | None = None,
        cache: DecoderCache | None = None,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """``tgt (B, Lt)`` token ids and ``memory (B, Ls, E)`` → logits ``(B, Lt, V)``.

        With a :class:`DecoderCache` (``model.new_cache()``), ``tgt`` holds only the new tokens, which take the
        positions after those already cached, and ``tgt_key_mask`` covers every cached target token. With
        ``return_weights`` also each layer's cross-attention weights ``(B, H, Lt, Ls)``.
        """
        check_decoder_cache(cache, len(self.decoder.layers))
        offset = 0 if cache is None else cache.length
        tgt = self._check_tokens("tgt", tgt, self.config.tgt_vocab, offset)
        check_hidden("memory", memory, self.config.d_model, self.output_proj.weight)
        check_same_batch(("tgt", "memory"), (tuple(tgt.shape), tuple(memory.shape)))
        check_key_mask("memory_key_mask", memory_key_mask, memory.shape[0], memory.shape[1])
        check_key_mask("tgt_key_mask", tgt_key_mask, tgt.shape[0], offset + tgt.shape[1])
        check_flag("return_weights", return_weights)
        if tgt_key_mask is None and self.config.pad_id is not None and cache is None:
            tgt_key_mask = padding_mask_from_tokens(tgt, self.config.pad_id)
        hidden = self.decoder(
            self._embed(self.tgt_embed, tgt, offset),
            memory,
            tgt_key_mask=tgt_key_mask,
            memory_key_mask=memory_key_mask,
            cache=cache,
            return_weights=return_weights,
        )
        if return_weights:
            return self.output_proj(hidden[0]), hidden[1]
        return self.output_proj(hidden)  # (B, Lt, V)

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        *,
        src_key_mask: torch.Tensor | None = None,
        tgt_key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits ``(B, Lt, V)`` for ``src (B, Ls)`` and ``tgt (B, Lt)``."""
        src = self._check_source(src, src_key_mask)
        tgt = self._check_tokens("tgt", tgt, self.config.tgt_vocab)
        check_same_batch(("src", "tgt"), (tuple(src.shape), tuple(tgt.shape)))
        check_key_mask("tgt_key_mask", tgt_key_mask, tgt.shape[0], tgt.shape[1])
        src_key_mask = self._key_mask(src, src_key_mask)
        memory = self.encode(src, src_key_mask=src_key_mask)
        return self.decode(tgt, memory, memory_key_mask=src_key_mask, tgt_key_mask=tgt_key_mask)

    def new_cache(self, capacity: int | None = None) -> DecoderCache:
        return DecoderCache(len(self.decoder.layers), KVCache, capacity)

    @torch.no_grad()
    def generate(
        self,
        src: torch.Tensor,
        *,
        max_len: int,
        bos_id: int,
        eos_id: int,
        src_key_mask: torch.Tensor | None = None,
        beam_size: int = 1,
        use_cache: bool = True,
        pad_id: int | None = None,
        length_penalty: float = 1.0,
    ) -> torch.Tensor:
        """Translate ``src (B, Ls)``: greedy (``beam_size=1``) or beam search.

        Returns the generated tokens after BOS, ``LongTensor (B, T)`` with ``T <= max_len``; each row stops at its
        first ``eos_id`` and is padded after it with ``pad_id`` (default: the config's ``pad_id``, else
        ``eos_id``). ``use_cache`` decodes one token per step over a KV cache instead of recomputing the whole
        prefix; both give the same tokens.
        """
        pad_id = pad_id if pad_id is not None else self.config.pad_id if self.config.pad_id is not None else eos_id
        check_generation_args(max_len, bos_id, eos_id, pad_id, beam_size, length_penalty, self.config)
        check_flag("use_cache", use_cache)
        src = self._check_source(src, src_key_mask)
        src_key_mask = self._key_mask(src, src_key_mask)
        memory = self.encode(src, src_key_mask=src_key_mask)
        batch = src.shape[0]
        if beam_size > 1:  # row b * beam_size + j is beam j of sequence b
            memory = memory.repeat_interleave(beam_size, dim=0)
            src_key_mask = None if src_key_mask is None else src_key_mask.repeat_interleave(beam_size, dim=0)
        state = {"memory": memory, "mask": src_key_mask, "cache": self.new_cache() if use_cache else None}

        def step(prefix: np.ndarray) -> np.ndarray:
            tokens = torch.from_numpy(prefix).to(memory.device)
            if use_cache:
                tokens = tokens[:, state["cache"].length :]
            logits = self.decode(tokens, state["memory"], memory_key_mask=state["mask"], cache=state["cache"])
            return torch.log_softmax(logits[:, -1].float(), dim=-1).cpu().numpy()  # (N, V)

        def reorder(rows: np.ndarray) -> None:
            index = torch.from_numpy(rows).to(memory.device)
            state["memory"] = state["memory"].index_select(0, index)
            if state["mask"] is not None:
                state["mask"] = state["mask"].index_select(0, index)
            if state["cache"] is not None:
                state["cache"].reorder(index)

        search = dict(max_len=max_len, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
        if beam_size == 1:
            tokens = greedy_search(step, batch, **search)
        else:
            tokens = beam_search(step, reorder, batch, beam_size=beam_size, length_penalty=length_penalty, **search)
        return torch.from_numpy(tokens).to(src.device)
