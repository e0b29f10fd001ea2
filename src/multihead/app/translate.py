"""Translating with a trained run: texts in length-sorted batches, each text's best few translations, scores of
given translations and one sentence's cross-attention, by a :class:`Translator` made of three parts:

- the loaded run (:class:`~multihead.app.loaded.LoadedRun`): the checkpoint and its model (an ensemble's models) on a
  device, in its inference form, and what decodes with them;
- the direction (:class:`~multihead.app.languages.Direction`, immutable): the languages, the ids that open every
  source, the generation and the ids it forces first; the model's language tokens make another pair's
  (:meth:`Translator.for_languages`);
- the cutter (:class:`~multihead.app.cutting.Cutter`): texts cut into the pieces the model reads, and joined back.

A translator of another pair, or that splits texts otherwise, is a new one sharing the loaded run; what describes a
run without its model is a :class:`Described`. The run's checkpoint holds everything needed (config, weights,
tokenizers): the training corpus is never read. A guard searches again a sentence whose translation looks as if it
lost or invented text (:func:`doubt`).

Notation: B batch, Ls source length, T generated length.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from textwrap import shorten
from typing import Any

import numpy as np

from multihead.app import scoring
from multihead.app.batched import (
    BATCH_TOKENS,
    CUDA_BATCH_TOKENS,
    TRANSLATION,
    Generate,
    Ids,
    Phrases,
    Ranked,
    in_batches,
    length_limit,
    translate_ids,
    translation,
)
from multihead.app.console import UserError, plural, progress_bar, say, warn
from multihead.app.cutting import Cut, Cutter, moses_normalizer
from multihead.app.glossary import Glossary, read_glossary
from multihead.app.keep import Keep, Kept, miscounted
from multihead.app.languages import Direction, LanguageTokens, choose_direction
from multihead.app.loaded import LoadedRun, load_run, run_direction
from multihead.app.runs import Checkpoint
from multihead.app.scoring import Scored, Translation
from multihead.app.segment import halved
from multihead.app.tokenizers import Tokenizer
from multihead.decoding import Generation, SearchOptions, Specials
from multihead.engine import n_best_search

__all__ = [
    "BATCH_TOKENS", "CUDA_BATCH_TOKENS", "GUARD_BEAM", "TRANSLATION", "Cut", "Described", "Generate", "Ids",
    "Ranked", "Scored", "Translated", "Translation", "Translator", "doubt", "in_batches", "length_limit",
    "repeats", "speed_text", "translate_ids", "translation",
]  # fmt: skip

GUARD_BEAM = 4
"""The beam with which the guard searches again a translation it doubts (:meth:`Translator.joined`)."""
SHORTEST, LONGEST, GUARDED = 0.4, 3.0, 6
"""A translation of a source of at least ``GUARDED`` tokens is doubted when it has fewer than ``SHORTEST`` or more
than ``LONGEST`` times its source's tokens (:func:`doubt`)."""
REPEATS = 4
"""A translation is doubted when the same run of one to four tokens comes this many times in a row."""


def speed_text(count: int, unit: str, tokens: int, seconds: float) -> str:
    """How fast a batch job went: ``22 sentences in 0.3 s (73.3 sentences/s, 1034 tokens/s)``; ``tokens`` are
    target tokens (generated or scored, EOS included)."""
    seconds = max(seconds, 1e-9)
    return (
        f"{count} {unit if count == 1 else unit + 's'} in {seconds:.1f} s ({count / seconds:.1f} {unit}s/s, "
        f"{tokens / seconds:.0f} tokens/s)"
    )


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


@dataclass(frozen=True, eq=False)
class Described:
    """What describes a translator without its model (a run whose model ``serve`` does not hold), and without its
    tokenizers, which a loaded run alone keeps: the checkpoint directory of each run that translates (``paths``: this
    one's, then an ensemble's others'), its model's language tokens, and the direction it translates."""

    paths: tuple[Path, ...]
    language_tokens: LanguageTokens | None
    direction: Direction

    @property
    def name(self) -> str:
        """The run's name: its directory's."""
        return self.paths[0].parents[1].name


