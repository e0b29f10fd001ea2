"""Checks of tensor arguments, written once for both front ends over what each says of its tensors (:class:`TensorOps`).

The rules about plain values and shapes are in :mod:`multihead.validation`; here they meet tensors. Every public entry
point of both front ends (the attention functions, the layers, the Transformer) checks its arguments with these
functions, before any computation, so that both refuse the same inputs with the same messages. A front end's
``OPS`` (``multihead.torch.tensors``, ``multihead.keras.tensors``) supplies the few facts and operations they need.

Shapes may hold ``None`` (a length unknown until run time in a Keras graph): such a dim agrees with anything.

Notation: B batch, H query heads, Hkv key/value heads, Lq query length, Lk key length, L length, E features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from multihead import masks
from multihead.cache import (
    DecoderCache,
    KVCacheBase,
    check_decoder_cache,
    check_decoder_cache_call,
    check_layer_caches,
)
from multihead.config import TransformerConfig
from multihead.decoding import Generation, SearchOptions, Specials, search_options
from multihead.masks import MaskOps
from multihead.validation import (
    DTypeError,
    check_attention_shapes,
    check_broadcastable,
    check_dropout,
    check_features,
    check_flag,
    check_implementation,
    check_mask_dtype,
    check_module_inputs,
    check_non_negative_int,
    check_padding_mask_shape,
    check_positions,
    check_positive_int,
    check_same_batch,
    check_scale,
    module_mask_shape,
)

Tensor = Any


class TensorOps(MaskOps, Protocol):
    """What the checks and the mask rules need of one front end's tensors."""

    noun: str
    """How messages name this front end's tensors: ``"a torch.Tensor"``, ``"a tensor"``."""

    def is_tensor(self, x: Tensor) -> bool: ...

    def kind(self, x: Tensor) -> str:
        """The kind of ``x``'s dtype: ``"bool"``, ``"float"``, ``"int"`` or ``"other"``."""
        ...

    def dtype(self, x: Tensor) -> str:
        """``x``'s dtype as messages print it."""
        ...

    def fits(self, x: Tensor, parameter: Tensor) -> bool:
        """Whether a module whose weights are like ``parameter`` can compute on ``x`` (dtypes, autocast)."""
        ...

    def device(self, x: Tensor) -> object | None:
        """``x``'s device where the front end places tensors itself, else ``None``."""
        ...

    def reshape(self, x: Tensor, shape: tuple[int | None, ...]) -> Tensor: ...

    def value_range(self, x: Tensor) -> tuple[int, int] | None:
        """The smallest and largest of ``x``'s integers, when they are known now and ``x`` is not empty."""
        ...

    def values(self, x: Tensor) -> np.ndarray | None:
        """``x``'s values as a NumPy array, when they are known now (``None`` for a symbolic or traced tensor)."""
        ...


# --- single tensors ---------------------------------------------------------------------------------------


def check_tensor(name: str, x: Tensor, ops: TensorOps, what: str = "") -> Tensor:
    if not ops.is_tensor(x):
        raise TypeError(f"`{name}` must be {ops.noun}{what}, received {type(x).__name__}")
    return x


def check_hidden(name: str, x: Tensor, width: int, ops: TensorOps, parameter: Tensor | None = None) -> Tensor:
    """``x`` is a floating ``(B, L, width)`` tensor that a module with weights like ``parameter`` can compute on."""
    check_tensor(name, x, ops)
    if ops.kind(x) != "float":
        raise DTypeError(f"`{name}` must be a floating tensor, received dtype {ops.dtype(x)}")
    check_features(name, tuple(x.shape), width)
    if parameter is not None and not ops.fits(x, parameter):
        raise DTypeError(f"`{name}` must have the module's dtype {ops.dtype(parameter)}, received dtype {ops.dtype(x)}")
    return x


