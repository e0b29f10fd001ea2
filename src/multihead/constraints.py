"""Lexical constraints: target phrases, as token ids, that a translation must hold (each whole, anywhere, once or
more) or that it is to prefer (a :class:`Phrase` with a bonus on its tokens), and how far hypotheses have come with
them:
the phrases each holds and, of each other, the longest start that its newest tokens write. A constrained beam search
keeps hypotheses of every degree of progress side by side, so that a phrase the model finds unlikely still gets a
place in the beam (dynamic beam allocation: Post and Vilar, 2018), tracking every hypothesis' progress at once, as
arrays (the vectorised form of Hu et al., 2019).

Notation: R hypotheses (rows), C candidate tokens of each, Q phrases (padded: a phrase of no token is held from the
start), L tokens of the longest.
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


@dataclass(frozen=True)
class Phrase:
    """A phrase (token ids) with how a translation takes it. ``bonus``: ``None``, the translation must hold it;
    else it is to prefer it, each of its tokens a hypothesis writes adding ``bonus`` (> 0) to its score (the phrase
    whole, or the start of it the hypothesis ends with: a start it leaves loses its bonus), and to its rank once it
    ends, beside its log-probability (which the length penalty divides; the bonus it is not), for terms a language
    may inflect. ``followed_by``: bools ``(V,)``, the tokens that may come right after a phrase to hold where a
    hypothesis first writes it whole (the translation's end always may): a term that must stay a whole word is
    followed by a token that begins one, or by punctuation. A plain sequence of ids is a phrase to hold, followed by
    anything."""

    tokens: Sequence[int]
    bonus: float | None = None
    followed_by: np.ndarray | None = None


@dataclass(frozen=True)
class Tables:
    """Phrases as arrays: ``ids (..., Q, L)`` (padded with -1), ``sizes (..., Q)``, ``fail (..., Q, L)``: for a
    start of ``s`` tokens, the longest shorter start that it ends with (where a hypothesis falls back to when its
    next token does not continue the phrase), and ``bonus (..., Q)``: a preferred phrase's bonus a token (0: a
    phrase to hold)."""

    ids: np.ndarray
    sizes: np.ndarray
    fail: np.ndarray
    bonus: np.ndarray


class Constraints:
    """The phrases ``phrases`` of a translation: each a :class:`Phrase`, or a non-empty sequence of token ids that
    it must hold."""

    def __init__(self, phrases: Sequence[Sequence[int] | Phrase]) -> None:
        if isinstance(phrases, (str, bytes)) or not isinstance(phrases, Sequence):
            raise TypeError(f"`constraints` must be a sequence of token id sequences, received {phrases!r}")
        given = [phrase if isinstance(phrase, Phrase) else Phrase(phrase) for phrase in phrases]
        for index, phrase in enumerate(given):
            _check(index, phrase)
        self.phrases: tuple[tuple[int, ...], ...] = tuple(tuple(int(t) for t in phrase.tokens) for phrase in given)
        """Every phrase, those to hold and those to prefer, in order."""
        self.bonuses = tuple(phrase.bonus or 0.0 for phrase in given)
        """Each phrase's bonus a token (0: one to hold)."""
        self.followers = tuple(phrase.followed_by for phrase in given)
        """What may follow each phrase (``None``: anything)."""
        self.longest = max(map(len, self.phrases), default=0)
        self.held = tuple(phrase for phrase, bonus in zip(self.phrases, self.bonuses, strict=True) if not bonus)
        """The phrases a translation must hold."""

    def __len__(self) -> int:
        return len(self.phrases)

    def tables(self, count: int, length: int) -> Tables:
        """The phrases as :class:`Tables` of ``count`` phrases (at least this many) of ``length`` tokens (at least
        the longest)."""
        ids = np.full((count, length), -1, dtype=np.int64)
        sizes = np.zeros(count, dtype=np.int64)
        fail = np.zeros((count, length), dtype=np.int64)
        bonus = np.zeros(count)
        bonus[: len(self)] = self.bonuses
        for q, phrase in enumerate(self.phrases):
            ids[q, : len(phrase)], sizes[q] = phrase, len(phrase)
            for s in range(2, len(phrase)):  # fail[s]: the longest start, shorter than s, that phrase[:s] ends with
                back = fail[q, s - 1]
                while back and phrase[back] != phrase[s - 1]:
                    back = fail[q, back]
                fail[q, s] = back + (phrase[back] == phrase[s - 1])
        return Tables(ids, sizes, fail, bonus)

    def of(self, tokens: Sequence[int] | np.ndarray) -> Progress:
        """The progress of a hypothesis of ``tokens``."""
        tables = self.tables(len(self), self.longest)
        met, partial = np.zeros((1, len(self)), dtype=bool), np.zeros((1, len(self)), dtype=np.int64)
        for token in tokens:
            met, partial = (a[:, 0] for a in advanced(tables, met, partial, np.array([[int(token)]])))
        return Progress(tuple(met[0].tolist()), tuple(partial[0].tolist()))


