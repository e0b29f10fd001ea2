"""Token-id sequences decoded in batches of similar length: how many tokens a translation may take, the batches made
and given back in input order, and a translation as generated cut to what it translates.

Notation: B batch, Ls source length, T generated length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from multihead.app.console import progress_bar
from multihead.app.devices import fit_threads
from multihead.constraints import Phrase
from multihead.decoding import Generation, SearchOptions

Ids = list[int]
Phrases = list[Phrase]
"""The phrases, as target token ids, one translation must hold (its constraints)."""
Ranked = list[tuple[float, Ids]]
"""A sentence's hypotheses, best first, each with its rank."""
Row = TypeVar("Row")  # what a batch gives for each of its rows
Run = Callable[[np.ndarray, np.ndarray, np.ndarray], Sequence[Row]]
"""What translates a batch: ``src (B, Ls)`` padded, each row's length limit ``(B,)`` and index in the input ``(B,)``
-> one result per row."""
Generate = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""A :data:`Run` whose results are the rows of tokens ``(B, T)``."""
TRANSLATION = SearchOptions(length_penalty=0.6)
"""How ``translate``, ``evaluate`` and ``serve`` search unless told otherwise: greedy; with more beams, ranked by the
paper's length penalty."""
BATCH_TOKENS = 6000
"""Source tokens per translation batch on a CPU (divided by the beam): large batches amortise each decoding step's
fixed cost."""
CUDA_BATCH_TOKENS = 24000
"""The same on a GPU, where a decoding step costs mostly the launching of its kernels, whatever the batch."""


def length_limit(source_length: int, longest_target: int, model_max_len: int) -> int:
    """How many tokens a translation of ``source_length`` tokens may take: what training saw, or twice the source
    for longer inputs, within the positions the model has."""
    return max(1, min(model_max_len - 1, max(longest_target + 1, 2 * source_length + 10)))


def in_batches(
    run: Run[Row],
    sources: Sequence[Ids],
    *,
    limit: Callable[[int], int],
    pad: int,
    batch_tokens: int = BATCH_TOKENS,
    progress: bool = False,
) -> list[Row]:
    """``run(src, limits, indices)`` over token-id sequences in batches of similar length: ``src (B, Ls)`` a batch
    padded with ``pad``, ``limits (B,)`` the length limit of each row (``limit`` of its source's length: never of
    the batch's), ``indices (B,)`` their places in ``sources``, and ``run`` gives one result per row; the results
    come back in input order."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results: dict[int, Row] = {}
    bar = progress_bar(len(sources), enabled=progress, unit="sentence")
    start = 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and (stop + 1 - start) * len(sources[order[stop]]) <= batch_tokens:
            stop += 1
        rows = order[start:stop]
        longest = len(sources[rows[-1]])
        src = np.full((len(rows), longest), pad, dtype=np.int64)  # (B, Ls)
        for row, index in enumerate(rows):
            src[row, : len(sources[index])] = sources[index]
        limits = np.array([limit(len(sources[index])) for index in rows], dtype=np.int64)  # (B,)
        fit_threads()
        for row, result in zip(rows, run(src, limits, np.array(rows, dtype=np.int64)), strict=True):
            results[row] = result
        bar.update(len(rows))
        start = stop
    bar.close()
    return [results[index] for index in range(len(sources))]


def translation(tokens: Sequence[int] | np.ndarray, limit: int, generation: Generation) -> Ids:
    """The translation in ``tokens`` as generated: up to their first EOS, included, and at most ``limit`` of them,
    without the tokens ``generation`` forces first (a language code: the model's, not the text's)."""
    ids = list(tokens[:limit])
    ids = ids[: ids.index(generation.specials.eos) + 1] if generation.specials.eos in ids else ids
    return [int(token) for token in ids[len(generation.forced) :]]


def translate_ids(
    generate: Generate,
    sources: Sequence[Ids],
    *,
    limit: Callable[[int], int],
    generation: Generation,
    batch_tokens: int = BATCH_TOKENS,
    progress: bool = False,
) -> list[Ids]:
    """Translate token-id sequences in batches of similar length (:func:`in_batches`, padded with ``generation``'s
    pad) with ``generate``, which gives ``(B, T)`` tokens a batch; the results come back in input order, each its
    :func:`translation`."""

    def run(src: np.ndarray, limits: np.ndarray, indices: np.ndarray) -> list[Ids]:
        out = generate(src, limits, indices)
        return [translation(tokens, limit, generation) for tokens, limit in zip(out, limits, strict=True)]

    pad = generation.specials.pad
    return in_batches(run, sources, limit=limit, pad=pad, batch_tokens=batch_tokens, progress=progress)
