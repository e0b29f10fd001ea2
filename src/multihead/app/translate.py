"""Translating with a trained run: many sentences in length-sorted batches, and one sentence's cross-attention.

The run's checkpoint holds everything needed (config, weights, tokenizers): the training corpus is never read.
Every line gives one line: a blank line a blank one. A line is translated sentence by sentence
(:mod:`multihead.app.segment`), as models learnt to translate, and a guard searches again a sentence whose
translation looks as if it lost or invented text (:func:`doubt`).

Notation: B batch, Ls source length, T generated length, H heads, Lt target length.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from textwrap import shorten
from typing import Any, TypeVar

import numpy as np

from multihead.app.console import UserError, progress_bar, warn
from multihead.app.languages import LanguageTokens, pair_text
from multihead.app.runs import WEIGHTS, Checkpoint, open_checkpoint
from multihead.app.segment import halved, join, readable, shorter, split, whole
from multihead.app.tokenizers import SentencePieceTokenizer, Tokenizer, digest
from multihead.decoding import Generation, SearchOptions, Specials
from multihead.engine import Ensemble, generate, n_best_search

Ids = list[int]
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
GUARD_BEAM = 4
"""The beam with which the guard searches again a translation it doubts (:meth:`Translator.joined`)."""
SHORTEST, LONGEST, GUARDED = 0.4, 3.0, 6
"""A translation of a source of at least ``GUARDED`` tokens is doubted when it has fewer than ``SHORTEST`` or more
than ``LONGEST`` times its source's tokens (:func:`doubt`)."""
REPEATS = 4
"""A translation is doubted when the same run of one to four tokens comes this many times in a row."""
BATCH_TOKENS = 6000
"""Source tokens per translation batch on a CPU (divided by the beam): large batches amortise each decoding step's
fixed cost."""
CUDA_BATCH_TOKENS = 24000
"""The same on a GPU, where a decoding step costs mostly the launching of its kernels, whatever the batch."""


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


def speed_text(count: int, unit: str, tokens: int, seconds: float) -> str:
    """How fast a batch job went: ``22 sentences in 0.3 s (73.3 sentences/s, 1034 tokens/s)``; ``tokens`` are
    target tokens (generated or scored, EOS included)."""
    seconds = max(seconds, 1e-9)
    return (
        f"{count} {unit if count == 1 else unit + 's'} in {seconds:.1f} s ({count / seconds:.1f} {unit}s/s, "
        f"{tokens / seconds:.0f} tokens/s)"
    )


@dataclass
class Cut:
    """One text as the model reads it (:meth:`Translator.pieces`): its pieces' token ids (a sentence each; a
    sentence longer than the model reads, several), each piece's source text, and the whitespace around the pieces
    (one more than they; see :mod:`multihead.app.segment`). A blank text has no piece."""

    ids: list[Ids]
    sources: list[str]
    gaps: list[str]


@dataclass(frozen=True)
class Translated:
    """Texts' translations and, for each text, the sentences (source, why) whose translation the guard still doubts
    (:meth:`Translator.joined`)."""

    texts: list[str]
    doubtful: list[list[tuple[str, str]]]


def repeats(tokens: Sequence[int], times: int = REPEATS) -> bool:
    """Whether a run of one to four tokens comes ``times`` times in a row in ``tokens`` ("black black black black")."""
    for width in range(1, 5):
        for start in range(len(tokens) - width * times + 1):
            run = tokens[start : start + width]
            if all(tokens[start + width * k : start + width * (k + 1)] == run for k in range(1, times)):
                return True
    return False


def doubt(source: Ids, translated: Ids, eos: int, room: int) -> str | None:
    """Why ``translated`` (as :func:`translation` gives it, at most ``room`` tokens) looks as if it lost or invented
    text of its ``source`` (token ids), or ``None``: it never ended (its length limit cut it, or a model that ends
    every translation there ended it), it is far shorter or longer than its source (:data:`SHORTEST`,
    :data:`LONGEST`), or it repeats itself (:func:`repeats`)."""
    if not translated or translated[-1] != eos or len(translated) >= room:
        return "it did not end within its length limit"
    words, read = len(translated) - 1, len(source)
    if read >= GUARDED and words < SHORTEST * read:
        return f"{words} tokens for a source of {read}"
    if words > LONGEST * max(read, GUARDED):
        return f"{words} tokens for a source of {read}"
    if repeats(translated[:-1]):
        return "it repeats itself"
    return None


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