def check_mask_tensor(name: str, mask: Tensor, ops: TensorOps, *, allow_float: bool = True) -> None:
    """A mask must be a tensor, boolean (``True`` = attend) or, where allowed, floating (added to the scores)."""
    check_tensor(name, mask, ops, " or None")
    check_mask_dtype(name, ops.kind(mask), ops.dtype(mask), allow_float=allow_float)


def check_key_mask(name: str, key_mask: Tensor, batch: int | None, length: int | None, ops: TensorOps) -> None:
    """``None``, or a boolean ``(B, L)`` tensor, ``True`` at real tokens."""
    if key_mask is not None:
        check_mask_tensor(name, key_mask, ops, allow_float=False)
        check_padding_mask_shape(name, tuple(key_mask.shape), batch, length)


def check_token_ids(name: str, tokens: Tensor, ops: TensorOps) -> None:
    """Token ids: an integer tensor ``(B, L)``."""
    check_tensor(name, tokens, ops, " of token ids")
    if ops.kind(tokens) != "int":
        raise DTypeError(f"`{name}` must hold integer token ids, received dtype {ops.dtype(tokens)}")
    if len(tokens.shape) != 2:
        raise ValueError(f"`{name}` must be 2-D (B, L), received {name}.shape={tuple(tokens.shape)}")


def check_tokens(name: str, tokens: Tensor, vocab: int, max_len: int, ops: TensorOps, offset: int = 0) -> None:
    """Token ids ``(B, L)`` in ``[0, vocab)`` (checked when their values are known: eager calls), at positions
    ``offset .. offset + L - 1`` within ``max_len``."""
    check_token_ids(name, tokens, ops)
    found = ops.value_range(tokens)
    if found is not None and (found[0] < 0 or found[1] >= vocab):
        raise ValueError(f"`{name}` must hold ids in [0, {vocab}), received ids from {found[0]} to {found[1]}")
    if tokens.shape[1] is not None:
        check_positions(name, offset, tokens.shape[1], max_len)


def check_lengths(lengths: Tensor, max_len: int, ops: TensorOps) -> None:
    """Sequence lengths for a padding mask: a 1-D integer tensor ``(B,)`` with values in ``[0, max_len]``."""
    if ops.kind(lengths) != "int":
        raise DTypeError(f"`lengths` must hold integers, received dtype {ops.dtype(lengths)}")
    if len(lengths.shape) != 1:
        raise ValueError(f"`lengths` must be 1-D (B,), received lengths.shape={tuple(lengths.shape)}")
    found, values = ops.value_range(lengths), ops.values(lengths)
    if found is not None and values is not None and (found[0] < 0 or found[1] > max_len):
        raise ValueError(f"`lengths` must lie in [0, max_len={max_len}], received {values.tolist()}")


def check_pad_id(pad_id: object) -> int:
    if isinstance(pad_id, bool) or not isinstance(pad_id, int):
        raise TypeError(f"`pad_id` must be an int, received {pad_id!r}")
    return pad_id


# --- the attention functions --------------------------------------------------------------------------------


def check_qkv(q: Tensor, k: Tensor, v: Tensor, ops: TensorOps, *, packed: bool = False) -> None:
    """Floating ``q``, ``k``, ``v`` of one dtype (and one device), laid out as :func:`check_attention_shapes` says."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, ops)
        if ops.kind(x) != "float":
            raise DTypeError(f"`{name}` must be a floating tensor, received dtype {ops.dtype(x)}")
    dtypes = [ops.dtype(x) for x in (q, k, v)]
    if len(set(dtypes)) > 1:
        raise DTypeError(f"`q`, `k`, `v` must share one dtype, received {', '.join(dtypes)}")
    devices = [ops.device(x) for x in (q, k, v)]
    if len(set(devices)) > 1:
        raise ValueError(f"`q`, `k`, `v` must be on one device, received {', '.join(map(str, devices))}")
    check_attention_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape), packed=packed)


def check_functional_mask(
    name: str, mask: Tensor, target: tuple[int | None, ...], layout: str, device: object, ops: TensorOps
) -> None:
    """A functional mask: bool or float, broadcastable to ``target`` (named ``layout``), on the inputs' device."""
    check_mask_tensor(name, mask, ops)
    check_broadcastable(name, tuple(mask.shape), target, layout)
    if ops.device(mask) != device:
        raise ValueError(f"`{name}` must be on the inputs' device {device}, received {ops.device(mask)}")


