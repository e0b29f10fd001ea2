"""The encoder-decoder Transformer ("Attention Is All You Need") on :class:`MultiHeadAttention`, for Keras 3.

The same parts, names and arguments as :mod:`multihead.torch.transformer`, and the same weight names (each
composite layer lists its children in ``state_children()``), so one safetensors file serves both front ends.
Post-norm as in the paper by default; pre-norm with ``norm_first=True``.

Every public layer checks its arguments in ``call`` and then runs ``_forward``, the unchecked path; layers call each
other's ``_forward`` (Keras' own layers, ``Dense`` and the rest, through their ``__call__``), so a model call is
checked once, where it enters. Key masks travel inside as ``(B, 1, 1, L)``, the attention's 4-D layout.

Notation: B batch, Ls source length, Lt target length, E d_model, V vocabulary size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

import keras
import numpy as np
from keras import layers, ops

from multihead import checks, decoding, engine, schema
from multihead.cache import DecoderCache, DecoderCaches, StepCache
from multihead.config import ACTIVATIONS, LAYER_NORM_EPS, TransformerConfig, config_fields
from multihead.keras.attention import KVCache, MultiHeadAttention
from multihead.keras.generation import COMPILED_BACKENDS, CompiledDecoding
from multihead.keras.tensors import OPS, NamedTensorArguments, Tensor
from multihead.masks import key_layout, padding_from_tokens, target_padding_from_tokens
from multihead.positional import sinusoidal_positions
from multihead.validation import check_dropout, check_flag, check_non_negative_int, check_positive_int

# approximate=False: the exact erf GELU, as torch.nn.functional.gelu computes it
ACTIVATION_FUNCTIONS: dict[str, str | Callable[[Tensor], Tensor]] = {
    "relu": "relu", "gelu": lambda h: keras.activations.gelu(h, approximate=False), "silu": keras.activations.silu,
}  # fmt: skip

__all__ = [
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "PositionalEncoding",
    "Transformer",
]

Shape = tuple[int | None, ...]
register = keras.saving.register_keras_serializable(package="multihead")


def _build(layer: layers.Layer, *shapes: Shape) -> None:
    """Build ``layer`` unless a call already has: the layers build their sublayers on a first call too, and a
    model may be built after one (a second build would create every weight again)."""
    if not layer.built:
        layer.build(*shapes)


@register
class PositionalEncoding(NamedTensorArguments, layers.Layer):
    """Adds the paper's sinusoidal position encodings to ``(B, L, E)`` inputs, then dropout.

    ``layout``: ``"interleaved"`` (the paper's), ``"halves"`` (Marian's) or ``"fairseq"`` (see
    :mod:`multihead.positional`); ``start``: the table's position of a sequence's first token.
    """

    def __init__(
        self,
        d_model: int,
        max_len: int = 512,
        dropout: float = 0.0,
        layout: str = "interleaved",
        start: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.d_model = check_positive_int("d_model", d_model)
        self.max_len = check_positive_int("max_len", max_len)
        self.rate = check_dropout("dropout", dropout)
        self.dropout = layers.Dropout(self.rate)
        self.start = check_non_negative_int("start", start)
        self.table = sinusoidal_positions(max_len, d_model, layout, start).astype("float32")  # derived: never saved
        self.layout = layout

    def call(self, x: Tensor, offset: int = 0, training: bool | None = None) -> Tensor:
        checks.check_positional_call(x, offset, self.d_model, self.max_len, OPS)
        return self._forward(x, offset, training)

    def _forward(self, x: Tensor, offset: int | Tensor, training: bool | None) -> Tensor:
        # Rows gathered, not sliced: in a compiled decoding step the offset is a tensor, and XLA compiles a slice
        # that starts at a tensor again for every value it takes.
        if len(getattr(offset, "shape", ())) == 1:  # one offset per row (a stream's rows)
            offset = ops.expand_dims(offset, -1)  # (B, 1)
        rows = ops.arange(ops.shape(x)[1]) + offset  # (L,) or (B, L)
        positions = ops.take(ops.convert_to_tensor(self.table), rows, axis=0)  # (L, E) or (B, L, E)
        return self.dropout(x + ops.cast(positions, x.dtype), training=training)

    def get_config(self) -> dict[str, Any]:
        config = {"d_model": self.d_model, "max_len": self.max_len, "dropout": self.rate, "layout": self.layout,
                  "start": self.start}  # fmt: skip
        return {**super().get_config(), **config}


@register
class FeedForward(NamedTensorArguments, layers.Layer):
    """Position-wise feed-forward block: ``linear2(dropout(activation(linear1(x))))``."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {ACTIVATIONS}, received {activation!r}")
        self.d_model, self.d_ff = check_positive_int("d_model", d_model), check_positive_int("d_ff", d_ff)
        self.rate, self.activation = check_dropout("dropout", dropout), activation
        self.linear1 = layers.Dense(d_ff, activation=ACTIVATION_FUNCTIONS[activation], name=schema.FEED_FORWARD[0])
        self.linear2 = layers.Dense(d_model, name=schema.FEED_FORWARD[1])
        self.dropout = layers.Dropout(self.rate)

    def build(self, x_shape: Shape) -> None:
        # The configured width, not the received one: a call of the wrong width is refused, not built for.
        _build(self.linear1, (None, None, self.d_model))
        _build(self.linear2, (None, None, self.d_ff))
        self.built = True

    def call(self, x: Tensor, training: bool | None = None) -> Tensor:
        checks.check_hidden("x", x, self.d_model, OPS)
        return self._forward(x, training)

    def _forward(self, x: Tensor, training: bool | None) -> Tensor:
        return self.linear2(self.dropout(self.linear1(x), training=training))

    def state_children(self) -> dict[str, layers.Layer]:
        return {name: getattr(self, name) for name in schema.FEED_FORWARD}

    def get_config(self) -> dict[str, Any]:
        config = {"d_model": self.d_model, "d_ff": self.d_ff, "dropout": self.rate, "activation": self.activation}
        return {**super().get_config(), **config}


