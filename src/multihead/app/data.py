"""What a run trains on: a built-in task (generated locally, no download) or a parallel corpus.

A built-in task has a fixed held-out split that never overlaps training: an example belongs to it when a hash of
its key (the date, the number, the string) falls in a fixed tenth. A corpus is validated on ``--valid`` when given,
else on the sentences whose source hashes into that same tenth (at most ``HELDOUT_SIZE`` of them).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from multihead.app.console import UserError, progress_bar, warn
from multihead.app.corpus import Pair, iter_parallel, read_parallel
from multihead.app.generated import GENERATORS
from multihead.app.languages import file_language

HELDOUT_SIZE = 1000
SIDE_SAMPLE = 200
"""Validation sentences (and ten times as many training ones) whose words tell which way round a corpus reads."""
TASKS = tuple(GENERATORS)
__all__ = ["HELDOUT_SIZE", "TASKS", "Corpus", "Survey", "Task", "load_corpus", "load_task", "survey"]


def is_heldout(key: str) -> bool:
    return zlib.crc32(key.encode("utf-8")) % 10 == 0


@dataclass
class Task:
    """A built-in task: training pairs drawn on demand, a fixed held-out list, the tokenizer kind it suits."""

    name: str
    tokenizer: str
    heldout: list[Pair]
    draw: Callable[[np.random.Generator], Pair]  # one training pair

    def batch(self, seed: int, step: int, size: int) -> list[Pair]:
        rng = np.random.default_rng([seed, step])
        return [self.draw(rng) for _ in range(size)]

    def vocabulary_sample(self, count: int = 5000) -> list[Pair]:
        rng = np.random.default_rng([12345])
        return [self.draw(rng) for _ in range(count)] + self.heldout


@dataclass
class Corpus:
    """A parallel corpus: its files, read line by line when its training pairs are wanted (:meth:`pairs`), and its
    validation pairs, in memory. ``holdout`` says which pairs of ``data`` are held out for validation: none
    (``--valid`` given), those whose source hashes into the held-out tenth (``"hash"``), or, in a corpus too small
    for that, those whose source is the last line's (``"last"``, that source in ``last_source``)."""

    name: str
    data: list[str]
    valid: list[Pair]
    holdout: str | None
    last_source: str | None = None

    def _held_out(self, source: str) -> bool:
        if self.holdout == "hash":
            return is_heldout(source)
        return self.holdout == "last" and source == self.last_source

    def pairs(self) -> Iterator[Pair]:
        """The training pairs, in file order, read as they are wanted."""
        for pair in iter_parallel(self.data, "--data"):
            if not self._held_out(pair[0]):
                yield pair


@dataclass
class Survey:
    """What one pass over a corpus's training pairs finds: how many, a fixed-seed sample of at most ``sample_size``
    of them in corpus order (all of them in a smaller corpus) to learn the vocabulary from, the first ones (to tell
    which way round the corpus reads), whether every pair is one text twice, and whether every validation pair is
    also a training pair."""

    size: int
    sample: list[Pair]
    first: list[Pair]
    copies: bool
    valid_in_training: bool


def survey(corpus: Corpus, sample_size: int, seed: int = 0, progress: bool = False) -> Survey:
    """One pass over ``corpus``'s training pairs (see :class:`Survey`); the sample is drawn by reservoir sampling."""
    rng = random.Random(seed)
    reservoir: list[tuple[int, Pair]] = []
    first: list[Pair] = []
    copies, size = True, 0
    valid, found = set(corpus.valid), set()
    bar = progress_bar(None, enabled=progress, unit="pair")
    for size, pair in enumerate(corpus.pairs(), start=1):
        if size <= sample_size:
            reservoir.append((size, pair))
        elif (slot := int(rng.random() * size)) < sample_size:
            reservoir[slot] = (size, pair)
        if size <= SIDE_SAMPLE * 10:
            first.append(pair)
        copies = copies and pair[0] == pair[1]
        if pair in valid:
            found.add(pair)
        if size % 10_000 == 0:
            bar.update(10_000)
    bar.close()
    if not size:
        raise UserError(f"--data: {corpus.name} holds no sentence pairs")
    reservoir.sort(key=lambda entry: entry[0])
    return Survey(size, [pair for _, pair in reservoir], first, copies, bool(valid) and found == valid)


