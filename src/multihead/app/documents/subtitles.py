"""Subtitle files as documents: SubRip (``.srt``, read and written by ``srt``) and WebVTT (``.vtt``, by
``webvtt-py``).

A unit is a sentence: consecutive cues read together until one ends a sentence (``.``, ``!``, ``?``, ``…``, ``。``,
``！``, ``？``, then any closing quotes or brackets), a cue's own line breaks read as spaces; a cue without a letter or
a digit (``♪``) is kept as it is and ends the sentence before it. A sentence's translation is shared out over its own
cues, which keep their indices, identifiers, timings and settings: cut at spaces, in proportion to the lengths of the
cues' texts, each cue holding at least one word where the translation has as many words as the sentence has cues,
and each cue's text wrapped into lines of about :data:`LINE_WIDTH` characters, of near equal lengths.

Cue styling: tags that wrap a whole cue (``<i>…</i>``, a WebVTT voice ``<v Anna>``, an SRT ``{\\an8}``), or each of
its lines the same way, are put back around its new text; tags inside a cue's text are dropped, since its words are
new. A WebVTT file keeps its header, ``NOTE`` comments, ``STYLE`` and ``REGION`` blocks as they were.
"""

from __future__ import annotations

import html
import math
import re
import textwrap
from bisect import bisect_left
from collections.abc import Callable, Sequence
from copy import deepcopy
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from pathlib import Path

import srt
import webvtt
from webvtt.errors import MalformedCaptionError, MalformedFileError

from multihead.app.console import UserError
from multihead.app.documents.base import Format, read_utf8
from multihead.app.segment import readable

LINE_WIDTH = 42
"""The length of a subtitle line, in characters, that a cue's translation is wrapped at (a usual broadcast limit)."""
SENTENCE_END = re.compile(r"[.!?…。！？][\"'”’“‘»«」』)\]]*$")
"""How a cue that ends a sentence ends."""
TAG = re.compile(r"<[^<>]*>|\{\\[^{}]*\}")
"""A cue tag: an HTML-like one (``<i>``, ``</i>``, ``<v Anna>``, ``<00:01.000>``) or an SRT override (``{\\an8}``)."""
WRAPPED = re.compile(r"((?:<[^/<>][^<>]*>|\{\\[^{}]*\})*)(.*?)((?:</[^<>]*>)*)", re.DOTALL)
"""A cue's text: the tags that open it, what they wrap, the tags that close it."""

Save = Callable[[list[str], Path], None]
"""What writes a subtitle file again: each cue's text (its lines joined by line breaks), in the file's order."""


def _wrap(text: str) -> tuple[str, str, str] | None:
    """The tags that wrap the whole of ``text``, and what they wrap (``None`` where tags stand inside it)."""
    opening, inside, closing = WRAPPED.fullmatch(text).groups()  # type: ignore[union-attr]  # matches every text
    return None if TAG.search(inside) else (opening, inside, closing)


def _styled(raw: str) -> tuple[str, str, str]:
    """A cue's tags that wrap it whole or each of its lines alike, kept (to go around its new text, which may be
    wrapped otherwise), and its text, one line, without tags."""
    whole, lines = _wrap(raw), [_wrap(line) for line in raw.split("\n")]
    alike = {(line[0], line[2]) for line in lines if line is not None}
    if whole is not None:
        opening, inside, closing = whole
    elif None not in lines and len(alike) == 1:
        ((opening, closing),) = alike
        inside = " ".join(line[1] for line in lines if line is not None)
    else:
        opening, inside, closing = "", TAG.sub("", raw), ""
    return opening, " ".join(inside.split()), closing


def sentences(texts: Sequence[str]) -> list[list[int]]:
    """The cues of each sentence, by their places among ``texts`` (each cue's text): consecutive cues until one ends
    a sentence; a cue without a letter or a digit is in none, and ends the sentence before it."""
    found: list[list[int]] = []
    going: list[int] = []
    for place, text in enumerate(texts):
        if readable(text):
            going.append(place)
        if going and (not readable(text) or SENTENCE_END.search(text)):
            found.append(going)
            going = []
    return [*found, going] if going else found


