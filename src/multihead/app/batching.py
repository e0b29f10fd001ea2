"""Batches: token ids padded into arrays, and the order a corpus is trained in.

A built-in task draws a fresh batch of ``batch_size`` sentences at every step. A corpus is trained epoch by
epoch in batches of at most ``batch_tokens`` padded tokens: each epoch sorts the sentences by length (ties broken
at random), cuts the sorted list into batches, and shuffles the batches, so that a batch wastes little on padding
and the order differs between epochs. Everything is drawn from RNGs seeded with ``(seed, step)`` or
``(seed, epoch)``, so a resumed run replays the batches an uninterrupted one would have seen.

Notation: B batch, Ls source length, Lt target length (with BOS or EOS).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from multihead.app.encoded import EncodedCorpus
from multihead.decoding import Specials

Ids = list[int]


@dataclass
class Batch:
    """``src (B, Ls)``, ``tgt_in (B, Lt)`` = BOS + target, ``tgt_out (B, Lt)`` = target + EOS, padded with ``pad``
    (the ids of the target tokenizer's :class:`Specials`; the source pads with the same id)."""

    src: np.ndarray
    tgt_in: np.ndarray
    tgt_out: np.ndarray
    pad: int

    @property
    def target_tokens(self) -> int:
        """The tokens the loss is taken over (not padding)."""
        return int((self.tgt_out != self.pad).sum())

    def as_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.src, self.tgt_in, self.tgt_out


class Batches(Protocol):
    """A run's training batches by index (0-based), the same whichever framework, rank or resume."""

    def batch(self, index: int) -> Batch: ...

    def target_tokens(self, index: int) -> int:
        """Batch ``index``'s target tokens (without building it, where the batches can)."""
        ...


def join_batches(batches: Sequence[Batch]) -> Batch:
    """``batches`` as one, every array padded to the longest."""
    if len(batches) == 1:
        return batches[0]
    pad = batches[0].pad
    arrays = []
    for parts in zip(*(batch.as_arrays() for batch in batches), strict=True):
        width = max(part.shape[1] for part in parts)
        arrays.append(
            np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=pad) for p in parts])
        )
    src, tgt_in, tgt_out = arrays
    return Batch(src, tgt_in, tgt_out, pad)