def check_attention_options(
    causal: object,
    scale: object,
    dropout: object,
    return_weights: object,
    implementation: object,
    implementations: Sequence[str],
) -> float | None:
    """The options of an attention function; returns the scale (``None``: the default ``1/sqrt(Dk)``)."""
    check_flag("causal", causal)
    check_dropout("dropout", dropout)
    weights = check_flag("return_weights", return_weights)
    check_implementation(implementation, implementations, return_weights=weights)
    return check_scale(scale)


def check_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor,
    ops: TensorOps,
    *,
    causal: object,
    scale: object,
    dropout: object,
    return_weights: object,
    implementation: object,
    implementations: Sequence[str],
) -> float | None:
    """An attention function's call: :func:`check_qkv`, the mask against ``(B, H, Lq, Lk)`` and the options.
    Returns the scale."""
    check_qkv(q, k, v, ops)
    if mask is not None:
        target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        check_functional_mask("mask", mask, target, "(B, H, Lq, Lk)", ops.device(q), ops)
    return check_attention_options(causal, scale, dropout, return_weights, implementation, implementations)


# --- the attention modules ------------------------------------------------------------------------------------


class AttentionModule(Protocol):
    """What the checks read of a multi-head attention module or layer."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    value_head_dim: int
    qdim: int
    kdim: int
    vdim: int
    implementation: str


@dataclass
class AttentionCall:
    """A module call's checked arguments: ``key`` and ``value`` defaulted, ``mask`` in the 4-D layout
    ``(B|1, H|1, Lq|1, Lk|1)``."""

    key: Tensor
    value: Tensor
    mask: Tensor | None
    key_mask: Tensor | None
    query_mask: Tensor | None
    self_attention: bool
    ops: TensorOps

    def padded_mask(self) -> Tensor | None:
        """The mask with the key and query padding in it."""
        return masks.padded(self.mask, self.key_mask, self.query_mask, self.ops)

    def finish(self, out: Tensor, weights: Tensor | None) -> Tensor | tuple[Tensor, Tensor]:
        """The module's result, ``out`` with the rows of padded queries zeroed (and ``weights``, when asked)."""
        if self.query_mask is not None:
            out = masks.zero_padded_queries(out, self.query_mask, self.ops)
        return out if weights is None else (out, weights)


def module_mask(mask: Tensor, batch: int | None, heads: int, lq: int | None, lk: int | None, ops: TensorOps) -> Tensor:
    """A module's ``mask`` (``(Lq, Lk)``, ``(B, Lq, Lk)`` or 4-D) in the functional layout, checked against the call."""
    if mask is None:
        return None
    check_mask_tensor("mask", mask, ops)
    shape = module_mask_shape(tuple(mask.shape))
    check_broadcastable("mask", shape, (batch, heads, lq, lk), "(B, H, Lq, Lk)")
    return ops.reshape(mask, shape)