def load_task(name: str) -> Task:
    """A built-in task by name."""
    if not isinstance(name, str):
        raise TypeError(f"the task `name` must be a str, received {name!r} of type {type(name).__name__}")
    if name not in GENERATORS:
        raise UserError(f"--task: unknown task {name!r}; built-in tasks are {', '.join(TASKS)} (or use --data)")
    make, kind = GENERATORS[name]

    def draw(rng: np.random.Generator) -> Pair:
        while True:
            key, pair = make(rng)
            if not is_heldout(key):
                return pair

    heldout, seen, rng = [], set(), np.random.default_rng([2026])
    while len(heldout) < HELDOUT_SIZE:
        key, pair = make(rng)
        if is_heldout(key) and key not in seen:
            seen.add(key)
            heldout.append(pair)
    return Task(name, kind, heldout, draw)


def load_corpus(data: Sequence[str], valid: Sequence[str] | None = None) -> Corpus:
    """The corpus in ``data`` (a TSV file or two line-aligned files), validated on ``valid`` or a held-out tenth (read
    in one pass over ``data``; only the held-out pairs are kept)."""
    name = " ".join(data)
    if valid:
        iter_parallel(data, "--data").close()  # its files checked now; its lines are read when wanted
        return Corpus(name, list(data), read_parallel(valid, "--valid"), None)
    heldout, trained, last = [], False, None
    for source, target in iter_parallel(data, "--data"):
        if is_heldout(source):
            if len(heldout) < HELDOUT_SIZE:
                heldout.append((source, target))
        else:
            trained = True
        last = source
    if last is None:
        raise UserError(f"--data: {' and '.join(repr(path) for path in data)} hold no sentence pairs")
    if trained and heldout:
        return Corpus(name, list(data), heldout, "hash")
    # Too few lines for a tenth to fall out by hash: hold out the last line's source instead.
    corpus = Corpus(name, list(data), [], "last", last)
    corpus.valid = [pair for pair in iter_parallel(data, "--data") if pair[0] == last][:HELDOUT_SIZE]
    if next(corpus.pairs(), None) is None:
        raise UserError(f"--data: {name}: need at least two different source lines, so that some can be held out")
    return corpus


# --- what looks like a mistake ------------------------------------------------------------------------------


def _words(texts: Sequence[str]) -> set[str]:
    return {word for text in texts for word in text.lower().split()}


def _overlap(texts: Sequence[str], others: set[str]) -> float:
    """The share of the words of ``texts`` that are among ``others``."""
    words = _words(texts)
    return len(words & others) / max(len(words), 1)


def swapped(corpus: Corpus, found: Survey, data: Sequence[str], valid: Sequence[str]) -> bool:
    """Whether ``valid`` reads as the other way round from ``data``: by the files' language codes where both name
    theirs, else by vocabulary (the validation sources share more words with the training targets)."""
    if len(data) == 2 and len(valid) == 2:
        data_codes, valid_codes = [file_language(p) for p in data], [file_language(p) for p in valid]
        if None not in data_codes + valid_codes and data_codes[0] != data_codes[1]:
            return valid_codes == data_codes[::-1]
    sources = [s for s, _ in corpus.valid[:SIDE_SAMPLE]]
    train_sources = _words([s for s, _ in found.first])
    train_targets = _words([t for _, t in found.first])
    return _overlap(sources, train_targets) > max(2 * _overlap(sources, train_sources), 0.2)


def check_sides(corpus: Corpus, found: Survey, data: Sequence[str], valid: Sequence[str] | None) -> None:
    """Warn about the usual mix-ups: one text on both sides, the validation set swapped, or the training set again."""
    if found.copies:
        warn(
            f"--data {' '.join(data)}: source and target are the same text on every line: the model will learn to copy"
        )
    if valid is None:
        return
    if swapped(corpus, found, data, valid):
        warn(f"--valid {' '.join(valid)} reads the other way round from --data {' '.join(data)}: source and target "
             "swapped? (validation scores, and the best checkpoint, would mean nothing)")  # fmt: skip
    if found.valid_in_training:
        warn(f"--valid {' '.join(valid)} holds only training pairs: its scores will not say how the model does on "
             "new sentences")  # fmt: skip
