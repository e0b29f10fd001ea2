"""Continuous batching: sentences join and leave one running batch at every decoding step (greedy or sampling).

``generate`` decodes a batch until its longest sentence ends, so the batch shrinks as its sentences end. A service
whose requests arrive a few at a time would decode small batches that shrink in turn, paying a step's fixed cost
(reading every decoder weight) for a few rows. A :class:`Stream` keeps the sentences being translated in one batch
that changes at every step instead: a sentence leaves as soon as it ends (EOS, or its length limit) and those
waiting join before a step, their sources encoded together. Each step is the model's forward pass over the stream's
caches (:class:`~multihead.cache.StepCache`), through its public decoding steps (``model.decoder_steps()``).

The decoder's keys and values are kept in shared columns: a step writes every row's new key and value at the same
column, and a row that joins starts at the next column, so each row holds its tokens at columns ``start..length``
and attends those (the columns before its start masked), at its own positions (``length - start``: the caches'
``length`` is one per row). Its encoder memory's projections are at ``0..Ls`` of its row, the rest masked. The rows
in use are packed at the front of the buffers: a sentence that leaves is replaced by the last row. When the columns
run out, the columns every row still uses move to the front. A sentence gets the tokens the same search gives it in
a batch of its own, up to float rounding (that of a batch of other sizes and padding, as between ``generate``'s
batches); a sampled one draws from a generator seeded by the search's seed and its own key, as in ``generate``.

Notation: N rows in use, R rows the buffers hold, C columns the self-attention buffers hold, S columns the
cross-attention buffers hold, H key/value heads, D head dim, E d_model, n sentences joining.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import torch

from multihead.cache import StepCache
from multihead.decoding import Generation, process, sample, sentence_generators
from multihead.torch.layouts import Layouts
from multihead.torch.transformer import Transformer
from multihead.validation import check_positive_int

__all__ = ["JOIN_AFTER", "Stream"]

JOIN_AFTER = 3
"""The most steps sentences wait to join while others decode (see :class:`Stream`)."""


Owner = TypeVar("Owner")
"""What a sentence's caller names it by (returned with its translation)."""


def _pow2(size: int) -> int:
    return 1 << max(0, size - 1).bit_length()