def check_attention_call(
    module: AttentionModule,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    mask: Tensor,
    key_mask: Tensor,
    query_mask: Tensor,
    causal: object,
    return_weights: object,
    cache: object,
    cache_type: type[KVCacheBase],
    implementations: Sequence[str],
    ops: TensorOps,
    parameter: Tensor | None = None,
) -> AttentionCall:
    """Everything a multi-head attention call is given, checked before anything is projected."""
    if cache is not None and not isinstance(cache, cache_type):
        raise TypeError(f"`cache` must be a KVCache or None, received {type(cache).__name__}")
    check_flag("causal", causal)
    weights = check_flag("return_weights", return_weights)
    check_implementation(module.implementation, implementations, return_weights=weights)
    self_attention = key is None
    key = query if key is None else key
    value = key if value is None else value
    for name, x, width in (("query", query, module.qdim), ("key", key, module.kdim), ("value", value, module.vdim)):
        check_hidden(name, x, width, ops, parameter)
    check_module_inputs(tuple(query.shape), tuple(key.shape), tuple(value.shape), module.qdim, module.kdim, module.vdim)
    batch, lq, lk = query.shape[0], query.shape[1], key.shape[1]
    if cache is not None:
        new = lq if self_attention else lk
        cache.check_call(self_attention, batch, new, module.num_kv_heads, module.head_dim, module.value_head_dim)
        lk = cache.key_length(self_attention, new)
    mask = module_mask(mask, batch, module.num_heads, lq, lk, ops)
    check_key_mask("key_mask", key_mask, batch, lk, ops)
    check_key_mask("query_mask", query_mask, batch, lq, ops)
    return AttentionCall(key, value, mask, key_mask, query_mask, self_attention, ops)


# --- the Transformer's parts ------------------------------------------------------------------------------------


def check_positional_call(x: Tensor, offset: object, d_model: int, max_len: int, ops: TensorOps) -> None:
    """A positional encoding's input ``(B, L, E)`` and the first position ``offset``."""
    check_hidden("x", x, d_model, ops)  # the table follows x's dtype
    check_non_negative_int("offset", offset)
    length = x.shape[1]
    if length is not None and offset + length > max_len:
        raise ValueError(
            f"positions {offset}..{offset + length - 1} exceed max_len={max_len}; build the model with a larger max_len"
        )


def check_layer_input(
    x: Tensor,
    key_mask: Tensor,
    key_mask_name: str,
    width: int,
    ops: TensorOps,
    parameter: Tensor | None = None,
    *,
    cached: int = 0,
) -> None:
    """A layer's or stack's ``x (B, L, E)`` and its ``(B, cached + L)`` key mask."""
    check_hidden("x", x, width, ops, parameter)
    length = None if x.shape[1] is None else cached + x.shape[1]
    check_key_mask(key_mask_name, key_mask, x.shape[0], length, ops)


def check_memory(memory: Tensor, x: Tensor, memory_key_mask: Tensor, ops: TensorOps, parameter: Tensor | None) -> None:
    """The encoder output ``(B, Ls, E)`` for the decoder's ``x (B, Lt, E)``, and its ``(B, Ls)`` key mask."""
    check_hidden("memory", memory, x.shape[-1], ops, parameter)
    check_same_batch(("x", "memory"), (tuple(x.shape), tuple(memory.shape)))
    check_key_mask("memory_key_mask", memory_key_mask, memory.shape[0], memory.shape[1], ops)


def _check_decoder_inputs(
    x: Tensor,
    memory: Tensor,
    tgt_key_mask: Tensor,
    memory_key_mask: Tensor,
    return_weights: object,
    *,
    width: int,
    cached: int,
    ops: TensorOps,
    parameter: Tensor | None,
) -> None:
    """What a decoder layer and a decoder stack are given besides their caches."""
    check_layer_input(x, tgt_key_mask, "tgt_key_mask", width, ops, parameter, cached=cached)
    check_memory(memory, x, memory_key_mask, ops, parameter)
    check_flag("return_weights", return_weights)