class Translator:
    """A run's checkpoint, loaded in PyTorch (whatever trained it; ``framework="keras"``: in Keras, on the backend
    ``KERAS_BACKEND`` names) on ``device`` (see :mod:`multihead.app.devices`), ready to translate. ``quantize``
    (``"int8"`` or ``"bf16"``) computes the linear layers in that type (:func:`multihead.torch.quantize`, on the CPU),
    for translations, scores and attention maps alike. ``source_lang`` and ``target_lang``: another pair of a
    many-to-many model's languages than the run's (:meth:`for_languages`). ``ensemble``: other runs of the same
    vocabularies whose models translate with this one's (:class:`multihead.engine.Ensemble`), each from its checkpoint
    ``checkpoint`` names, on the same device and quantized alike; this run's tokenizers, generation and languages are
    the ensemble's. ``normalize="moses"``: the sources' punctuation through Moses' normalizer first.
    ``split_sentences``: translate each text sentence by sentence (the default), else as one sentence (sources already
    split into sentences). ``guard``: search again the translations that look as if they lost or invented text, and name
    those that still do (the default; :meth:`joined`), else take them as the search finds them. ``glossary``: a
    glossary file (:mod:`multihead.app.glossary`) whose terms found in a sentence its translation must use, each as a
    whole word where it ends in a letter or digit, or, with ``glossary_bonus``, is to prefer (that bonus to a
    hypothesis' log-probability for each token of a term it writes). ``keep``: the spans kept as they are in
    translations, exactly once (:mod:`multihead.app.keep`; default: the usual placeholders; ``None``: none).

    Its parts: :attr:`loaded` (:class:`~multihead.app.loaded.LoadedRun`), :attr:`direction`
    (:class:`~multihead.app.languages.Direction`) and :attr:`cutter` (:class:`~multihead.app.cutting.Cutter`);
    translators of other pairs and splittings share the loaded run (:meth:`of`)."""

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
        framework: str = "torch",
        glossary: str | Path | None = None,
        keep: Keep | None = Keep(),  # noqa: B008 (immutable)
        glossary_bonus: float | None = None,
    ) -> None:
        loaded = load_run(run, checkpoint, device=device, quantize=quantize, ensemble=ensemble,
                          framework=framework)  # fmt: skip
        found, normalizer = loaded.checkpoint, moses_normalizer() if normalize == "moses" else None
        split = split_sentences and found.options.get("task") is None  # a task's inputs: no sentences
        cutter = Cutter(found.source, found.target, loaded.max_len, split=split, guard=guard, normalizer=normalizer,
                        keep=keep or None, bonus=glossary_bonus, vocab=found.config.tgt_vocab)  # fmt: skip
        direction = run_direction(found)
        if source_lang is not None or target_lang is not None:
            direction = choose_direction(loaded.language_tokens, direction, source_lang, target_lang,
                                         task=found.options.get("task"))  # fmt: skip
        if glossary is not None:
            terms = read_glossary(glossary, direction.langs)
            cutter.check_glossary(terms, f"--glossary {str(glossary)!r}")
            cutter = replace(cutter, glossary=terms)
        self._hold(loaded, direction, cutter)

    @classmethod
    def of(cls, loaded: LoadedRun, direction: Direction, cutter: Cutter) -> Translator:
        """The translator of these parts (what :meth:`toward` and :meth:`splitting` make: a loaded run shared)."""
        made = cls.__new__(cls)
        made._hold(loaded, direction, cutter)
        return made

    def _hold(self, loaded: LoadedRun, direction: Direction, cutter: Cutter) -> None:
        self.loaded, self.direction, self.cutter = loaded, direction, cutter
        self.tokens = 0
        """Target tokens this translator has generated or scored so far, EOS included: what speeds count."""

    @property
    def checkpoint(self) -> Checkpoint:
        return self.loaded.checkpoint

    @property
    def model(self) -> Any:
        return self.loaded.model

    @property
    def device(self) -> Any:
        return self.loaded.device

    @property
    def runs(self) -> list[Checkpoint]:
        """The checkpoint of each run that translates: this one's, then the ensemble's others'."""
        return self.loaded.runs

    @property
    def max_len(self) -> int:
        """The most tokens a source may have: what every member's model reads."""
        return self.loaded.max_len

    @property
    def batch_tokens(self) -> int:
        return self.loaded.batch_tokens

    @property
    def language_tokens(self) -> LanguageTokens | None:
        """The language tokens of this run's model, if it translates between many languages."""
        return self.loaded.language_tokens

    @property
    def source(self) -> Tokenizer:
        return self.cutter.source

    @property
    def target(self) -> Tokenizer:
        return self.cutter.target

    @property
    def generation(self) -> Generation:
        """What this translator generates with (its special ids, banned and forced tokens), whatever the search."""
        return self.direction.generation

    @property
    def specials(self) -> Specials:
        return self.direction.generation.specials

    @property
    def langs(self) -> list[str] | None:
        """``[source, target]``, where known."""
        return None if self.direction.langs is None else list(self.direction.langs)

    @property
    def described(self) -> Described:
        """What describes it without its model."""
        return Described(tuple(run.path for run in self.runs), self.language_tokens, self.direction)

    def for_languages(self, source: str | None, target: str | None, *, named: str | None = None) -> Translator:
        """This translator from ``source`` into ``target`` (``None``: this one's; ISO codes or the model's own),
        sharing its loaded run (:func:`~multihead.app.languages.choose_direction`); refused in one line, naming what
        chose them as ``named`` says (default: ``--source-lang``/``--target-lang``)."""
        task = self.checkpoint.options.get("task")
        return self.toward(choose_direction(self.language_tokens, self.direction, source, target, named=named,
                                            task=task))  # fmt: skip

    def toward(self, direction: Direction) -> Translator:
        """This translator in ``direction`` (one its model's language tokens made), sharing its loaded run:
        ``serve``'s translator of one request's pair."""
        return type(self).of(self.loaded, direction, self.cutter)

    def splitting(self, split: bool) -> Translator:
        """This translator, translating texts sentence by sentence or whole as ``split`` says, sharing its loaded
        run: a ``serve`` request's own choice."""
        if split == self.cutter.split:
            return self
        return type(self).of(self.loaded, self.direction, replace(self.cutter, split=split))

    def glossing(self, glossary: Glossary | None) -> Translator:
        """This translator, ``glossary``'s terms in place of its own making translations use their targets
        (``None``: as it is), sharing its loaded run: what a ``serve`` request's pair uses, the server's glossary
        joined by the request's own (:meth:`Glossary.joined <multihead.app.glossary.Glossary.joined>`)."""
        if glossary is None:
            return self
        return type(self).of(self.loaded, self.direction, replace(self.cutter, glossary=glossary))

    def keeping(self, patterns: Sequence[re.Pattern[str]]) -> Translator:
        """This translator, keeping the matches of ``patterns`` as they are too (:meth:`Keep.joined
        <multihead.app.keep.Keep.joined>`), sharing its loaded run: a ``serve`` request's own spans to keep."""
        if not patterns:
            return self
        keep = (self.cutter.keep or Keep(placeholders=False)).joined(patterns)
        return type(self).of(self.loaded, self.direction, replace(self.cutter, keep=keep))

    def constraints(
        self, sources: Sequence[str], kept: Sequence[Kept] | None = None, *, sampled: bool = False
    ) -> list[Phrases] | None:
        """Each source piece's constraints (:meth:`Cutter.constraints <multihead.app.cutting.Cutter.constraints>`)."""
        return self.cutter.constraints(sources, kept, sampled=sampled)

    def pieces(self, texts: Sequence[str], names: Sequence[str] | None = None) -> tuple[list[Cut], list[Ids]]:
        """Each text cut into the pieces the model reads (:meth:`Cutter.pieces <multihead.app.cutting.Cutter.pieces>`;
        warnings name each text as ``names`` say), and all of their pieces' ids in one list, in order."""
        return self.cutter.pieces(texts, names, self.direction)

    def limit(self, source_length: int) -> int:
        """How many tokens a translation of ``source_length`` tokens may take (:meth:`LoadedRun.limit
        <multihead.app.loaded.LoadedRun.limit>`)."""
        return self.loaded.limit(source_length)

    def limits(self, search: SearchOptions) -> Callable[[int], int]:
        """How many tokens a translation of a source's length may take under ``search``."""
        return self.loaded.limits(search)

    def batch_size(self, search: SearchOptions) -> int:
        """Source tokens per batch for ``search``: the device's, divided by the beams."""
        return self.loaded.batch_size(search)

    def session(self, src: np.ndarray, limits: np.ndarray) -> Any:
        """A decoding session of ``src (B, Ls)`` for rows limited to ``limits (B,)`` (:meth:`LoadedRun.session
        <multihead.app.loaded.LoadedRun.session>`)."""
        return self.loaded.session(src, limits)

    def stream_rows(self) -> Any:
        """The rows a stream decodes this translator's sentences over (:meth:`LoadedRun.stream_rows
        <multihead.app.loaded.LoadedRun.stream_rows>`)."""
        return self.loaded.stream_rows(self.specials.pad)

    def spec(self, search: SearchOptions) -> Generation:
        """This translator's generation, searching as ``search`` says."""
        return self.direction.spec(search)

    def generate(
        self,
        search: SearchOptions = TRANSLATION,
        *,
        sources: Sequence[str] | None = None,
        kept: Sequence[Kept] | None = None,
        first_key: int = 0,
    ) -> Generate:
        """What translates a batch as ``search`` says (one translation a sentence): ``src (B, Ls)``, each row's length
        limit and index ``i`` in the input (which seeds its sampling, as ``first_key + i``) -> tokens ``(B, T)`` as
        generated; with a glossary, input ``i`` of source text ``sources[i]`` holds its terms
        (:meth:`Cutter.constraints <multihead.app.cutting.Cutter.constraints>`), and the stand-ins of its spans kept as
        they are (``kept[i]``: those of its text)."""
        constraints = None if sources is None else self.constraints(sources, kept, sampled=search.strategy.draws)
        return self.loaded.generator(self.spec(search), constraints=constraints, first_key=first_key)

    def prepare(self) -> None:
        """Lay its model's decoding out now (the decoding of one end-of-sentence token, two steps) rather than at its
        first request's first step, so that what it holds while serving is held from here on."""
        eos = self.specials.eos
        self.generate()(np.array([[eos]]), np.array([2]), np.array([0]))

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
        run = self.generate(search, sources=[source for cut in cuts for source in cut.sources], kept=_kept(cuts),
                            first_key=first_key)  # fmt: skip
        outputs = translate_ids(run, flat, limit=self.limits(search), generation=self.generation,
                                batch_tokens=self.batch_size(search), progress=progress)  # fmt: skip
        self.tokens += sum(map(len, outputs))
        done = self.joined(cuts, outputs, search)
        for name, doubtful in zip(names, done.doubtful, strict=True):
            for sentence, why in doubtful:
                warn(f"{name}: the translation of {shorten(sentence, 60)!r} may have lost or invented words ({why})")
        return done.texts, first_key + len(flat)

    def joined(
        self,
        cuts: Sequence[Cut],
        outputs: Sequence[Ids],
        search: SearchOptions = TRANSLATION,
        *,
        again: Mapping[int, Ids] | None = None,
    ) -> Translated:
        """Each text's translation from the translations ``outputs`` of all pieces, in order (searched with
        ``search``): the guard (unless the cutter's ``guard`` is off) first searches again those that look as if they
        lost or invented text (:func:`doubt`), or that do not hold each of their kept spans once
        (:func:`~multihead.app.keep.miscounted`): with a beam of at least :data:`GUARD_BEAM`, then, where that does not
        settle it, their source split at its clauses (or in two halves) translated part by part; what still looks
        wrong is kept (the first translation) and named in the result. Then the pieces' translations are joined with
        their source's spacing, their kept spans put back (:meth:`Cutter.joined
        <multihead.app.cutting.Cutter.joined>`). ``again``: the translations of the doubted pieces (:meth:`doubts`)
        with the wider search (:meth:`wider`), where the caller searched them (a stream), instead of a batch here."""
        translated = [self.target.decode(ids) for ids in outputs]
        sources = [source for cut in cuts for source in cut.sources]
        flat = [ids for cut in cuts for ids in cut.ids]
        doubts = self.doubts(cuts, outputs, search)
        if doubts:
            doubts = self._search_again(doubts, (flat, sources, _kept(cuts)), translated, search, again)
        doubtful, at = [], 0
        for cut in cuts:
            doubtful.append([(sources[i], doubts[i]) for i in range(at, at + len(cut.ids)) if i in doubts])
            at += len(cut.ids)
        return Translated(self.cutter.joined(cuts, translated, self.direction), doubtful)

    def doubts(self, cuts: Sequence[Cut], outputs: Sequence[Ids], search: SearchOptions) -> dict[int, str]:
        """The pieces (index among all of ``cuts``' pieces) whose translations ``outputs`` (searched with ``search``)
        the guard doubts, and why; none when the guard is off."""
        if not self.cutter.guard:
            return {}
        flat, sources, kept = (
            [ids for cut in cuts for ids in cut.ids],
            [s for cut in cuts for s in cut.sources],
            _kept(cuts),
        )
        return {index: why for index, (ids, out) in enumerate(zip(flat, outputs, strict=True))
                if (why := self._why(ids, out, search, sources[index], kept[index])) is not None}  # fmt: skip

    @staticmethod
    def wider(search: SearchOptions) -> SearchOptions:
        """The guard's second try of a translation searched with ``search``: a beam of at least :data:`GUARD_BEAM`."""
        return replace(search, beam_size=max(search.beam_size, GUARD_BEAM), n_best=1, sampling_topk=1,
                       sampling_topp=1.0, sampling_temperature=1.0)  # fmt: skip

    def _doubt(self, source: Ids, translated: Ids, search: SearchOptions) -> str | None:
        """:func:`doubt` of a piece ``source`` translated as ``translated`` with ``search``, within its limit."""
        room = self.limits(search)(len(source)) - len(self.direction.forced)
        return doubt(source, translated, self.specials.eos, room)

    def _why(self, ids: Ids, translated: Ids, search: SearchOptions, source: str, kept: Kept) -> str | None:
        """:meth:`_doubt` of piece ``ids`` (of text ``source``, whose stand-ins ``kept`` stand for spans), else why its
        translation does not hold each of its kept spans once (:func:`~multihead.app.keep.miscounted`)."""
        why = self._doubt(ids, translated, search)
        return why if why is not None or not kept else miscounted(source, self.target.decode(translated), kept)

    def _search_again(
        self,
        doubts: dict[int, str],
        pieces: tuple[list[Ids], list[str], list[Kept]],
        translated: list[str],
        search: SearchOptions,
        searched: Mapping[int, Ids] | None,
    ) -> dict[int, str]:
        """The guard's second and third tries of the pieces ``doubts`` names (index among the ``pieces``' ids, source
        texts and kept spans -> why): their translations in ``translated`` replaced where a try settles the doubt; the
        doubts left. ``searched``: the second tries, made by the caller."""
        (flat, sources, kept), wider, indices = pieces, self.wider(search), list(doubts)
        if searched is None:
            run = self.generate(wider, sources=[sources[i] for i in indices], kept=[kept[i] for i in indices])
            again = translate_ids(run, [flat[i] for i in indices], limit=self.limits(wider), generation=self.generation,
                                  batch_tokens=self.batch_size(wider))  # fmt: skip
            self.tokens += sum(map(len, again))
        else:
            again = [searched[index] for index in indices]
        left = {}
        for index, out in zip(indices, again, strict=True):
            if self._why(flat[index], out, wider, sources[index], kept[index]) is None:
                translated[index] = self.target.decode(out)
            else:
                left[index] = doubts[index]
        texts = [(index, part) for index in left for part in halved(sources[index])]
        parts = [(index, self.cutter.encode(part, self.direction)[0][: self.max_len]) for index, part in texts]
        run = self.generate(search, sources=[part for _, part in texts], kept=[kept[index] for index, _ in texts])
        outputs = translate_ids(run, [ids for _, ids in parts], limit=self.limits(search), generation=self.generation,
                                batch_tokens=self.batch_size(search))  # fmt: skip
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
        spec = self.spec(search)
        cuts, flat = self.pieces(texts, names)
        constraints = self.constraints([source for cut in cuts for source in cut.sources], _kept(cuts))

        def run(src: np.ndarray, limits: np.ndarray, indices: np.ndarray) -> list[list[tuple[float, Ids]]]:
            phrases = None if constraints is None else [constraints[index] for index in indices]
            with self.loaded.decoding():
                found = n_best_search(self.session(src, limits), len(src), spec, max_len=limits, constraints=phrases)
            # The model's log-probabilities are finite: every sentence has `n_best` hypotheses.
            return [
                [(score, translation(tokens, limit, spec)) for score, tokens in best]
                for best, limit in zip(found, limits, strict=True)
            ]

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
        return self.cutter.joined_best(cuts, found, count, self.direction)

    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        *,
        names: Sequence[str] | None = None,
        progress: bool = False,
    ) -> list[Scored]:
        """How probable the model finds each translation ``targets[i]`` of ``sources[i]``
        (:func:`multihead.app.scoring.score`; ``names`` say how warnings refer to each pair)."""
        scored = scoring.score(self.loaded, self.direction, self.cutter, sources, targets, names=names,
                               progress=progress)  # fmt: skip
        self.tokens += sum(item.tokens for item in scored)
        return scored

    def attention(self, text: str, *, search: SearchOptions = TRANSLATION) -> Translation:
        """One sentence's translation with every decoder layer's cross-attention
        (:func:`multihead.app.scoring.attention`)."""
        return scoring.attention(self.loaded, self.direction, self.cutter, text, search=search)