class _Buffers:
    """Every decoder layer's keys and values of one kind of attention (self or cross), in one buffer ``(2 * layers,
    R, H, C|S, D)``: layer ``i``'s keys at ``2 * i``, its values at ``2 * i + 1``. What a step reads is set before it:
    the rows in use, the ``columns`` they use, and each row's position (``length``)."""

    def __init__(self, layers: int) -> None:
        self.buffer = torch.zeros(0, 0, 0, 0, 0)  # none yet (see fit)
        self.rows = 0
        self.columns = slice(0, 0)
        self.length = torch.zeros(0, dtype=torch.long)  # (N,)
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

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Layer ``layer``'s rows ``start..start + n`` get ``keys`` and ``values`` ``(n, H, l, D)`` at columns
        ``0..l``."""
        rows, length = slice(start, start + keys.shape[0]), keys.shape[2]
        self.buffer[2 * layer, rows, :, :length] = keys
        self.buffer[2 * layer + 1, rows, :, :length] = values

    def move_rows(self, targets: Sequence[int], sources: Sequence[int], columns: slice) -> None:
        """Rows ``targets`` take what rows ``sources`` (none of them a target) hold at ``columns``: a copy each,
        cheaper than gathering the few rows that move."""
        for target, source in zip(targets, sources, strict=True):
            self.buffer[:, target, :, columns] = self.buffer[:, source, :, columns]

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
        buffers = self.buffers
        return buffers.buffer[self.index, : buffers.rows, :, buffers.columns]

    @property
    def values(self) -> torch.Tensor:
        buffers = self.buffers
        return buffers.buffer[self.index + 1, : buffers.rows, :, buffers.columns]

    @property
    def length(self) -> torch.Tensor:
        return self.buffers.length

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        buffers = self.buffers
        column = buffers.columns.stop - 1
        buffers.buffer[self.index, : buffers.rows, :, column] = keys[:, :, 0]
        buffers.buffer[self.index + 1, : buffers.rows, :, column] = values[:, :, 0]
        return self.keys, self.values


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


@dataclass(frozen=True)
class _Waiting(Generic[Owner]):
    ids: Sequence[int]  # its source
    owner: Owner
    limit: int
    key: int  # names its random generator
    forced: tuple[int, ...]


@dataclass
class _Sentence(Generic[Owner]):
    owner: Owner  # what :meth:`Stream.step` returns with the translation
    limit: int  # the most tokens it may take
    generator: np.random.Generator | None  # its draws, when sampling
    forced: tuple[int, ...]  # the tokens it starts with: its own, or the generation's
    tokens: list[int] = field(default_factory=list)


class Stream(Generic[Owner]):
    """Sentences (token ids) translated by ``model`` as ``generation`` says (a
    :class:`~multihead.decoding.Generation` whose search is greedy or sampling: one row a sentence), at
    most ``rows`` at a time: :meth:`add` queues one, :meth:`step` lets those waiting join and decodes one token of
    each. Those waiting join once they are a quarter of the rows decoding, or have waited :data:`JOIN_AFTER` steps, or
    nothing is decoding: encoding a few sources at a time costs much more per source than a step. The model should
    be in evaluation mode, its weights fixed while the stream decodes: ``layouts`` lay them out (default: a new
    :class:`~multihead.torch.layouts.Layouts`, kept for the stream's life)."""

    def __init__(
        self,
        model: Transformer,
        *,
        rows: int,
        generation: Generation,
        layouts: Layouts | None = None,
    ) -> None:
        if not isinstance(generation, Generation):
            raise TypeError(f"`generation` must be a Generation, received {type(generation).__name__}")
        generation.check(model.config.tgt_vocab)
        if not generation.search.strategy.one_row:
            raise ValueError("a Stream decodes one row a sentence: beam search (beam_size > 1) translates in batches")
        self.model, self.generation = model, generation
        self.search, self.specials = generation.search, generation.specials
        self.max_rows = check_positive_int("rows", rows)
        self.device = model.src_embed.weight.device
        layers = len(model.decoder.layers)
        self.own, self.memory = _Buffers(layers), _Buffers(layers)  # self-attention's, cross-attention's
        self.cache = _Caches(self.own, self.memory)
        self.steps = model.decoder_steps(layouts)
        self.sentences: list[_Sentence[Owner]] = []  # row i's
        self.waiting: deque[_Waiting[Owner]] = deque()
        self.tokens = np.zeros(0, dtype=np.int64)  # (N,) each row's last token
        self.starts = np.zeros(0, dtype=np.int64)  # (N,) the column of its first token
        self.sources = np.zeros(0, dtype=np.int64)  # (N,) its source's length
        self.length = 0  # the columns written: a step writes column `length`
        self.waited = 0  # steps since sentences began waiting to join
        self.forcing_own = 0  # sentences whose forced tokens are their own, not the generation's

    def __len__(self) -> int:
        """Sentences in the stream or waiting to join."""
        return len(self.sentences) + len(self.waiting)

    def add(
        self, ids: Sequence[int], owner: Owner, *, limit: int, key: int = 0, forced: Sequence[int] | None = None
    ) -> None:
        """Queue source ``ids`` (at most the model's ``max_len``, not empty), translated into at most ``limit`` tokens
        (and the search's ``max_length``); ``key`` names it to its random generator when sampling (as its index in a
        ``generate`` call would); ``forced``: the tokens its translation starts with, instead of the generation's
        (its target language's code, where sentences go into different languages)."""
        own = tuple(self.generation.forced if forced is None else forced)
        if forced is not None:
            dataclasses.replace(self.generation, forced=own).check(self.model.config.tgt_vocab)
        self.waiting.append(_Waiting(ids, owner, int(self.search.limit(limit, 1)[0]), key, own))

    def room(self, available: int) -> int:
        """How many of ``available`` sentences not yet added would join at the next step, by the rule sentences
        :meth:`add`-ed wait by: a caller that asks once a step (a step they wait is counted) and adds only that many
        keeps its sentences in its own queue, never waiting here."""
        count = min(self.max_rows - len(self.sentences), len(self.waiting) + available)
        if count <= 0:
            return 0
        if self.sentences and count * 4 < len(self.sentences) and self.waited < JOIN_AFTER:
            if not self.waiting:  # else the step counts it
                self.waited += 1
            return 0
        return max(0, count - len(self.waiting))

    def clear(self) -> list[Owner]:
        """Drop every sentence; their owners."""
        owners = [sentence.owner for sentence in self.sentences] + [entry.owner for entry in self.waiting]
        self.sentences, self.waiting = [], deque()
        self._keep(np.zeros(0, dtype=np.int64))
        return owners

    def drop(self, dropped: Callable[[Owner], bool]) -> list[Owner]:
        """Drop the sentences (decoding or waiting) whose owner ``dropped`` names, e.g. those nobody waits for any
        more; their owners. The others decode on as before."""
        waiting = [entry for entry in self.waiting if dropped(entry.owner)]
        if waiting:
            self.waiting = deque(entry for entry in self.waiting if not dropped(entry.owner))
        rows = [row for row, sentence in enumerate(self.sentences) if dropped(sentence.owner)]
        owners = [self.sentences[row].owner for row in rows] + [entry.owner for entry in waiting]
        with torch.inference_mode():
            self._leave(rows)
        return owners

    def step(self) -> list[tuple[Owner, list[int]]]:
        """Let those waiting join (as many as there is room for), decode one token of every sentence; the sentences
        that ended, as (owner, tokens up to EOS or the limit)."""
        with torch.inference_mode():
            self._join()
            if not self.sentences:
                return []
            chosen = self._decode()
            ended = []
            for row, (sentence, token) in enumerate(zip(self.sentences, chosen.tolist(), strict=True)):
                sentence.tokens.append(token)
                if token == self.specials.eos or len(sentence.tokens) == sentence.limit:
                    ended.append(row)
            self.tokens = chosen
            finished = [(self.sentences[row].owner, self.sentences[row].tokens) for row in ended]
            self._leave(ended)
        return finished

    def _join(self) -> None:
        count = min(self.max_rows - len(self.sentences), len(self.waiting))
        if count <= 0:
            return
        if self.sentences and count * 4 < len(self.sentences) and self.waited < JOIN_AFTER:
            self.waited += 1
            return
        self.waited = 0
        # They stay waiting until they have joined: a failure before then fails them too (see clear).
        joining = [self.waiting[index] for index in range(count)]
        lengths = np.array([len(entry.ids) for entry in joining], dtype=np.int64)
        src = np.full((count, lengths.max()), self.model.config.pad_id or 0, dtype=np.int64)  # (n, Ls)
        for row, entry in enumerate(joining):
            src[row, : len(entry.ids)] = entry.ids
        key_mask = torch.from_numpy(np.arange(src.shape[1]) < lengths[:, None]).to(self.device)  # (n, Ls)
        memory, _ = self.steps.encode(torch.from_numpy(src).to(self.device), key_mask)  # (n, Ls, E)
        start, rows = len(self.sentences), len(self.sentences) + count
        for index, (keys, values) in enumerate(self.steps.project_memory(memory)):  # (n, H, Ls, D) each
            self.memory.fit(rows, keys.shape[2], keys)
            self.memory.write(index, start, keys, values)
        self.own.fit(rows, self.length + 1, keys)  # self-attention's keys and values are shaped as cross-attention's
        for _ in range(count):
            self.waiting.popleft()
        keys_drawn = [entry.key for entry in joining]
        generators = sentence_generators(self.search.seed, keys_drawn) if self.search.strategy.draws else None
        self.sentences += [
            _Sentence(entry.owner, entry.limit, None if generators is None else generators[index], entry.forced)
            for index, entry in enumerate(joining)
        ]
        self.forcing_own += sum(entry.forced != self.generation.forced for entry in joining)
        self.tokens = np.concatenate([self.tokens, np.full(count, self.specials.bos, dtype=np.int64)])
        self.starts = np.concatenate([self.starts, np.full(count, self.length, dtype=np.int64)])
        self.sources = np.concatenate([self.sources, lengths])

    def _columns(self) -> int:
        """The first column any row uses, once column ``length`` exists (the columns in use moved to the front when
        they have run out)."""
        first = int(self.starts.min())
        if self.length < self.own.buffer.shape[3]:
            return first
        self.own.move_columns(len(self.sentences), first, self.length)
        self.own.fit(len(self.sentences), self.length - first + 1, self.own.buffer[0])
        self.starts -= first
        self.length -= first
        return 0

    def _decode(self) -> np.ndarray:
        """One token of every row, chosen as the search says; ``(N,)``."""
        count = len(self.sentences)
        first = self._columns()
        source_span = int(self.sources.max())
        self.own.rows, self.own.columns = count, slice(first, self.length + 1)
        self.memory.rows, self.memory.columns = count, slice(0, source_span)
        made = self.length - self.starts  # (N,) each row's position: the tokens it has made after BOS
        self.own.length = torch.from_numpy(made).to(self.device)
        # A row attends its own columns (the others masked), and its source's.
        self_mask = memory_mask = None
        if first != self.starts.max():
            columns = torch.arange(first, self.length + 1, device=self.device)
            self_mask = columns >= torch.from_numpy(self.starts).to(self.device)[:, None]  # (N, span)
        if source_span != self.sources.min():
            sources = torch.from_numpy(self.sources).to(self.device)
            memory_mask = torch.arange(source_span, device=self.device) < sources[:, None]  # (N, S)
        tokens = torch.from_numpy(self.tokens[:, None]).to(self.device)  # (N, 1)
        logits = self.steps.step(tokens, self.cache, memory_mask, self_mask)
        self.length += 1
        own = [sentence.forced for sentence in self.sentences] if self.forcing_own else None  # else the generation's
        limits = np.array([sentence.limit for sentence in self.sentences], dtype=np.int64)  # (N,)
        logits = process(self.steps, logits, made, self.generation, own, limits)
        if not self.search.strategy.draws:
            return self.steps.argmax(logits)
        generators = [sentence.generator for sentence in self.sentences if sentence.generator is not None]
        return sample(self.steps, logits, generators, self.search)  # every sentence has one when sampling

    def _leave(self, ended: Sequence[int]) -> None:
        """Rows ``ended`` leave; the last rows take their places."""
        if not ended:
            return
        count = len(self.sentences) - len(ended)
        gone = set(ended)
        holes = [row for row in ended if row < count]
        donors = [row for row in range(count, len(self.sentences)) if row not in gone]  # as many as holes
        if holes:
            self.own.move_rows(holes, donors, slice(int(self.starts.min()), self.length))
            self.memory.move_rows(holes, donors, slice(0, int(self.sources.max())))
        order = np.arange(count)
        order[holes] = donors
        self._keep(order)

    def _keep(self, order: np.ndarray) -> None:
        """The host's state of rows ``order``, in that order."""
        self.sentences = [self.sentences[row] for row in order]
        self.forcing_own = sum(sentence.forced != self.generation.forced for sentence in self.sentences)
        self.tokens, self.starts, self.sources = (x[order] for x in (self.tokens, self.starts, self.sources))
        if not len(order):
            self.length = 0