def language_pair(
    tokens: LanguageTokens,
    source_side: Tokenizer,
    generation: Generation,
    langs: Sequence[str] | None,
    source: str | None,
    target: str | None,
) -> tuple[Tokenizer, Generation, list[str]]:
    """The source tokenizer, generation and languages (``langs``: the run's) that translate from ``source`` into
    ``target`` (``None``: the run's; an ISO code or the model's own, see :meth:`LanguageTokens.choose`), two of the
    languages of a model that marks them with tokens: M2M100's and NLLB's source tokenizer's prefix and forced token
    become theirs, a multilingual OPUS-MT model's sources start with the target's (``tokens``: the model's language
    tokens, :meth:`LanguageTokens.of`). ``ValueError`` for a language it lacks."""
    if not isinstance(source_side, SentencePieceTokenizer):
        raise ValueError("the model marks no languages with tokens")
    source_side = copy.copy(source_side)
    recorded: Sequence[str | None] = langs or (None, None)
    if source is not None and tokens.sources:
        source = tokens.choose(source, target=False)
        source_side.prefix = [tokens.sources[source]]
    elif source is not None and source != recorded[0] and recorded[0] not in (None, "mul"):
        raise ValueError(f"this model reads {recorded[0]} (its sources carry no language token)")
    if target is not None:
        target = tokens.choose(target, target=True)
        if tokens.forced_target:
            generation = replace(generation, forced=(tokens.targets[target],))
        else:
            source_side.prefix = [tokens.targets[target]]
    chosen = [code and tokens.public(code, target=side == 1) for side, code in enumerate((source, target))]
    return source_side, generation, [chosen[0] or recorded[0] or "mul", chosen[1] or recorded[1] or "mul"]


def moses_normalizer() -> Callable[[str], Any]:
    """Moses' punctuation normalizer of a language (``sacremoses.MosesPunctNormalizer``, made once per language),
    refused in one line where ``sacremoses`` is not installed."""
    try:
        import sacremoses
    except ImportError:
        raise UserError("--normalize moses needs sacremoses: pip install sacremoses") from None
    return functools.lru_cache(maxsize=None)(lambda lang: sacremoses.MosesPunctNormalizer(lang=lang))


def model_tokens(checkpoint: Checkpoint) -> str:
    """A digest of the tokens a run's model reads and writes (:func:`multihead.app.tokenizers.digest`), less the
    language token its tokenizers open each text with: the pair a run of a many-language model chose, not its
    model."""
    sides = [copy.copy(tokenizer) for tokenizer in (checkpoint.source, checkpoint.target)]
    for side in sides:
        if isinstance(side, SentencePieceTokenizer):
            side.prefix = []
    return digest(*sides)