def shared(words: Sequence[str], weights: Sequence[int]) -> list[str]:
    """``words`` shared out over as many cues as ``weights`` (each cue's length), in order: each word to the cue its
    middle falls in, in proportion to the weights; then each cue given at least one word, where there are as many."""
    length, total = sum(len(word) + 1 for word in words) or 1, sum(weights)
    middles, start = [], 0
    for word in words:
        middles.append((start + len(word) / 2) / length * total)
        start += len(word) + 1
    edges = [0, *(bisect_left(middles, bound) for bound in accumulate(weights[:-1])), len(words)]
    for place in range(1, len(weights)):
        edges[place] = min(max(edges[place], edges[place - 1] + 1), len(words))
    if len(words) >= len(weights):
        for place in reversed(range(1, len(weights))):
            edges[place] = min(edges[place], edges[place + 1] - 1)
    return [" ".join(words[start:end]) for start, end in pairwise(edges)]


def wrapped(text: str, width: int = LINE_WIDTH) -> list[str]:
    """``text`` as subtitle lines: one where it is at most ``width`` characters, else as few lines of at most about
    ``width`` as hold it, of near equal lengths (a word longer than a line stands alone on its own)."""
    if len(text) <= width:
        return [text] if text else []
    count = len(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False))
    narrowest = math.ceil(len(text) / count)
    for narrower in range(narrowest, width):
        lines = textwrap.wrap(text, narrower, break_long_words=False, break_on_hyphens=False)
        if len(lines) <= count:
            return lines
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)


@dataclass
class Subtitles:
    """A subtitle file's cues (``raw``: each one's text as written) read as sentences, each a unit; ``escaped``: cue
    texts write ``&``, ``<`` and ``>`` as character references (WebVTT's)."""

    raw: list[str]
    save: Save
    escaped: bool
    styles: list[tuple[str, str, str]] = field(init=False)
    groups: list[list[int]] = field(init=False)
    units: list[str] = field(init=False)
    weights: list[int] = field(init=False)
    markup: bool = False

    def __post_init__(self) -> None:
        self.styles = [_styled(raw) for raw in self.raw]
        texts = [html.unescape(text) if self.escaped else text for _, text, _ in self.styles]
        self.groups = sentences(texts)
        self.units = [" ".join(texts[cue] for cue in group) for group in self.groups]
        self.weights = [len(text) for text in texts]

    def write(self, translations: Sequence[str], path: Path) -> None:
        cues = list(self.raw)
        for group, translation in zip(self.groups, translations, strict=True):
            for cue, text in zip(group, shared(translation.split(), [self.weights[cue] for cue in group]), strict=True):
                opening, _, closing = self.styles[cue]
                lines = wrapped(html.escape(text, quote=False) if self.escaped else text)
                cues[cue] = opening + "\n".join(lines) + closing if lines else ""
        self.save(cues, path)


def _subtitles(path: Path, raw: list[str], save: Save, *, escaped: bool) -> Subtitles:
    """The cues ``raw`` of the file ``path`` as a document, refused where none holds text."""
    found = Subtitles(raw, save, escaped)
    if not found.units:
        raise UserError(f"--input {str(path)!r} holds no subtitle text to translate ({len(raw)} cues)")
    return found


def read_srt(path: Path) -> Subtitles:
    """The SubRip file ``path``, refused in one line where it is not one."""
    try:
        cues = list(srt.parse(read_utf8(path, "a SubRip file")))
    except srt.SRTParseError as error:
        raise UserError(f"--input {str(path)!r} is not a SubRip (.srt) file: {str(error)[:200]}") from None

    def save(texts: list[str], target: Path) -> None:
        new = [
            srt.Subtitle(cue.index, cue.start, cue.end, text, cue.proprietary)
            for cue, text in zip(cues, texts, strict=True)
        ]
        target.write_text(srt.compose(new, reindex=False), encoding="utf-8")

    return _subtitles(path, [cue.content for cue in cues], save, escaped=False)


def read_vtt(path: Path) -> Subtitles:
    """The WebVTT file ``path``, refused in one line where it is not one."""
    try:
        captions = webvtt.from_string(read_utf8(path, "a WebVTT file"), strict=True)
    except (MalformedFileError, MalformedCaptionError) as error:
        raise UserError(f"--input {str(path)!r} is not a WebVTT (.vtt) file: {error}") from None

    def save(texts: list[str], target: Path) -> None:
        new = deepcopy(captions)
        for caption, text in zip(new.captions, texts, strict=True):
            caption.lines = text.split("\n") if text else []
        target.write_text(new.content, encoding="utf-8")

    return _subtitles(path, [caption.raw_text for caption in captions.captions], save, escaped=True)


FORMATS = (Format("srt", (".srt",), read_srt), Format("vtt", (".vtt",), read_vtt))
