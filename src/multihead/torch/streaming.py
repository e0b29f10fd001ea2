"""Continuous batching in PyTorch: the rows of :class:`multihead.engine.Engine` that sentences join and leave at every
decoding step, whatever their search (greedy, sampling, beam search).

``generate`` decodes a batch until its longest sentence ends, so the batch shrinks as its sentences end. A service
whose requests arrive a few at a time would decode small batches that shrink in turn, paying a step's fixed cost
(reading every decoder weight) for a few rows. A :class:`Stream` keeps the sentences being translated in one batch
that changes at every step instead: a sentence leaves as soon as it ends (EOS, or its length limit) and those
waiting join before a step, their sources encoded together (the engine's rule). Each step is the model's forward
pass over the stream's caches (:class:`~multihead.cache.StepCache`), through its public decoding steps
(``model.decoder_steps()``).

The decoder's keys and values are kept in shared columns: a step writes every row's new key and value at the same
column, and a row that joins starts at the next column, so each row holds its tokens at columns ``start..length``
and attends those (the columns before its start masked), at its own positions (``length - start``: the caches'
``length`` is one per row). The encoder memory's projections are kept once per source, in slots (columns ``0..Ls``
of its slot, the rest masked), which every row of the sentence reads (a beam-search sentence's beams:
:class:`~multihead.cache.MemoryRows`). The rows and slots in use are packed at the front of the buffers; the engine
says which rows stay where (:meth:`StreamRows.keep`: a row that leaves replaced by the last, a beam by its parent's
state), and only the rows that move are copied; a slot no row reads any more is taken by the last. When the columns
run out, the columns every row still uses move to the front. A sentence gets the tokens the same search
gives it in a batch of its own, up to float rounding (that of a batch of other sizes and padding, as between
``generate``'s batches); a sampled one draws from a generator seeded by the search's seed and its own key, as in
``generate``.

Notation: N rows in use, R rows the buffers hold, C columns the self-attention buffers hold, M memory slots in use,
S columns the cross-attention buffers hold, H key/value heads, D head dim, E d_model, n sentences joining.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from multihead.cache import MemoryRows, StepCache, memory_rows
from multihead.decoding import Chooser, Generation
from multihead.engine import JOIN_AFTER, Engine, Owner
from multihead.torch.layouts import Layouts
from multihead.torch.transformer import StepLogits, Transformer
from multihead.validation import check_positive_int

__all__ = ["JOIN_AFTER", "Stream", "StreamRows"]


def _pow2(size: int) -> int:
    return 1 << max(0, size - 1).bit_length()


class _Buffers:
    """Every decoder layer's keys and values of one kind of attention (self or cross), in one buffer ``(2 * layers,
    R|M, H, C|S, D)``: layer ``i``'s keys at ``2 * i``, its values at ``2 * i + 1``. What a step reads is set before
    it: the rows (or memory slots) in use and the columns they use (:meth:`read`), each row's position (``length``),
    and for the memory which slot each row reads (``memory_rows``)."""

    def __init__(self, layers: int) -> None:
        self.buffer = torch.zeros(0, 0, 0, 0, 0)  # none yet (see fit)
        self.read(0, slice(0, 0))
        self.length = torch.zeros(0, dtype=torch.long)  # (N,)
        self.memory_rows: MemoryRows | None = None
        self.layers = [_Layer(self, 2 * index) for index in range(layers)]

    def fit(self, rows: int, columns: int, like: torch.Tensor) -> None:
        """A buffer of at least ``rows`` rows and ``columns`` columns (powers of two), for keys and values shaped
        like ``like`` ``(n, H, l, D)``, keeping what it held; zeros elsewhere (a masked column is never NaN)."""
        held = self.buffer.shape[1:4]
        if rows <= held[0] and columns <= held[2]:
            return
        size = (max(held[0], _pow2(rows)), max(held[2], _pow2(columns)))
        grown = like.new_zeros((2 * len(self.layers), size[0], like.shape[1], size[1], like.shape[3]))
        if self.buffer.numel():
            grown[:, : held[0], :, : held[2]] = self.buffer
        self.buffer = grown

    def read(self, rows: int, columns: slice) -> None:
        """The next step reads the first ``rows`` rows at ``columns``: each layer's keys and values there, as views
        made at once (``spans``: ``2 * layers`` of ``(N|M, H, span, D)``)."""
        self.spans = self.buffer[:, :rows, :, columns].unbind(0)

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Layer ``layer``'s rows ``start..start + n`` get ``keys`` and ``values`` ``(n, H, l, D)`` at columns
        ``0..l``."""
        rows, length = slice(start, start + keys.shape[0]), keys.shape[2]
        self.buffer[2 * layer, rows, :, :length] = keys
        self.buffer[2 * layer + 1, rows, :, :length] = values

    def move_rows(self, targets: np.ndarray, sources: np.ndarray, columns: slice) -> None:
        """Rows ``targets`` take what rows ``sources`` held at ``columns`` (all read before any is written); the other
        rows stay as they are."""
        if len(targets) == 1:  # a copy, cheaper than gathering
            self.buffer[:, int(targets[0]), :, columns] = self.buffer[:, int(sources[0]), :, columns]
            return
        to, of = (torch.from_numpy(rows).to(self.buffer.device) for rows in (targets, sources))
        self.buffer[:, to, :, columns] = self.buffer[:, of, :, columns]

    def move_columns(self, rows: int, start: int, stop: int) -> None:
        """Columns ``start..stop`` of the first ``rows`` rows to the front."""
        self.buffer[:, :rows, :, : stop - start] = self.buffer[:, :rows, :, start:stop].clone()


