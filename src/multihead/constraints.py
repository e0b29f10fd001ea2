"""Lexical constraints: target phrases, as token ids, that a translation must hold (each whole, anywhere, once or
more), and how far a hypothesis has come with them: the phrases it holds and the longest start of another that its
newest tokens write. A constrained beam search keeps hypotheses of every degree of progress side by side, so that a
phrase the model finds unlikely still gets a place in the beam (dynamic beam allocation: Post and Vilar, 2018).

Notation: P phrases, t tokens of a hypothesis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Progress:
    """A hypothesis' progress: ``met``, for each phrase, whether the hypothesis holds it whole; ``partial``, for each
    phrase it does not hold, how many of its first tokens the hypothesis ends with (0: none)."""

    met: tuple[bool, ...]
    partial: tuple[int, ...]


class Constraints:
    """The phrases ``phrases`` (each a non-empty sequence of token ids) that a translation must hold."""

    def __init__(self, phrases: Sequence[Sequence[int]]) -> None:
        if isinstance(phrases, (str, bytes)) or not isinstance(phrases, Sequence):
            raise TypeError(f"`constraints` must be a sequence of token id sequences, received {phrases!r}")
        checked = []
        for index, phrase in enumerate(phrases):
            if isinstance(phrase, (str, bytes)) or not isinstance(phrase, Sequence) or not phrase:
                raise ValueError(f"constraint {index} must be a non-empty sequence of token ids, received {phrase!r}")
            if not all(isinstance(token, (int, np.integer)) and int(token) >= 0 for token in phrase):
                raise ValueError(f"constraint {index} must hold token ids (ints >= 0), received {list(phrase)!r}")
            checked.append(tuple(int(token) for token in phrase))
        self.phrases: tuple[tuple[int, ...], ...] = tuple(checked)
        self.total = sum(map(len, self.phrases))
        """The tokens of every phrase: a hypothesis that holds them all has made this much progress."""
        self.tokens = frozenset(token for phrase in self.phrases for token in phrase)
        """Every id of every phrase: another token only ends a phrase's start."""

    def __len__(self) -> int:
        return len(self.phrases)

    def of(self, tokens: Sequence[int] | np.ndarray) -> Progress:
        """The progress of a hypothesis of ``tokens``."""
        written = [int(token) for token in tokens]
        met, partial = [], []
        for phrase in self.phrases:
            size = len(phrase)
            whole = any(tuple(written[i : i + size]) == phrase for i in range(len(written) - size + 1))
            met.append(whole)
            started = 0 if whole else next(
                (length for length in range(min(size - 1, len(written)), 0, -1)
                 if tuple(written[len(written) - length :]) == phrase[:length]),
                0,
            )  # fmt: skip
            partial.append(started)
        return Progress(tuple(met), tuple(partial))

    def after(self, progress: Progress, tokens: np.ndarray | Sequence[int], token: int) -> Progress:
        """The progress of a hypothesis of ``tokens`` (at ``progress``) once it writes ``token``: what :meth:`of`
        gives of them all, from their last few."""
        if token not in self.tokens and not any(progress.partial):
            return progress  # nothing started, nothing begun
        tail = [int(t) for t in tokens[len(tokens) - max(map(len, self.phrases)) + 1 :]] if len(tokens) else []
        tail.append(int(token))
        met, partial = [], []
        for phrase, was, started in zip(self.phrases, progress.met, progress.partial, strict=True):
            size = len(phrase)
            whole = was or (started == size - 1 and phrase[-1] == token)
            met.append(whole)
            partial.append(0 if whole else next(
                (length for length in range(min(size - 1, len(tail)), 0, -1)
                 if tuple(tail[len(tail) - length :]) == phrase[:length]),
                0,
            ))  # fmt: skip
        return Progress(tuple(met), tuple(partial))

    def done(self, progress: Progress) -> bool:
        """Whether a hypothesis of this progress holds every phrase."""
        return all(progress.met)

    def made(self, progress: Progress) -> int:
        """How many phrase tokens a hypothesis of this progress has written: those of the phrases it holds, and the
        most of any it has started (the bank a constrained beam search keeps it in, ``0..total``)."""
        whole = sum(len(phrase) for phrase, met in zip(self.phrases, progress.met, strict=True) if met)
        return whole + max(progress.partial, default=0)

    def next_tokens(self, progress: Progress) -> set[int]:
        """The tokens that take a hypothesis of this progress further: each phrase's next after what it has
        written of it."""
        return {
            phrase[started]
            for phrase, met, started in zip(self.phrases, progress.met, progress.partial, strict=True)
            if not met
        }
