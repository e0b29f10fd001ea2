"""What a loaded run computes of given translations and of one sentence, besides translating: how probable it finds
a translation of a source (teacher-forced, in length-sorted batches), and a sentence's translation with every decoder
layer's cross-attention.

Notation: B batch, Ls source length, Lt target length, H heads, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from multihead.app.batched import TRANSLATION, in_batches, translate_ids
from multihead.app.console import UserError, warn
from multihead.app.cutting import Cutter, warn_unknown
from multihead.app.languages import Direction
from multihead.app.loaded import LoadedRun
from multihead.decoding import SearchOptions


@dataclass(frozen=True)
class Scored:
    """A translation's log-probability under the model (natural log, summed over its tokens) and how many tokens
    that is (EOS included)."""

    log_prob: float
    tokens: int

    @property
    def mean(self) -> float:
        """The log-probability per token."""
        return self.log_prob / self.tokens


@dataclass
class Translation:
    """One sentence, its translation, their tokens, and every decoder layer's cross-attention ``(H, Lt, Ls)``."""

    source: str
    target: str
    source_tokens: list[str]
    target_tokens: list[str]
    source_word_starts: list[bool]
    target_word_starts: list[bool]
    cross_attention: list[np.ndarray]


def _pairs_read(
    cutter: Cutter, direction: Direction, sources: Sequence[str], targets: Sequence[str], names: Sequence[str]
) -> tuple[list[list[int]], list[list[int]]]:
    """Each pair's source ids (cut to what the model reads; a blank source, one pad) and the target ids the model
    predicts (the forced tokens, the translation's, EOS; cut alike), with one warning naming the pairs cut and one the
    blank sources."""
    specials, forced, max_len = direction.generation.specials, list(direction.forced), cutter.max_len
    blank, cut = [], []
    source_ids, target_ids = [], []
    for source, target, name in zip(sources, targets, names, strict=True):
        ids, unknown = cutter.encode(cutter.normalized(source, direction), direction)
        warn_unknown(f"{name} (source)", unknown)
        tokens, unknown = cutter.target.encode(target)
        warn_unknown(f"{name} (translation)", unknown)
        if not source.strip():
            blank.append(name)
        if len(ids) > max_len or len(forced) + len(tokens) >= max_len:
            cut.append(name)
        source_ids.append(ids[:max_len] or [specials.pad])  # a blank source is scored as nan
        target_ids.append([*forced, *tokens, specials.eos][:max_len])  # predicted: the translation and EOS
    for what, listed, how in (
        (f"longer than this model reads (at most {max_len} tokens a side)", cut, "cut to what it reads"),
        ("blank: the model reads no empty source", blank, "scored nan"),
    ):
        if listed:
            shown = ", ".join(listed[:3]) + (f" and {len(listed) - 3} more" if len(listed) > 3 else "")
            warn(f"{shown} {'is' if len(listed) == 1 else 'are'} {what}: {how}")
    return source_ids, target_ids


def score(
    run: LoadedRun,
    direction: Direction,
    cutter: Cutter,
    sources: Sequence[str],
    targets: Sequence[str],
    *,
    names: Sequence[str] | None = None,
    progress: bool = False,
) -> list[Scored]:
    """How probable ``run``'s model finds each translation ``targets[i]`` of ``sources[i]`` in ``direction``:
    teacher-forced, the model's forward pass reads the source and BOS + the forced tokens + the translation's tokens
    and predicts the translation's tokens + EOS; the log-probabilities (natural log) of those, summed, with their
    count (EOS included, and the forced tokens, which generation gives every translation first with probability 1,
    as its search counts them). In length-sorted batches (:func:`~multihead.app.batched.in_batches`). A source or
    translation longer than the model reads is cut to what it reads (only what was read is scored: see the count),
    with one warning naming the lines as ``names`` say; a blank source, which the model never reads, scores ``nan``,
    with one warning."""
    specials, forced = direction.generation.specials, len(direction.forced)
    names = names or [f"pair {i + 1}" for i in range(len(sources))]
    source_ids, target_ids = _pairs_read(cutter, direction, sources, targets, names)

    def batch(src: np.ndarray, limits: np.ndarray, indices: np.ndarray) -> list[Scored]:
        rows = [target_ids[index] for index in indices]
        longest = max(map(len, rows))
        tgt_in = np.full((len(rows), longest), specials.pad, dtype=np.int64)  # (B, Lt): BOS + forced + translation
        tgt_out = np.full((len(rows), longest), specials.pad, dtype=np.int64)  # (B, Lt): translation + EOS
        for row, tokens in enumerate(rows):
            tgt_in[row, 0], tgt_in[row, 1 : len(tokens)] = specials.bos, tokens[:-1]
            tgt_out[row, forced : len(tokens)] = tokens[forced:]  # the forced: probability 1, not read
        totals = run.front.log_probs(run, src, tgt_in, tgt_out, specials.pad)  # (B,)
        return [Scored(float(total), len(tokens)) for total, tokens in zip(totals, rows, strict=True)]

    scored = in_batches(
        batch, source_ids, limit=run.limit, pad=specials.pad, batch_tokens=run.batch_tokens, progress=progress
    )
    blanks = {index for index, source in enumerate(sources) if not source.strip()}
    return [Scored(math.nan, item.tokens) if index in blanks else item for index, item in enumerate(scored)]


def attention(
    run: LoadedRun, direction: Direction, cutter: Cutter, text: str, *, search: SearchOptions = TRANSLATION
) -> Translation:
    """One sentence's translation by ``run`` in ``direction``, searched as ``search`` says, with every decoder layer's
    cross-attention; refused in one line for a sentence longer than the model reads."""
    ids, unknown = cutter.encode(cutter.normalized(text, direction), direction)
    warn_unknown("the text", unknown)
    if len(ids) > run.checkpoint.config.max_len:
        raise UserError(
            f"the text to plot is longer than this model reads: {len(ids)} {cutter.unit}, at most "
            f"{run.checkpoint.config.max_len}"
        )
    spec = direction.spec(search)
    (out,) = translate_ids(run.generator(spec), [ids], limit=run.limits(search), generation=spec)
    forced, bos = list(direction.forced), direction.generation.specials.bos
    weights = run.front.cross_attention(run, ids, [bos, *forced, *out][: len(forced) + len(out)])
    source, target = cutter.source, cutter.target
    return Translation(
        source=text,
        target=target.decode(out),
        source_tokens=source.pieces(ids),
        target_tokens=target.pieces(out),
        source_word_starts=source.word_starts(ids),
        target_word_starts=target.word_starts(out),
        cross_attention=[w[:, len(forced) :] for w in weights],  # per layer (H, Lt, Ls)
    )
