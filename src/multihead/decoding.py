"""Generation, written once for both front ends: encode once, step, reorder beams, stop.

A Transformer's ``generate`` checks its arguments, encodes the source and hands a :class:`DecodingSession` to
:func:`generate`. The session holds the encoder memory, its key mask and the decoder's cache; the model supplies its
decoding :class:`Steps`: one token per row over the cache (the memory projected into it once, at the start), or,
without a cache, the whole prefix again at every step.

The searches work on ``step(prefix) -> log_probs``: given the token prefixes ``(N, t)`` decoded so far (NumPy
int64), the log-probabilities ``(N, V)`` of the next token. Beam search also needs ``reorder(rows)``: keep the
model state (cache, encoder memory) of rows ``rows`` in that order.

Results hold the generated tokens after BOS, ``(B, T)`` with ``T <= max_len``: each row ends at its first EOS,
and positions after it hold ``pad_id``.

Notation: B batch, N = B (greedy) or B * beam_size rows, t tokens so far, Ls source length, E d_model, Hkv
key/value heads, D head dim, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real
from typing import Any, Protocol

import numpy as np

from multihead.cache import DecoderCache
from multihead.config import TransformerConfig
from multihead.validation import check_non_negative_int, check_positive_int

Step = Callable[[np.ndarray], np.ndarray]
Reorder = Callable[[np.ndarray], None]
Tensor = Any


class Steps(Protocol):
    """What a front end's Transformer supplies for one ``generate`` call (its ``decoder_steps()``)."""

    def project_memory(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every decoder layer's cross-attention keys and values ``(N, Hkv, Ls, D)`` of ``memory (N, Ls, E)``."""
        ...

    def step(self, tokens: Tensor, cache: Any, memory_key_mask: Tensor | None) -> Tensor:
        """Log-probabilities ``(N, V)`` (float32) of the token after ``tokens (N, 1)``, whose predecessors and projected
        memory ``cache`` holds (a :class:`DecoderCache`, or buffers that act as one); ``tokens`` extend it."""
        ...

    def recompute(self, prefix: Tensor, memory: Tensor, memory_key_mask: Tensor | None) -> Tensor:
        """Log-probabilities ``(N, V)`` of the token after each whole ``prefix (N, t)``, without a cache."""
        ...

    def take(self, x: Tensor, rows: np.ndarray) -> Tensor:
        """Rows ``rows`` of ``x``'s first axis."""
        ...

    def tensor(self, array: np.ndarray) -> Tensor:
        """A NumPy array as a tensor where the model computes."""
        ...

    def numpy(self, x: Tensor) -> np.ndarray: ...


class Session(Protocol):
    """What the searches drive: one ``generate`` call's model state."""

    def step(self, prefix: np.ndarray) -> np.ndarray:
        """Log-probabilities ``(N, V)`` of the token after each prefix ``(N, t)``."""
        ...

    def reorder(self, rows: np.ndarray) -> None:
        """Keep rows ``rows``, in that order, of the state."""
        ...


class DecodingSession:
    """The state of one ``generate`` call over a model's :class:`Steps`: the encoder memory ``(N, Ls, E)`` (without a
    cache; with one, its projections go into the cache at the start), its key mask ``(N, Ls)`` and the decoder's
    cache (``None``: every step recomputes the whole prefix)."""

    def __init__(
        self, steps: Steps, memory: Tensor, memory_key_mask: Tensor | None, cache: DecoderCache | None
    ) -> None:
        self.steps = steps
        self.memory = memory
        self.memory_key_mask = memory_key_mask
        self.cache = cache
        if cache is not None:
            for cross_cache, (keys, values) in zip(cache.cross_attention, steps.project_memory(memory), strict=True):
                cross_cache._append(keys, values)
            self.memory = None

    def step(self, prefix: np.ndarray) -> np.ndarray:
        """Log-probabilities ``(N, V)`` of the token after each prefix ``(N, t)``."""
        if self.cache is None:
            log_probs = self.steps.recompute(self.steps.tensor(prefix), self.memory, self.memory_key_mask)
        else:
            log_probs = self.steps.step(self.steps.tensor(prefix[:, -1:]), self.cache, self.memory_key_mask)
        return self.steps.numpy(log_probs)

    def reorder(self, rows: np.ndarray) -> None:
        """Keep rows ``rows``, in that order, of everything the session holds."""
        if self.memory is not None:
            self.memory = self.steps.take(self.memory, rows)
        if self.memory_key_mask is not None:
            self.memory_key_mask = self.steps.take(self.memory_key_mask, rows)
        if self.cache is not None:
            self.cache.reorder(rows)


def generate(
    session: Session,
    batch: int,
    *,
    max_len: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    beam_size: int = 1,
    length_penalty: float = 1.0,
) -> np.ndarray:
    """Greedy search (``beam_size=1``) or beam search over a session of ``batch`` sources; int64 ``(B, T)``."""
    search = dict(max_len=max_len, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    if beam_size == 1:
        return greedy_search(session.step, batch, reorder=session.reorder, **search)
    session.reorder(np.repeat(np.arange(batch), beam_size))  # row b * beam_size + j is beam j of sequence b
    return beam_search(session.step, session.reorder, batch, beam_size=beam_size, length_penalty=length_penalty,
                       **search)  # fmt: skip


def resolve_pad_id(pad_id: int | None, config: TransformerConfig, eos_id: int) -> int:
    """What pads finished rows: ``pad_id`` if given, else the config's, else ``eos_id``."""
    if pad_id is not None:
        return pad_id
    return config.pad_id if config.pad_id is not None else eos_id


def check_generation_args(
    max_len: object,
    bos_id: object,
    eos_id: object,
    pad_id: object,
    beam_size: object,
    length_penalty: object,
    config: TransformerConfig,
) -> None:
    """A model's ``generate`` arguments, checked against its config before anything is computed."""
    check_positive_int("max_len", max_len)
    if max_len > config.max_len:
        raise ValueError(
            f"`max_len` must be at most the model's max_len={config.max_len} positions, received {max_len}"
        )
    for name, token in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
        if check_non_negative_int(name, token) >= config.tgt_vocab:
            raise ValueError(f"`{name}` must be < tgt_vocab={config.tgt_vocab}, received {name}={token}")
    check_positive_int("beam_size", beam_size)
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, Real):
        raise TypeError(f"`length_penalty` must be a float, received {length_penalty!r}")
    if not math.isfinite(length_penalty):
        raise ValueError(f"`length_penalty` must be finite, received {length_penalty!r}")


def greedy_search(
    step: Step,
    batch: int,
    *,
    max_len: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    reorder: Reorder | None = None,
) -> np.ndarray:
    """The most probable token at every step. With ``reorder``, rows that have ended leave the model's state once a
    quarter of those still decoding have: the rest of the batch no longer computes them."""
    prefix = np.full((batch, 1), bos_id, dtype=np.int64)  # (B, 1)
    finished = np.zeros(batch, dtype=bool)
    active = np.arange(batch)  # the rows of `prefix` the model's state still holds, in its order
    for _ in range(max_len):
        token = np.full(batch, pad_id)
        token[active] = step(prefix[active]).argmax(axis=-1)  # (N,) for the N active rows
        token[finished] = pad_id
        prefix = np.concatenate([prefix, token[:, None]], axis=1)  # (B, t + 1)
        finished |= token == eos_id
        if finished.all():
            break
        ended = finished[active]
        if reorder is not None and ended.sum() * 4 >= len(active):
            reorder(np.flatnonzero(~ended))
            active = active[~ended]
    return prefix[:, 1:]


def beam_search(
    step: Step,
    reorder: Reorder,
    batch: int,
    *,
    beam_size: int,
    max_len: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    length_penalty: float = 1.0,
) -> np.ndarray:
    """Beam search over ``batch * beam_size`` rows; row ``b * beam_size + j`` is beam ``j`` of sequence ``b``.

    The model state must already be laid out that way. Hypotheses are ranked by total log-probability divided
    by ``length ** length_penalty``. With ``beam_size=1`` this is greedy search.
    """
    k = beam_size
    prefix = np.full((batch * k, 1), bos_id, dtype=np.int64)  # (B*k, 1)
    scores = np.zeros((batch, k))
    scores[:, 1:] = -np.inf  # every beam starts identical: expand only the first at step 1
    finished = np.zeros((batch, k), dtype=bool)
    lengths = np.zeros((batch, k))
    for _ in range(max_len):
        log_probs = step(prefix)  # (B*k, V)
        vocab = log_probs.shape[-1]
        log_probs = log_probs.reshape(batch, k, vocab)
        # A finished beam may only continue with padding, at no cost, so its score stays as it ended.
        pad_only = np.full(vocab, -np.inf)
        pad_only[pad_id] = 0.0
        log_probs = np.where(finished[..., None], pad_only, log_probs)
        candidates = (scores[..., None] + log_probs).reshape(batch, k * vocab)  # (B, k*V)
        best = np.argsort(-candidates, axis=-1, kind="stable")[:, :k]  # (B, k)
        origin, token = best // vocab, best % vocab
        scores = np.take_along_axis(candidates, best, axis=-1)
        was_finished = np.take_along_axis(finished, origin, axis=-1)
        lengths = np.take_along_axis(lengths, origin, axis=-1) + ~was_finished
        finished = was_finished | (token == eos_id)
        rows = (np.arange(batch)[:, None] * k + origin).reshape(-1)  # (B*k,)
        reorder(rows)
        prefix = np.concatenate([prefix[rows], token.reshape(-1, 1)], axis=1)  # (B*k, t + 1)
        if finished.all():
            break
    ranked = scores / np.maximum(lengths, 1.0) ** length_penalty
    winners = np.arange(batch) * k + ranked.argmax(axis=-1)
    return prefix[winners, 1:]