def advanced(tables: Tables, met: np.ndarray, partial: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The progress of hypotheses ``(R,)`` at ``met`` and ``partial`` ``(R, Q)`` on the phrases ``tables`` (``(R, Q,
    L)``, or one table for all) once each writes each of its candidates ``tokens (R, C)``: ``met`` and ``partial``,
    ``(R, C, Q)`` each."""
    ids, fail = np.broadcast_to(tables.ids, (*met.shape, tables.ids.shape[-1])), tables.fail
    fail = np.broadcast_to(fail, ids.shape)
    r, q = np.arange(len(met))[:, None, None], np.arange(met.shape[1])[None, None, :]  # (R, 1, 1), (1, 1, Q)
    x = tokens[:, :, None]  # (R, C, 1)
    s = np.broadcast_to(partial[:, None, :], (*tokens.shape, met.shape[1]))  # (R, C, Q) the start written so far
    if ids.shape[-1]:
        for _ in range(ids.shape[-1]):  # fall back until the token continues the start, or none is left
            back = (s > 0) & (ids[r, q, s] != x)
            if not back.any():
                break
            s = np.where(back, fail[r, q, s], s)
        s = s + (ids[r, q, s] == x)
    whole = met[:, None, :] | (s == np.broadcast_to(tables.sizes, met.shape)[:, None, :])
    return whole, np.where(whole, 0, s)


def made(sizes: np.ndarray, met: np.ndarray, partial: np.ndarray) -> np.ndarray:
    """How many phrase tokens hypotheses at ``met`` and ``partial`` ``(..., Q)`` have written, of phrases of ``sizes``
    (broadcast to them): those of the phrases they hold, and the most of any they have started (the bank a constrained
    beam search keeps them in)."""
    return np.where(met, sizes, 0).sum(-1) + (partial.max(-1) if partial.shape[-1] else 0)


def written(tables: Tables, met: np.ndarray, partial: np.ndarray) -> np.ndarray:
    """The bonus hypotheses at ``met`` and ``partial`` ``(R, ..., Q)`` have earned from the preferred phrases of
    ``tables`` (``(R, Q)``): each phrase's bonus for each token of it they have written, whole or ending them."""
    shape = (len(met),) + (1,) * (met.ndim - 2) + (met.shape[-1],)
    sizes, bonus = tables.sizes.reshape(shape), tables.bonus.reshape(shape)
    return (np.where(met, sizes, partial) * bonus).sum(-1)


def _check(index: int, phrase: Phrase) -> None:
    """Refuse constraint ``index`` in one line unless it is a phrase of ids, its bonus a number > 0 and what may follow
    it bools."""
    tokens, bonus, after = phrase.tokens, phrase.bonus, phrase.followed_by
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence) or not tokens:
        raise ValueError(f"constraint {index} must be a non-empty sequence of token ids, received {tokens!r}")
    if not all(isinstance(token, (int, np.integer)) and int(token) >= 0 for token in tokens):
        raise ValueError(f"constraint {index} must hold token ids (ints >= 0), received {list(tokens)!r}")
    if bonus is not None and not (isinstance(bonus, (int, float)) and 0 < bonus < float("inf")):
        raise ValueError(f"constraint {index}'s bonus must be a number > 0, received {bonus!r}")
    if after is not None and not (isinstance(after, np.ndarray) and after.dtype == bool and after.ndim == 1):
        raise ValueError(f"constraint {index}'s followed_by must be a 1-D bool array (one a token), received "
                         f"{type(after).__name__} {getattr(after, 'dtype', '')}")  # fmt: skip
    if after is not None and bonus is not None:
        raise ValueError(f"constraint {index}: followed_by applies to a phrase to hold, not to one with a bonus")
