"""What generation is, written once for both front ends: its specification, the processing of every step's logits,
the decoding steps a model supplies, and a batch's rows over them; the searches run on :mod:`multihead.engine`.

A Transformer's ``generate`` checks its arguments, encodes the source and hands a :class:`DecodingSession` (rows that
hold the batch's sources) to :func:`multihead.engine.generate`, with the :class:`Generation` that says how to choose
the tokens. The session holds the encoder memory, its key mask and the decoder's cache; the model supplies its
decoding :class:`Steps`: one token per row over the cache (the memory projected into it once, at the start), or,
without a cache, the whole prefix again at every step. A step is the model's own forward pass with a cache, one
query per row. ``argmax`` and ``top_k`` (:class:`Choices`) choose from a step's logits where the model computes,
``top_k`` as log-probabilities, so that only the chosen ids and scores reach the host (and a greedy step never
normalises). Sentences that have ended leave the state. Beam search mostly reorders rows among the beams of one
sentence, which share their source: it says so (``same_sources``), and the source's state (encoder memory, its
projections and key mask) stays where it is.

A search strategy is one entry of :data:`SEARCHES`, chosen by :attr:`SearchOptions.strategy`:

- ``"greedy"``: the most probable token at every step.
- ``"sample"``: a token drawn at every step from the ``sampling_topk`` most probable (0: all), their probabilities
  sharpened or flattened by ``sampling_temperature`` (``p ** (1 / T)``, renormalised), then cut to the fewest best
  whose probability reaches ``sampling_topp`` (nucleus sampling), as CTranslate2's and Hugging Face's options do.
  Each sentence draws from a random generator of its own, seeded by ``seed`` and the sentence's key (its index in
  the call unless ``keys`` says otherwise), so its translation depends neither on the sentences searched with it
  nor on the framework: the same seed and input give the same output.
- ``"beam"``: beam search. It ranks a hypothesis of ``n`` tokens (its EOS included) with total log-probability ``s``
  by ``s / n ** length_penalty`` (the length penalty of fairseq's ``--lenpen`` and of Hugging Face's
  ``length_penalty``; CTranslate2's ``length_penalty`` divides by ``n ** length_penalty`` likewise). At every step
  one top-k picks the ``2 * beam_size`` best continuations of a sentence's beams; those ending in EOS among the
  first ``beam_size`` become finished hypotheses, and the first ``beam_size`` others are the next beams, so the beam
  is always full of unfinished hypotheses. A sentence stops when its best finished hypothesis ranks at least as
  high as any continuation of its beams could (their scores only fall: ``s / n ** length_penalty`` is bounded by its
  value at ``n`` = the next length or its ``max_len``), or at its ``max_len``, where its unfinished beams are ranked
  too. An n-best search keeps a sentence's best few finished hypotheses (``n_best``, at most
  ``beam_size``) and stops the sentence when the last of them ranks at least as high as any continuation could: the
  same rule, which keeping one is.

What generation reads besides the model is one :class:`Generation`: the special ids, the tokens never chosen, the
tokens every translation starts with, whether one that reaches its length limit ends with EOS, and the search (with
its length limits). :func:`process` applies it to every step's logits, whatever the strategy, before anything is
chosen (as Hugging Face's logits processors do): banned tokens (CTranslate2's and Hugging Face's ``bad_words_ids``
with ``renormalize_logits``) and, while a row has made fewer than ``min_length`` tokens, EOS get the logit ``-inf``;
while it has made fewer than its forced tokens, every token but the next forced one does; with ``eos_at_limit``, at
a row's last place every token but EOS does (Hugging Face's ``forced_eos_token_id``), whatever the other rules say.
The other tokens' probabilities sum to 1.

``max_len`` is one length limit for every row, or one per row: a row's translation then never depends on the rows
searched with it. Results hold the generated tokens after BOS, ``(B, T)`` with ``T`` at most the
longest limit: each row ends at its first EOS or at its limit, and positions after that hold the pad.

Notation: B batch, N = B (greedy, sampling) or B * beam_size rows, t tokens so far, Ls source length, E d_model, Hkv
key/value heads, D head dim, V vocabulary, k candidates.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any, Protocol

import numpy as np

from multihead.cache import DecoderCache, DecoderCaches, kept_sources, memory_rows
from multihead.validation import check_flag, check_non_negative_int, check_positive_int

Tensor = Any
Limit = int | Sequence[int] | np.ndarray
"""``generate``'s length limit: one for every row, or one per row."""


