"""Multi-head attention as a Keras 3 layer around :func:`multihead.keras.attention`.

The layer projects, splits heads, calls the attention function, merges heads and projects out; with a cache (a
:class:`~multihead.cache.StepCache` such as :class:`KVCache`) it appends to it (self-attention) or projects the memory
into it once (cross-attention): a decoding step is the same call with one query per row.

``call`` checks its arguments; ``_attend`` is the unchecked path the Transformer's layers call once their own public
entry point has checked theirs.

Notation: B batch, Lq query length, Lk key length, H query heads, Hkv key/value heads, Dk query/key head dim,
Dv value head dim, E = d_model (output width).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras
from keras import ops

# Keras has no public accessor for the padding mask a tensor carries; its own layers read it through this one.
from keras.src.backend import get_keras_mask

from multihead.cache import KVCacheBase, StepCache, attended
from multihead.checks import check_attention_call
from multihead.keras.functional import IMPLEMENTATIONS, _attention
from multihead.keras.tensors import OPS, Tensor, is_tensor_like
from multihead.schema import ATTENTION
from multihead.validation import (
    check_dropout,
    check_flag,
    check_heads,
    check_implementation,
    check_optional_positive_int,
    resolve_head_dim,
)

__all__ = ["KVCache", "MultiHeadAttention"]

Shape = tuple[int | None, ...]


class KVCache(KVCacheBase):
    """Projected keys and values kept between decoding steps, ``(B, Hkv, L, D)``, for eager decoding (a
    Transformer's compiled generation keeps its own fixed buffers: :mod:`multihead.keras.generation`).

    Passed as ``cache=`` to :class:`MultiHeadAttention`: self-attention (no ``key``) appends the new tokens and
    attends over everything cached; cross-attention (``key`` given) projects the memory once and reuses it.
    ``capacity`` preallocates buffers of that length; default: grow by concatenation.
    """

    def _concat(self, cached: Tensor, new: Tensor) -> Tensor:
        return ops.concatenate([cached, new], axis=2)

    def _empty(self, like: Tensor, length: int) -> Tensor:
        return ops.zeros((like.shape[0], like.shape[1], length, like.shape[3]), dtype=like.dtype)

    def _write(self, buffer: Tensor, new: Tensor, start: int) -> Tensor:
        return ops.slice_update(buffer, (0, 0, start, 0), new)

    def _take(self, x: Tensor, rows: Any) -> Tensor:
        return ops.take(x, ops.convert_to_tensor(rows), axis=0)


def _features(name: str, shape: Shape) -> int:
    """The last dimension of an input shape ``(B, L, features)``, which must be known."""
    if len(shape) != 3 or shape[-1] is None:
        raise ValueError(f"`{name}` must be 3-D (B, L, features) with known features, received shape {shape}")
    return shape[-1]


def _split_heads(x: Tensor, heads: int, dim: int) -> Tensor:
    batch, length = ops.shape(x)[0], ops.shape(x)[1]
    return ops.transpose(ops.reshape(x, (batch, length, heads, dim)), (0, 2, 1, 3))  # (B, heads, L, dim)


@keras.saving.register_keras_serializable(package="multihead")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention (self, cross, grouped-query), batch first.

    Args:
        num_heads: query heads ``H``.
        d_model: output width ``E``; default: the query's last dimension at build time.
        head_dim: query/key width per head ``Dk``; default ``d_model // num_heads`` (which must divide).
        value_head_dim: value width per head ``Dv``; default ``head_dim``.
        num_kv_heads: key/value heads ``Hkv`` (grouped-query attention when ``< num_heads``; multi-query when
            1); must divide ``num_heads``. Default ``num_heads``.
        dropout: dropout on the attention probabilities, with ``training=True`` only.
        use_bias: whether the four projections have a bias.
        seed: seed of the dropout's random generator.
        implementation: the attention path, as :func:`multihead.keras.attention`'s ``implementation``: ``"auto"``
            (default), ``"explicit"``, ``"fused"`` or ``"blocked"``.
        **kwargs: base ``keras.layers.Layer`` arguments (``name``, ``dtype``, ...).

    Sublayers ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` are ``Dense`` (kernel ``(in, out)``), created in
    ``build`` once the input widths are known; head ``h`` owns columns ``h*Dk:(h+1)*Dk`` of ``q_proj``.

    When the query carries a Keras padding mask (from ``Embedding(mask_zero=True)``) and no key is given, that
    mask becomes ``key_mask``; a key's Keras mask becomes ``key_mask`` in cross-attention. The output carries the
    query's mask onwards.

    Example:
        >>> import numpy as np
        >>> mha = MultiHeadAttention(num_heads=8)
        >>> x = np.random.randn(64, 5, 512).astype("float32")
        >>> tuple(mha(x, causal=True).shape)
        (64, 5, 512)
    """

    def __init__(
        self,
        num_heads: int,
        *,
        d_model: int | None = None,
        head_dim: int | None = None,
        value_head_dim: int | None = None,
        num_kv_heads: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        seed: int | None = None,
        implementation: str = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.num_heads, self.num_kv_heads = check_heads(num_heads, num_kv_heads)
        self._d_model = check_optional_positive_int("d_model", d_model)
        self._head_dim = check_optional_positive_int("head_dim", head_dim)
        self._value_head_dim = check_optional_positive_int("value_head_dim", value_head_dim)
        if self._d_model is not None:
            resolve_head_dim(self._d_model, self.num_heads, self._head_dim)
        self.dropout = check_dropout("dropout", dropout)
        self.use_bias = check_flag("use_bias", use_bias)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"`seed` must be an int or None, received {seed!r}")
        self.seed = seed
        self.implementation = check_implementation(implementation, IMPLEMENTATIONS)
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True
        self._build_shapes: dict[str, Shape] | None = None

    @property
    def d_model(self) -> int | None:
        return self._d_model

    @property
    def head_dim(self) -> int | None:
        return self._head_dim

    @property
    def value_head_dim(self) -> int | None:
        return self._value_head_dim

    def build(self, query_shape: Shape, key_shape: Shape | None = None, value_shape: Shape | None = None) -> None:
        key_shape = query_shape if key_shape is None else key_shape
        value_shape = key_shape if value_shape is None else value_shape
        qdim, kdim, vdim = (
            _features(name, shape)
            for name, shape in (("query", query_shape), ("key", key_shape), ("value", value_shape))
        )
        d_model = self._d_model or qdim
        head_dim = resolve_head_dim(d_model, self.num_heads, self._head_dim)
        value_head_dim = self._value_head_dim or head_dim
        self._d_model, self._head_dim, self._value_head_dim = d_model, head_dim, value_head_dim
        self.qdim, self.kdim, self.vdim = qdim, kdim, vdim

        def dense(units: int, name: str, in_shape: Shape) -> keras.layers.Dense:
            layer = keras.layers.Dense(units, use_bias=self.use_bias, dtype=self.dtype_policy, name=name)
            layer.build(in_shape)
            return layer

        q_name, k_name, v_name, out_name = ATTENTION
        self.q_proj = dense(self.num_heads * head_dim, q_name, query_shape)
        self.k_proj = dense(self.num_kv_heads * head_dim, k_name, key_shape)
        self.v_proj = dense(self.num_kv_heads * value_head_dim, v_name, value_shape)
        self.out_proj = dense(d_model, out_name, (None, None, self.num_heads * value_head_dim))
        self._build_shapes = {"query_shape": query_shape, "key_shape": key_shape, "value_shape": value_shape}
        self.built = True

    def state_children(self) -> dict[str, keras.layers.Layer]:
        """Sublayers under their PyTorch state-dict names (see :mod:`multihead.io`)."""
        return {name: getattr(self, name) for name in ATTENTION}

    def build_from_state(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Build from the tensor shapes of a weights file; sizes left unset take the file's values."""
        inputs, out_name = ATTENTION[:3], ATTENTION[3]
        if any(f"{name}.weight" not in shapes for name in inputs):
            raise ValueError(f"cannot build from weights without {', '.join(inputs)}, received {sorted(shapes)}")
        (q_out, qdim), (_, kdim), (v_out, vdim) = (shapes[f"{name}.weight"][:2] for name in inputs)
        self._d_model = self._d_model or shapes.get(f"{out_name}.weight", (qdim,))[0]
        self._head_dim = self._head_dim or q_out // self.num_heads
        self._value_head_dim = self._value_head_dim or v_out // self.num_kv_heads
        self.build((None, None, qdim), (None, None, kdim), (None, None, vdim))

    def get_build_config(self) -> dict[str, Any] | None:
        return None if self._build_shapes is None else {"shapes_dict": self._build_shapes}

    def build_from_config(self, config: dict[str, Any]) -> None:
        if config:
            self.build(**{name: tuple(shape) for name, shape in config["shapes_dict"].items()})

    def __call__(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None, **kwargs: Any) -> Any:
        # Tensors are checked here because Keras rejects other positional arguments with a message of its own.
        # With a single tensor argument Keras would pass the query's padding mask (B, Lq) as `mask`, which here
        # means (Lq, Lk). In self-attention that padding mask is the key padding: hand it over as such.
        for name, x in (("query", query), ("key", key), ("value", value)):
            if (x is not None or name == "query") and not is_tensor_like(x):
                raise TypeError(f"`{name}` must be a tensor, received {type(x).__name__}")
        if key is None and value is None and kwargs.get("key_mask") is None:
            kwargs["key_mask"] = get_keras_mask(query)
        return super().__call__(query, key, value, **kwargs)

    def call(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        query_mask: Tensor | None = None,
        causal: bool = False,
        return_weights: bool = False,
        training: bool | None = None,
        cache: KVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(B, Lq, qdim)``.
            key: ``(B, Lk, kdim)``; default ``query`` (self-attention).
            value: ``(B, Lk, vdim)``; default ``key``.
            mask: ``(Lq, Lk)``, ``(B, Lq, Lk)`` or broadcastable to ``(B, H, Lq, Lk)``; bool (``True`` = attend)
                or float (added to the scores).
            key_mask: ``(B, Lk)`` bool, ``True`` at real (non-pad) keys.
            query_mask: ``(B, Lq)`` bool, ``True`` at real queries; padded query rows give zero output and
                weights. (Unlike the PyTorch module, which skips them, this layer still computes them: Keras
                graphs need static shapes.)
            causal: bottom-right aligned causal masking, combined with the masks by AND.
            return_weights: also return the per-head weights ``(B, H, Lq, Lk)``.
            training: whether dropout applies.
            cache: a :class:`KVCache` (eager decoding). Self-attention appends to it and attends over all cached
                tokens (masks then cover every cached key); cross-attention projects the memory into it once and
                reuses it.

        Returns:
            ``(B, Lq, E)``, or ``(out, weights)``.
        """
        if training is not None:
            check_flag("training", training)
        call = check_attention_call(
            self, query, key, value, mask=mask, key_mask=key_mask, query_mask=query_mask, causal=causal,
            return_weights=return_weights, cache=cache, cache_type=KVCache, implementations=IMPLEMENTATIONS, ops=OPS,
        )  # fmt: skip
        out, weights = self._attend(
            query, call.key, call.value, mask=call.padded_mask(), causal=causal, return_weights=return_weights,
            cache=cache, self_attention=call.self_attention, training=bool(training),
        )  # fmt: skip
        return call.finish(out, weights)

    def _attend(
        self,
        query: Tensor,
        key: Tensor | None,
        value: Tensor | None,
        *,
        mask: Tensor | None,
        causal: bool = False,
        return_weights: bool = False,
        cache: StepCache | None = None,
        self_attention: bool,
        training: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`call` on checked arguments, the output and, with ``return_weights``, the weights (else ``None``):
        ``mask`` is 4-D ``(B|1, H|1, Lq|1, Lk|1)`` with the key padding
        already in it; ``self_attention`` says whether a cache appends ``key`` or holds the memory (``key`` and
        ``value`` may then be ``None``)."""
        if not self.built:  # the Transformer's layers call this directly, not through Keras' __call__
            key = query if key is None else key
            self.build(tuple(query.shape), tuple(key.shape), tuple((key if value is None else value).shape))
        k, v = attended(cache, self_attention, lambda: self._project_keys_values(key, value))  # (B, Hkv, Lk, D)
        return self._attend_projected(query, k, v, mask=mask, causal=causal, return_weights=return_weights,
                                      training=training)  # fmt: skip

    def _project_keys_values(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """``key (B, Lk, kdim)`` and ``value (B, Lk, vdim)`` projected and split: ``(B, Hkv, Lk, Dk)``,
        ``(B, Hkv, Lk, Dv)`` (what a KV cache keeps)."""
        head_dim, value_head_dim = self._built_dims()
        k = _split_heads(self.k_proj(key), self.num_kv_heads, head_dim)  # (B, Hkv, Lk, Dk)
        v = _split_heads(self.v_proj(value), self.num_kv_heads, value_head_dim)  # (B, Hkv, Lk, Dv)
        return k, v

    def _built_dims(self) -> tuple[int, int]:
        """The head widths ``(Dk, Dv)``, known once the layer is built."""
        if self._head_dim is None or self._value_head_dim is None:
            raise RuntimeError("the layer is not built: call it, or build it, first")
        return self._head_dim, self._value_head_dim

    def _attend_projected(
        self,
        query: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None,
        causal: bool,
        return_weights: bool,
        training: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query (B, Lq, qdim)`` to keys and values already projected, ``(B, Hkv, Lk, D)``: the output
        and, with ``return_weights``, the weights (else ``None``)."""
        head_dim, value_head_dim = self._built_dims()
        q = _split_heads(self.q_proj(query), self.num_heads, head_dim)  # (B, H, Lq, Dk)
        dropout = self.dropout if training else 0.0
        result = _attention(
            q, k, v, mask, causal=causal, scale=None, dropout=dropout, return_weights=return_weights,
            seed=self.seed_generator, implementation=self.implementation,
        )  # fmt: skip
        out, weights = result if return_weights else (result, None)
        batch, lq = ops.shape(query)[0], ops.shape(query)[1]
        out = ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (batch, lq, self.num_heads * value_head_dim))
        # out: (B, Lq, H*Dv)
        return self.out_proj(out), weights  # (B, Lq, E)

    def compute_mask(self, inputs: Tensor, previous_mask: Tensor | None = None) -> Tensor | None:
        # Output position i belongs to query i: the query's padding mask carries on, never an attention mask.
        return get_keras_mask(inputs) if is_tensor_like(inputs) else None

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            d_model=self._d_model,
            head_dim=self._head_dim,
            value_head_dim=self._value_head_dim,
            num_kv_heads=self.num_kv_heads,
            dropout=self.dropout,
            use_bias=self.use_bias,
            seed=self.seed,
            implementation=self.implementation,
        )
        return config

    @classmethod
    def from_keras(cls, layer: keras.layers.MultiHeadAttention) -> MultiHeadAttention:
        """A copy of a built ``keras.layers.MultiHeadAttention`` with the same weights and outputs.

        Keras' layer takes ``(query, value, key)`` and ``attention_mask`` (``True`` = attend, as ours); call ours
        as ``(query, key, value, mask=attention_mask)``. Its ``use_causal_mask`` is top-left aligned, ours
        bottom-right: they agree when ``Lq == Lk``.
        """
        if not isinstance(layer, keras.layers.MultiHeadAttention):
            raise TypeError(f"`layer` must be a keras.layers.MultiHeadAttention, received {type(layer).__name__}")
        if not layer.built:
            raise ValueError("`layer` must be built (called once) so that its weights exist, received an unbuilt layer")
        if layer._attention_axes is not None and tuple(layer._attention_axes) != (1,):
            raise ValueError(
                f"`layer` attends over axes {layer._attention_axes}; only the sequence axis (1) is supported"
            )
        query_dense, key_dense, value_dense, output_dense = (
            layer._query_dense,
            layer._key_dense,
            layer._value_dense,
            layer._output_dense,
        )
        qdim, heads, head_dim = query_dense.kernel.shape
        kdim = key_dense.kernel.shape[0]
        vdim, _, value_head_dim = value_dense.kernel.shape
        d_model = output_dense.kernel.shape[-1]
        ours = cls(
            heads,
            d_model=d_model,
            head_dim=head_dim,
            value_head_dim=value_head_dim,
            dropout=layer.dropout,
            use_bias=layer.use_bias,
            dtype=layer.dtype_policy,
        )
        ours.build((None, None, qdim), (None, None, kdim), (None, None, vdim))
        pairs = [(ours.q_proj, query_dense), (ours.k_proj, key_dense), (ours.v_proj, value_dense)]
        for mine, theirs in pairs:
            mine.kernel.assign(ops.reshape(theirs.kernel, mine.kernel.shape))  # (in, H, D) -> (in, H*D)
            if layer.use_bias:
                mine.bias.assign(ops.reshape(theirs.bias, mine.bias.shape))  # (H, D) -> (H*D,)
        ours.out_proj.kernel.assign(ops.reshape(output_dense.kernel, ours.out_proj.kernel.shape))  # (H, Dv, E)
        if layer.use_bias:
            ours.out_proj.bias.assign(output_dense.bias)
        return ours