def check_decoder_layer_call(
    layer: Any,
    x: Tensor,
    memory: Tensor,
    *,
    tgt_key_mask: Tensor,
    memory_key_mask: Tensor,
    self_cache: Tensor,
    cross_cache: Tensor,
    return_weights: object,
    cache_type: type,
    ops: TensorOps,
    parameter: Tensor | None = None,
) -> None:
    """A decoder layer's call: ``x (B, Lt, E)``, ``memory (B, Ls, E)``, their key masks and KV caches."""
    for name, cache in (("self_cache", self_cache), ("cross_cache", cross_cache)):
        if cache is not None and not isinstance(cache, cache_type):
            raise TypeError(f"`{name}` must be a KVCache or None, received {type(cache).__name__}")
    cached = 0 if self_cache is None else self_cache.length
    inputs = (tgt_key_mask, memory_key_mask, return_weights)
    _check_decoder_inputs(
        x, memory, *inputs, width=layer.self_attn.d_model, cached=cached, ops=ops, parameter=parameter
    )
    check_layer_caches(layer, self_cache, cross_cache, x.shape[0], x.shape[1], memory.shape[1])


def check_decoder_call(
    layers: Sequence[Any],
    x: Tensor,
    memory: Tensor,
    *,
    width: int,
    tgt_key_mask: Tensor,
    memory_key_mask: Tensor,
    cache: Tensor,
    return_weights: object,
    ops: TensorOps,
    parameter: Tensor | None = None,
) -> None:
    """A decoder stack's call: as :func:`check_decoder_layer_call`, with one :class:`DecoderCache` for the stack."""
    check_decoder_cache(cache, len(layers))
    cached = 0 if cache is None else cache.length
    inputs = (tgt_key_mask, memory_key_mask, return_weights)
    _check_decoder_inputs(x, memory, *inputs, width=width, cached=cached, ops=ops, parameter=parameter)
    if cache is not None:
        check_decoder_cache_call(cache, layers, x.shape[0], x.shape[1], memory.shape[1])


# --- the Transformer ----------------------------------------------------------------------------------------


def check_source(src: Tensor, src_key_mask: Tensor, config: TransformerConfig, ops: TensorOps) -> None:
    check_tokens("src", src, config.src_vocab, config.max_len, ops)
    check_key_mask("src_key_mask", src_key_mask, src.shape[0], src.shape[1], ops)


def check_model_call(
    src: Tensor, tgt: Tensor, src_key_mask: Tensor, tgt_key_mask: Tensor, config: TransformerConfig, ops: TensorOps
) -> None:
    """Teacher forcing: ``src (B, Ls)``, ``tgt (B, Lt)`` and their key masks."""
    check_source(src, src_key_mask, config, ops)
    check_tokens("tgt", tgt, config.tgt_vocab, config.max_len, ops)
    check_same_batch(("src", "tgt"), (tuple(src.shape), tuple(tgt.shape)))
    check_key_mask("tgt_key_mask", tgt_key_mask, tgt.shape[0], tgt.shape[1], ops)


def check_decode_call(
    tgt: Tensor,
    memory: Tensor,
    *,
    memory_key_mask: Tensor,
    tgt_key_mask: Tensor,
    cache: Tensor,
    return_weights: object,
    config: TransformerConfig,
    layers: Sequence[Any],
    ops: TensorOps,
    parameter: Tensor | None = None,
) -> None:
    """A Transformer's ``decode``: ``tgt (B, Lt)`` after the tokens a :class:`DecoderCache` holds, ``memory``."""
    check_decoder_cache(cache, config.num_decoder_layers)
    offset = 0 if cache is None else cache.length
    check_tokens("tgt", tgt, config.tgt_vocab, config.max_len, ops, offset)
    check_hidden("memory", memory, config.d_model, ops, parameter)
    check_same_batch(("tgt", "memory"), (tuple(tgt.shape), tuple(memory.shape)))
    check_key_mask("memory_key_mask", memory_key_mask, memory.shape[0], memory.shape[1], ops)
    length = None if tgt.shape[1] is None else offset + tgt.shape[1]
    check_key_mask("tgt_key_mask", tgt_key_mask, tgt.shape[0], length, ops)
    check_flag("return_weights", return_weights)
    if isinstance(cache, DecoderCache):
        check_decoder_cache_call(cache, layers, tgt.shape[0], tgt.shape[1], memory.shape[1])