class _Block(NamedTensorArguments, layers.Layer):
    """What the encoder and decoder layers share: sizes, and residual connections with LayerNorm."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_flag("norm_first", norm_first)
        self.sizes: dict[str, Any] = dict(
            d_model=d_model,
            num_heads=num_heads,
            d_ff=d_ff,
            dropout=dropout,
            activation=activation,
            norm_first=norm_first,
        )
        self.norm_first = norm_first
        self.dropout = layers.Dropout(check_dropout("dropout", dropout))
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation, name=schema.FEED_FORWARD_BLOCK)

    @property
    def hidden_shape(self) -> Shape:
        """What the sublayers are built for: the configured width (a call of another width is refused)."""
        return (None, None, self.sizes["d_model"])

    def attention(self, name: str) -> MultiHeadAttention:
        return MultiHeadAttention(self.sizes["num_heads"], d_model=self.sizes["d_model"], dropout=self.rate, name=name)

    @property
    def rate(self) -> float:
        return self.sizes["dropout"]

    def norm(self, name: str) -> layers.LayerNormalization:
        return layers.LayerNormalization(epsilon=LAYER_NORM_EPS, name=name)

    def residual(self, x: Tensor, norm: layers.LayerNormalization, sublayer, training: bool | None) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(norm(x)), training=training)
        return norm(x + self.dropout(sublayer(x), training=training))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **self.sizes}


@register
class EncoderLayer(_Block):
    """Self-attention then feed-forward, each with a residual connection and LayerNorm."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.self_attn = self.attention(schema.SELF_ATTENTION)
        self.norm1, self.norm2 = (self.norm(name) for name in schema.norms(schema.ENCODER))

    def build(self, x_shape: Shape) -> None:
        hidden = self.hidden_shape
        _build(self.self_attn, hidden, hidden, hidden)
        _build(self.feed_forward, hidden)
        for norm in (self.norm1, self.norm2):
            _build(norm, hidden)
        self.built = True

    def call(self, x: Tensor, key_mask: Tensor | None = None, training: bool | None = None) -> Tensor:
        checks.check_layer_input(x, key_mask, "key_mask", self.sizes["d_model"], OPS)
        return self._forward(x, key_layout(key_mask, OPS), training)

    def _forward(self, x: Tensor, mask: Tensor | None, training: bool | None) -> Tensor:
        """``mask``: the key padding as ``(B, 1, 1, L)``."""

        def attend(h: Tensor) -> Tensor:
            return self.self_attn._attend(h, h, h, mask=mask, self_attention=True, training=bool(training))[0]

        x = self.residual(x, self.norm1, attend, training)
        return self.residual(x, self.norm2, lambda h: self.feed_forward._forward(h, training), training)

    def state_children(self) -> dict[str, layers.Layer]:
        return {name: getattr(self, name) for name in schema.ENCODER_LAYER}


