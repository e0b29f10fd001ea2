"""What a run trains on: a built-in task (generated locally, no download) or a parallel corpus.

A built-in task has a fixed held-out split that never overlaps training: an example belongs to it when a hash of
its key (the date, the number, the string) falls in a fixed tenth. A corpus is validated on ``--valid`` when given,
else on the sentences whose source hashes into that same tenth (at most ``HELDOUT_SIZE`` of them).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from multihead.app.console import UserError, warn
from multihead.app.corpus import Pair, read_parallel
from multihead.app.generated import GENERATORS

HELDOUT_SIZE = 1000
SIDE_SAMPLE = 200
"""Validation sentences (and ten times as many training ones) whose words tell which way round a corpus reads."""
TASKS = tuple(GENERATORS)
__all__ = ["HELDOUT_SIZE", "TASKS", "Corpus", "Task", "load_corpus", "load_task"]


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
    """A parallel corpus: its training pairs and its validation pairs."""

    name: str
    train: list[Pair]
    valid: list[Pair]


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
    """The corpus in ``data`` (a TSV file or two line-aligned files), validated on ``valid`` or a held-out tenth."""
    pairs = read_parallel(data, "--data")
    name = " ".join(data)
    if valid:
        return Corpus(name, pairs, read_parallel(valid, "--valid"))
    train = [pair for pair in pairs if not is_heldout(pair[0])]
    heldout = [pair for pair in pairs if is_heldout(pair[0])]
    if not train or not heldout:
        # Too few lines for a tenth to fall out by hash: hold out the last line's source instead.
        last = pairs[-1][0]
        train = [pair for pair in pairs if pair[0] != last]
        heldout = [pair for pair in pairs if pair[0] == last]
    if not train:
        raise UserError(f"--data: {name}: need at least two different source lines, so that some can be held out")
    return Corpus(name, train, heldout[:HELDOUT_SIZE])


# --- what looks like a mistake ------------------------------------------------------------------------------


def language(path: str) -> str | None:
    """The language code a corpus file's name gives (``train.de.gz``: ``de``), if any."""
    suffixes = [suffix[1:] for suffix in Path(path).suffixes if suffix != ".gz"]
    return suffixes[-1].lower() if suffixes and 2 <= len(suffixes[-1]) <= 3 and suffixes[-1].isalpha() else None


def _words(texts: Sequence[str]) -> set[str]:
    return {word for text in texts for word in text.lower().split()}


def _overlap(texts: Sequence[str], others: set[str]) -> float:
    """The share of the words of ``texts`` that are among ``others``."""
    words = _words(texts)
    return len(words & others) / max(len(words), 1)


def swapped(corpus: Corpus, data: Sequence[str], valid: Sequence[str]) -> bool:
    """Whether ``valid`` reads as the other way round from ``data``: by the files' language codes where both name
    theirs, else by vocabulary (the validation sources share more words with the training targets)."""
    if len(data) == 2 and len(valid) == 2:
        data_codes, valid_codes = [language(p) for p in data], [language(p) for p in valid]
        if None not in data_codes + valid_codes and data_codes[0] != data_codes[1]:
            return valid_codes == data_codes[::-1]
    sources = [s for s, _ in corpus.valid[:SIDE_SAMPLE]]
    train_sources = _words([s for s, _ in corpus.train[: SIDE_SAMPLE * 10]])
    train_targets = _words([t for _, t in corpus.train[: SIDE_SAMPLE * 10]])
    return _overlap(sources, train_targets) > max(2 * _overlap(sources, train_sources), 0.2)


def check_sides(corpus: Corpus, data: Sequence[str], valid: Sequence[str] | None) -> None:
    """Warn about the usual mix-ups: one text on both sides, the validation set swapped, or the training set again."""
    if all(source == target for source, target in corpus.train):
        warn(
            f"--data {' '.join(data)}: source and target are the same text on every line: the model will learn to copy"
        )
    if valid is None:
        return
    if swapped(corpus, data, valid):
        warn(f"--valid {' '.join(valid)} reads the other way round from --data {' '.join(data)}: source and target "
             "swapped? (validation scores, and the best checkpoint, would mean nothing)")  # fmt: skip
    training = set(corpus.train)
    if all(pair in training for pair in corpus.valid):
        warn(f"--valid {' '.join(valid)} holds only training pairs: its scores will not say how the model does on "
             "new sentences")  # fmt: skip
