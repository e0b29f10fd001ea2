"""Batches: token ids padded into arrays, and the order a corpus is trained in.

A built-in task draws a fresh batch of ``batch_size`` sentences at every step. A corpus is trained epoch by
epoch in batches of at most ``batch_tokens`` padded tokens: each epoch sorts the sentences by length (ties broken
at random), cuts the sorted list into batches, and shuffles the batches, so that a batch wastes little on padding
and the order differs between epochs. Everything is drawn from RNGs seeded with ``(seed, step)`` or
``(seed, epoch)``, so a resumed run replays the batches an uninterrupted one would have seen.

Notation: B batch, Ls source length, Lt target length (with BOS or EOS).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from multihead.app.encoded import EncodedCorpus
from multihead.app.tokenizers import BOS, EOS, PAD

Ids = list[int]


@dataclass
class Batch:
    """``src (B, Ls)``, ``tgt_in (B, Lt)`` = BOS + target, ``tgt_out (B, Lt)`` = target + EOS, padded with PAD."""

    src: np.ndarray
    tgt_in: np.ndarray
    tgt_out: np.ndarray

    @property
    def target_tokens(self) -> int:
        """The tokens the loss is taken over (not padding)."""
        return int((self.tgt_out != PAD).sum())

    def as_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.src, self.tgt_in, self.tgt_out


def join_batches(batches: Sequence[Batch]) -> Batch:
    """``batches`` as one, every array padded to the longest."""
    if len(batches) == 1:
        return batches[0]
    arrays = []
    for parts in zip(*(batch.as_arrays() for batch in batches), strict=True):
        width = max(part.shape[1] for part in parts)
        arrays.append(
            np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=PAD) for p in parts])
        )
    return Batch(*arrays)


def round_up(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def make_batch(sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], pad_to: int = 1) -> Batch:
    """Padded arrays of ``sources`` and ``targets`` (lists or arrays of ids); lengths rounded up to a multiple of
    ``pad_to`` (fewer distinct shapes, for frameworks that compile one program per shape)."""
    length_src = round_up(max(map(len, sources)), pad_to)
    length_tgt = round_up(max(map(len, targets)) + 1, pad_to)
    src = np.full((len(sources), length_src), PAD, dtype=np.int64)
    tgt_in = np.full((len(targets), length_tgt), PAD, dtype=np.int64)
    tgt_out = np.full_like(tgt_in, PAD)
    for row, (s, t) in enumerate(zip(sources, targets, strict=True)):
        src[row, : len(s)] = s
        tgt_in[row, 0], tgt_in[row, 1 : len(t) + 1] = BOS, t
        tgt_out[row, : len(t)], tgt_out[row, len(t)] = t, EOS
    return Batch(src, tgt_in, tgt_out)


def pair_lengths(source_lengths: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
    """What each pair takes in a batch: its longer side, the target with its BOS or EOS."""
    return np.maximum(source_lengths, target_lengths + 1)


def length_batches(lengths: np.ndarray, order: Sequence[int], max_tokens: int, pad_to: int = 1) -> list[Ids]:
    """Cut ``order`` (indices, sorted by length) into consecutive batches of at most ``max_tokens`` padded tokens
    (``lengths`` from :func:`pair_lengths`, rounded up to a multiple of ``pad_to``)."""
    rounded = (-(-np.asarray(lengths) // pad_to) * pad_to).tolist()
    batches, current, longest = [], [], 0
    for index in order:
        length = rounded[index]
        if current and (len(current) + 1) * max(longest, length) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


class CorpusBatches:
    """The training batches of an encoded corpus, step by step over shuffled, length-bucketed epochs."""

    def __init__(self, corpus: EncodedCorpus, max_tokens: int, seed: int, pad_to: int = 1) -> None:
        self.corpus = corpus
        self.lengths = pair_lengths(corpus.sources.lengths, corpus.targets.lengths)  # (n,)
        self.max_tokens, self.seed, self.pad_to = max_tokens, seed, pad_to
        self._epoch, self._first_step, self._batches = -1, 0, []

    def _layout(self, epoch: int) -> list[Ids]:
        rng = np.random.default_rng([self.seed, epoch])
        order = np.lexsort((rng.random(len(self.lengths)), self.lengths))  # by length, ties at random
        batches = length_batches(self.lengths, order.tolist(), self.max_tokens, self.pad_to)
        return [batches[i] for i in rng.permutation(len(batches))]

    def epoch_of(self, step: int) -> float:
        """Epochs completed at optimizer step ``step`` (fractional)."""
        self.rows(step)
        return self._epoch + (step - self._first_step) / len(self._batches)

    def rows(self, step: int) -> Ids:
        """The sentence indices of the batch at ``step`` (0-based)."""
        if step < self._first_step:
            self._epoch, self._first_step, self._batches = -1, 0, []
        while step >= self._first_step + len(self._batches):
            self._first_step += len(self._batches)
            self._epoch += 1
            self._batches = self._layout(self._epoch)
        return self._batches[step - self._first_step]

    def batch(self, step: int) -> Batch:
        rows = self.rows(step)
        sources, targets = self.corpus.sources, self.corpus.targets
        return make_batch([sources[i] for i in rows], [targets[i] for i in rows], self.pad_to)

    def target_tokens(self, step: int) -> int:
        """The target tokens of the batch at ``step`` (with their EOS), without building it."""
        return int(self.corpus.targets.lengths[self.rows(step)].sum()) + len(self.rows(step))


def evaluation_batches(
    sources: Sequence[Ids], targets: Sequence[Ids], max_tokens: int, pad_to: int = 1
) -> Iterator[tuple[Ids, Batch]]:
    """The whole of a validation set in length-sorted batches, with each batch's row indices."""
    lengths = pair_lengths(np.array([len(s) for s in sources]), np.array([len(t) for t in targets]))
    order = sorted(range(len(sources)), key=lambda i: (lengths[i], i))
    for rows in length_batches(lengths, order, max_tokens):
        yield rows, make_batch([sources[i] for i in rows], [targets[i] for i in rows], pad_to)
