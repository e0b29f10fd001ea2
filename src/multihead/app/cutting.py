"""Texts cut into the pieces a model reads, and the pieces' translations joined back into texts.

Every line gives one line: a blank line a blank one. A text is translated sentence by sentence
(:mod:`multihead.app.segment`), as models learnt to translate, a sentence longer than the model reads in parts; each
piece is encoded as a :class:`~multihead.app.languages.Direction` opens its sources (a language's token), and the
translations are joined with their sources' spacing, in the target language's way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from multihead.app.batched import Ids, Phrases, Ranked
from multihead.app.console import UserError, warn
from multihead.app.glossary import NO_SPACES, Glossary
from multihead.app.keep import Keep, Kept, held, restored
from multihead.app.languages import Direction
from multihead.app.segment import join, readable, shorter, split, whole
from multihead.app.tokenizers import Tokenizer, encode_opened, word_ends
from multihead.constraints import Phrase


@dataclass
class Cut:
    """One text as the model reads it (:meth:`Cutter.pieces`): its pieces' token ids (a sentence each; a sentence
    longer than the model reads, several), each piece's source text, and the whitespace around the pieces (one more
    than they; see :mod:`multihead.app.segment`). A blank text has no piece. ``kept``: the stand-ins its pieces' sources
    hold in place of the spans kept as they are, and those spans (:mod:`multihead.app.keep`)."""

    ids: list[Ids]
    sources: list[str]
    gaps: list[str]
    kept: dict[str, str] = field(default_factory=dict)


def moses_normalizer() -> Callable[[str], Any]:
    """Moses' punctuation normalizer of a language (``sacremoses.MosesPunctNormalizer``, made once per language),
    refused in one line where ``sacremoses`` is not installed."""
    try:
        import sacremoses
    except ImportError:
        raise UserError("--normalize moses needs sacremoses: pip install sacremoses") from None
    return functools.lru_cache(maxsize=None)(lambda lang: sacremoses.MosesPunctNormalizer(lang=lang))


def warn_unknown(name: str, unknown: Sequence[str]) -> None:
    """A warning naming the pieces of ``name`` the vocabulary lacks, if any."""
    if unknown:
        shown = ", ".join(repr(piece) for piece in dict.fromkeys(unknown))
        warn(f"{name}: {shown} not in the model's vocabulary, read as <unk>")


@dataclass(frozen=True)
class Cutter:
    """How a run's texts become the pieces its model reads, and their translations texts again: ``source`` and
    ``target`` its tokenizers, ``max_len`` the most tokens a piece may have (what every model of an ensemble reads).
    ``split``: each text sentence by sentence, else whole (sources already split into sentences). ``guard``:
    translations that look as if they lost or invented text are searched again
    (:meth:`multihead.app.translate.Translator.joined`). ``normalizer``: what the sources' punctuation goes through
    first (Moses', per language), if anything. ``glossary``: the terms whose targets translations must use
    (:meth:`constraints`), unless ``bonus`` says to prefer them (a :class:`~multihead.constraints.Phrase`'s bonus a
    token). ``keep``: the spans (placeholders...) kept as they are in translations (:mod:`multihead.app.keep`).
    ``vocab``: the model's target vocabulary (what may follow a term: :func:`~multihead.app.tokenizers.word_ends`;
    0: anything). The languages are a direction's, which each method is given."""

    source: Tokenizer
    target: Tokenizer
    max_len: int
    split: bool = True
    guard: bool = True
    normalizer: Callable[[str], Any] | None = None
    glossary: Glossary | None = None
    keep: Keep | None = None
    bonus: float | None = None
    vocab: int = 0

    def constraints(
        self, sources: Sequence[str], kept: Sequence[Kept] | None = None, *, sampled: bool = False
    ) -> list[Phrases] | None:
        """Each source piece's constraints: the target terms of the glossary's entries it holds, as the target
        tokenizer writes them (:mod:`multihead.app.glossary`), then the stand-ins of kept spans it holds (``kept[i]``:
        those of piece ``i``'s text, :attr:`Cut.kept`) that the target tokenizer writes as they are, unless the
        search is ``sampled``; ``None`` when no piece can have any. Each is a phrase to hold, followed by what may
        follow a whole word where it ends in a letter or digit (of a script written with spaces), or, a term when
        :attr:`bonus` says so, a phrase to prefer. Refused in one line where a piece's phrases to hold take more
        tokens than the model writes."""
        stand_ins = (
            [] if kept is None or sampled else [held(source, own) for source, own in zip(sources, kept, strict=True)]
        )
        if self.glossary is None and not any(stand_ins):
            return None
        found = [[] if self.glossary is None else [term.target for term in self.glossary.found(source)]
                 for source in sources]  # fmt: skip
        terms = [len(texts) for texts in found]
        for index, own in enumerate(stand_ins):
            found[index] += [stand_in for stand_in in own if self._spells(stand_in)]
        encoded = {text: self.target.encode(text)[0] for text in {text for texts in found for text in texts}}
        phrases = [[self._phrase(text, encoded[text], term=at < count)
                    for at, text in enumerate(texts) if encoded[text]]
                   for texts, count in zip(found, terms, strict=True)]  # fmt: skip
        for source, texts, its in zip(sources, found, phrases, strict=True):
            held_tokens = sum(len(phrase.tokens) for phrase in its if phrase.bonus is None)
            if held_tokens > self.max_len - 1:
                raise UserError(f"the terms and kept spans of {source!r} ({', '.join(map(repr, texts))}) take "
                                f"{held_tokens} tokens, more than the {self.max_len - 1} the model writes")  # fmt: skip
        return phrases

    def check_glossary(self, glossary: Glossary, named: str) -> None:
        """Refuse ``glossary`` (which messages call ``named``) in one line where the model cannot write one of its
        target terms: more tokens than it writes, or none at all."""
        for term in glossary.terms:
            ids = self.target.encode(term.target)[0]
            if not ids or len(ids) > self.max_len - 1:
                raise UserError(f"{named}: the target term {term.target!r} (for {term.source!r}) is {len(ids)} "
                                f"tokens, and this model writes 1 to {self.max_len - 1}")  # fmt: skip

    def _phrase(self, text: str, ids: Ids, *, term: bool) -> Phrase:
        """The constraint of ``text`` (a glossary's target term, or a stand-in), written as ``ids``."""
        if term and self.bonus is not None:
            return Phrase(ids, bonus=self.bonus)
        whole = self.vocab > 0 and text[-1].isalnum() and not NO_SPACES.match(text[-1])
        ends = word_ends(self.target, self.vocab) if whole else None  # type: ignore[arg-type]
        return Phrase(ids, followed_by=ends)

    def _spells(self, stand_in: str) -> bool:
        """Whether the target tokenizer writes ``stand_in`` as it is."""
        ids, unknown = self.target.encode(stand_in)
        return not unknown and self.target.decode(ids) == stand_in

    @property
    def unit(self) -> str:
        """What the source's tokens are, in words."""
        return {"char": "characters", "word": "words"}.get(self.source.kind, "subword tokens")

    def encode(self, text: str, direction: Direction) -> tuple[Ids, list[str]]:
        """The ids of a source ``text``, opened as ``direction`` opens its sources, and the pieces the vocabulary
        lacks."""
        return encode_opened(self.source, text, direction.prefix)

    def normalized(self, text: str, direction: Direction) -> str:
        """A source ``text`` as the model reads it: through the punctuation normalizer, where there is one, for
        ``direction``'s source language."""
        if self.normalizer is None or not text.strip():
            return text
        return str(self.normalizer((direction.source_lang or "en").split("-")[0]).normalize(text))

    def cut(self, text: str, name: str, direction: Direction) -> Cut:
        """``text`` as the pieces the model reads: its sentences (:func:`multihead.app.segment.split`; the whole text
        with :attr:`split` off), a sentence longer than the model reads in parts split at its clauses, then between
        its words (:func:`multihead.app.segment.shorter`; a word too long alone is cut), with one warning naming
        it."""
        if not readable(text):  # blank, or marks alone: kept as they are (:meth:`joined`)
            return Cut([], [], [text])
        text, kept = self.keep.masked(text) if self.keep else (text, {})
        text, max_len = self.normalized(text, direction), self.max_len
        found = split(text, direction.source_lang) if self.split else whole(text)

        def fits(part: str) -> bool:
            return len(self.encode(part, direction)[0]) <= max_len

        cut, unknown = Cut([], [], [found.gaps[0]], kept), list[str]()
        longest, parted, count, cut_words = 0, 0, 0, False
        for sentence, gap in zip(found.sentences, found.gaps[1:], strict=True):
            ids, missing = self.encode(sentence, direction)
            unknown += missing
            parts = [(sentence, ids)]
            if len(ids) > max_len:
                parts = [(part, self.encode(part, direction)[0]) for part in shorter(sentence, fits)]
                cut_words = cut_words or any(len(part_ids) > max_len for _, part_ids in parts)
                parts = [(part, part_ids[:max_len]) for part, part_ids in parts]
                longest, parted, count = max(longest, len(ids)), parted + 1, count + len(parts)
            for index, (part, part_ids) in enumerate(parts):
                cut.ids.append(part_ids)
                cut.sources.append(part)
                cut.gaps.append(gap if index == len(parts) - 1 else " ")
        warn_unknown(name, unknown)
        if parted:
            what = "a sentence" if parted == 1 else f"{parted} sentences"
            how = f"cut to its first {max_len}"  # a word alone
            if count > parted:
                how = f"translated in {count} parts split at sentence ends, clauses or words"
                how += f", a word longer than that cut to its first {max_len}" if cut_words else ""
            warn(f"{name}: {what} longer than this model reads ({longest} {self.unit}, at most {max_len}): {how}")
        return cut

    def pieces(
        self, texts: Sequence[str], names: Sequence[str] | None, direction: Direction
    ) -> tuple[list[Cut], list[Ids]]:
        """Each text cut into the pieces the model reads (:meth:`cut`; a blank text has none, warnings name each
        text as ``names`` say), and all of their pieces' ids in one list, in order."""
        names = names or [f"text {i + 1}" for i in range(len(texts))]
        cuts = [self.cut(text, name, direction) for text, name in zip(texts, names, strict=True)]
        return cuts, [ids for cut in cuts for ids in cut.ids]

    def joined(self, cuts: Sequence[Cut], translated: Sequence[str], direction: Direction) -> list[str]:
        """Each text's translation: its pieces' ``translated`` (all pieces', in order) joined with its source's
        spacing (:func:`multihead.app.segment.join`, in ``direction``'s target language); a text without pieces as
        it is, stripped."""
        texts, at = [], 0
        for cut in cuts:
            count = len(cut.ids)
            pieces = [restored(source, piece, cut.kept)
                      for source, piece in zip(cut.sources, translated[at : at + count], strict=True)]  # fmt: skip
            texts.append(join(cut.gaps, pieces, direction.target_lang) if count else cut.gaps[0].strip())
            at += count
        return texts

    def joined_best(
        self, cuts: Sequence[Cut], found: Sequence[Ranked], count: int, direction: Direction
    ) -> list[list[tuple[float | None, str]]]:
        """Each text's ``count`` best translations from its pieces' hypotheses ``found`` (ranked, best first, in
        order): its ``i``-th joins its pieces' ``i``-th best (their last where a piece has fewer), its score the sum of
        theirs; a blank text gives ``[(None, "")]``."""
        outputs = iter(found)
        results: list[list[tuple[float | None, str]]] = []
        for cut in cuts:
            if not cut.ids:  # a blank text
                results.append([(None, "")])
                continue
            pieces = [next(outputs) for _ in cut.ids]  # per piece, its best
            best = [[ranked[min(i, len(ranked) - 1)] for ranked in pieces] for i in range(count)]
            results.append([
                (sum(rank for rank, _ in chosen),
                 join(cut.gaps, [restored(source, self.target.decode(ids), cut.kept)
                                 for source, (_, ids) in zip(cut.sources, chosen, strict=True)], direction.target_lang))
                for chosen in best
            ])  # fmt: skip
        return results
