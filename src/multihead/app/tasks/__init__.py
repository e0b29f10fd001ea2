"""Built-in sequence-to-sequence tasks (generated locally, no download) and parallel corpora from TSV files.

Every task has a fixed held-out split that never overlaps training: an example belongs to it when a hash of its
key (the date, the number, the source string, the TSV line's source) falls in a fixed tenth. Training batches are
drawn from an RNG seeded by ``(seed, step)``, so a run replays the same batches wherever it resumes.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from multihead.app.tasks.generated import GENERATORS
from multihead.app.tasks.tsv import read_tsv
from multihead.app.tokenizers import KINDS

Pair = tuple[str, str]
HELDOUT_SIZE = 1000
__all__ = ["HELDOUT_SIZE", "TASKS", "Dataset", "load_task"]


def is_heldout(key: str) -> bool:
    return zlib.crc32(key.encode("utf-8")) % 10 == 0


@dataclass
class Dataset:
    """Training pairs on demand, a fixed held-out list, and the tokenizer kind the task suits."""

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


def _generated(name: str, make: Callable[[np.random.Generator], tuple[str, Pair]], kind: str) -> Dataset:
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
    return Dataset(name, kind, heldout, draw)


def _from_pairs(name: str, pairs: Sequence[Pair], kind: str) -> Dataset:
    train = [pair for pair in pairs if not is_heldout(pair[0])]
    heldout = [pair for pair in pairs if is_heldout(pair[0])]
    if not train or not heldout:
        # Too few lines for a tenth to fall out by hash: hold out the last line's source instead.
        last = pairs[-1][0]
        train = [pair for pair in pairs if pair[0] != last]
        heldout = [pair for pair in pairs if pair[0] == last]
    if not train:
        raise ValueError(f"{name}: need at least two different source lines, so that some can be held out")

    def draw(rng: np.random.Generator) -> Pair:
        return train[int(rng.integers(len(train)))]

    return Dataset(name, kind, heldout[:HELDOUT_SIZE], draw)


TASKS = tuple(GENERATORS)


def load_task(name: str | None = None, *, data: str | None = None, tokenizer: str | None = None) -> Dataset:
    """A built-in task by name, or the parallel corpus in the TSV file ``data``."""
    if tokenizer is not None and tokenizer not in KINDS:
        raise ValueError(f"`tokenizer` must be one of {KINDS} or None, received {tokenizer!r}")
    if data is not None:
        if not isinstance(data, str | os.PathLike):
            raise TypeError(f"`data` must be a path to a TSV file, received {data!r} of type {type(data).__name__}")
        return _from_pairs(str(data), read_tsv(data), tokenizer or "char")
    if not isinstance(name, str):
        raise TypeError(f"the task `name` must be a str, received {name!r} of type {type(name).__name__}")
    if name not in GENERATORS:
        raise ValueError(f"unknown task {name!r}; built-in tasks are {', '.join(TASKS)} (or use --data FILE.tsv)")
    make, kind = GENERATORS[name]
    return _generated(name, make, tokenizer or kind)
