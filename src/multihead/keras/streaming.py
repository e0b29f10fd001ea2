"""Continuous batching in Keras: the rows of :class:`multihead.engine.Engine` that sentences join and leave at every
decoding step, whatever their search, on any backend, eagerly (the layout of :mod:`multihead.torch.streaming`).

The decoder's self-attention keys and values are kept in shared columns: a step appends every row's new key and
value as one column, and a row that joins starts at the next column, so each row holds its tokens at columns
``start..length``, attends those (the columns before its start masked, ``self_key_mask``) and sits at its own
position (``length - start``: the caches' ``length`` is one per row). Its encoder memory's projections are at
``0..Ls`` of its row, the rest masked. Joining concatenates the new rows (zeros in the columns before their start,
and past their source); :meth:`StreamRows.keep` gathers the rows kept; columns no row uses any more are dropped.
Keras tensors are not written in place, so every step copies the self-attention caches once (their concatenation):
a stream of Keras steps suits a service of a Keras run, while compiled ``generate`` stays the fast way to decode a
batch.

Notation: N rows, H key/value heads, C columns of the self-attention caches, S of the memory's, D head dim, E
d_model, n sentences joining.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from keras import ops

from multihead.decoding import Chooser
from multihead.keras.tensors import Tensor

__all__ = ["StreamRows"]


class _Layer:
    """One decoder layer's self- or cross-attention keys and values ``(N, H, C|S, D)`` over every row (a
    :class:`multihead.cache.StepCache`)."""

    def __init__(self, rows: StreamRows) -> None:
        self.rows = rows
        self.keys: Tensor = None  # none until sources join
        self.values: Tensor = None

    @property
    def length(self) -> Tensor:
        return self.rows.positions

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """The step's keys and values ``(N, H, 1, D)`` as the next column."""
        self.keys = ops.concatenate([self.keys, keys], axis=2)
        self.values = ops.concatenate([self.values, values], axis=2)
        return self.keys, self.values


class _Caches:
    """The decoder's caches as its forward pass reads them (a :class:`multihead.cache.DecoderCaches`)."""

    def __init__(self, rows: StreamRows, layers: int) -> None:
        self.self_attention = [_Layer(rows) for _ in range(layers)]
        self.cross_attention = [_Layer(rows) for _ in range(layers)]
        self.rows = rows

    @property
    def length(self) -> Tensor:
        return self.rows.positions


def _rows_of(tensor: Tensor, rows: np.ndarray) -> Tensor:
    return ops.take(tensor, ops.convert_to_tensor(rows.astype("int32")), axis=0)


def _stacked(held: Tensor | None, new: Tensor, columns: int) -> Tensor:
    """``held (N, H, c, D)`` (``None``: no rows) and ``new (n, H, l, D)`` as ``(N + n, H, columns, D)``, each filled
    with zeros after its own columns."""
    parts = []
    for part in (held, new):
        if part is None:
            continue
        missing = columns - int(part.shape[2])
        if missing:
            zeros = ops.zeros((part.shape[0], part.shape[1], missing, part.shape[3]), dtype=part.dtype)
            part = ops.concatenate([part, zeros], axis=2)
        parts.append(part)
    return ops.concatenate(parts, axis=0)


class StreamRows(Chooser):
    """A Keras :class:`~multihead.keras.Transformer`'s rows for :class:`~multihead.engine.Engine` that sources join
    while others decode (a :class:`multihead.engine.JoiningRows`): see the module's docstring. ``pad`` fills a batch
    of joining sources (their key mask leaves it out)."""

    def __init__(self, model: Any, *, pad: int) -> None:
        model.build()  # the decoding steps call the layers' unchecked paths, which need their weights
        self.steps, self.pad = model.decoder_steps(), pad
        self.choices = self.steps
        self.cache = _Caches(self, len(model.decoder.blocks))
        self.starts = np.zeros(0, dtype=np.int64)  # (N,) the column of each row's first token
        self.sources = np.zeros(0, dtype=np.int64)  # (N,) its source's length
        self.length = 0  # the columns written
        self.positions = ops.zeros((0,), dtype="int32")  # (N,) each row's position

    def join(self, sources: Sequence[Sequence[int]]) -> None:
        lengths = np.array([len(ids) for ids in sources], dtype=np.int64)
        src = np.full((len(sources), lengths.max()), self.pad, dtype=np.int32)  # (n, Ls)
        for row, ids in enumerate(sources):
            src[row, : len(ids)] = ids
        key_mask = ops.convert_to_tensor(np.arange(src.shape[1]) < lengths[:, None])  # (n, Ls)
        memory, _ = self.steps.encode(ops.convert_to_tensor(src), key_mask)  # (n, Ls, E)
        held = self.cache.cross_attention[0].keys
        span = max(int(lengths.max()), 0 if held is None else int(held.shape[2]))
        for cross, own, (keys, values) in zip(
            self.cache.cross_attention, self.cache.self_attention, self.steps.project_memory(memory), strict=True
        ):
            cross.keys, cross.values = (_stacked(held, new, span) for held, new in ((cross.keys, keys),
                                                                                   (cross.values, values)))  # fmt: skip
            empty = ops.zeros((len(sources), keys.shape[1], 0, keys.shape[3]), dtype=keys.dtype)  # (n, H, 0, D)
            own.keys, own.values = (_stacked(held, empty, self.length) for held in (own.keys, own.values))
        self.starts = np.concatenate([self.starts, np.full(len(sources), self.length, dtype=np.int64)])
        self.sources = np.concatenate([self.sources, lengths])

    def step(self, tokens: np.ndarray) -> Tensor:
        self.positions = ops.convert_to_tensor((self.length - self.starts).astype("int32"))
        columns = np.arange(self.length + 1)
        self_key_mask = None if (self.starts == 0).all() else columns >= self.starts[:, None]  # (N, C + 1)
        span = int(self.cache.cross_attention[0].keys.shape[2])
        memory_key_mask = np.arange(span) < self.sources[:, None]  # (N, S)
        logits = self.steps.step(
            ops.convert_to_tensor(tokens[:, None].astype("int32")),
            self.cache,
            ops.convert_to_tensor(memory_key_mask),
            None if self_key_mask is None else ops.convert_to_tensor(self_key_mask),
        )
        self.length += 1
        return logits

    def keep(self, rows: np.ndarray, *, same_sources: bool = False) -> None:
        self.starts, self.sources = self.starts[rows], self.sources[rows]
        first = int(self.starts.min(initial=self.length))  # columns before it are no row's any more
        for layer in self.cache.self_attention:
            layer.keys, layer.values = (_rows_of(x, rows)[:, :, first:] for x in (layer.keys, layer.values))
        if not same_sources:
            span = int(self.sources.max(initial=0))  # columns past every source kept are dropped
            for layer in self.cache.cross_attention:
                layer.keys, layer.values = (_rows_of(x, rows)[:, :, :span] for x in (layer.keys, layer.values))
        self.starts -= first
        self.length -= first