@dataclass(frozen=True)
class Specials:
    """The special ids of a vocabulary, which generation reads: ``bos`` starts every target sequence (the decoder's
    first input; Marian's is its pad), ``eos`` ends a sentence, ``pad`` fills a row after its end (and batches),
    ``unk`` reads a piece the vocabulary lacks (the defaults: the built-in tokenizers')."""

    pad: int = 0
    bos: int = 1
    eos: int = 2
    unk: int = 3

    def __post_init__(self) -> None:
        for name in ("pad", "bos", "eos", "unk"):
            check_non_negative_int(name, getattr(self, name))


@dataclass(frozen=True)
class SearchOptions:
    """How a search chooses each translation's tokens (see the module's docstring), checked when made.

    Attributes:
        beam_size: beams per sentence; more than 1 is beam search.
        length_penalty: beam search ranks a hypothesis of ``n`` tokens by its log-probability over
            ``n ** length_penalty`` (finite; 0: by log-probability alone).
        n_best: how many hypotheses of each sentence an n-best search keeps, best first (at most ``beam_size``;
            :func:`generate` gives the best one).
        sampling_topk: sample each token from this many most probable (0: from all); 1, the default, takes the most
            probable (greedy search).
        sampling_topp: sample only from the fewest most probable tokens whose probability reaches this, in (0, 1].
        sampling_temperature: divides the log-probabilities before sampling (> 0; below 1 sharper, above flatter).
        seed: seeds the sampling (a non-negative int); ``None``: a fresh seed for every call.
        max_length: the most tokens a translation may take, whatever longer limit the call gives (``None``: the
            call's).
        min_length: the fewest tokens a translation takes before its EOS (EOS not counted): until then no search
            chooses EOS, whose probability goes to the other tokens (CTranslate2's ``min_decoding_length``). A row's
            length limit still ends it.
    """

    beam_size: int = 1
    length_penalty: float = 1.0
    n_best: int = 1
    sampling_topk: int = 1
    sampling_topp: float = 1.0
    sampling_temperature: float = 1.0
    seed: int | None = None
    max_length: int | None = None
    min_length: int = 0

    def __post_init__(self) -> None:
        check_positive_int("beam_size", self.beam_size)
        check_positive_int("n_best", self.n_best)
        check_non_negative_int("sampling_topk", self.sampling_topk)
        for name in ("length_penalty", "sampling_topp", "sampling_temperature"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Real):
                raise TypeError(f"`{name}` must be a float, received {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"`{name}` must be finite, received {value!r}")
        if not 0.0 < self.sampling_topp <= 1.0:
            raise ValueError(f"`sampling_topp` must be in (0, 1], received {self.sampling_topp!r}")
        if self.sampling_temperature <= 0.0:
            raise ValueError(f"`sampling_temperature` must be > 0, received {self.sampling_temperature!r}")
        if self.seed is not None:
            check_non_negative_int("seed", self.seed)
        if self.max_length is not None:
            check_positive_int("max_length", self.max_length)
        check_non_negative_int("min_length", self.min_length)
        if self.max_length is not None and self.min_length > self.max_length:
            raise ValueError(
                f"`min_length`={self.min_length} is above `max_length`={self.max_length}: no translation could end"
            )
        if self.sampling_topk != 1 and self.beam_size > 1:
            raise ValueError(
                f"sampling (`sampling_topk`={self.sampling_topk}) draws one hypothesis a sentence and takes no beams, "
                f"received `beam_size`={self.beam_size}"
            )
        if self.sampling_topk == 1 and (self.sampling_topp != 1.0 or self.sampling_temperature != 1.0):
            raise ValueError(
                f"`sampling_topp`={self.sampling_topp!r} and `sampling_temperature`={self.sampling_temperature!r} "
                "shape sampling, which `sampling_topk`=1 (take the most probable token) does not do: give "
                "`sampling_topk`=0 (every token) or more than 1"
            )
        if self.n_best > self.beam_size:
            raise ValueError(
                f"n-best lists come from a beam at least as wide: received `n_best`={self.n_best} with "
                f"`beam_size`={self.beam_size}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def strategy(self) -> Strategy:
        """The entry of :data:`SEARCHES` that searches with these options."""
        if self.beam_size > 1:
            return SEARCHES["beam"]
        return SEARCHES["greedy" if self.sampling_topk == 1 else "sample"]

    def limit(self, max_len: Limit, batch: int) -> np.ndarray:
        """Each row's length limit, int64 ``(B,)``: ``max_len`` (one, or one per row), at most :attr:`max_length`."""
        limits = row_limits(max_len, batch)
        return limits if self.max_length is None else np.minimum(limits, self.max_length)


def search_options(search: SearchOptions | None, *, beam_size: int = 1, length_penalty: float = 1.0) -> SearchOptions:
    """A ``generate`` call's options: ``search``, or its loose ``beam_size`` and ``length_penalty`` (not both)."""
    if search is None:
        return SearchOptions(beam_size=beam_size, length_penalty=length_penalty)
    if not isinstance(search, SearchOptions):
        raise TypeError(f"`search` must be a SearchOptions or None, received {type(search).__name__}")
    if (beam_size, length_penalty) != (1, 1.0):
        raise ValueError(
            "give the search once: `search` or `beam_size`/`length_penalty`, received search and "
            f"beam_size={beam_size!r}, length_penalty={length_penalty!r}"
        )
    return search


@dataclass(frozen=True)
class Generation:
    """Everything generation reads besides the model and the sources, checked when made (and against a model's
    vocabulary by :meth:`check`): the one argument a ``generate`` call, a translator or a stream passes on.

    Attributes:
        specials: the special ids: ``bos`` starts every target sequence (the decoder's start token), ``eos`` ends
            it, ``pad`` fills a row after its end.
        banned: tokens no search ever chooses (their logits are ``-inf`` at every step, before the softmax).
        forced: tokens every translation starts with, after ``bos`` (a multilingual model's target-language code):
            each is the only token a row may take at its place. They are part of the translation, and count towards
            its ``min_length`` and length limit.
        eos_at_limit: a translation that reaches its length limit ends with EOS: EOS is the only token a row may take
            at its last place (Hugging Face's ``forced_eos_token_id``). ``False``: it stops there without one.
        search: how the tokens are chosen, and the length limits (:class:`SearchOptions`).

    ``to_dict``/``from_dict`` write and read it as JSON values (what a run stores; a missing key takes its default).
    """

    specials: Specials = Specials()
    banned: Sequence[int] = ()  # kept as a tuple
    forced: Sequence[int] = ()  # kept as a tuple
    eos_at_limit: bool = False
    search: SearchOptions = SearchOptions()

    def __post_init__(self) -> None:
        check_flag("eos_at_limit", self.eos_at_limit)
        if not isinstance(self.specials, Specials):
            raise TypeError(f"`specials` must be a Specials, received {type(self.specials).__name__}")
        if not isinstance(self.search, SearchOptions):
            raise TypeError(f"`search` must be a SearchOptions, received {type(self.search).__name__}")
        for name in ("banned", "forced"):
            tokens = getattr(self, name)
            if isinstance(tokens, str) or not isinstance(tokens, list | tuple):
                raise TypeError(f"`{name}` must be a list of token ids, received {tokens!r}")
            for token in tokens:
                check_non_negative_int(name, token)
            object.__setattr__(self, name, tuple(tokens))  # JSON gives a list
        never = sorted(set(self.forced) & set(self.banned))
        if never:
            raise ValueError(f"`banned` holds {never}, which `forced` makes every translation start with")
        if self.specials.eos in self.banned:
            raise ValueError(f"`banned` holds the EOS {self.specials.eos}: no translation could end before its limit")

    def check(self, vocab: int) -> None:
        """Refuse ids that are not tokens of a target vocabulary of ``vocab`` tokens."""
        named = [(f"specials.{name}", getattr(self.specials, name)) for name in ("pad", "bos", "eos")]
        for name, token in [*named, *(("banned", t) for t in self.banned), *(("forced", t) for t in self.forced)]:
            if token >= vocab:
                raise ValueError(f"`{name}` must be a target token (< {vocab}), received {token}")

    def to_dict(self) -> dict[str, Any]:
        return {"specials": dataclasses.asdict(self.specials), "banned": list(self.banned),
                "forced": list(self.forced), "eos_at_limit": self.eos_at_limit,
                "search": self.search.to_dict()}  # fmt: skip

    @classmethod
    def from_dict(cls, values: object) -> Generation:
        if not isinstance(values, dict):
            raise TypeError(f"a generation spec must be a JSON object, received {type(values).__name__}")
        unknown = sorted(set(values) - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(
                f"unknown generation keys {unknown}; known keys are specials, banned, forced, eos_at_limit, search"
            )
        parts = dict(values)
        for name, kind in (("specials", Specials), ("search", SearchOptions)):
            if name in parts:
                if not isinstance(parts[name], dict):
                    raise TypeError(f"`{name}` must be a JSON object, received {parts[name]!r}")
                parts[name] = kind(**parts[name])
        return cls(**parts)


class Choices(Protocol):
    """How tokens are chosen from a step's logits, where the model computes: only the chosen ids and scores reach the
    host."""

    def argmax(self, logits: Tensor) -> np.ndarray:
        """The most probable token of each row of ``logits (N, V)``: int64 ``(N,)`` on the host."""
        ...

    def top_k(
        self, logits: Tensor, scores: np.ndarray, beam: int, count: int, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``count`` best continuations of each sentence's ``beam`` rows: ``scores`` added to the
        log-probabilities of the rows ``rows`` of ``logits`` (int64 ``(S * beam,)``, each sentence's rows one after
        the other; default: every row of ``logits (N, V)``, in order), the best over each sentence's ``beam * V``
        candidates, best first. Their scores (float32) and indices (int64, ``beam_row * V + token``, ``beam_row``
        counted among the sentence's rows), ``(S, count)`` each, on the host."""
        ...

    def suppress(self, logits: Tensor, tokens: np.ndarray, rows: np.ndarray | None = None) -> Tensor:
        """``logits (N, V)`` as a step gives them with ``tokens`` (int64 ids) impossible in rows ``rows`` (int64
        indices; default: every row), their probability going to the other tokens."""
        ...

    def log_probs_at(self, logits: Tensor, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The log-probabilities of ``tokens`` (int64 ids ``(T,)``) in rows ``rows`` (int64 ``(R,)``) of ``logits
        (N, V)``: float32 ``(R, T)`` on the host (a constrained search's candidates beside its best)."""
        ...


class Steps(Choices, Protocol):
    """What a front end's Transformer supplies for decoding (its ``decoder_steps()``): the parts of its forward pass
    that the rows of :mod:`multihead.engine` run, on arguments already checked."""

    def encode(self, src: Tensor, src_key_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """``src (N, Ls)`` encoded: the memory ``(N, Ls, E)`` and its key mask ``(N, Ls)`` (from the model's pad id
        when not given; ``None``: every position real)."""
        ...

    def project_memory(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every decoder layer's cross-attention keys and values ``(N, Hkv, Ls, D)`` of ``memory (N, Ls, E)``."""
        ...

    def step(
        self,
        tokens: Tensor,
        cache: DecoderCaches,
        memory_key_mask: Tensor | None,
        self_key_mask: Tensor | None = None,
    ) -> Tensor:
        """Logits ``(N, V)`` (float32) of the token after ``tokens (N, 1)``, which take the positions ``cache.length``
        (one for all rows, or one per row ``(N,)``) after the tokens ``cache`` holds; ``tokens`` extend it. It holds
        the projected memory too, whose key mask is ``memory_key_mask (N, Ls)``. ``self_key_mask (N|1, L)``: the keys
        each row attends of those the self-attention caches give (default: all; rows that joined at different steps
        attend only their own)."""
        ...

    def recompute(self, prefix: Tensor, memory: Tensor, memory_key_mask: Tensor | None) -> Tensor:
        """Logits ``(N, V)`` of the token after each whole ``prefix (N, t)``, without a cache."""
        ...

    def take(self, x: Tensor, rows: np.ndarray) -> Tensor:
        """Rows ``rows`` of ``x``'s first axis."""
        ...

    def tensor(self, array: np.ndarray) -> Tensor:
        """A NumPy array as a tensor where the model computes."""
        ...


class Chooser:
    """:class:`Choices` made by another object's, ``choices`` (a front end's decoding steps, an ensemble's first
    member): what rows choose with."""

    choices: Choices

    def argmax(self, logits: Tensor) -> np.ndarray:
        return self.choices.argmax(logits)

    def top_k(
        self, logits: Tensor, scores: np.ndarray, beam: int, count: int, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        return self.choices.top_k(logits, scores, beam, count, rows)

    def suppress(self, logits: Tensor, tokens: np.ndarray, rows: np.ndarray | None = None) -> Tensor:
        return self.choices.suppress(logits, tokens, rows)

    def log_probs_at(self, logits: Tensor, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return self.choices.log_probs_at(logits, rows, tokens)


class DecodingSession(Chooser):
    """The rows of one ``generate`` call over a model's :class:`Steps` (a :class:`multihead.engine.Rows`): the encoder
    memory ``(N, Ls, E)`` (without a cache) or the decoder's cache with the memory projected into it, and the memory's
    key mask ``(N, Ls)`` (``None``: every position real). ``cache``: a model's empty
    :class:`~multihead.cache.DecoderCache` (``None``: every step recomputes the whole prefix, which the session keeps).
    Its rows hold the sources they were made with: none join later. Where the cache can
    (:attr:`~multihead.cache.DecoderCache.shares_memory`), it holds each source's projected memory once, whatever
    the rows extending it (a beam-search sentence's beams), and the key mask is one per source."""

    def __init__(
        self, steps: Steps, memory: Tensor, memory_key_mask: Tensor | None, cache: DecoderCache | None
    ) -> None:
        self.steps = self.choices = steps
        self.memory = memory
        self.memory_key_mask = memory_key_mask
        self.cache = cache
        self.prefix: np.ndarray | None = None  # (N, t) the tokens so far, without a cache
        self.sources: np.ndarray | None = None  # (N,) the memory slot each row reads, where the cache shares them
        if cache is not None:
            for cross_cache, (keys, values) in zip(cache.cross_attention, steps.project_memory(memory), strict=True):
                cross_cache.append(keys, values)
            if cache.shares_memory:
                self._read(np.arange(int(memory.shape[0])), None)
            self.memory = None

    def _read(self, sources: np.ndarray, slots: np.ndarray | None) -> None:
        """Rows read memory slots ``sources``, once the cache keeps slots ``slots`` (``None``: all it holds)."""
        assert self.cache is not None
        self.sources = sources
        held = int(sources.max()) + 1 if len(sources) else 0
        self.cache.keep_memory(slots, memory_rows(sources, held, self.steps.tensor))

    def step(self, tokens: np.ndarray) -> Tensor:
        """Logits ``(N, V)`` of every row's next token after its newest, ``tokens (N,)``."""
        if self.cache is None:
            column = tokens[:, None]  # (N, 1)
            self.prefix = column if self.prefix is None else np.concatenate([self.prefix, column], axis=1)
            return self.steps.recompute(self.steps.tensor(self.prefix), self.memory, self.memory_key_mask)
        return self.steps.step(self.steps.tensor(tokens[:, None]), self.cache, self.memory_key_mask)

    def keep(self, rows: np.ndarray, *, same_sources: bool = False) -> None:
        """Keep rows ``rows``, in that order, of everything the session holds (:meth:`multihead.engine.Rows.keep`)."""
        if self.sources is not None:  # the memory stays in its slots: only those no row reads any more go
            assert self.cache is not None
            self.cache.reorder(rows, same_sources=True)
            read = self.sources[rows]  # (N,) the slot each kept row reads
            slots, sources = kept_sources(read)
            if len(slots) == int(self.sources.max()) + 1:
                self._read(read, None)
                return
            self._read(sources, slots)
            if self.memory_key_mask is not None:
                self.memory_key_mask = self.steps.take(self.memory_key_mask, slots)
            return
        if self.cache is not None:
            self.cache.reorder(rows, same_sources=same_sources)
        if self.prefix is not None:
            self.prefix = self.prefix[rows]
        if same_sources:
            return
        if self.memory is not None:
            self.memory = self.steps.take(self.memory, rows)
        if self.memory_key_mask is not None:
            self.memory_key_mask = self.steps.take(self.memory_key_mask, rows)


def process(
    choices: Choices,
    logits: Tensor,
    lengths: np.ndarray,
    generation: Generation,
    forced: Sequence[Sequence[int]] | None = None,
    limits: np.ndarray | None = None,
    floors: np.ndarray | None = None,
) -> Tensor:
    """A step's ``logits (N, V)`` for rows that have made ``lengths (N,)`` tokens (BOS aside), with what
    ``generation`` makes impossible ``-inf`` (see the module's docstring): the one place where a step's logits are
    processed, for every search and for a stream whose rows sit at lengths of their own. ``forced``: each row's own
    forced tokens instead of ``generation``'s (a stream's sentences, each into a language of its own). ``limits``:
    each row's length limit ``(N,)``, which ``eos_at_limit`` needs. ``floors``: each row's own ``min_length`` ``(N,)``
    instead of the search's (sentences searched each as they ask)."""
    last = np.zeros(len(lengths), dtype=bool)  # (N,) the rows at their last place, where EOS is forced
    if generation.eos_at_limit:
        if limits is None:
            raise ValueError("`eos_at_limit` ends each row at its length limit: give the rows' `limits`")
        last = lengths == limits - 1
    if generation.banned:
        logits = choices.suppress(logits, np.asarray(generation.banned, dtype=np.int64))
    if forced is None:
        forced_at = [(place, token, np.flatnonzero((lengths == place) & ~last))
                     for place, token in enumerate(generation.forced)]  # fmt: skip
    else:
        due: dict[tuple[int, int], list[int]] = {}  # (place, token) -> the rows that must take it now
        for row in np.flatnonzero((lengths < max(map(len, forced), default=0)) & ~last).tolist():
            if lengths[row] < len(forced[row]):
                due.setdefault((int(lengths[row]), forced[row][lengths[row]]), []).append(row)
        forced_at = [(place, token, np.asarray(rows, dtype=np.int64)) for (place, token), rows in due.items()]
    forced_at += [(-1, generation.specials.eos, np.flatnonzero(last))]  # a row's last place: EOS
    for _, token, rows in forced_at:
        if len(rows):
            others = np.delete(np.arange(int(logits.shape[-1]), dtype=np.int64), token)
            logits = choices.suppress(logits, others, None if len(rows) == len(lengths) else rows)
    floors = np.asarray(generation.search.min_length if floors is None else floors)
    if floors.any():
        rows = np.flatnonzero((lengths < floors) & ~last)
        if len(rows):
            eos = np.array([generation.specials.eos], dtype=np.int64)
            logits = choices.suppress(logits, eos, None if len(rows) == len(lengths) else rows)
    return logits


def row_limits(max_len: Limit, batch: int) -> np.ndarray:
    """``max_len`` (checked: :func:`multihead.checks.check_generate_call`) as each row's limit, int64 ``(B,)``."""
    return np.broadcast_to(np.asarray(max_len, dtype=np.int64), (batch,))


def sentence_generators(seed: int | None, keys: Sequence[int] | np.ndarray) -> list[np.random.Generator]:
    """A random generator for each sentence key, seeded by ``seed`` and the key (a fresh ``seed`` when ``None``)."""
    seed = seed if seed is not None else secrets.randbits(64)
    return [np.random.default_rng([seed, int(key)]) for key in keys]


def sample(
    choices: Choices,
    logits: Tensor,
    generators: Sequence[np.random.Generator],
    options: SearchOptions,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """One token for each of the rows ``rows`` of ``logits (N, V)`` (default: every row), drawn as ``options`` say,
    the ``i``-th with ``generators[i]``: int64, one per row drawn."""
    vocab, count_rows = int(logits.shape[-1]), len(generators)
    count = vocab if options.sampling_topk == 0 else min(options.sampling_topk, vocab)
    scores = np.zeros(count_rows, dtype=np.float32)
    values, tokens = choices.top_k(logits, scores, 1, count, rows)  # (n, k) best first
    uniforms = np.array([generator.random() for generator in generators])  # (n,)
    drawn = draw(values, uniforms, temperature=options.sampling_temperature, top_p=options.sampling_topp)
    return tokens[np.arange(count_rows), drawn]


def draw(log_probs: np.ndarray, uniforms: np.ndarray, *, temperature: float, top_p: float) -> np.ndarray:
    """For each row of candidates' log-probabilities, best first ``(N, k)``, the index of the candidate that the
    uniform draw ``uniforms (N,)`` in [0, 1) picks from their distribution ``p ** (1 / temperature)`` cut to the
    fewest best whose (renormalised) probability reaches ``top_p``: ``(N,)``."""
    scaled = log_probs.astype(np.float64) / temperature
    probs = np.exp(scaled - scaled[:, :1])  # the best is 1: no overflow; impossible candidates 0
    probs /= probs.sum(axis=1, keepdims=True)
    if top_p < 1.0:
        before = np.cumsum(probs, axis=1) - probs  # the probability of the better candidates
        probs = np.where(before < top_p, probs, 0.0)
    cumulative = np.cumsum(probs, axis=1)
    # The first candidate whose cumulative probability reaches the draw (never one of probability 0).
    return (cumulative < uniforms[:, None] * cumulative[:, -1:]).sum(axis=1)


@dataclass(frozen=True)
class Strategy:
    """A search strategy of :class:`multihead.engine.Engine`: its ``name``, and what it asks of the code that runs it:
    ``one_row``, one row a sentence (beam search keeps several); ``draws``, the tokens drawn at random (each sentence
    seeded by its key)."""

    name: str
    one_row: bool
    draws: bool


SEARCHES: dict[str, Strategy] = {
    strategy.name: strategy
    for strategy in (
        Strategy("greedy", one_row=True, draws=False),
        Strategy("sample", one_row=True, draws=True),
        Strategy("beam", one_row=False, draws=False),
    )
}
"""The search strategies by name; :attr:`SearchOptions.strategy` chooses one."""