@register
class DecoderLayer(_Block):
    """Causal self-attention, cross-attention over the encoder memory, feed-forward; residuals and LayerNorm."""

    tensor_arguments = ("x", "memory")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.self_attn = self.attention(schema.SELF_ATTENTION)
        self.cross_attn = self.attention(schema.CROSS_ATTENTION)
        self.norm1, self.norm2, self.norm3 = (self.norm(name) for name in schema.norms(schema.DECODER))

    def build(self, x_shape: Shape, memory_shape: Shape | None = None) -> None:
        hidden = self.hidden_shape
        _build(self.self_attn, hidden, hidden, hidden)
        _build(self.cross_attn, hidden, hidden, hidden)
        _build(self.feed_forward, hidden)
        for norm in (self.norm1, self.norm2, self.norm3):
            _build(norm, hidden)
        self.built = True

    def call(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_key_mask: Tensor | None = None,
        memory_key_mask: Tensor | None = None,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        return_weights: bool = False,
        training: bool | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``x (B, Lt, E)``, ``memory (B, Ls, E)``; with ``return_weights`` also the cross-attention weights
        ``(B, H, Lt, Ls)``."""
        checks.check_decoder_layer_call(
            self, x, memory, tgt_key_mask=tgt_key_mask, memory_key_mask=memory_key_mask, self_cache=self_cache,
            cross_cache=cross_cache, return_weights=return_weights, cache_type=KVCache, ops=OPS,
        )  # fmt: skip
        out, weights = self._forward(
            x, memory, key_layout(tgt_key_mask, OPS), key_layout(memory_key_mask, OPS), self_cache, cross_cache,
            return_weights, training,
        )  # fmt: skip
        return out if weights is None else (out, weights)

    def _forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        tgt_mask: Tensor | None,
        memory_mask: Tensor | None,
        self_cache: StepCache | None,
        cross_cache: StepCache | None,
        return_weights: bool,
        training: bool | None,
    ) -> tuple[Tensor, Tensor | None]:
        """The output, and with ``return_weights`` the cross-attention weights (else ``None``). Masks as
        ``(B, 1, 1, L)``. With caches, ``x`` holds the new tokens (one per row at a decoding step) and ``memory`` may
        be ``None`` once ``cross_cache`` holds its projection."""

        def self_attention(h: Tensor) -> Tensor:
            return self.self_attn._attend(
                h, h, h, mask=tgt_mask, causal=True, cache=self_cache, self_attention=True, training=bool(training)
            )[0]

        cross_weights: list[Tensor | None] = []

        def cross_attention(h: Tensor) -> Tensor:
            out, weights = self.cross_attn._attend(
                h, memory, memory, mask=memory_mask, return_weights=return_weights, cache=cross_cache,
                self_attention=False, training=bool(training),
            )  # fmt: skip
            cross_weights.append(weights)
            return out

        x = self.residual(x, self.norm1, self_attention, training)
        x = self.residual(x, self.norm2, cross_attention, training)
        x = self.residual(x, self.norm3, lambda h: self.feed_forward._forward(h, training), training)
        return x, cross_weights[0]

    def state_children(self) -> dict[str, layers.Layer]:
        return {name: getattr(self, name) for name in schema.DECODER_LAYER}


class _Stack(NamedTensorArguments, layers.Layer):
    """A stack of layers with a final LayerNorm when ``norm_first``."""

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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_non_negative_int("num_layers", num_layers)
        self.sizes: dict[str, Any] = dict(
            num_layers=num_layers, d_model=d_model, num_heads=num_heads, d_ff=d_ff, dropout=dropout,
            activation=activation, norm_first=norm_first,
        )  # fmt: skip
        block = (d_model, num_heads, d_ff, dropout, activation, norm_first)
        self.blocks = [self.layer_type(*block, name=f"{schema.LAYERS}_{i}") for i in range(num_layers)]
        self.norm = layers.LayerNormalization(epsilon=LAYER_NORM_EPS, name=schema.STACK_NORM) if norm_first else None

    def build(self, x_shape: Shape, *_: Shape) -> None:
        for block in self.blocks:
            _build(block, x_shape)
        if self.norm is not None:
            _build(self.norm, (None, None, self.sizes["d_model"]))
        self.built = True

    def finish(self, x: Tensor) -> Tensor:
        return x if self.norm is None else self.norm(x)

    def state_children(self) -> dict[str, layers.Layer]:
        children = {f"{schema.LAYERS}.{i}": block for i, block in enumerate(self.blocks)}
        return children if self.norm is None else {**children, schema.STACK_NORM: self.norm}

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **self.sizes}


@register
class Encoder(_Stack):
    """A stack of :class:`EncoderLayer`, with a final LayerNorm when ``norm_first``."""

    layer_type = EncoderLayer

    def call(self, x: Tensor, key_mask: Tensor | None = None, training: bool | None = None) -> Tensor:
        checks.check_layer_input(x, key_mask, "key_mask", self.sizes["d_model"], OPS)
        return self._forward(x, key_layout(key_mask, OPS), training)

    def _forward(self, x: Tensor, mask: Tensor | None, training: bool | None) -> Tensor:
        for block in self.blocks:
            x = block._forward(x, mask, training)
        return self.finish(x)


@register
class Decoder(_Stack):
    """A stack of :class:`DecoderLayer`, with a final LayerNorm when ``norm_first``."""

    tensor_arguments = ("x", "memory")

    layer_type = DecoderLayer

    def build(self, x_shape: Shape, memory_shape: Shape | None = None, *_: Shape) -> None:
        super().build(x_shape)

    def call(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_key_mask: Tensor | None = None,
        memory_key_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        return_weights: bool = False,
        training: bool | None = None,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """``x (B, Lt, E)``; with ``return_weights`` also each layer's cross-attention weights ``(B, H, Lt, Ls)``."""
        checks.check_decoder_call(
            self.blocks, x, memory, width=self.sizes["d_model"], tgt_key_mask=tgt_key_mask,
            memory_key_mask=memory_key_mask, cache=cache, return_weights=return_weights, ops=OPS,
        )  # fmt: skip
        out, weights = self._forward(
            x, memory, key_layout(tgt_key_mask, OPS), key_layout(memory_key_mask, OPS), cache, return_weights,
            training,
        )  # fmt: skip
        return (out, weights) if return_weights else out

    def _forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        tgt_mask: Tensor | None,
        memory_mask: Tensor | None,
        cache: DecoderCaches | None,
        return_weights: bool,
        training: bool | None,
    ) -> tuple[Tensor, list[Tensor]]:
        """The output, and with ``return_weights`` each layer's cross-attention weights (else none)."""
        cross_weights = []
        for index, block in enumerate(self.blocks):
            x, weights = block._forward(
                x,
                memory,
                tgt_mask,
                memory_mask,
                None if cache is None else cache.self_attention[index],
                None if cache is None else cache.cross_attention[index],
                return_weights,
                training,
            )
            if weights is not None:
                cross_weights.append(weights)
        return self.finish(x), cross_weights