def check_generate_call(
    config: TransformerConfig,
    generation: Generation | None,
    *,
    max_len: object,
    src: object,
    bos_id: int | None,
    eos_id: int | None,
    pad_id: int | None,
    beam_size: int,
    length_penalty: float,
    search: SearchOptions | None,
) -> tuple[Generation, int]:
    """A model's ``generate`` arguments, checked before anything is computed: its spec (``generation``, or the one its
    loose keywords make: ``bos_id``, ``eos_id``; ``pad_id``, default the config's, else ``eos_id``; the search, as
    :func:`multihead.decoding.search_options` makes it), checked against the model's target vocabulary, and the
    longest of its length limits ``max_len`` (one, or one per row of ``src``), checked against the config."""
    loose = {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id, "search": search}
    if generation is not None:
        if not isinstance(generation, Generation):
            raise TypeError(f"`generation` must be a Generation or None, received {type(generation).__name__}")
        given = [name for name, value in loose.items() if value is not None]
        defaults = (("beam_size", beam_size, 1), ("length_penalty", length_penalty, 1.0))
        given += [name for name, value, default in defaults if value != default]
        if given:
            raise ValueError(f"give the generation once: `generation` or its keywords, received generation and {given}")
    else:
        if bos_id is None or eos_id is None:
            missing = [name for name in ("bos_id", "eos_id") if loose[name] is None]
            raise TypeError(f"`generate` needs `generation`, or `bos_id` and `eos_id`: received neither {missing}")
        pad = pad_id if pad_id is not None else config.pad_id if config.pad_id is not None else eos_id
        for name, token in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad)):
            if check_non_negative_int(name, token) >= config.tgt_vocab:
                raise ValueError(f"`{name}` must be < tgt_vocab={config.tgt_vocab}, received {name}={token}")
        searched = search_options(search, beam_size=beam_size, length_penalty=length_penalty)
        generation = Generation(Specials(pad=pad, bos=bos_id, eos=eos_id), search=searched)
    generation.check(config.tgt_vocab)
    return generation, _longest_limit(config, max_len, src)


def _longest_limit(config: TransformerConfig, max_len: object, src: object) -> int:
    """``generate``'s length limit ``max_len``, checked against the config (and, one per row, against the rows of
    ``src``, when it has a shape): the longest."""
    if isinstance(max_len, (Sequence, np.ndarray)) and not isinstance(max_len, (str, bytes)):
        limits = np.asarray(max_len)
        if limits.ndim != 1 or len(limits) == 0 or not np.issubdtype(limits.dtype, np.integer):  # bools are not
            raise TypeError(
                "`max_len` must be an int or a non-empty 1-D sequence of ints (one per row), received "
                f"{type(max_len).__name__} of shape {limits.shape} and dtype {limits.dtype}"
            )
        rows = getattr(src, "shape", (None,))
        if rows and rows[0] is not None and len(limits) != int(rows[0]):
            raise ValueError(
                f"`max_len` gives one limit per row: src has {int(rows[0])} rows, received {len(limits)} limits"
            )
        if limits.min() <= 0:
            raise ValueError(f"`max_len` must be positive ints, received {int(limits.min())} in {limits.tolist()}")
        longest = int(limits.max())
    elif isinstance(max_len, bool) or not isinstance(max_len, int):
        raise TypeError(
            "`max_len` must be an int, or a list or 1-D NumPy array of ints (one per row), received "
            f"{max_len!r} of type {type(max_len).__name__}"
        )
    else:
        longest = check_positive_int("max_len", max_len)
    if longest > config.max_len:
        raise ValueError(
            f"`max_len` must be at most the model's max_len={config.max_len} positions, received {longest}"
        )
    return longest