def round_up(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def make_batch(
    sources: Sequence[Sequence[int] | np.ndarray],
    targets: Sequence[Sequence[int] | np.ndarray],
    specials: Specials,
    pad_to: int = 1,
) -> Batch:
    """Padded arrays of ``sources`` and ``targets`` (lists or arrays of ids) with the target tokenizer's ``specials``;
    lengths rounded up to a multiple of ``pad_to`` (fewer distinct shapes, for frameworks that compile one program
    per shape)."""
    length_src = round_up(max(map(len, sources)), pad_to)
    length_tgt = round_up(max(map(len, targets)) + 1, pad_to)
    src = np.full((len(sources), length_src), specials.pad, dtype=np.int64)
    tgt_in = np.full((len(targets), length_tgt), specials.pad, dtype=np.int64)
    tgt_out = np.full_like(tgt_in, specials.pad)
    for row, (s, t) in enumerate(zip(sources, targets, strict=True)):
        src[row, : len(s)] = s
        tgt_in[row, 0], tgt_in[row, 1 : len(t) + 1] = specials.bos, t
        tgt_out[row, : len(t)], tgt_out[row, len(t)] = t, specials.eos
    return Batch(src, tgt_in, tgt_out, specials.pad)


def pair_lengths(source_lengths: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
    """What each pair takes in a batch: its longer side, the target with its BOS or EOS."""
    return np.maximum(source_lengths, target_lengths + 1)


def length_cuts(lengths: np.ndarray, order: np.ndarray, max_tokens: int, pad_to: int = 1) -> np.ndarray:
    """Cut ``order`` (indices sorted by length) into consecutive batches of at most ``max_tokens`` padded tokens
    (``lengths`` from :func:`pair_lengths`, rounded up to a multiple of ``pad_to``; a pair longer than that is a
    batch of its own): where each batch begins in ``order``, and where the last ends, ``(batches + 1,)``."""
    rounded = -(-np.asarray(lengths)[order] // pad_to) * pad_to  # (n,): nondecreasing
    cuts, start = [0], 0
    while start < len(order):
        most = max(1, max_tokens // int(rounded[start]))  # no batch from here holds more rows
        window = rounded[start : start + most]  # (m,): the lengths of the rows it could hold
        fits = np.arange(1, len(window) + 1) * window <= max_tokens  # True, then False: the lengths only grow
        start += max(1, int(fits.sum()))
        cuts.append(start)
    return np.array(cuts)


class CorpusBatches:
    """The training batches of an encoded corpus, step by step over shuffled, length-bucketed epochs. An epoch is
    held as arrays (the corpus's order, each batch's start and end in it), never as lists of indices."""

    def __init__(self, corpus: EncodedCorpus, specials: Specials, max_tokens: int, seed: int, pad_to: int = 1) -> None:
        self.corpus, self.specials = corpus, specials
        self.lengths = pair_lengths(corpus.sources.lengths, corpus.targets.lengths)  # (n,)
        self.max_tokens, self.seed, self.pad_to = max_tokens, seed, pad_to
        self._epoch, self._first_step = -1, 0
        self._order, self._starts, self._ends = np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)

    def _layout(self, epoch: int) -> None:
        rng = np.random.default_rng([self.seed, epoch])
        self._order = np.lexsort((rng.random(len(self.lengths)), self.lengths))  # by length, ties at random
        cuts = length_cuts(self.lengths, self._order, self.max_tokens, self.pad_to)
        shuffled = rng.permutation(len(cuts) - 1)  # the batches' order in the epoch
        self._starts, self._ends = cuts[:-1][shuffled], cuts[1:][shuffled]

    def epoch_of(self, step: int) -> float:
        """Epochs completed at optimizer step ``step`` (fractional)."""
        self.rows(step)
        return self._epoch + (step - self._first_step) / len(self._starts)

    def rows(self, step: int) -> Ids:
        """The sentence indices of the batch at ``step`` (0-based)."""
        if step < self._first_step:
            self._epoch, self._first_step, self._starts = -1, 0, np.zeros(0, np.int64)
        while step >= self._first_step + len(self._starts):
            self._first_step += len(self._starts)
            self._epoch += 1
            self._layout(self._epoch)
        batch = step - self._first_step
        return self._order[self._starts[batch] : self._ends[batch]].tolist()

    def batch(self, step: int) -> Batch:
        rows = self.rows(step)
        sources, targets = self.corpus.sources, self.corpus.targets
        return make_batch([sources[i] for i in rows], [targets[i] for i in rows], self.specials, self.pad_to)

    def target_tokens(self, step: int) -> int:
        """The target tokens of the batch at ``step`` (with their EOS), without building it."""
        return int(self.corpus.targets.lengths[self.rows(step)].sum()) + len(self.rows(step))


def evaluation_batches(
    sources: Sequence[Ids], targets: Sequence[Ids], specials: Specials, max_tokens: int, pad_to: int = 1
) -> Iterator[tuple[Ids, Batch]]:
    """The whole of a validation set in length-sorted batches, with each batch's row indices."""
    lengths = pair_lengths(np.array([len(s) for s in sources]), np.array([len(t) for t in targets]))
    order = np.argsort(lengths, kind="stable")  # by length, then index
    cuts = length_cuts(lengths, order, max_tokens)
    for start, end in itertools.pairwise(cuts):
        rows = order[start:end].tolist()
        yield rows, make_batch([sources[i] for i in rows], [targets[i] for i in rows], specials, pad_to)
