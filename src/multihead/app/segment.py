"""Texts cut into the sentences a translation model learnt to translate, and joined back with the source's spacing.

Models are trained on sentence pairs: given a paragraph whole they tend to stop after its first sentence or two. So
every text is split into sentences first, by sentencex (Wikimedia's rule-based segmenter: abbreviations and numbers
of some 240 languages through fallback chains, CJK's full stops, a few microseconds a paragraph), Thai and Lao
further at their spaces (they end sentences with a space, not a mark). A sentence still longer than the model reads
is split at the sentence ends the segmenter kept (German's before a lower-case word), then at its clause
punctuation, then between words (:func:`shorter`).

Notation: a text's *gaps* are what stands before its first sentence, between its sentences and after its last (one
more than its sentences): whitespace, and what holds no letter or digit (a lone mark, an emoji), which is kept, not
translated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sentencex

SPACED_SCRIPTS = re.compile(r"(?<=[\u0e00-\u0eff])\s+(?=[\u0e00-\u0eff])")
"""Where Thai and Lao text (Unicode's Thai and Lao blocks) ends a sentence: at a space between two of its letters."""
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|(?<=[。！？])")
"""Where a sentence too long for the model is split first: after a mark that ends sentences."""
CLAUSE_END = re.compile(r"(?<=[,;:\u060c\u061b\u3001\uff0c\uff1b\uff1a\u2014])\s*")
"""Where it is split next: after its clause punctuation (commas, semicolons, colons, Arabic's, CJK's, dashes)."""
LINES = re.compile(r"[^\n]*\n|[^\n]+")
"""A text's lines, each with its line feed (the only line end: ``translate`` reads files so, ``serve`` makes ``\\r\\n``
and ``\\r`` line feeds)."""
OTHER_BREAKS = re.compile(r"[\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
"""Whitespace that some programs read as a line end (form feeds, Unicode's line separators): a gap of a text's lines
holding one is joined as a space, so that a translation has as many lines as its text."""
SURROGATE = re.compile("[\ud800-\udfff]")
"""A lone surrogate: half of a UTF-16 pair, which no text holds (what JSON's ``"\\ud800"`` decodes to, and what
Python makes of an argument's bytes that are not UTF-8)."""
UNSPACED = frozenset({"zh", "ja", "yue", "wuu"})
"""Languages whose sentences follow each other without a space (Chinese's and Japanese's full stops end them; Thai
and Lao end them with a space): their translations are joined without one."""


@dataclass(frozen=True)
class Sentences:
    """A text's sentences and its :data:`gaps <multihead.app.segment>` (``len(gaps) == len(sentences) + 1``)."""

    sentences: list[str]
    gaps: list[str]


def not_text(text: str) -> str | None:
    """Why ``text`` is not text a model can read (a lone surrogate, and where), or ``None``: what every boundary that
    takes text from users (HTTP, the command line) checks first."""
    found = SURROGATE.search(text)
    if found is None:
        return None
    return f"a lone surrogate (U+{ord(found[0]):04X}, not a character) at character {found.start() + 1}"


def readable(text: str) -> bool:
    """Whether ``text`` holds a letter or a digit: something a model translates (a run of marks, emoji or control
    characters is kept as it is)."""
    return any(character.isalnum() for character in text)


def language_of(code: str | None) -> str:
    """The language subtag of a code (``zh-Hant``: ``zh``; ``None`` or ``mul``: ``en``, sentencex's default)."""
    language = (code or "en").replace("_", "-").split("-")[0].lower()
    return "en" if language in ("mul", "") else language


def split(text: str, language: str | None) -> Sentences:
    """``text``'s sentences in ``language`` (a code, :func:`language_of`; none goes past a line break) and the
    whitespace around them; a blank text has none. Joining the gaps and sentences in turn gives ``text`` back."""
    sentences: list[str] = []
    gaps: list[str] = []
    at = 0
    code = language_of(language)
    parts = (part for line in LINES.findall(text) for part in sentencex.segment(code, line))
    for part in parts:  # a sentence never goes past the end of its line
        for sentence in SPACED_SCRIPTS.split(part):
            core = sentence.strip()
            if not readable(core):  # a mark, an emoji, a control character: kept in the gap, never translated
                continue
            start = text.find(core, at)
            if start < 0:  # never seen: sentencex gives the text's own characters
                return whole(text)
            gaps.append(text[at:start])
            sentences.append(core)
            at = start + len(core)
    gaps.append(text[at:])
    return Sentences(sentences, gaps)


def whole(text: str) -> Sentences:
    """``text`` as one sentence (a text without a letter or a digit as none)."""
    core = text.strip()
    if not readable(core):
        return Sentences([], [text])
    start = text.index(core)
    return Sentences([core], [text[:start], text[start + len(core) :]])


def join(gaps: Sequence[str], translations: Sequence[str], language: str | None) -> str:
    """Translations of a text's sentences joined with its gaps between them (the first and last gaps left out, as a
    translation of a text is stripped); a space where the source had none (CJK's sentences) unless ``language``
    (the target's) writes its sentences without spaces, where a gap loses its spaces."""
    unspaced = language_of(language) in UNSPACED
    out: list[str] = []
    for index, translated in enumerate(translations):
        if index and translated and out:
            gap = gaps[index]
            if "\n" not in gap:
                gap = "".join(gap.split()) if unspaced else (OTHER_BREAKS.sub(" ", gap) or " ")
            out.append(gap)
        if translated:
            out.append(translated)
    return "".join(out)


def shorter(sentence: str, fits: Callable[[str], bool]) -> list[str]:
    """``sentence`` in parts that each ``fits``: split after the ends of sentences the segmenter kept together (an
    end followed by a lower-case word, in German), each of those that does not fit split after its clause
    punctuation, the clauses joined back while they fit, a clause that does not fit alone split between its words
    the same way; a single word that does not fit is a part alone (the caller cuts it). One part when the sentence
    fits."""
    if fits(sentence):
        return [sentence]
    parts: list[str] = []
    for piece in (piece for piece in SENTENCE_END.split(sentence) if piece.strip()):
        if fits(piece):
            parts.append(piece)
            continue
        clauses: list[str] = []
        for clause in (clause for clause in CLAUSE_END.split(piece) if clause.strip()):
            for part in [clause] if fits(clause) else clause.split():
                _pack(clauses, part, fits)
        parts += clauses
    return parts


def _pack(parts: list[str], piece: str, fits: Callable[[str], bool]) -> None:
    """Add ``piece`` to the last of ``parts`` when together they fit, else as a part of its own."""
    if parts and fits(f"{parts[-1]} {piece}"):
        parts[-1] = f"{parts[-1]} {piece}"
    else:
        parts.append(piece)


def halved(sentence: str) -> list[str]:
    """``sentence`` in smaller parts: its clauses (split after clause punctuation), or, in one clause, its two halves
    split between words; a single word as it is."""
    clauses = [clause.strip() for clause in CLAUSE_END.split(sentence) if clause.strip()]
    if len(clauses) > 1:
        return clauses
    words = sentence.split()
    middle = len(words) // 2
    return [" ".join(words[:middle]), " ".join(words[middle:])] if middle else [sentence]