@register
class TiedProjection(layers.Layer):
    """The output projection of a model with tied embeddings (``tie_embeddings`` or ``tie_output``):
    ``x @ Eᵀ + bias``, with ``E`` an ``Embedding``'s matrix ``(V, E)``, as the paper shares it. Its weight is that
    embedding's, stored under this layer's name too."""

    def __init__(self, embedding: layers.Embedding, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.embedding = embedding

    def build(self, input_shape: Any = None) -> None:
        self.bias = self.add_weight(shape=(self.embedding.input_dim,), initializer="zeros", name="bias")
        self.built = True

    def call(self, x: Tensor) -> Tensor:
        kernel = ops.cast(self.embedding.embeddings, x.dtype)  # (V, E)
        return ops.matmul(x, ops.transpose(kernel)) + ops.cast(self.bias, x.dtype)  # (B, L, V)

    def state_variables(self) -> dict[str, tuple[keras.Variable, bool]]:
        """Weights under their PyTorch state-dict names, with whether the file stores them transposed."""
        return {"weight": (self.embedding.embeddings, False), "bias": (self.bias, False)}


@register
class Transformer(NamedTensorArguments, keras.Model):
    """Encoder-decoder Transformer for sequence-to-sequence tasks (a ``keras.Model``: ``fit`` works on
    ``((src, tgt_in), tgt_out)`` data).

    Embeddings are scaled by ``sqrt(d_model)`` and summed with sinusoidal positions, as in the paper; the decoder's
    self-attention is causal. Key masks are ``(B, L)`` bool, ``True`` at real tokens; when ``pad_id`` is set and
    a mask is not given, it is ``tokens != pad_id`` (a target's first position always real). With ``tie_embeddings``
    (one vocabulary for both sides), the source embedding, the target embedding and the output projection share one
    matrix, as in the paper; with ``tie_output`` the target embedding and the output projection do. The options for
    models trained elsewhere (``positions``, ``first_position``, ``scale_embeddings``) are :class:`TransformerConfig`'s.
    """

    tensor_arguments = ("src", "tgt")
    built: bool

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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config = TransformerConfig(
            src_vocab, tgt_vocab, d_model, num_heads, num_encoder_layers, num_decoder_layers, d_ff, dropout,
            activation, norm_first, max_len, pad_id, tie_embeddings, positions, scale_embeddings, tie_output,
            first_position,
        )  # fmt: skip
        # std d_model^-1/2: unit variance after the sqrt(d_model) scaling, like the positional encodings
        embedding_init = keras.initializers.RandomNormal(stddev=d_model**-0.5)
        self.src_embed = layers.Embedding(
            src_vocab, d_model, embeddings_initializer=embedding_init, name=schema.SOURCE_EMBEDDING
        )
        if tie_embeddings:
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = layers.Embedding(
                tgt_vocab, d_model, embeddings_initializer=embedding_init, name=schema.TARGET_EMBEDDING
            )
        if tie_embeddings or tie_output:
            self.output_proj = TiedProjection(self.tgt_embed, name=schema.OUTPUT)
        else:
            self.output_proj = layers.Dense(tgt_vocab, name=schema.OUTPUT)
        self.positional = PositionalEncoding(d_model, max_len, dropout, positions, first_position, name="positional")
        stack = (d_model, num_heads, d_ff, dropout, activation, norm_first)
        self.encoder = Encoder(num_encoder_layers, *stack, name=schema.ENCODER)
        self.decoder = Decoder(num_decoder_layers, *stack, name=schema.DECODER)
        self.generation_programs: dict[tuple, Any] = {}  # see multihead.keras.generation

    @classmethod
    def from_config(cls, config: TransformerConfig | Mapping[str, Any]) -> Transformer:
        """From a :class:`TransformerConfig` or the dict ``get_config()`` returns."""
        name = config.get("name") if isinstance(config, Mapping) else None
        if isinstance(config, Mapping):
            config = {key: value for key, value in config.items() if key != "name"}
        values = config_fields(config)
        return cls(values.pop("src_vocab"), values.pop("tgt_vocab"), name=name, **values)

    def get_config(self) -> dict[str, Any]:
        return {**asdict(self.config), "name": self.name}

    def state_children(self) -> dict[str, layers.Layer]:
        return {name: getattr(self, name) for name in schema.TRANSFORMER}

    def build(self, input_shape: Any = None) -> None:
        """Create every weight (the sizes are the config's, whatever ``input_shape`` says)."""
        if self.built:
            return
        hidden = (None, None, self.config.d_model)
        for embedding in (self.src_embed, self.tgt_embed):
            _build(embedding, (None, None))
        _build(self.encoder, hidden)
        _build(self.decoder, hidden, hidden)
        _build(self.output_proj, hidden)
        self.built = True

    def build_from_state(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.build()

    def _key_mask(self, tokens: Tensor, key_mask: Tensor | None) -> Tensor | None:
        return padding_from_tokens(tokens, key_mask, self.config.pad_id, OPS)

    def _target_key_mask(self, tokens: Tensor, key_mask: Tensor | None) -> Tensor | None:
        return target_padding_from_tokens(tokens, key_mask, self.config.pad_id, OPS)

    def _embed(
        self, embedding: layers.Embedding, tokens: Tensor, offset: int | Tensor, training: bool | None
    ) -> Tensor:
        embedded = embedding(tokens)  # (B, L, E)
        if self.config.scale_embeddings:
            embedded = embedded * math.sqrt(self.config.d_model)
        return self.positional._forward(embedded, offset, training)  # (B, L, E)

    def encode(self, src: Tensor, src_key_mask: Tensor | None = None, training: bool | None = None) -> Tensor:
        """``src (B, Ls)`` token ids → memory ``(B, Ls, E)``."""
        checks.check_source(src, src_key_mask, self.config, OPS)
        return self._encode(src, self._key_mask(src, src_key_mask), training)

    def _encode(self, src: Tensor, src_key_mask: Tensor | None, training: bool | None) -> Tensor:
        memory_mask = key_layout(src_key_mask, OPS)
        return self.encoder._forward(self._embed(self.src_embed, src, 0, training), memory_mask, training)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        memory_key_mask: Tensor | None = None,
        tgt_key_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        return_weights: bool = False,
        training: bool | None = None,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """``tgt (B, Lt)`` token ids and ``memory (B, Ls, E)`` → logits ``(B, Lt, V)``.

        With a cache (``model.new_cache()``), ``tgt`` holds only the new tokens, which take the positions after
        those already cached, and ``tgt_key_mask`` covers every cached target token. With ``return_weights`` also
        each layer's cross-attention weights ``(B, H, Lt, Ls)``.
        """
        checks.check_decode_call(
            tgt, memory, memory_key_mask=memory_key_mask, tgt_key_mask=tgt_key_mask, cache=cache,
            return_weights=return_weights, config=self.config, layers=self.decoder.blocks, ops=OPS,
        )  # fmt: skip
        if tgt_key_mask is None and cache is None:
            tgt_key_mask = self._target_key_mask(tgt, None)
        hidden, weights = self._decode_hidden(
            tgt, memory, memory_key_mask, tgt_key_mask, cache, return_weights, training
        )
        logits = self.output_proj(hidden)  # (B, Lt, V)
        return (logits, weights) if return_weights else logits

    def _decode_hidden(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        memory_key_mask: Tensor | None,
        tgt_key_mask: Tensor | None,
        cache: DecoderCaches | None,
        return_weights: bool,
        training: bool | None,
    ) -> tuple[Tensor, list[Tensor]]:
        """The decoder's output ``(B, Lt, E)`` before the output projection, over any
        :class:`~multihead.cache.DecoderCaches` (``memory`` may be ``None`` once it holds the memory's projection),
        and with ``return_weights`` each layer's cross-attention weights (else none)."""
        offset = 0 if cache is None else cache.length
        return self.decoder._forward(
            self._embed(self.tgt_embed, tgt, offset, training),
            memory,
            key_layout(tgt_key_mask, OPS),
            key_layout(memory_key_mask, OPS),
            cache,
            return_weights,
            training,
        )

    def call(
        self,
        src: Tensor | tuple[Tensor, Tensor],
        tgt: Tensor | None = None,
        src_key_mask: Tensor | None = None,
        tgt_key_mask: Tensor | None = None,
        training: bool | None = None,
    ) -> Tensor:
        """Teacher-forced logits ``(B, Lt, V)``; ``src`` may be the pair ``(src, tgt)``, as ``fit`` passes it."""
        if tgt is None and isinstance(src, (tuple, list)):
            src, tgt = src
        checks.check_model_call(src, tgt, src_key_mask, tgt_key_mask, self.config, OPS)
        src_key_mask = self._key_mask(src, src_key_mask)
        memory = self._encode(src, src_key_mask, training)
        tgt_key_mask = self._target_key_mask(tgt, tgt_key_mask)
        hidden, _ = self._decode_hidden(tgt, memory, src_key_mask, tgt_key_mask, None, False, training)
        return self.output_proj(hidden)  # (B, Lt, V)

    def new_cache(self, capacity: int | None = None) -> DecoderCache:
        return DecoderCache(self.config.num_decoder_layers, KVCache, capacity)

    def decoder_steps(self) -> DecoderSteps:
        """The decoding steps of one ``generate`` call (see :class:`multihead.decoding.Steps`), eager or inside the
        compiled programs of :mod:`multihead.keras.generation`."""
        return DecoderSteps(self)

    def generate(
        self,
        src: Tensor,
        *,
        max_len: decoding.Limit,
        bos_id: int | None = None,
        eos_id: int | None = None,
        src_key_mask: Tensor | None = None,
        beam_size: int = 1,
        use_cache: bool = True,
        pad_id: int | None = None,
        length_penalty: float = 1.0,
        compiled: bool | None = None,
        search: decoding.SearchOptions | None = None,
        generation: decoding.Generation | None = None,
    ) -> np.ndarray:
        """Translate ``src (B, Ls)`` as ``generation`` says (a :class:`multihead.decoding.Generation`: the special
        ids, banned and forced tokens, the search), or as its keywords do: ``bos_id`` and ``eos_id``, greedy
        (``beam_size=1``), beam search, or as ``search`` says (a :class:`multihead.decoding.SearchOptions`: greedy,
        beam search or sampling; not with ``beam_size`` or ``length_penalty``).

        ``max_len``: the most tokens a row may take, one for all rows or one per row (a list or 1-D array of ``B``
        ints). Returns the generated tokens after BOS as an int64 array ``(B, T)``, ``T <= max(max_len)``; each row
        stops at its first EOS or its ``max_len`` and is padded after it with the pad (``pad_id`` default: the
        config's ``pad_id``, else ``eos_id``).

        ``compiled`` chooses how the decoding steps run: ``True``, as one traced program per step over a cache of
        fixed capacity (``tf.function`` on TensorFlow, ``jax.jit`` on JAX; see
        :mod:`multihead.keras.generation`), which costs a compilation on the first call with new sizes and is then
        many times faster; ``False``, eagerly, operation by operation; ``None`` (default), compiled on TensorFlow and
        JAX, eager on the torch backend, which has no compiled path. Both give the same tokens.
        """
        generation, longest = checks.check_generate_call(
            self.config, generation, max_len=max_len, src=src, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
            beam_size=beam_size, length_penalty=length_penalty, search=search,
        )  # fmt: skip
        session = self.decoding_session(
            src, max_len=longest, src_key_mask=src_key_mask, use_cache=use_cache, compiled=compiled
        )
        return engine.generate(session, int(src.shape[0]), generation, max_len=max_len)

    def decoding_session(
        self,
        src: Tensor,
        *,
        max_len: int,
        src_key_mask: Tensor | None = None,
        use_cache: bool = True,
        compiled: bool | None = None,
    ) -> engine.Rows:
        """What :meth:`generate` searches: ``src (B, Ls)`` (checked) encoded, and the decoding state for ``max_len``
        steps, as :class:`multihead.engine.Rows` for the searches of :mod:`multihead.engine`; ``compiled`` as
        :meth:`generate` takes it."""
        check_flag("use_cache", use_cache)
        if compiled is not None:
            check_flag("compiled", compiled)
        if compiled and keras.backend.backend() not in COMPILED_BACKENDS:
            raise ValueError(
                f"`compiled`=True needs one of the backends {COMPILED_BACKENDS}, received the "
                f"{keras.backend.backend()} backend; use compiled=None or False"
            )
        checks.check_source(src, src_key_mask, self.config, OPS)
        src = ops.convert_to_tensor(src)
        src_key_mask = self._key_mask(src, src_key_mask)
        if compiled is None:
            compiled = keras.backend.backend() in COMPILED_BACKENDS
        self.build()  # the decoding steps call the layers' unchecked paths, which need their weights
        if compiled:
            return CompiledDecoding(self, src, src_key_mask, use_cache, max_len)
        steps = self.decoder_steps()
        memory, src_key_mask = steps.encode(src, src_key_mask)
        cache = self.new_cache() if use_cache else None
        return decoding.DecodingSession(steps, memory, src_key_mask, cache)


class DecoderSteps:
    """The decoding steps of a Keras :class:`Transformer` (a :class:`multihead.decoding.Steps`), on arguments
    already checked: sources encoded, their memory projected for the cross-attention caches, and steps of one token
    per row, each the model's forward pass over a :class:`~multihead.cache.DecoderCaches`.

    The same steps run eagerly over a :class:`~multihead.cache.DecoderCache` and, traced, inside the compiled
    programs of :mod:`multihead.keras.generation`, over buffers of fixed capacity whose position (``cache.length``)
    is a tensor; there ``self_key_mask`` ``(1, C)`` says which of the buffers' positions hold keys.
    """

    def __init__(self, model: Transformer) -> None:
        self.model = model

    def encode(self, src: Tensor, src_key_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """``src (N, Ls)`` encoded: the memory ``(N, Ls, E)`` and its key mask ``(N, Ls)`` (from the config's
        ``pad_id`` when not given; ``None``: every position real)."""
        src_key_mask = self.model._key_mask(src, src_key_mask)
        return self.model._encode(src, src_key_mask, False), src_key_mask

    def project_memory(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every decoder layer's cross-attention keys and values ``(N, Hkv, Ls, D)`` of ``memory (N, Ls, E)``."""
        return [block.cross_attn._project_keys_values(memory, memory) for block in self.model.decoder.blocks]

    def empty_self_caches(self, rows: Tensor, capacity: int, dtype: str) -> tuple[list[Tensor], list[Tensor]]:
        """Zeroed self-attention buffers of every layer: keys ``(N, Hkv, C, Dk)`` and values ``(N, Hkv, C, Dv)``."""
        attention = [block.self_attn for block in self.model.decoder.blocks]
        keys = [ops.zeros((rows, a.num_kv_heads, capacity, a.head_dim), dtype=dtype) for a in attention]
        values = [ops.zeros((rows, a.num_kv_heads, capacity, a.value_head_dim), dtype=dtype) for a in attention]
        return keys, values

    def step(
        self,
        tokens: Tensor,
        cache: DecoderCaches,
        memory_key_mask: Tensor | None,
        self_key_mask: Tensor | None = None,
    ) -> Tensor:
        """As :meth:`multihead.decoding.Steps.step`."""
        hidden, _ = self.model._decode_hidden(
            tokens, None, memory_key_mask, self_key_mask, cache, False, False
        )  # (N, 1, E)
        return self.log_probs(hidden[:, 0])

    def recompute(
        self, prefix: Tensor, memory: Tensor, memory_key_mask: Tensor | None, position: Tensor | int | None = None
    ) -> Tensor:
        """:class:`~multihead.decoding.Steps`' ``recompute``; at ``position`` of ``prefix`` (default: its last)."""
        hidden, _ = self.model._decode_hidden(prefix, memory, memory_key_mask, None, None, False, False)  # (N, t, E)
        position = ops.shape(prefix)[1] - 1 if position is None else position
        return self.log_probs(ops.take(hidden, position, axis=1))

    def log_probs(self, hidden: Tensor) -> Tensor:
        """``hidden (N, E)`` → next-token log-probabilities ``(N, V)`` in float32."""
        return ops.log_softmax(ops.cast(self.model.output_proj(hidden), "float32"), axis=-1)  # (N, V)

    def take(self, x: Tensor, rows: np.ndarray) -> Tensor:
        return ops.take(x, ops.convert_to_tensor(rows), axis=0)

    @staticmethod
    def mean_log_probs(log_probs: Sequence[Tensor]) -> Tensor:
        """The mean of several steps' log-probabilities ``(N, V)``: an ensemble's (:class:`~multihead.engine.Ensemble`
        steps so)."""
        return ops.mean(ops.stack(list(log_probs)), axis=0)  # (models, N, V) -> (N, V)

    def tensor(self, array: np.ndarray) -> Tensor:
        return ops.convert_to_tensor(array.astype("int32") if array.dtype == np.int64 else array)

    def argmax(self, log_probs: Tensor) -> np.ndarray:
        return np.asarray(ops.convert_to_numpy(ops.argmax(log_probs, axis=-1))).astype(np.int64)

    def suppress(self, log_probs: Tensor, tokens: np.ndarray, rows: np.ndarray | None = None) -> Tensor:
        """:meth:`multihead.decoding.Choices.suppress` of log-probabilities: renormalised."""
        count, vocab = (int(size) for size in log_probs.shape)
        impossible = np.zeros(vocab, bool)  # (V,)
        impossible[tokens] = True
        if rows is not None:
            chosen = np.zeros(count, bool)
            chosen[rows] = True
            impossible = np.logical_and.outer(chosen, impossible)  # (N, V)
        return ops.log_softmax(ops.where(ops.convert_to_tensor(impossible), -np.inf, log_probs), axis=-1)

    def log_probs_at(self, log_probs: Tensor, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        picked = ops.take(
            ops.take(log_probs, ops.convert_to_tensor(rows), axis=0), ops.convert_to_tensor(tokens), axis=1
        )
        return np.asarray(ops.convert_to_numpy(picked), dtype=np.float32)  # (R, T)

    def top_k(
        self, log_probs: Tensor, scores: np.ndarray, beam: int, count: int, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        vocab = int(log_probs.shape[-1])
        # A sentence's best candidates are among the best of each of its rows: scores are added to those only.
        row_best = min(count, vocab)
        values, tokens = ops.top_k(log_probs, row_best)  # (N, row_best)
        values, tokens = np.asarray(ops.convert_to_numpy(values)), np.asarray(ops.convert_to_numpy(tokens))
        if rows is not None:  # the rows searched, each sentence's together
            values, tokens = values[rows], tokens[rows]  # (S*beam, row_best)
        values, tokens = values + scores[:, None], tokens.astype(np.int64)
        values, tokens = values.reshape(-1, beam * row_best), tokens.reshape(-1, beam * row_best)  # (S, beam*row_best)
        chosen = np.argsort(-values, axis=-1, kind="stable")[:, :count]  # (S, count), ties to the lower row
        indices = chosen // row_best * vocab + np.take_along_axis(tokens, chosen, axis=-1)  # beam_row * V + token
        return np.take_along_axis(values, chosen, axis=-1).astype(np.float32), indices