class _Layer(StepCache):
    """One layer's part of :class:`_Buffers`, as the layer's attention reads its cache: ``keys`` and ``values`` ``(N,
    H, span, D)``; in self-attention ``append`` writes the step's at the last column read."""

    def __init__(self, buffers: _Buffers, index: int) -> None:
        self.buffers, self.index = buffers, index

    @property
    def keys(self) -> torch.Tensor:
        return self.buffers.spans[self.index]

    @property
    def values(self) -> torch.Tensor:
        return self.buffers.spans[self.index + 1]

    @property
    def length(self) -> torch.Tensor:
        return self.buffers.length

    @property
    def memory_rows(self) -> MemoryRows | None:  # type: ignore[override]
        return self.buffers.memory_rows

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        held = self.keys, self.values
        for span, new in zip(held, (keys, values), strict=True):
            span[:, :, -1:].copy_(new)  # the step's column, the last read
        return held


@dataclass
class _Caches:
    """The decoder's caches as its forward pass reads them (a :class:`multihead.cache.DecoderCaches`), each row at its
    own position."""

    own: _Buffers
    memory: _Buffers

    @property
    def self_attention(self) -> list[_Layer]:
        return self.own.layers

    @property
    def cross_attention(self) -> list[_Layer]:
        return self.memory.layers

    @property
    def length(self) -> torch.Tensor:
        return self.own.length