class Translator:
    """A run's checkpoint, loaded in PyTorch (whatever trained it) on ``device`` (see
    :mod:`multihead.app.devices`), ready to translate. ``quantize`` (``"int8"`` or ``"bf16"``) computes the linear
    layers in that type (:func:`multihead.torch.quantize`, on the CPU), for translations, scores and attention maps
    alike. ``source_lang`` and ``target_lang``: another pair of a many-to-many model's languages than the run's
    (:meth:`choose_languages`). ``ensemble``: other runs of the same vocabularies whose models translate with this
    one's (:class:`multihead.engine.Ensemble`), each from its checkpoint ``checkpoint`` names, on the same device and
    quantized alike; this run's tokenizers, generation and languages are the ensemble's. ``split_sentences``:
    translate each text sentence by sentence (the default), else as one sentence (sources already split into
    sentences). ``guard``:
    search again the translations that look as if they lost or invented text, and name those that still do (the
    default; :meth:`joined`), else take them as the search finds them."""

    def __init__(
        self,
        run: str | Path,
        checkpoint: str | None = None,
        *,
        device: str | None = None,
        quantize: str | None = None,
        source_lang: str | None = None,
        target_lang: str | None = None,
        normalize: str | None = None,
        ensemble: Sequence[str | Path] = (),
        split_sentences: bool = True,
        guard: bool = True,
    ) -> None:
        import torch

        from multihead.app.devices import resolve_device
        from multihead.app.memory import keep_freed_memory
        from multihead.io import load_weights
        from multihead.torch import Layouts, Transformer
        from multihead.torch import quantize as quantize_model

        self.device = torch.device(resolve_device(device or "auto"))
        if quantize is not None and self.device.type != "cpu":
            raise UserError(f"--quantize {quantize} runs on the CPU (oneDNN's kernels): add --device cpu")

        def load(found: Checkpoint) -> Any:
            model = Transformer.from_config(found.config).eval()
            load_weights(model, found.path / WEIGHTS)
            return model.to(self.device)

        self.checkpoint, self.model = open_checkpoint(Path(run), checkpoint, load)
        if self.device.type == "cpu":  # a step's logits, (rows, vocabulary), would take fresh pages at every step;
            keep_freed_memory()  # from here on, not while loading, which frees what no step will reuse
        if quantize is not None:
            quantize_model(self.model, quantize)
        self.layouts = Layouts()
        """The model's weights laid out for decoding, once for every session: a translator never changes them."""
        self.source, self.target = self.checkpoint.source, self.checkpoint.target
        self.generation: Generation = self.checkpoint.generation
        """What this run generates with (its special ids, banned and forced tokens), whatever the search."""
        self.specials: Specials = self.generation.specials
        self.longest_target = int(self.checkpoint.trainer["data"].get("longest_target", 0))
        self.langs: list[str] | None = self.checkpoint.options.get("langs")  # [source, target], when recorded
        self.batch_tokens = CUDA_BATCH_TOKENS if self.device.type == "cuda" else BATCH_TOKENS
        self.tokens = 0
        """Target tokens this translator has generated or scored so far, EOS included: what speeds count."""
        self.torch = torch
        self.normalizer = moses_normalizer() if normalize == "moses" else None
        """What the sources' punctuation goes through first (``normalize="moses"``), if anything."""
        self.split = split_sentences and self.checkpoint.options.get("task") is None  # a task's inputs: no sentences
        self.guard = guard  # see the class's docstring: :meth:`pieces` and :meth:`joined` read them
        self.others = [Translator(other, checkpoint, device=device, quantize=quantize) for other in ensemble]
        """The ensemble's other members (:meth:`session`): their models, and their lengths (:meth:`limit`)."""
        for other in self.others:
            self._check_member(other)
        self.max_len = min(member.checkpoint.config.max_len for member in (self, *self.others))
        """The most tokens a source may have: what every member's model reads."""
        if source_lang is not None or target_lang is not None:
            self.choose_languages(source_lang, target_lang)

    def _check_member(self, other: Translator) -> None:
        """Refuse, in one line, a run whose model reads or writes other tokens than this one's (whatever pair of a
        many-language model's languages each run chose: the ensemble translates this run's)."""
        mine, theirs = self.checkpoint, other.checkpoint
        same = model_tokens(mine) == model_tokens(theirs)
        if not same or mine.config.tgt_vocab != theirs.config.tgt_vocab:
            what = "their vocabularies differ" if not same else "their output layers differ"
            raise UserError(
                f"cannot ensemble {str(theirs.path.parents[1])!r} with {str(mine.path.parents[1])!r}: {what} (an "
                "ensemble's runs read and write the same tokens: train them with --vocab-from one of them)"
            )

    @property
    def runs(self) -> list[Checkpoint]:
        """The checkpoint of each run that translates: this one's, then the ensemble's others'."""
        return [self.checkpoint, *(other.checkpoint for other in self.others)]

    def release(self) -> None:
        """Let go of the model (``serve --max-loaded``): the run's languages and tokenizers stay, nothing translates
        until a new translator of the run is made."""
        self.model = None
        self.layouts = self.layouts.__class__()

    def choose_languages(self, source: str | None, target: str | None, *, named: str | None = None) -> None:
        """Translate from ``source`` and into ``target`` (see :func:`language_pair`); refused in one line, naming
        what chose them as ``named`` says (default: ``--source-lang``/``--target-lang``)."""
        given = named or " ".join(f"{flag} {code}" for flag, code in (("--source-lang", source),
                                  ("--target-lang", target)) if code is not None)  # fmt: skip
        tokens = self.language_tokens
        if tokens is None:
            pair = pair_text(self.langs, task=self.checkpoint.options.get("task"))
            raise UserError(f"{given}: this run translates {pair} only; its model marks no languages with tokens "
                            "(M2M100, NLLB-200 and multilingual OPUS-MT models do)")  # fmt: skip
        try:
            self.source, self.generation, self.langs = language_pair(
                tokens, self.source, self.generation, self.langs, source, target
            )
        except ValueError as error:
            raise UserError(f"{given}: {error}") from None

    def for_languages(self, source: str | None, target: str | None) -> Translator:
        """This translator between ``source`` and ``target`` (:meth:`choose_languages`), sharing its model, layouts
        and device: ``serve``'s translator of one request's pair."""
        other = copy.copy(self)
        other.choose_languages(source, target)
        return other

    def splitting(self, split: bool) -> Translator:
        """This translator, translating texts sentence by sentence or whole as ``split`` says (:attr:`split`),
        sharing its model: a ``serve`` request's own choice."""
        if split == self.split:
            return self
        other = copy.copy(self)
        other.split = split
        return other

    @functools.cached_property
    def language_tokens(self) -> LanguageTokens | None:
        """The language tokens of this run's model, if it translates between many languages (read once from its
        vocabularies, which choosing languages leaves as they are; a translator of another pair shares them)."""
        return LanguageTokens.of(getattr(self.source, "vocabulary", {}), getattr(self.target, "vocabulary", {}))

    def _unit(self) -> str:
        return {"char": "characters", "word": "words"}.get(self.source.kind, "subword tokens")

    def _encode(self, text: str, name: str, *, target: bool = False) -> Ids:
        """The ids of ``text`` (a source, or with ``target`` a translation), with a warning naming what the
        vocabulary lacks."""
        ids, unknown = (self.target if target else self.source).encode(text)
        if unknown:
            shown = ", ".join(repr(piece) for piece in dict.fromkeys(unknown))
            warn(f"{name}: {shown} not in the model's vocabulary, read as <unk>")
        return ids

    def normalized(self, text: str) -> str:
        """A source ``text`` as the model reads it: through the punctuation normalizer, where there is one, for the
        source's language."""
        if self.normalizer is None or not text.strip():
            return text
        return str(self.normalizer((self.langs or ["en"])[0].split("-")[0]).normalize(text))

    def _cut(self, text: str, name: str) -> Cut:
        """``text`` as the pieces the model reads: its sentences (:func:`multihead.app.segment.split`; the whole text
        with :attr:`split` off), a sentence longer than the model reads in parts split at its clauses, then between
        its words (:func:`multihead.app.segment.shorter`; a word too long alone is cut), with one warning naming
        it."""
        if not readable(text):  # blank, or marks alone: kept as they are (:meth:`joined`)
            return Cut([], [], [text])
        text, max_len = self.normalized(text), self.max_len
        found = split(text, self.langs[0] if self.langs else None) if self.split else whole(text)

        def fits(part: str) -> bool:
            return len(self.source.encode(part)[0]) <= max_len

        cut, unknown = Cut([], [], [found.gaps[0]]), list[str]()
        longest, parted, count, cut_words = 0, 0, 0, False
        for sentence, gap in zip(found.sentences, found.gaps[1:], strict=True):
            ids, missing = self.source.encode(sentence)
            unknown += missing
            parts = [(sentence, ids)]
            if len(ids) > max_len:
                parts = [(part, self.source.encode(part)[0]) for part in shorter(sentence, fits)]
                cut_words = cut_words or any(len(part_ids) > max_len for _, part_ids in parts)
                parts = [(part, part_ids[:max_len]) for part, part_ids in parts]
                longest, parted, count = max(longest, len(ids)), parted + 1, count + len(parts)
            for index, (part, part_ids) in enumerate(parts):
                cut.ids.append(part_ids)
                cut.sources.append(part)
                cut.gaps.append(gap if index == len(parts) - 1 else " ")
        if unknown:
            shown = ", ".join(repr(piece) for piece in dict.fromkeys(unknown))
            warn(f"{name}: {shown} not in the model's vocabulary, read as <unk>")
        if parted:
            what = "a sentence" if parted == 1 else f"{parted} sentences"
            how = f"cut to its first {max_len}"  # a word alone
            if count > parted:
                how = f"translated in {count} parts split at sentence ends, clauses or words"
                how += f", a word longer than that cut to its first {max_len}" if cut_words else ""
            warn(f"{name}: {what} longer than this model reads ({longest} {self._unit()}, at most {max_len}): {how}")
        return cut

    def pieces(self, texts: Sequence[str], names: Sequence[str] | None = None) -> tuple[list[Cut], list[Ids]]:
        """Each text cut into the pieces the model reads (:meth:`_cut`; a blank text has none, warnings name each
        text as ``names`` say), and all of their pieces' ids in one list, in order."""
        names = names or [f"text {i + 1}" for i in range(len(texts))]
        cuts = [self._cut(text, name) for text, name in zip(texts, names, strict=True)]
        return cuts, [ids for cut in cuts for ids in cut.ids]

    def limit(self, source_length: int) -> int:
        """How many tokens a translation of ``source_length`` tokens may take (:func:`length_limit`; in an ensemble,
        the fewest any member allows)."""
        own = length_limit(source_length, self.longest_target, self.checkpoint.config.max_len)
        return min([own, *(other.limit(source_length) for other in self.others)])

    def limits(self, search: SearchOptions) -> Callable[[int], int]:
        """How many tokens a translation of a source's length may take under ``search``: its ``max_length`` where it
        sets one (more than :meth:`limit` allows, too), within the positions the model has; else :meth:`limit`."""
        if search.max_length is None:
            return self.limit
        most = min(search.max_length, self.max_len - 1)
        return lambda source_length: most

    def batch_size(self, search: SearchOptions) -> int:
        """Source tokens per batch for ``search``: the device's, divided by the beams."""
        return self.batch_tokens // search.beam_size

    def session(self, src: np.ndarray, limits: np.ndarray) -> Any:
        """A decoding session of ``src (B, Ls)`` for rows limited to ``limits (B,)``, stepping with this translator's
        layouts (an :class:`~multihead.engine.Ensemble` of every member's, in an ensemble); inside
        ``torch.inference_mode()``."""
        source = self.torch.from_numpy(src).to(self.device)
        sessions = [
            member.model.decoding_session(source, max_len=int(limits.max()), layouts=member.layouts)
            for member in (self, *self.others)
        ]
        return Ensemble(sessions, sessions[0].steps.mean_log_probs) if self.others else sessions[0]

    def stream_rows(self) -> Any:
        """The rows a stream decodes this translator's sentences over (:class:`multihead.torch.streaming.StreamRows`,
        stepping with its layouts; an :class:`~multihead.engine.Ensemble` of every member's, in an ensemble)."""
        from multihead.torch.streaming import StreamRows

        members = [StreamRows(member.model, member.layouts, pad=self.specials.pad) for member in (self, *self.others)]
        return Ensemble(members, members[0].steps.mean_log_probs) if self.others else members[0]

    def spec(self, search: SearchOptions) -> Generation:
        """This run's generation, searching as ``search`` says."""
        return replace(self.generation, search=search)

    def generate(self, search: SearchOptions = TRANSLATION) -> Generate:
        """What translates a batch as ``search`` says (one translation a sentence): ``src (B, Ls)``, each row's length
        limit and index in the input (which seeds its sampling) -> tokens ``(B, T)`` as generated."""
        torch, spec = self.torch, self.spec(search)

        def run(src: np.ndarray, limits: np.ndarray, indices: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                return generate(self.session(src, limits), len(src), spec, max_len=limits, keys=indices)

        return run

    def translate(
        self,
        texts: Sequence[str],
        *,
        search: SearchOptions = TRANSLATION,
        names: Sequence[str] | None = None,
        progress: bool = False,
    ) -> list[str]:
        """Translations of ``texts``, in order: a blank text gives a blank line, a text longer than the model reads is
        translated in pieces (:meth:`pieces`). ``names`` say how warnings refer to each text. A sampled piece draws
        from a generator seeded by the search's seed and its place among all pieces, so the same texts translate the
        same whatever batches they fall in."""
        return self.translate_from(texts, search=search, names=names, progress=progress)[0]

    def translate_from(
        self,
        texts: Sequence[str],
        *,
        search: SearchOptions = TRANSLATION,
        names: Sequence[str] | None = None,
        progress: bool = False,
        first_key: int = 0,
    ) -> tuple[list[str], int]:
        """:meth:`translate` of ``texts`` that follow ``first_key`` pieces of the same input (their sampled pieces
        draw as they would among all of it), and the key of the piece after them: a long input translated a part at
        a time. A sentence whose translation the guard still doubts (:meth:`joined`) is named in a warning."""
        names = names or [f"text {i + 1}" for i in range(len(texts))]
        cuts, flat = self.pieces(texts, names)
        run = self.generate(search)
        outputs = translate_ids(
            lambda src, limits, indices: run(src, limits, indices + first_key), flat, limit=self.limits(search),
            generation=self.generation, batch_tokens=self.batch_size(search), progress=progress,
        )  # fmt: skip
        self.tokens += sum(map(len, outputs))
        done = self.joined(cuts, outputs, search)
        for name, doubtful in zip(names, done.doubtful, strict=True):
            for sentence, why in doubtful:
                warn(f"{name}: the translation of {shorten(sentence, 60)!r} may have lost or invented words ({why})")
        return done.texts, first_key + len(flat)

    def joined(self, cuts: Sequence[Cut], outputs: Sequence[Ids], search: SearchOptions = TRANSLATION) -> Translated:
        """Each text's translation from the translations ``outputs`` of all pieces, in order (searched with
        ``search``): the guard (unless :attr:`guard` is off) first searches again those that look as if they lost or
        invented text (:func:`doubt`): with a beam of at least :data:`GUARD_BEAM`, then, where that does not settle
        it, their source split at its clauses (or in two halves) translated part by part; what still looks wrong is
        kept (the first translation) and named in the result. Then the pieces' translations are joined with their
        source's spacing (:func:`multihead.app.segment.join`)."""
        translated = [self.target.decode(ids) for ids in outputs]
        sources = [source for cut in cuts for source in cut.sources]
        flat = [ids for cut in cuts for ids in cut.ids]
        doubts = {index: why for index, (ids, out) in enumerate(zip(flat, outputs, strict=True))
                  if self.guard and (why := self._doubt(ids, out, search)) is not None}  # fmt: skip
        if doubts:
            doubts = self._search_again(doubts, flat, sources, translated, search)
        texts, doubtful, at = [], [], 0
        language = self.langs[1] if self.langs else None
        for cut in cuts:
            count = len(cut.ids)
            texts.append(join(cut.gaps, translated[at : at + count], language) if count else cut.gaps[0].strip())
            doubtful.append([(sources[i], doubts[i]) for i in range(at, at + count) if i in doubts])
            at += count
        return Translated(texts, doubtful)

    def _doubt(self, source: Ids, translated: Ids, search: SearchOptions) -> str | None:
        """:func:`doubt` of a piece ``source`` translated as ``translated`` with ``search``, within its limit."""
        room = self.limits(search)(len(source)) - len(self.generation.forced)
        return doubt(source, translated, self.specials.eos, room)

    def _search_again(
        self, doubts: dict[int, str], flat: list[Ids], sources: list[str], translated: list[str], search: SearchOptions
    ) -> dict[int, str]:
        """The guard's second and third tries of the pieces ``doubts`` names (index among ``flat`` -> why): their
        translations in ``translated`` replaced where a try settles the doubt; the doubts left."""
        wider = replace(search, beam_size=max(search.beam_size, GUARD_BEAM), n_best=1, sampling_topk=1,
                        sampling_topp=1.0, sampling_temperature=1.0)  # fmt: skip
        indices = list(doubts)
        again = translate_ids(self.generate(wider), [flat[i] for i in indices], limit=self.limits(wider),
                              generation=self.generation, batch_tokens=self.batch_size(wider))  # fmt: skip
        self.tokens += sum(map(len, again))
        left = {}
        for index, out in zip(indices, again, strict=True):
            if self._doubt(flat[index], out, wider) is None:
                translated[index] = self.target.decode(out)
            else:
                left[index] = doubts[index]
        parts = [(index, self.source.encode(part)[0][: self.max_len]) for index in left
                 for part in halved(sources[index])]  # fmt: skip
        outputs = translate_ids(self.generate(search), [ids for _, ids in parts], limit=self.limits(search),
                                generation=self.generation, batch_tokens=self.batch_size(search))  # fmt: skip
        self.tokens += sum(map(len, outputs))
        tried: dict[int, list[tuple[Ids, Ids]]] = {}  # per piece, its parts' (source, translation)
        for (index, ids), out in zip(parts, outputs, strict=True):
            tried.setdefault(index, []).append((ids, out))
        still = {}
        for index, pairs in tried.items():
            if len(pairs) > 1 and all(self._doubt(ids, out, search) is None for ids, out in pairs):
                translated[index] = " ".join(self.target.decode(out) for _, out in pairs)
            else:
                still[index] = left[index]
        return still

    def hypotheses(self, texts: Sequence[str], search: SearchOptions) -> list[list[str]]:
        """For each text, its ``search.n_best`` best translations, best first (:meth:`scored_hypotheses` without their
        scores)."""
        return [[text for _, text in found] for found in self.scored_hypotheses(texts, search)]

    def scored_hypotheses(
        self,
        texts: Sequence[str],
        search: SearchOptions,
        *,
        names: Sequence[str] | None = None,
        progress: bool = False,
    ) -> list[list[tuple[float | None, str]]]:
        """For each text, its ``search.n_best`` best translations, best first, each with its score, from a beam search
        as ``search`` says (:func:`multihead.engine.n_best_search`): its log-probability (natural log, EOS
        included) over its length in tokens (EOS included) raised to ``search.length_penalty``, what ranks it. The
        first is what :meth:`translate` gives with that search, in the same batches. A blank text gives
        ``[(None, "")]``; a text longer than the model reads is translated in pieces (:meth:`pieces`, warnings
        naming it as ``names`` say): its ``i``-th translation joins its pieces' ``i``-th best, and its score is the
        sum of theirs."""
        torch, spec = self.torch, self.spec(search)

        def run(src: np.ndarray, limits: np.ndarray, indices: np.ndarray) -> list[list[tuple[float, Ids]]]:
            with torch.inference_mode():
                found = n_best_search(self.session(src, limits), len(src), spec, max_len=limits)
            # The model's log-probabilities are finite: every sentence has `n_best` hypotheses.
            return [
                [(score, translation(tokens, limit, spec)) for score, tokens in best]
                for best, limit in zip(found, limits, strict=True)
            ]

        cuts, flat = self.pieces(texts, names)
        batches = in_batches(
            run,
            flat,
            limit=self.limits(search),
            pad=self.specials.pad,
            batch_tokens=self.batch_size(search),
            progress=progress,
        )
        self.tokens += sum(len(tokens) for best in batches for _, tokens in best)
        return self.joined_best(cuts, batches, search.n_best)

    def joined_best(
        self, cuts: Sequence[Cut], found: Sequence[Ranked], count: int
    ) -> list[list[tuple[float | None, str]]]:
        """Each text's ``count`` best translations from its pieces' hypotheses ``found`` (ranked, best first, in
        order): its ``i``-th joins its pieces' ``i``-th best (their last where a piece has fewer), its score the sum of
        theirs; a blank text gives ``[(None, "")]``."""
        outputs = iter(found)
        results: list[list[tuple[float | None, str]]] = []
        language = self.langs[1] if self.langs else None
        for cut in cuts:
            if not cut.ids:  # a blank text
                results.append([(None, "")])
                continue
            pieces = [next(outputs) for _ in cut.ids]  # per piece, its best
            best = [[ranked[min(i, len(ranked) - 1)] for ranked in pieces] for i in range(count)]
            results.append([
                (sum(rank for rank, _ in chosen), join(cut.gaps, [self.target.decode(ids) for _, ids in chosen],
                                                       language))
                for chosen in best
            ])  # fmt: skip
        return results

    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        *,
        names: Sequence[str] | None = None,
        progress: bool = False,
    ) -> list[Scored]:
        """How probable the model finds each translation ``targets[i]`` of ``sources[i]``: teacher-forced, the model's
        forward pass reads the source and BOS + the forced tokens + the translation's tokens and predicts the
        translation's tokens + EOS; the log-probabilities (natural log) of those, summed, with their count (EOS
        included, and the forced tokens, which generation gives every translation first with probability 1, as its
        search counts them). In length-sorted
        batches (:func:`in_batches`). A source or translation longer than the model reads is cut to what it reads
        (only what was read is scored: see the count), with one warning naming the lines as ``names`` say; a blank
        source, which the model never reads, scores ``nan``, with one warning."""
        torch, specials, forced = self.torch, self.specials, list(self.generation.forced)
        names = names or [f"pair {i + 1}" for i in range(len(sources))]
        max_len = self.checkpoint.config.max_len
        blank, cut = [], []
        source_ids, target_ids = [], []
        for source, target, name in zip(sources, targets, names, strict=True):
            ids, tokens = (
                self._encode(self.normalized(source), f"{name} (source)"),
                self._encode(target, f"{name} (translation)", target=True),
            )
            if not source.strip():
                blank.append(name)
            if len(ids) > max_len or len(forced) + len(tokens) >= max_len:
                cut.append(name)
            source_ids.append(ids[:max_len] or [specials.pad])  # a blank source is scored as nan below
            target_ids.append([*forced, *tokens, specials.eos][:max_len])  # predicted: the translation and EOS
        for what, listed, how in (
            (f"longer than this model reads (at most {max_len} tokens a side)", cut, "cut to what it reads"),
            ("blank: the model reads no empty source", blank, "scored nan"),
        ):
            if listed:
                shown = ", ".join(listed[:3]) + (f" and {len(listed) - 3} more" if len(listed) > 3 else "")
                warn(f"{shown} {'is' if len(listed) == 1 else 'are'} {what}: {how}")

        def run(src: np.ndarray, limits: np.ndarray, indices: np.ndarray) -> list[Scored]:
            rows = [target_ids[index] for index in indices]
            longest = max(map(len, rows))
            tgt_in = np.full((len(rows), longest), specials.pad, dtype=np.int64)  # (B, Lt): BOS + forced + translation
            tgt_out = np.full((len(rows), longest), specials.pad, dtype=np.int64)  # (B, Lt): translation + EOS
            for row, tokens in enumerate(rows):
                tgt_in[row, 0], tgt_in[row, 1 : len(tokens)] = specials.bos, tokens[:-1]
                tgt_out[row, len(forced) : len(tokens)] = tokens[len(forced) :]  # the forced: probability 1, not read
            with torch.inference_mode():
                out = torch.from_numpy(tgt_out).to(self.device)
                logits = self.model(torch.from_numpy(src).to(self.device), torch.from_numpy(tgt_in).to(self.device))
                logits = logits.float()  # (B, Lt, V)
                picked = logits.gather(-1, out.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # (B, Lt)
                totals = picked.masked_fill(out == specials.pad, 0.0).sum(dim=1).double().cpu().numpy()  # (B,)
            return [Scored(float(total), len(tokens)) for total, tokens in zip(totals, rows, strict=True)]

        scored = in_batches(
            run, source_ids, limit=self.limit, pad=specials.pad, batch_tokens=self.batch_tokens, progress=progress
        )
        self.tokens += sum(item.tokens for item in scored)
        blanks = {index for index, source in enumerate(sources) if not source.strip()}
        return [Scored(math.nan, item.tokens) if index in blanks else item for index, item in enumerate(scored)]

    def attention(self, text: str, *, search: SearchOptions = TRANSLATION) -> Translation:
        """One sentence's translation with every decoder layer's cross-attention."""
        torch = self.torch
        ids = self._encode(self.normalized(text), "the text")
        if len(ids) > self.checkpoint.config.max_len:
            raise UserError(
                f"the text to plot is longer than this model reads: {len(ids)} {self._unit()}, at most "
                f"{self.checkpoint.config.max_len}"
            )
        (out,) = translate_ids(self.generate(search), [ids], limit=self.limits(search), generation=self.generation)
        src, forced = torch.tensor([ids], device=self.device), list(self.generation.forced)
        with torch.no_grad():
            memory = self.model.encode(src)
            tgt = torch.tensor([[self.specials.bos, *forced, *out][: len(forced) + len(out)]], device=self.device)
            _, weights = self.model.decode(tgt, memory, return_weights=True)
        return Translation(
            source=text,
            target=self.target.decode(out),
            source_tokens=self.source.pieces(ids),
            target_tokens=self.target.pieces(out),
            source_word_starts=self.source.word_starts(ids),
            target_word_starts=self.target.word_starts(out),
            cross_attention=[w[0, :, len(forced) :].float().cpu().numpy() for w in weights],  # per layer (H, Lt, Ls)
        )
