"""What attention keeps between decoding steps: the :class:`StepCache` protocol, and the KV cache's bookkeeping,
written once for both front ends (each supplies four tensor operations).

A decoding step is the same forward pass as a whole sequence, with a cache: self-attention appends the new tokens'
keys and values to its :class:`StepCache` and attends everything it holds; cross-attention projects the encoder
memory into an empty one once and reuses it afterwards (:func:`attended`, the one rule both front ends follow).
Three kinds of cache implement the protocol: :class:`KVCacheBase` (the front ends' ``KVCache``), the fixed buffers
of Keras' compiled generation (:mod:`multihead.keras.generation`) and the shared columns of continuous batching
(:mod:`multihead.torch.streaming`), whose rows each sit at a position of their own.

Beam search extends several rows of one source. A cross-attention cache whose front end says so
(:attr:`KVCacheBase.shares_memory`) holds the projected memory once per source, in slots, and its
:attr:`StepCache.memory_rows` (a :class:`MemoryRows`) says which slot each row reads: attention then takes each
slot's rows as the queries of one sequence, so a source's memory is neither copied per beam nor read once per beam.

:class:`KVCacheBase` keeps keys and values as ``(B, Hkv, L, D)``. Without a capacity it grows by concatenation; with
one, buffers of that length are allocated on the first append and written in place of the next free positions. A
module's public call with one goes: :meth:`KVCacheBase.check_call` (before anything is computed), then
:meth:`KVCacheBase.key_length` (the ``Lk`` its masks must cover), then :func:`attended`.

Notation: B batch, Hkv key/value heads, L cached length, n new tokens, D head dim; N query rows, S memory slots,
w the most rows reading one slot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

import numpy as np

from multihead.validation import check_optional_positive_int

Tensor = Any


@dataclass(frozen=True)
class MemoryRows:
    """Which memory slot each query row of a cross-attention step reads, where a cache holds the memory once per
    source: attention lays the rows out as a grid ``(S, w)`` of queries, slot by slot, and reads each row's output
    back from its place. ``grid`` ``(S * w,)``: the row at each place of the grid (a place no row takes holds row 0,
    whose output there is never read); ``place`` ``(N,)``: each row's place. Both ``None`` when the rows already are
    the grid, in order (every slot read by ``w`` rows next to each other). Tensors of the front end, int64."""

    slots: int
    width: int
    grid: Tensor | None
    place: Tensor | None


def memory_rows(sources: np.ndarray, slots: int, tensor: Callable[[np.ndarray], Tensor]) -> MemoryRows | None:
    """The :class:`MemoryRows` of rows reading memory slots ``sources (N,)`` of ``slots`` (each read by one row at
    least); ``tensor`` makes the front end's tensor of an int64 array. ``None`` where row ``i`` reads slot ``i``."""
    counts = np.bincount(sources, minlength=slots)  # (S,)
    width = int(counts.max()) if slots else 0
    if len(sources) == slots * width and np.array_equal(sources, np.repeat(np.arange(slots), width)):
        return None if width == 1 else MemoryRows(slots, width, None, None)
    order = np.argsort(sources, kind="stable")  # (N,) the rows, slot by slot
    rank = np.arange(len(sources)) - np.repeat(np.cumsum(counts) - counts, counts)  # (N,) in its slot, in order
    place = np.empty(len(sources), dtype=np.int64)
    place[order] = sources[order] * width + rank
    grid = np.zeros(slots * width, dtype=np.int64)
    grid[place] = np.arange(len(sources))
    return MemoryRows(slots, width, tensor(grid), tensor(place))