class StreamRows(Chooser):
    """A PyTorch :class:`~multihead.torch.Transformer`'s rows for :class:`~multihead.engine.Engine` that sources join
    while others decode (a :class:`multihead.engine.JoiningRows`): see the module's docstring. ``pad`` fills a batch of
    joining sources (their key mask leaves it out)."""

    def __init__(self, model: Transformer, layouts: Layouts | None, *, pad: int) -> None:
        self.model, self.pad = model, pad
        self.device = model.src_embed.weight.device
        layers = len(model.decoder.layers)
        self.own, self.memory = _Buffers(layers), _Buffers(layers)  # self-attention's, cross-attention's
        self.cache = _Caches(self.own, self.memory)
        self.steps = model.decoder_steps(layouts)
        self.choices = self.steps
        self.starts = np.zeros(0, dtype=np.int64)  # (N,) the column of each row's first token
        self.slots = np.zeros(0, dtype=np.int64)  # (N,) the memory slot it reads
        self.read = True  # whether the memory's MemoryRows say what slots holds
        self.sources = np.zeros(0, dtype=np.int64)  # (M,) each slot's source length
        self.length = 0  # the columns written: a step writes column `length`

    def join(self, sources: Sequence[Sequence[int]]) -> None:
        count, held, slots = len(sources), len(self.starts), len(self.sources)
        lengths = np.array([len(ids) for ids in sources], dtype=np.int64)
        src = np.full((count, lengths.max()), self.pad, dtype=np.int64)  # (n, Ls)
        for row, ids in enumerate(sources):
            src[row, : len(ids)] = ids
        key_mask = torch.from_numpy(np.arange(src.shape[1]) < lengths[:, None]).to(self.device)  # (n, Ls)
        with torch.inference_mode():
            memory, _ = self.steps.encode(torch.from_numpy(src).to(self.device), key_mask)  # (n, Ls, E)
            for index, (keys, values) in enumerate(self.steps.project_memory(memory)):  # (n, H, Ls, D) each
                self.memory.fit(slots + count, keys.shape[2], keys)
                self.memory.write(index, slots, keys, values)
            self.own.fit(held + count, self.length + 1, keys)  # self-attention's are shaped as cross-attention's
        self.starts = np.concatenate([self.starts, np.full(count, self.length, dtype=np.int64)])
        self._read(np.concatenate([self.slots, np.arange(slots, slots + count)]))
        self.sources = np.concatenate([self.sources, lengths])

    def _read(self, slots: np.ndarray) -> None:
        """The rows read memory slots ``slots (N,)``."""
        self.slots = slots
        self.read = False  # the memory's MemoryRows made again by the next step

    def _columns(self) -> int:
        """The first column any row uses, once column ``length`` exists (the columns in use moved to the front when
        they have run out)."""
        first = int(self.starts.min())
        if self.length < self.own.buffer.shape[3]:
            return first
        self.own.move_columns(len(self.starts), first, self.length)
        self.own.fit(len(self.starts), self.length - first + 1, self.own.buffer[0])
        self.starts -= first
        self.length -= first
        return 0

    def step(self, tokens: np.ndarray) -> StepLogits:
        count, slots = len(self.starts), len(self.sources)
        with torch.inference_mode():
            first = self._columns()
            source_span = int(self.sources.max())
            self.own.read(count, slice(first, self.length + 1))
            self.memory.read(slots, slice(0, source_span))
            if not self.read:
                self.memory.memory_rows, self.read = memory_rows(self.slots, slots, self.steps.tensor), True
            made = self.length - self.starts  # (N,) each row's position: the tokens it has made after BOS
            self.own.length = torch.from_numpy(made).to(self.device)
            # A row attends its own columns (the others masked), and its source's.
            self_key_mask = memory_mask = None
            if first != self.starts.max():
                columns = torch.arange(first, self.length + 1, device=self.device)
                self_key_mask = columns >= torch.from_numpy(self.starts).to(self.device)[:, None]  # (N, span)
            if source_span != self.sources.min():
                sources = torch.from_numpy(self.sources).to(self.device)
                memory_mask = torch.arange(source_span, device=self.device) < sources[:, None]  # (M, S)
            logits = self.steps.step(torch.from_numpy(tokens[:, None]).to(self.device), self.cache, memory_mask,
                                     self_key_mask)  # fmt: skip
        self.length += 1
        return logits

    def keep(self, rows: np.ndarray, *, same_sources: bool = False) -> None:
        count = len(rows)
        moved = np.flatnonzero(rows != np.arange(count))  # the rows that take another's state
        slots = self.slots[rows]
        read = np.zeros(len(self.sources), dtype=bool)  # (M,) the slots a kept row reads
        read[slots] = True
        kept = int(read.sum())
        movers = np.flatnonzero(read[kept:]) + kept  # the slots read past the first `kept`, which take the free ones
        with torch.inference_mode():
            if count > len(self.starts):  # beams opening: more rows
                self.own.fit(count, self.own.buffer.shape[3], self.own.buffer[0])
            if len(moved):
                self.own.move_rows(moved, rows[moved], slice(int(self.starts.min()), self.length))
            if len(movers):
                free = np.flatnonzero(~read[:kept])
                self.memory.move_rows(free, movers, slice(0, int(self.sources.max())))
                renamed = np.arange(len(self.sources))
                renamed[movers] = free
                slots = renamed[slots]
                self.sources[free] = self.sources[movers]
        if len(moved) or len(movers) or count != len(self.starts):
            self._read(slots)
        self.starts, self.sources = self.starts[rows], self.sources[:kept]
        if not count:
            self.length = 0


class Stream(Engine[Owner]):
    """Sentences (token ids) translated by ``model`` as ``generation`` says (each with its own search if it asks), at
    most ``rows`` rows at a time (a beam-search sentence takes its beam size): the :class:`~multihead.engine.Engine`
    over :class:`StreamRows`. :meth:`add` queues one, :meth:`step` lets those waiting join and decodes one token of
    each. The model should be in evaluation mode, its weights fixed while the stream decodes: ``layouts`` lay them out
    (default: a new :class:`~multihead.torch.layouts.Layouts`, kept for the stream's life)."""

    def __init__(
        self, model: Transformer, *, rows: int, generation: Generation, layouts: Layouts | None = None
    ) -> None:
        if not isinstance(generation, Generation):
            raise TypeError(f"`generation` must be a Generation, received {type(generation).__name__}")
        rows = check_positive_int("rows", rows)
        rows_of = StreamRows(model, layouts, pad=generation.specials.pad)
        super().__init__(rows_of, generation, capacity=rows, vocab=model.config.tgt_vocab)