TRANSLATE_CHUNK = 500
"""Texts :func:`translate_into` translates before it writes their lines (and makes them durable)."""


def translated_lines(
    translator: Translator,
    texts: Sequence[str],
    names: Sequence[str],
    search: SearchOptions,
    n_best: int | None,
    *,
    first: int = 1,
    progress: bool = False,
    first_key: int = 0,
) -> tuple[list[str], int]:
    """The lines ``translate`` prints for ``texts``: a translation each, or, with ``n_best``, each text's N best as
    NUMBER<TAB>SCORE<TAB>TRANSLATION (the texts numbered from ``first``); and the sampling key after them
    (:meth:`Translator.translate_from`, whose ``first_key`` they follow)."""
    if n_best is None:
        return translator.translate_from(texts, search=search, names=names, progress=progress, first_key=first_key)
    found = translator.scored_hypotheses(texts, search, names=names, progress=progress)
    lines = [
        f"{number}\t{'' if score is None else f'{score:.4f}'}\t{text}"
        for number, hypotheses in enumerate(found, start=first)
        for score, text in hypotheses
    ]
    return lines, first_key


def translate_into(
    path: str | Path,
    texts: Sequence[str],
    names: Sequence[str],
    translator: Translator,
    search: SearchOptions,
    *,
    resume: bool = False,
    n_best: int | None = None,
    progress: bool = True,
) -> int:
    """``texts`` translated into the file ``path`` as ``translate`` prints them (:func:`translated_lines`), written
    :data:`TRANSLATE_CHUNK` texts at a time as they are done and made durable (an interrupted job keeps what it
    finished); with ``resume`` (one line a text: no ``n_best``), after the complete lines ``path`` already holds. How
    many texts it translated."""
    done = 0
    target = Path(path)
    if resume and target.exists():
        data = target.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        done = complete.count(b"\n")
        if done > len(texts):
            raise UserError(f"--resume: {path} holds {plural(done, 'line')}, more than the input's "
                            f"{plural(len(texts), 'text')}: it is not their translation")  # fmt: skip
        if len(complete) < len(data):
            target.write_bytes(complete)  # an unfinished last line goes
        say(f"resuming {path} after its {plural(done, 'line')}, {plural(len(texts) - done, 'text')} left", sys.stderr)
    bar = progress_bar(len(texts), initial=done, unit="sentence", enabled=progress)
    key = 0
    with open(target, "ab" if done else "wb") as out:
        for start in range(done, len(texts), TRANSLATE_CHUNK):
            end = min(start + TRANSLATE_CHUNK, len(texts))
            lines, key = translated_lines(translator, texts[start:end], names[start:end], search, n_best,
                                          first=start + 1, first_key=key)  # fmt: skip
            out.write("".join(line + "\n" for line in lines).encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
            bar.update(end - start)
    bar.close()
    return len(texts) - done


def _kept(cuts: Sequence[Cut]) -> list[Kept]:
    """Each piece's kept spans: its text's (:attr:`Cut.kept <multihead.app.cutting.Cut.kept>`)."""
    return [cut.kept for cut in cuts for _ in cut.sources]