def kept_sources(sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The memory slots rows reading ``sources (N,)`` still need, in the order rows first read them, and each row's
    slot once only those are kept, in that order."""
    seen, first = np.unique(sources, return_index=True)
    live = seen[np.argsort(first)]  # (S',) by first reading row
    renamed = np.empty(int(seen[-1]) + 1 if len(seen) else 0, dtype=np.int64)
    renamed[live] = np.arange(len(live))
    return live, renamed[sources]


class StepCache(Protocol):
    """One attention layer's projected keys and values, kept between decoding steps.

    ``keys`` ``(B, Hkv, L, Dk)`` and ``values`` ``(B, Hkv, L, Dv)`` are what the next call attends (``None`` while
    empty); ``length`` is how many tokens each row holds, the position of its next one: an int, or a tensor, one per
    row ``(B,)`` where rows sit at positions of their own (or a scalar tensor inside a traced program); ``append``
    adds ``(B, Hkv, n, D)`` new keys and values and returns everything the call attends. A cache whose buffers hold
    more positions than a row has written returns them all: the caller's key mask leaves out the others.
    ``memory_rows``: a cross-attention cache holding one memory per source says which one each row reads
    (:class:`MemoryRows`); ``None``: row ``i`` reads memory row ``i``.
    """

    memory_rows: MemoryRows | None = None

    @property
    def keys(self) -> Tensor | None: ...

    @property
    def values(self) -> Tensor | None: ...

    @property
    def length(self) -> int | Tensor: ...

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]: ...


class DecoderCaches(Protocol):
    """What a decoder's forward pass reads as its cache: per layer a self-attention :class:`StepCache` and one holding
    the projected encoder memory; ``length``: the target tokens each row holds (the positions of the new ones), as
    :attr:`StepCache.length`. Implemented by :class:`DecoderCache` and by the step buffers of Keras' compiled
    generation and of continuous batching."""

    @property
    def self_attention(self) -> Sequence[StepCache]: ...

    @property
    def cross_attention(self) -> Sequence[StepCache]: ...

    @property
    def length(self) -> int | Tensor: ...


def attended(
    cache: StepCache | None, self_attention: bool, project: Callable[[], tuple[Tensor, Tensor]]
) -> tuple[Tensor, Tensor]:
    """The keys and values an attention call attends: what ``project()`` gives, appended to ``cache`` when there is
    one; in cross-attention, the memory ``cache`` already holds, projected by an earlier call."""
    if cache is None:
        return project()
    if not self_attention:
        keys = cache.keys  # once: a KV cache slices its buffers at each read
        if keys is not None:  # the memory, projected by an earlier call (:func:`reuses_memory`)
            return keys, cache.values
    return cache.append(*project())


def reuses_memory(cache: StepCache, self_attention: bool) -> bool:
    """Whether a call reuses the projected memory ``cache`` holds (cross-attention after its first call)."""
    return not self_attention and cache.keys is not None


class KVCacheBase(StepCache):
    """Projected keys and values kept between decoding steps (see the front ends' ``KVCache``)."""

    shares_memory: ClassVar[bool] = False
    """Whether the front end's attention reads :attr:`memory_rows`: a decoding session may then keep one memory per
    source (:meth:`DecoderCache.keep_memory`)."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = check_optional_positive_int("capacity", capacity)
        self._keys: Tensor | None = None
        self._values: Tensor | None = None
        self._spare: tuple[Tensor, Tensor] | None = None  # the buffers a reorder left, for the next one to write
        self._length = 0

    @property
    def length(self) -> int:
        """Tokens cached."""
        return self._length

    # The four tensor operations a front end supplies.
    def _concat(self, cached: Tensor, new: Tensor) -> Tensor:
        raise NotImplementedError

    def _empty(self, like: Tensor, length: int) -> Tensor:
        """A buffer shaped like ``like`` but ``length`` long on axis 2."""
        raise NotImplementedError

    def _write(self, buffer: Tensor, new: Tensor, start: int) -> Tensor:
        """``buffer`` with ``new`` written at positions ``start:start + n`` of axis 2."""
        raise NotImplementedError

    def _take(self, x: Tensor, rows: Any) -> Tensor:
        """Rows ``rows`` of axis 0."""
        raise NotImplementedError

    def _take_filled(self, buffer: Tensor, rows: Any, spare: Tensor | None) -> Tensor:
        """A buffer of ``capacity`` positions whose first ``length`` hold rows ``rows`` of ``buffer``'s; ``spare`` is a
        buffer as long that no one reads any more (``None`` at first): a front end may write into it."""
        filled = self._take(buffer[:, :, : self._length], rows)  # (n, Hkv, L, D)
        return self._write(self._empty(filled, self._capacity()), filled, 0)

    _fills_spare = False
    """Whether the front end's :meth:`_take_filled` writes into the spare buffer it is given."""

    def _capacity(self) -> int:
        """The capacity of a preallocated cache."""
        if self.capacity is None:
            raise TypeError("a cache that grows by concatenation has no buffers to fill")
        return self.capacity

    _moves_rows = False
    """Whether the front end moves rows within its buffers in place (:meth:`_move_rows`)."""

    def _move_rows(self, targets: Any, sources: Any) -> None:
        """Rows ``targets`` of the buffers' filled positions take what rows ``sources`` held (all read first)."""
        raise NotImplementedError

    def _keep(self, x: Tensor) -> Tensor:
        """``x`` laid out to be read at every later step (the first keys and values of a growing cache)."""
        return x

    @property
    def keys(self) -> Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self._length]  # (B, Hkv, L, Dk)

    @property
    def values(self) -> Tensor | None:
        return None if self._values is None else self._values[:, :, : self._length]  # (B, Hkv, L, Dv)

    def check_append(self, batch: int, new: int, kv_heads: int, key_dim: int, value_dim: int) -> None:
        """Refuse, before anything is projected, keys and values that :meth:`append` could not take."""
        if self.capacity is not None and self._length + new > self.capacity:
            raise ValueError(
                f"`cache`: KVCache capacity {self.capacity} exceeded: {self._length} cached + {new} new tokens"
            )
        keys, values = self._keys, self._values
        if keys is None or values is None:
            return
        cached = (int(keys.shape[0]), int(keys.shape[1]), int(keys.shape[3]))
        if cached != (batch, kv_heads, key_dim) or int(values.shape[3]) != value_dim:
            raise ValueError(
                f"`cache` holds keys (B, Hkv, L, Dk)={tuple(keys.shape)} and values of Dv="
                f"{values.shape[3]}; this call brings B={batch}, Hkv={kv_heads}, Dk={key_dim}, Dv={value_dim} "
                "(another batch, or another module's cache?)"
            )

    def key_length(self, self_attention: bool, new: int | None) -> int | None:
        """The keys a call attends, ``Lk``, once its ``new`` keys are in (``None``: not known yet)."""
        if reuses_memory(self, self_attention):
            return self._length
        if self_attention:
            return None if new is None else self._length + new
        return new

    def check_call(
        self, self_attention: bool, batch: int, new: int | None, kv_heads: int, key_dim: int, value_dim: int
    ) -> None:
        """Refuse, before anything is projected, a call this cache cannot serve."""
        if reuses_memory(self, self_attention):
            self.check_reuse(batch)
        elif new is not None:
            self.check_append(batch, new, kv_heads, key_dim, value_dim)

    def check_reuse(self, batch: int) -> None:
        """Refuse a cross-attention call whose batch differs from the memory cached."""
        if self._keys is not None and int(self._keys.shape[0]) != batch:
            raise ValueError(
                f"`cache` holds the memory of a batch of {self._keys.shape[0]}, received a query batch of {batch}"
            )

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Add ``(B, Hkv, n, D)`` keys and values; return everything cached, ``(B, Hkv, L + n, D)``."""
        batch, kv_heads, new, key_dim = map(int, keys.shape)
        cached = None if self._keys is None else tuple(map(int, self._keys.shape))
        if cached is not None and (cached[0], cached[1], cached[3]) != (batch, kv_heads, key_dim):
            raise ValueError(
                f"cached keys have shape (B, Hkv, L, Dk)={cached}, received new keys of shape {tuple(keys.shape)}"
            )
        self.check_append(batch, new, kv_heads, key_dim, int(values.shape[3]))
        return self._append(keys, values)

    def _append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`append` for keys and values already checked by :meth:`check_append`."""
        new = int(keys.shape[2])
        if self._keys is None:
            if self.capacity is None:
                self._keys, self._values = self._keep(keys), self._keep(values)
                self._length = new
                return self.keys, self.values
            self._keys, self._values = self._empty(keys, self.capacity), self._empty(values, self.capacity)
        if self.capacity is None:
            self._keys, self._values = self._concat(self._keys, keys), self._concat(self._values, values)
        else:
            self._keys = self._write(self._keys, keys, self._length)
            self._values = self._write(self._values, values, self._length)
        self._length += new
        return self.keys, self.values

    def reorder(self, rows: Any) -> None:
        """Keep batch rows ``rows`` (in that order), as beam search needs. Of a buffer, only the positions filled
        so far are copied: where the front end moves rows in place and the batch does not grow (a NumPy ``rows``),
        only the rows that change, within the buffers, which then keep their first ``len(rows)`` rows (tensors read
        from the cache before a reorder may then change); otherwise into the buffers the previous reorder left where
        the front end can. In place costs a copy of the moved rows more than filling spare buffers, and saves
        holding a spare copy of the cache."""
        if self._keys is None:
            return
        if self.capacity is None:
            self._keys, self._values = self._take(self._keys, rows), self._take(self._values, rows)
            return
        if self._moves_rows and isinstance(rows, np.ndarray) and len(rows) <= int(self._keys.shape[0]):
            moved = np.flatnonzero(rows != np.arange(len(rows)))  # the rows that do not keep their own state
            if len(moved):
                self._move_rows(moved, rows[moved])
            self._keys, self._values = self._keys[: len(rows)], cast(Tensor, self._values)[: len(rows)]
            self._spare = None
            return
        spare_keys, spare_values = self._spare or (None, None)
        # The buffers left become the next reorder's spare where the front end writes into spares and they hold as
        # many rows as it will write; otherwise (a batch growing, as beam search's first step does) they go now.
        kept = self._fills_spare and int(self._keys.shape[0]) >= len(rows)
        self._spare = (self._keys, self._values) if kept else None
        self._keys = self._take_filled(self._keys, rows, spare_keys)
        self._values = self._take_filled(self._values, rows, spare_values)

    def reset(self) -> None:
        self._keys = self._values = self._spare = None
        self._length = 0
        self.memory_rows = None


class DecoderCache:
    """Per decoder layer: a KV cache of self-attention keys/values and one of projected encoder memory (a
    :class:`DecoderCaches`).

    Made by a Transformer's ``new_cache()``; ``cache_type`` is the front end's ``KVCache``.
    """

    def __init__(self, num_layers: int, cache_type: type[KVCacheBase], capacity: int | None = None) -> None:
        self.self_attention: list[KVCacheBase] = [cache_type(capacity) for _ in range(num_layers)]
        self.cross_attention: list[KVCacheBase] = [cache_type() for _ in range(num_layers)]

    @property
    def length(self) -> int:
        """Target tokens decoded so far."""
        return self.self_attention[0].length if self.self_attention else 0

    def reorder(self, rows: Any, *, same_sources: bool = False) -> None:
        """Keep batch rows ``rows`` (in that order); ``same_sources``: row ``i`` keeps its source, so the projected
        memory stays as it is."""
        for cache in (*self.self_attention, *(() if same_sources else self.cross_attention)):
            cache.reorder(rows)

    @property
    def shares_memory(self) -> bool:
        """Whether the memory may be held once per source (:attr:`KVCacheBase.shares_memory`)."""
        return bool(self.cross_attention) and self.cross_attention[0].shares_memory

    def keep_memory(self, slots: Any, rows: MemoryRows | None) -> None:
        """Keep memory slots ``slots`` (in that order; ``None``: all, as they are), which the rows read as ``rows``
        says."""
        for cache in self.cross_attention:
            if slots is not None:
                cache.reorder(slots)
            cache.memory_rows = rows


def check_decoder_cache(cache: object, num_layers: int) -> None:
    """``None``, or a model's :class:`DecoderCache` with one KV cache per decoder layer."""
    if cache is None:
        return
    if not isinstance(cache, DecoderCache):
        raise TypeError(f"`cache` must be a DecoderCache or None, received {type(cache).__name__}")
    if len(cache.self_attention) != num_layers:
        raise ValueError(
            f"`cache` must hold one KV cache per decoder layer ({num_layers}), received {len(cache.self_attention)}"
        )


def check_layer_caches(
    layer: Any, self_cache: KVCacheBase | None, cross_cache: KVCacheBase | None, batch: int, new: int, memory: int
) -> None:
    """A decoder layer's caches can serve a call of ``new`` target tokens over ``memory`` memory positions."""
    for module, cache, length, is_self in (
        (layer.self_attn, self_cache, new, True),
        (layer.cross_attn, cross_cache, memory, False),
    ):
        if cache is not None:
            cache.check_call(is_self, batch, length, module.num_kv_heads, module.head_dim, module.value_head_dim)


def check_decoder_cache_call(cache: DecoderCache, layers: Any, batch: int, new: int, memory: int) -> None:
    """Every layer's caches in ``cache`` can serve the call (see :func:`check_layer_caches`)."""
    for layer, self_cache, cross_cache in zip(layers, cache.self_attention, cache.cross_attention, strict=True):
        check_layer_caches(layer, self_cache, cross_cache, batch, new, memory)
