"""The encoder-decoder Transformer ("Attention Is All You Need") on :class:`MultiHeadAttention`, for PyTorch.

Post-norm as in the paper (``x = LayerNorm(x + Sublayer(x))``) by default; pre-norm
(``x = x + Sublayer(LayerNorm(x))``, with a final LayerNorm after each stack) with ``norm_first=True``.

Every public module checks its arguments in ``forward`` and then runs ``_forward``, the unchecked path; modules
call each other's ``_forward``, so a model call is checked once, where it enters. Key masks travel inside as
``(B, 1, 1, L)``, the attention's 4-D layout.

Notation: B batch, Ls source length, Lt target length, E d_model, V vocabulary size; M chunks of a row of logits, C
the chunk width (:func:`row_top_k`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from multihead import checks, decoding, engine, schema
from multihead.cache import DecoderCache, DecoderCaches, StepCache
from multihead.config import ACTIVATIONS, LAYER_NORM_EPS, TransformerConfig, config_fields
from multihead.masks import key_layout, padding_from_tokens, target_padding_from_tokens
from multihead.positional import sinusoidal_positions
from multihead.torch.attention import KVCache, MultiHeadAttention, RealRows, Staging
from multihead.torch.dropout import Dropout
from multihead.torch.functional import StepMask, compute_dtype, step_mask
from multihead.torch.layouts import Columns, KeptLayouts, Layouts, apply_form
from multihead.torch.stored import Int8Rows
from multihead.torch.tensors import OPS
from multihead.validation import check_dropout, check_flag, check_non_negative_int, check_positive_int

ACTIVATION_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
}  # fmt: skip

_FIRST, _SECOND = schema.FEED_FORWARD  # the feed-forward block's linears, in order

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


class PositionalEncoding(nn.Module):
    """Adds the paper's sinusoidal position encodings to ``(B, L, E)`` inputs, then dropout.

    ``offset`` shifts the positions (the first new token's position when decoding with a cache). ``layout``:
    ``"interleaved"`` (the paper's), ``"halves"`` (Marian's) or ``"fairseq"`` (see :mod:`multihead.positional`);
    ``start``: the table's position of a sequence's first token.
    """

    table: torch.Tensor  # (max_len, E), a buffer

    def __init__(
        self, d_model: int, max_len: int = 512, dropout: float = 0.0, layout: str = "interleaved", start: int = 0
    ) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.max_len = check_positive_int("max_len", max_len)
        self.dropout = Dropout(check_dropout("dropout", dropout))
        start = check_non_negative_int("start", start)
        table = torch.from_numpy(sinusoidal_positions(max_len, d_model, layout, start)).float()
        self.register_buffer("table", table, persistent=False)  # derived, so never saved

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        checks.check_positional_call(x, offset, self.d_model, self.max_len, OPS)
        return self._forward(x, offset)

    def _forward(self, x: torch.Tensor, offset: int | torch.Tensor) -> torch.Tensor:
        """:meth:`forward` unchecked; ``offset`` may also be one per row, a ``(B,)`` tensor."""
        if isinstance(offset, torch.Tensor):  # a step's one position a row needs no range
            positions = (
                offset[:, None] if x.shape[1] == 1 else offset[:, None] + torch.arange(x.shape[1], device=offset.device)
            )
            table = self.table.index_select(0, positions.reshape(-1)).view(*positions.shape, -1)  # (B, L, E)
        else:
            table = self.table[offset : offset + x.shape[1]]  # (L, E)
        return self.dropout(x + table.to(x.dtype))


class FeedForward(nn.Module):
    """Position-wise feed-forward block: ``linear2(dropout(activation(linear1(x))))``."""

    INFERENCE_FORMS: ClassVar[dict[str, tuple[str, ...]]] = {name: (name,) for name in schema.FEED_FORWARD}
    """Each linear's inference form (see :mod:`multihead.torch.layouts`)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {ACTIVATIONS}, received {activation!r}")
        self.activation = activation
        self.linear1 = nn.Linear(check_positive_int("d_model", d_model), check_positive_int("d_ff", d_ff))
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = Dropout(check_dropout("dropout", dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        checks.check_hidden("x", x, self.linear1.in_features, OPS, self.linear1.weight)
        return self._forward(x)

    def _forward(self, x: torch.Tensor, layouts: Layouts | None = None) -> torch.Tensor:
        """``layouts``: a decoding session's (see :class:`~multihead.torch.layouts.Layouts`)."""
        hidden = self._activate(apply_form(self, _FIRST, x, layouts))
        return apply_form(self, _SECOND, self.dropout(hidden) if self.training else hidden, layouts)

    def _activate(self, hidden: torch.Tensor) -> torch.Tensor:
        return ACTIVATION_FUNCTIONS[self.activation](hidden)


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
        self.dropout = Dropout(check_dropout("dropout", dropout))
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model, eps=LAYER_NORM_EPS)
        self.norm2 = nn.LayerNorm(d_model, eps=LAYER_NORM_EPS)

    def residual(
        self, x: torch.Tensor, norm: nn.LayerNorm, sublayer: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        if self.norm_first:
            return x + self._drop(sublayer(norm(x)))
        return norm(x + self._drop(sublayer(x)))

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(x) if self.training and self.dropout.p > 0.0 else x


class EncoderLayer(_Block):
    """Self-attention then feed-forward, each with a residual connection and LayerNorm."""

    def forward(self, x: torch.Tensor, *, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        checks.check_layer_input(x, key_mask, "key_mask", self.self_attn.d_model, OPS, self.self_attn.q_proj.weight)
        return self._forward(x, key_layout(key_mask, OPS))

    def _forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, layouts: Layouts | None = None, real: RealRows | None = None
    ) -> torch.Tensor:
        """``mask``: the key padding as ``(B, 1, 1, L)``; ``layouts``: a decoding session's, whose encoder may give
        the ``real`` rows alone, ``x (T, E)``."""
        x = self.residual(
            x,
            self.norm1,
            lambda h: self.self_attn._attend(h, h, h, mask=mask, self_attention=True, layouts=layouts, real=real)[0],
        )
        return self.residual(x, self.norm2, lambda h: self.feed_forward._forward(h, layouts))


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
        checks.check_decoder_layer_call(
            self, x, memory, tgt_key_mask=tgt_key_mask, memory_key_mask=memory_key_mask, self_cache=self_cache,
            cross_cache=cross_cache, return_weights=return_weights, cache_type=KVCache, ops=OPS,
            parameter=self.self_attn.q_proj.weight,
        )  # fmt: skip
        out, weights = self._forward(
            x, memory, key_layout(tgt_key_mask, OPS), key_layout(memory_key_mask, OPS), self_cache, cross_cache,
            return_weights,
        )  # fmt: skip
        return (out, weights) if weights is not None else out

    def _forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        tgt_mask: torch.Tensor | StepMask | None,
        memory_mask: torch.Tensor | StepMask | None,
        self_cache: StepCache | None,
        cross_cache: StepCache | None,
        return_weights: bool,
        layouts: Layouts | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The output, and with ``return_weights`` the cross-attention weights (else ``None``). Masks as
        ``(B, 1, 1, L)``. With caches, ``x`` holds the new tokens (one per row at a decoding step) and ``memory`` may
        be ``None`` once ``cross_cache`` holds its projection. ``layouts``: a decoding session's."""
        cross_weights: list[torch.Tensor | None] = []

        def cross(h: torch.Tensor) -> torch.Tensor:
            out, weights = self.cross_attn._attend(
                h, memory, memory, mask=memory_mask, return_weights=return_weights, cache=cross_cache,
                self_attention=False, layouts=layouts,
            )  # fmt: skip
            cross_weights.append(weights)
            return out

        x = self.residual(
            x,
            self.norm1,
            lambda h: self.self_attn._attend(
                h, h, h, mask=tgt_mask, causal=True, cache=self_cache, self_attention=True, layouts=layouts
            )[0],
        )
        x = self.residual(x, self.norm2, cross)
        x = self.residual(x, self.norm3, lambda h: self.feed_forward._forward(h, layouts))
        return x, cross_weights[0]


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
        self.norm: nn.LayerNorm | None = nn.LayerNorm(d_model, eps=LAYER_NORM_EPS) if norm_first else None

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.norm is None else self.norm(x)


class Encoder(_Stack):
    """A stack of :class:`EncoderLayer`, with a final LayerNorm when ``norm_first``."""

    layer_type = EncoderLayer

    def forward(self, x: torch.Tensor, *, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        checks.check_layer_input(x, key_mask, "key_mask", self.d_model, OPS, next(self.parameters(), None))
        return self._forward(x, key_layout(key_mask, OPS))

    def _forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, layouts: Layouts | None = None, real: RealRows | None = None
    ) -> torch.Tensor:
        """``real``: ``x (T, E)`` holds the real rows of a padded batch alone (:class:`EncoderLayer`), as the output."""
        for layer in cast(Sequence[EncoderLayer], self.layers):
            x = layer._forward(x, mask, layouts, real)
        return self.finish(x)


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
        checks.check_decoder_call(
            list(self.layers), x, memory, width=self.d_model, tgt_key_mask=tgt_key_mask,
            memory_key_mask=memory_key_mask, cache=cache, return_weights=return_weights, ops=OPS,
            parameter=next(self.parameters(), None),
        )  # fmt: skip
        out, weights = self._forward(
            x, memory, key_layout(tgt_key_mask, OPS), key_layout(memory_key_mask, OPS), cache, return_weights
        )
        return (out, weights) if return_weights else out

    def _forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        tgt_mask: torch.Tensor | StepMask | None,
        memory_mask: torch.Tensor | StepMask | None,
        cache: DecoderCaches | None,
        return_weights: bool,
        layouts: Layouts | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The output, and with ``return_weights`` each layer's cross-attention weights (else none); ``layouts``: a
        decoding session's."""
        cross_weights = []
        for index, layer in enumerate(cast(Sequence[DecoderLayer], self.layers)):
            x, weights = layer._forward(
                x,
                memory,
                tgt_mask,
                memory_mask,
                None if cache is None else cache.self_attention[index],
                None if cache is None else cache.cross_attention[index],
                return_weights,
                layouts,
            )
            if weights is not None:
                cross_weights.append(weights)
        return self.finish(x), cross_weights


UNPADDED_POSITIONS = 2048
"""A decoding session encodes padded sources of at most this many positions (batch × length: the few sources that
join a service's stream) on their real positions alone. Larger batches (``translate``'s, thousands of positions) keep
the padded layout: their real-position tensors, smaller than the padded ones, left heap holes that the steps' caches
did not fit, and translation peaked higher (docs/performance.md)."""

WHOLE_LOGIT_ROWS = 256
"""A step of at most this many rows makes its logits at once, as one matrix."""
LOGIT_ROWS = 128
"""A step of more rows makes its logits (projects, processes, reads them) in blocks of at most this many rows, as even
as they can be: fewer would read the output projection's weights more often."""

TOP_K_CHUNK = 64
"""On the CPU a row's best few of many are found through its chunks of this many columns (:func:`row_top_k`)."""


def row_top_k(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``k`` largest values of ``x (N, V)`` and their columns, best first, as ``x.topk(k, dim=-1)`` gives
    them (where values tie, which of the tied columns comes first is unspecified by either). On the CPU, for rows
    longer than ``k`` chunks of :data:`TOP_K_CHUNK`: the ``k`` largest lie in the ``k`` chunks of largest maximum, so
    the rows' chunk maxima are taken (one pass, vectorised), then those chunks' and the remainder's columns searched
    (``x.topk`` sorts a copy of each whole row, several times slower)."""
    n, vocab = x.shape
    chunk = TOP_K_CHUNK
    chunks = vocab // chunk
    if x.device.type != "cpu" or chunks <= k:
        return x.topk(k, dim=-1)
    maxima = x[:, : chunks * chunk].reshape(n, chunks, chunk).amax(dim=-1)  # (N, M)
    best = maxima.topk(k, dim=-1).indices  # (N, k) the chunks holding the k largest
    columns = (best[:, :, None] * chunk + torch.arange(chunk, device=x.device)).reshape(n, k * chunk)  # (N, k*C)
    if chunks * chunk < vocab:  # the columns after the last whole chunk
        rest = torch.arange(chunks * chunk, vocab, device=x.device).expand(n, -1)
        columns = torch.cat([columns, rest], dim=1)
    values, found = x.gather(1, columns).topk(k, dim=-1)  # (N, k)
    return values, columns.gather(1, found)


_INIT_FUNCTIONS = {name: getattr(nn.init, name) for name in dir(nn.init) if name.endswith("_") and
                   not name.startswith("_") and callable(getattr(nn.init, name))}  # fmt: skip
"""``torch.nn.init``'s in-place functions (``normal_``, ``kaiming_uniform_``...), which modules initialise with."""
_SKIPPING = threading.local()
_USERS = {"count": 0}
_LOCK = threading.Lock()


def _skipping(name: str) -> Callable[..., torch.Tensor]:
    original = _INIT_FUNCTIONS[name]

    @functools.wraps(original)
    def call(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return tensor if getattr(_SKIPPING, "on", False) else original(tensor, *args, **kwargs)

    return call


@contextlib.contextmanager
def _uninitialised() -> Iterator[None]:
    """Modules made in the block by this thread are not initialised: ``torch.nn.init``'s functions leave their
    tensors as allocated. Other threads' calls meanwhile run as usual; the functions are torch's own again once no
    thread is in such a block."""
    with _LOCK:
        if _USERS["count"] == 0:
            for name in _INIT_FUNCTIONS:
                setattr(nn.init, name, _skipping(name))
        _USERS["count"] += 1
    _SKIPPING.on = True
    try:
        yield
    finally:
        _SKIPPING.on = False
        with _LOCK:
            _USERS["count"] -= 1
            if _USERS["count"] == 0:
                for name, original in _INIT_FUNCTIONS.items():
                    setattr(nn.init, name, original)


class Transformer(nn.Module):
    """Encoder-decoder Transformer for sequence-to-sequence tasks.

    Embeddings are scaled by ``sqrt(d_model)`` and summed with sinusoidal positions, as in the paper; the decoder's
    self-attention is causal. Key masks are ``(B, L)`` bool, ``True`` at real tokens; when ``pad_id`` is set and a mask
    is not given, it is ``tokens != pad_id`` (a target's first position always real). With ``tie_embeddings`` (one
    vocabulary for both sides), the source embedding, the target embedding and the output projection share one matrix,
    as in the paper; with ``tie_output`` the target embedding and the output projection do. The options for models
    trained elsewhere (``positions``, ``first_position``, ``scale_embeddings``) are :class:`TransformerConfig`'s.

    Example:
        >>> model = Transformer(20, 20, d_model=32, num_heads=4, num_encoder_layers=1, num_decoder_layers=1,
        ...                     d_ff=64).eval()
        >>> src = torch.randint(3, 20, (2, 7))
        >>> model(src, torch.randint(3, 20, (2, 5))).shape
        torch.Size([2, 5, 20])
        >>> model.generate(src, max_len=6, bos_id=1, eos_id=2).shape[0]
        2
    """

    INFERENCE_FORMS: ClassVar[dict[str, tuple[str, ...]]] = {"output": (schema.OUTPUT,)}
    """The output projection's inference form (see :mod:`multihead.torch.layouts`)."""

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
        tie_embeddings: bool = False,
        positions: str = "interleaved",
        scale_embeddings: bool = True,
        tie_output: bool = False,
        first_position: int = 0,
    ) -> None:
        super().__init__()
        config = TransformerConfig(
            src_vocab, tgt_vocab, d_model, num_heads, num_encoder_layers, num_decoder_layers, d_ff, dropout,
            activation, norm_first, max_len, pad_id, tie_embeddings, positions, scale_embeddings, tie_output,
            first_position,
        )  # fmt: skip
        self.config = config
        self._kept_layouts = KeptLayouts()  # generate()'s, while the weights stay as they were laid out from
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.positional = PositionalEncoding(d_model, max_len, dropout, positions, first_position)
        stack = (d_model, num_heads, d_ff, dropout, activation, norm_first)
        self.encoder = Encoder(num_encoder_layers, *stack)
        self.decoder = Decoder(num_decoder_layers, *stack)
        self.output_proj = nn.Linear(d_model, tgt_vocab)
        # Embeddings start at std d_model^-1/2, so after the sqrt(d_model) scaling they have unit variance, like
        # the positional encodings. (nn.Embedding's default N(0, 1) would drown the positions 11-fold at E=128.)
        for embedding in (self.src_embed, self.tgt_embed):
            nn.init.normal_(embedding.weight, std=d_model**-0.5)
        if tie_embeddings:
            self.tgt_embed.weight = self.src_embed.weight
        if tie_embeddings or tie_output:
            self.output_proj.weight = self.tgt_embed.weight
            nn.init.zeros_(self.output_proj.bias)

    @classmethod
    def from_config(cls, config: TransformerConfig | Mapping[str, Any], *, initialise: bool = True) -> Transformer:
        """From a :class:`TransformerConfig` or a dict of its fields. ``initialise=False``: for weights loaded next
        (:func:`multihead.io.load_weights`), its parameters are allocated but never written (their values undefined
        until then): no time spent drawing values to be replaced, and no memory touched for them."""
        values = config_fields(config)
        if initialise:
            return cls(values.pop("src_vocab"), values.pop("tgt_vocab"), **values)
        with _uninitialised():
            return cls(values.pop("src_vocab"), values.pop("tgt_vocab"), **values)

    def _key_mask(self, tokens: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor | None:
        return padding_from_tokens(tokens, key_mask, self.config.pad_id, OPS)

    def _target_key_mask(self, tokens: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor | None:
        return target_padding_from_tokens(tokens, key_mask, self.config.pad_id, OPS)

    def _embed(self, embedding: nn.Embedding, tokens: torch.Tensor, offset: int | torch.Tensor = 0) -> torch.Tensor:
        table = embedding.weight
        # Int8 rows kept as stored are looked up directly: PyTorch's first call through a tensor subclass imports
        # hundreds of modules (tens of MB) that nothing else here needs.
        embedded = table.rows(tokens) if isinstance(table, Int8Rows) else embedding(tokens)  # (B, L, E)
        if self.config.scale_embeddings:
            embedded = embedded * math.sqrt(self.config.d_model)
        return self.positional._forward(embedded, offset)  # (B, L, E)

    def encode(self, src: torch.Tensor, *, src_key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``src (B, Ls)`` token ids → memory ``(B, Ls, E)``."""
        checks.check_source(src, src_key_mask, self.config, OPS)
        return self._encode(src, self._key_mask(src, src_key_mask))

    def _encode(
        self, src: torch.Tensor, src_key_mask: torch.Tensor | None, layouts: Layouts | None = None
    ) -> torch.Tensor:
        """The memory ``(B, Ls, E)``. In a decoding session (``layouts``), padded sources of at most
        :data:`UNPADDED_POSITIONS` positions are encoded on their real positions alone (every product but the
        attention itself), the padded ones holding zeros."""
        embedded, mask = self._embed(self.src_embed, src), key_layout(src_key_mask, OPS)  # (B, Ls, E)
        if layouts is None or src_key_mask is None or src.numel() > UNPADDED_POSITIONS or bool(src_key_mask.all()):
            return self.encoder._forward(embedded, mask, layouts)
        real = RealRows.of(src_key_mask)
        return real.spread(self.encoder._forward(real.take(embedded), mask, layouts, real))  # (T, E) -> (B, Ls, E)

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
        checks.check_decode_call(
            tgt, memory, memory_key_mask=memory_key_mask, tgt_key_mask=tgt_key_mask, cache=cache,
            return_weights=return_weights, config=self.config, layers=list(self.decoder.layers), ops=OPS,
            parameter=self.output_proj.weight,
        )  # fmt: skip
        if tgt_key_mask is None and cache is None:
            tgt_key_mask = self._target_key_mask(tgt, None)
        logits, weights = self._decode(tgt, memory, memory_key_mask, tgt_key_mask, cache, return_weights)
        return (logits, weights) if return_weights else logits

    def _decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor | None,
        memory_key_mask: torch.Tensor | None,
        tgt_key_mask: torch.Tensor | None,
        cache: DecoderCaches | None,
        return_weights: bool = False,
        *,
        project: bool = True,
        layouts: Layouts | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """:meth:`decode` on checked arguments, over any :class:`~multihead.cache.DecoderCaches`, whose ``length`` may
        be one position per row; ``memory`` may be ``None`` once the cache holds its projection. The logits (with
        ``project=False`` the decoder's output ``(B, Lt, E)``) and, with ``return_weights``, every layer's
        cross-attention weights (else none). ``layouts``: a decoding session's, which its steps' projections take."""
        offset = 0 if cache is None else cache.length
        embedded = self._embed(self.tgt_embed, tgt, offset)  # (B, Lt, E)
        tgt_mask: torch.Tensor | StepMask | None
        memory_mask: torch.Tensor | StepMask | None
        if layouts is not None and cache is not None and tgt.shape[1] == 1 and not return_weights:
            # A decoding session's step: each mask made once for all the layers that read it.
            compute = compute_dtype(embedded.dtype)
            tgt_mask, memory_mask = step_mask(tgt_key_mask, compute), step_mask(memory_key_mask, compute)
        else:
            tgt_mask, memory_mask = key_layout(tgt_key_mask, OPS), key_layout(memory_key_mask, OPS)
        hidden, weights = self.decoder._forward(embedded, memory, tgt_mask, memory_mask, cache, return_weights, layouts)
        if not project:
            return hidden, weights  # (B, Lt, E)
        return apply_form(self, "output", hidden), weights  # (B, Lt, V)

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        *,
        src_key_mask: torch.Tensor | None = None,
        tgt_key_mask: torch.Tensor | None = None,
        project: bool = True,
        check: bool = True,
    ) -> torch.Tensor:
        """Teacher-forced logits ``(B, Lt, V)`` for ``src (B, Ls)`` and ``tgt (B, Lt)``; with ``project=False`` the
        decoder's output ``(B, Lt, E)``, before ``output_proj`` makes it logits (a loss that projects a slice at a
        time). ``check=False`` skips the checks of the arguments, some of which read token ids on the host: for a
        training loop that checked its batches itself, which then runs without waiting for the device (and
        ``torch.compile`` without a graph break)."""
        if check_flag("check", check):
            checks.check_model_call(src, tgt, src_key_mask, tgt_key_mask, self.config, OPS)
            check_flag("project", project)
        src_key_mask = self._key_mask(src, src_key_mask)
        memory = self._encode(src, src_key_mask)
        tgt_key_mask = self._target_key_mask(tgt, tgt_key_mask)
        return self._decode(tgt, memory, src_key_mask, tgt_key_mask, None, project=project)[0]

    def new_cache(self, capacity: int | None = None) -> DecoderCache:
        cache = DecoderCache(len(self.decoder.layers), KVCache, capacity)
        staging = Staging()  # the layers reorder one after the other
        for layer_cache in cache.self_attention:
            cast(KVCache, layer_cache).staging = staging
        return cache

    def decoder_steps(self, layouts: Layouts | None = None) -> DecoderSteps:
        """The decoding steps of one decoding session (see :class:`multihead.decoding.Steps`), their projections laid
        out by ``layouts`` (default: a new :class:`~multihead.torch.layouts.Layouts`, laid out from the weights as they
        are when first used): the weights must not change while they are in use."""
        return DecoderSteps(self, Layouts() if layouts is None else layouts)

    def generate(
        self,
        src: torch.Tensor,
        *,
        max_len: decoding.Limit,
        bos_id: int | None = None,
        eos_id: int | None = None,
        src_key_mask: torch.Tensor | None = None,
        beam_size: int = 1,
        use_cache: bool = True,
        pad_id: int | None = None,
        length_penalty: float = 1.0,
        search: decoding.SearchOptions | None = None,
        layouts: Layouts | None = None,
        generation: decoding.Generation | None = None,
    ) -> torch.Tensor:
        """Translate ``src (B, Ls)`` as ``generation`` says (a :class:`multihead.decoding.Generation`: the special
        ids, banned and forced tokens, the search), or as its keywords do: ``bos_id`` and ``eos_id``, greedy
        (``beam_size=1``), beam search, or as ``search`` says (a :class:`multihead.decoding.SearchOptions`: greedy,
        beam search or sampling; not with ``beam_size`` or ``length_penalty``).

        ``max_len``: the most tokens a row may take, one for all rows or one per row (a list or 1-D array of ``B``
        ints). Returns the generated tokens after BOS, ``LongTensor (B, T)`` with ``T <= max(max_len)``; each row
        stops at its first EOS or its ``max_len`` and is padded after it with the pad (``pad_id`` default: the
        config's ``pad_id``, else ``eos_id``). ``use_cache`` decodes one token per step over a KV cache instead of
        recomputing the whole prefix; both give the same tokens. A step is the model's forward pass with the cache,
        one token per row; its projections are laid out for such rows from the weights, and the layouts kept for the
        next calls until the weights change (:class:`~multihead.torch.layouts.KeptLayouts`), or by ``layouts`` (a
        :class:`~multihead.torch.layouts.Layouts` of the caller's).
        """
        generation, longest = checks.check_generate_call(
            self.config, generation, max_len=max_len, src=src, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
            beam_size=beam_size, length_penalty=length_penalty, search=search,
        )  # fmt: skip
        check_flag("use_cache", use_cache)
        with torch.inference_mode():
            kept = self._kept_layouts.of(self) if layouts is None else layouts
            session = self.decoding_session(
                src, max_len=longest, src_key_mask=src_key_mask, use_cache=use_cache, layouts=kept
            )
            tokens = engine.generate(session, src.shape[0], generation, max_len=max_len)
        return torch.from_numpy(tokens).to(src.device)  # made outside inference mode: usable for training

    def decoding_session(
        self,
        src: torch.Tensor,
        *,
        max_len: int,
        src_key_mask: torch.Tensor | None = None,
        use_cache: bool = True,
        layouts: Layouts | None = None,
    ) -> decoding.DecodingSession:
        """What :meth:`generate` searches: ``src (B, Ls)`` (checked) encoded, and a cache for ``max_len`` steps, as a
        :class:`multihead.decoding.DecodingSession` for the searches of :mod:`multihead.engine`. Make it and search
        inside ``torch.inference_mode()``. ``layouts``: the laid-out weights to step with (see :meth:`decoder_steps`;
        a caller whose weights stay fixed keeps one for all its sessions)."""
        checks.check_source(src, src_key_mask, self.config, OPS)
        steps = self.decoder_steps(layouts)
        memory, src_key_mask = steps.encode(src, src_key_mask)
        # Buffers for every step up front: a cache growing by concatenation would reallocate them at each step.
        cache = self.new_cache(capacity=max_len) if use_cache else None
        return decoding.DecodingSession(steps, memory, src_key_mask, cache)


class DecoderSteps:
    """The decoding steps of a PyTorch :class:`Transformer` (a :class:`multihead.decoding.Steps`), on arguments
    already checked: sources encoded, their memory projected for the cross-attention caches, and steps of one token
    per row, each the model's forward pass over a :class:`~multihead.cache.DecoderCaches`."""

    def __init__(self, model: Transformer, layouts: Layouts) -> None:
        self.model, self.layouts = model, layouts
        self.device = model.src_embed.weight.device

    def _logits(self, hidden: torch.Tensor) -> StepLogits:
        """The next token's logits ``(N, V)`` in float32 after the decoder's output ``hidden (N, E)``, made where
        they are read."""
        output = self.layouts[self.model, "output"]
        shape = (int(hidden.shape[0]), self.model.config.tgt_vocab)
        if isinstance(output, Columns):  # packed in blocks of columns: read a block at a time
            parts = output.parts
            columns = ColumnLogits(lambda rows, block: parts[block](hidden[rows]).float(), output.starts)
            return StepLogits(lambda rows: output(hidden[rows]).float(), shape, owned=True, columns=columns)
        if hidden.shape[0] <= WHOLE_LOGIT_ROWS:
            return StepLogits.of(output(hidden).float())
        return StepLogits(lambda rows: output(hidden[rows]).float(), shape, owned=True)

    def encode(
        self, src: torch.Tensor, src_key_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``src (N, Ls)`` encoded: the memory ``(N, Ls, E)`` and its key mask ``(N, Ls)`` (from the config's
        ``pad_id`` when not given; ``None``: every position real)."""
        src_key_mask = self.model._key_mask(src, src_key_mask)
        return self.model._encode(src, src_key_mask, self._sources_layouts(src)), src_key_mask

    def project_memory(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every decoder layer's cross-attention keys and values ``(N, Hkv, Ls, D)`` of ``memory (N, Ls, E)``."""
        layers = cast(Sequence[DecoderLayer], self.model.decoder.layers)
        layouts = self._sources_layouts(memory)
        return [layer.cross_attn._project_keys_values(memory, memory, layouts) for layer in layers]

    def _sources_layouts(self, x: torch.Tensor) -> Layouts | None:
        """The layouts that encoding the sources and projecting their memory take: the steps' on the CPU, where the
        laid-out forms multiply the few sources that join a stream at a step faster than the weights as they are
        (``None`` elsewhere: there a laid-out copy would take the device's memory for no measured gain)."""
        return self.layouts if x.device.type == "cpu" else None

    def step(
        self,
        tokens: torch.Tensor,
        cache: DecoderCaches,
        memory_key_mask: torch.Tensor | None,
        self_key_mask: torch.Tensor | None = None,
    ) -> StepLogits:
        """Logits ``(N, V)`` (float32, :class:`StepLogits`) of the token after ``tokens (N, 1)``, which take the
        positions ``cache.length`` (one for all rows, or one per row ``(N,)``) after the tokens ``cache`` holds; it
        holds the projected memory too, whose key mask is ``memory_key_mask (N, Ls)``. ``self_key_mask (N|1, L)``: the
        keys each row attends of those the self-attention caches give (default: all)."""
        hidden = self.model._decode(
            tokens, None, memory_key_mask, self_key_mask, cache, project=False, layouts=self.layouts
        )[0]
        return self._logits(hidden[:, -1])  # (N, V)

    def recompute(self, prefix: torch.Tensor, memory: torch.Tensor, memory_key_mask: torch.Tensor | None) -> StepLogits:
        hidden = self.model._decode(prefix, memory, memory_key_mask, None, None, project=False)[0]
        return self._logits(hidden[:, -1])  # (N, V)

    def take(self, x: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
        return x.index_select(0, torch.from_numpy(rows).to(x.device))

    @staticmethod
    def mean_log_probs(logits: Sequence[StepLogits | torch.Tensor]) -> torch.Tensor:
        """The mean of several steps' log-probabilities ``(N, V)``: an ensemble's (:class:`~multihead.engine.Ensemble`
        steps so)."""
        log_probs = [torch.log_softmax(StepLogits.of(each).whole(), dim=-1) for each in logits]
        return torch.stack(log_probs).mean(dim=0)  # (models, N, V) -> (N, V)

    def tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def argmax(self, logits: StepLogits | torch.Tensor) -> np.ndarray:
        return StepLogits.of(logits).argmax()

    def suppress(
        self, logits: StepLogits | torch.Tensor, tokens: np.ndarray, rows: np.ndarray | None = None
    ) -> StepLogits:
        # Logits: the searches' log-softmax renormalises the others.
        made = StepLogits.of(logits)
        made.suppressed.append((tokens, rows))
        return made

    def log_probs_at(self, logits: StepLogits | torch.Tensor, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        log_probs = StepLogits.of(logits).log_probs(rows)  # (R, V)
        return log_probs[:, torch.from_numpy(tokens).to(log_probs.device)].cpu().numpy()

    def top_k(
        self,
        logits: StepLogits | torch.Tensor,
        scores: np.ndarray,
        beam: int,
        count: int,
        rows: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        made = StepLogits.of(logits)
        vocab = made.shape[-1]
        # A sentence's best candidates are among the best of each of its rows: scores are added to those only, and
        # each block of rows is normalised and cut to its best as it is read.
        row_best = min(count, vocab)
        with _inference():
            best = list(made.top_log_probs(row_best))
        values, tokens = (torch.cat(parts) if len(best) > 1 else parts[0] for parts in zip(*best, strict=True))
        if rows is not None:  # the rows searched, each sentence's together: the few best of each, not the logits
            index = torch.from_numpy(rows).to(values.device)
            values, tokens = values.index_select(0, index), tokens.index_select(0, index)  # (S*beam, row_best)
        values = values + torch.from_numpy(scores).to(values.device)[:, None]
        values, chosen = values.reshape(-1, beam * row_best).topk(count, dim=-1)  # (S, count)
        tokens = tokens.reshape(-1, beam * row_best).gather(1, chosen)  # (S, count)
        indices = chosen.div(row_best, rounding_mode="floor") * vocab + tokens  # beam_row * V + token
        return values.cpu().numpy(), indices.cpu().numpy()


@dataclass(frozen=True)
class ColumnLogits:
    """Logits made a block of columns at a time: ``make(rows, block)``, the logits ``(R, C)`` of the rows ``rows`` (a
    slice, or int64 indices) in the columns from ``starts[block]`` to the next block's start (the last: to ``V``)."""

    make: Callable[[slice | torch.Tensor, int], torch.Tensor]
    starts: tuple[int, ...]


def _inference() -> contextlib.AbstractContextManager[Any]:
    """Inference mode, for the readers of a step's logits: entered only where it is not on already (a decoding
    session's steps run in it, and entering it again costs more than a small step's argmax)."""
    return contextlib.nullcontext() if torch.is_inference_mode_enabled() else torch.inference_mode()


def _row_maxima(logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Each row's first largest of ``logits (R, C)`` on the CPU: its column ``(R,)`` and value ``(R,)``."""
    values = logits.numpy()
    at = values.argmax(axis=-1)  # (R,)
    return at, values[np.arange(len(at)), at]


class StepLogits:
    """A decoding step's next-token logits ``(N, V)`` (float32), read :data:`LOGIT_ROWS` rows at a time (``make``: the
    logits of the rows a slice or an index array names), with the tokens :meth:`DecoderSteps.suppress` made impossible
    in them (in place: ``make`` gives new tensors, or views of logits only this step reads). Made a block at a time
    (``make`` projecting the decoder's output), a beam search's hundreds of rows never hold a whole ``(N, V)``
    matrix, nor its log-softmax. Where ``columns`` makes them a block of columns at a time too, the best tokens
    (:meth:`argmax`, :meth:`top_log_probs`) are found block by block: a step of up to :data:`WHOLE_LOGIT_ROWS` rows
    reads them all at once, each ``(N, C)`` block, without a whole ``(N, V)`` matrix."""

    def __init__(
        self,
        make: Callable[[slice | torch.Tensor], torch.Tensor],
        shape: tuple[int, int],
        *,
        owned: bool = False,
        columns: ColumnLogits | None = None,
    ) -> None:
        self.make, self.shape, self.owned, self.columns = make, shape, owned, columns
        """``owned``: every tensor ``make`` gives is new, its reader's alone, so it may be normalised in place."""
        self.suppressed: list[tuple[np.ndarray, np.ndarray | None]] = []  # (token ids, rows or None: all)

    @classmethod
    def of(cls, logits: StepLogits | torch.Tensor) -> StepLogits:
        """``logits`` as step logits: a whole ``(N, V)`` tensor (a small step's, an ensemble's mean) is read a block
        at a time, and takes the suppressed tokens' ``-inf`` in place."""
        if isinstance(logits, StepLogits):
            return logits
        whole = logits.float()
        return cls(lambda rows: whole[rows], (int(whole.shape[0]), int(whole.shape[1])))

    def rows(self, rows: slice | np.ndarray) -> torch.Tensor:
        """The logits ``(R, V)`` of rows ``rows`` (a slice, or int64 indices ``(R,)``), the suppressed tokens
        ``-inf``."""
        with _inference():
            return self._rows(rows)

    def _rows(self, rows: slice | np.ndarray) -> torch.Tensor:
        return self._suppress(self.make(rows if isinstance(rows, slice) else torch.from_numpy(rows)), rows)

    def _suppress(self, made: torch.Tensor, rows: slice | np.ndarray, start: int = 0) -> torch.Tensor:
        """``made``, the logits of rows ``rows`` in the columns from ``start`` on, with the suppressed tokens among
        them ``-inf``."""
        stop = start + int(made.shape[1])
        held: np.ndarray | None = None  # (R,) the rows made, by their index among all, once a suppression names rows
        for tokens, suppressed in self.suppressed:
            if start or stop < self.shape[1]:  # a block of columns: its tokens, counted from its first
                tokens = tokens[(tokens >= start) & (tokens < stop)] - start
                if not len(tokens):
                    continue
            columns = torch.from_numpy(tokens).to(made.device)
            if suppressed is None:
                made.index_fill_(1, columns, float("-inf"))
                continue
            held = np.arange(self.shape[0])[rows] if held is None else held
            local = np.flatnonzero(np.isin(held, suppressed))  # (r,) the rows made that it names
            if len(local):
                made[torch.from_numpy(local).to(made.device)[:, None], columns] = float("-inf")
        return made

    def log_probs(self, rows: slice | np.ndarray) -> torch.Tensor:
        """The log-softmax ``(R, V)`` of rows ``rows``' logits (see :meth:`rows`), written over them where they are
        :attr:`owned`, so that a block never takes a second ``(R, V)`` matrix."""
        with _inference():
            made = self._rows(rows)
            return torch.log_softmax(made, dim=-1, out=made) if self.owned else torch.log_softmax(made, dim=-1)

    def _blocks(self) -> Iterator[slice]:
        count = self.shape[0]
        size = max(1, -(-count // max(1, -(-count // LOGIT_ROWS))))  # the rows of each block but the last
        if self.columns is not None and count <= WHOLE_LOGIT_ROWS:
            size = max(count, 1)
        for start in range(0, max(count, 1), size):  # no rows: one empty block
            yield slice(start, min(start + size, count))

    def _tiles(self, rows: slice) -> Iterator[tuple[int, torch.Tensor]]:
        """Rows ``rows``' logits (see :meth:`rows`) a block of columns at a time where :attr:`columns` makes them so,
        else whole: each block's first column and its logits ``(R, C)``."""
        if self.columns is None:
            yield 0, self._rows(rows)
            return
        for block, start in enumerate(self.columns.starts):
            yield start, self._suppress(self.columns.make(rows, block), rows, start)

    def argmax(self) -> np.ndarray:
        """Each row's most probable token ``(N,)``, the first of equal maxima (a NaN before any number, as NumPy's
        ``argmax``). On the CPU, NumPy reads the logits' memory, several times faster than PyTorch's reduction;
        elsewhere only the ids leave the device."""
        with _inference():
            found = [self._argmax(rows) for rows in self._blocks()]
        return np.concatenate(found) if len(found) != 1 else found[0]

    def _argmax(self, rows: slice) -> np.ndarray:
        if self.columns is None:  # the whole rows
            block = self._rows(rows)
            if block.is_cpu:
                return block.numpy().argmax(axis=-1)
            return block.max(dim=-1).indices.cpu().numpy()
        chosen, best = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        for start, tile in self._tiles(rows):  # on the CPU, where forms are packed in blocks of columns
            at, value = _row_maxima(tile)
            del tile  # freed before the next block of columns is made
            if not start:
                chosen, best = at, value
                continue
            better = (value > best) | (np.isnan(value) & ~np.isnan(best))  # the earlier of equals stays
            chosen, best = np.where(better, at + start, chosen), np.where(better, value, best)
        return chosen

    def top_log_probs(self, k: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Each row's ``k`` (at most ``V``) most probable tokens, best first, a block of rows at a time: their
        log-probabilities ``(R, k)`` and ids ``(R, k)`` (:func:`row_top_k` of the log-softmax). Read a block of
        columns at a time: each block's best ``k`` logits and its log-sum-exp (its best logit less its best's
        log-softmax in the block, which PyTorch's kernel computes faster than ``logsumexp``), the row's log-sum-exp of
        those."""
        for rows in self._blocks():
            if self.columns is None:
                yield row_top_k(self.log_probs(rows), k)
                continue
            totals, values, tokens = [], [], []
            for start, tile in self._tiles(rows):  # each tile new: normalised in place
                best, columns = row_top_k(tile, min(k, int(tile.shape[1])))  # (R, k) logits
                normalised = torch.log_softmax(tile, dim=-1, out=tile).gather(1, columns[:, :1])  # (R, 1)
                largest = best[:, 0]  # (R,) -inf where the block's every token is suppressed: no sum, not NaN
                totals.append(torch.where(largest == -math.inf, largest, largest - normalised[:, 0]))
                values.append(best)
                tokens.append(columns + start)
                del tile  # freed before the next block of columns is made
            total = torch.logsumexp(torch.stack(totals, dim=-1), dim=-1)  # (R, blocks) -> (R,)
            best, chosen = torch.cat(values, dim=1).topk(k, dim=-1)  # (R, k) of the blocks' best
            yield best - total[:, None], torch.cat(tokens, dim=1).gather(1, chosen)

    def whole(self) -> torch.Tensor:
        """Every row's logits ``(N, V)`` at once (an ensemble averages them)."""
        return self.rows(slice(0, self.shape[0]))
