"""HTML as ``serve`` translates it (``format: "html"``): the text a page shows, translated, its tags kept.

A page is cut at its tags and comments; the text between them that shows (not blank, not inside ``script`` or
``style``) is translated, the rest kept as it was. A sentence that inline markup splits (``Ein <b>Hund</b> läuft.``)
is translated whole, and each inline element's tags go around its own translation where that (or its first words)
stands in the sentence's as whole words, case aside, as LibreTranslate's tag injection does; where one does not,
the texts between the tags are translated one by one. A text without a letter (the full stop after a ``</b>``) is
kept as it is: a model reads no sentence in it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Awaitable, Callable

Translate = Callable[[list[str]], Awaitable[list[str]]]
"""What translates texts, in order (a request's translators)."""
SKIPPED = {"script", "style"}
"""HTML elements whose text is not translated."""
INLINE = {
    "a", "abbr", "b", "bdi", "bdo", "cite", "code", "data", "dfn", "em", "font", "i", "kbd", "mark", "q", "s", "samp",
    "small", "span", "strong", "sub", "sup", "time", "u", "var",
}  # fmt: skip
"""HTML elements that stand inside a sentence: the sentence around them is translated with their text."""
TAG = re.compile(r"<(/?)([A-Za-z][\w-]*)")
Element = tuple[int, int]
"""An inline element of a cut page: the places of its opening and closing tags, its text between them."""


def html_nodes(text: str) -> tuple[list[str], list[int]]:
    """``text`` cut at its tags and comments (odd places), and the places of its text nodes that show: not blank, not
    inside ``script`` or ``style``."""
    parts = re.split(r"(<!--.*?-->|<[^>]*>)", text, flags=re.DOTALL)
    nodes, skipping = [], None
    for index, part in enumerate(parts):
        if index % 2:  # a tag or a comment
            tag = TAG.match(part)
            if tag and tag[2].lower() in SKIPPED:
                skipping = None if tag[1] else tag[2].lower()
        elif part.strip() and skipping is None:
            nodes.append(index)
    return parts, nodes


def shown(text: str) -> str:
    """A text node as it shows: its entities read, its line breaks and runs of spaces one space."""
    return " ".join(html.unescape(text).split())


def visible_text(text: str) -> str:
    """What an HTML ``text`` shows, its nodes' text one space apart: what its language is told from."""
    parts, nodes = html_nodes(text)
    return " ".join(shown(parts[index]) for index in nodes)


def _inline(part: str) -> bool:
    tag = TAG.match(part)
    return tag is not None and tag[2].lower() in INLINE and not part.endswith("/>")


def _elements(parts: list[str], run: list[int]) -> list[Element] | None:
    """The inline elements of a ``run`` of ``parts``, each an opening tag, its text and its closing tag; ``None``
    where the run's tags do not pair so (an element inside another, a tag left open)."""
    tags, elements, places = [index for index in run if index % 2], [], set(run)
    for index in tags:
        opening, closing = TAG.match(parts[index]), TAG.match(parts[index + 2]) if index + 2 in places else None
        if opening is None or opening[1]:  # a closing tag: its opening one has paired it
            continue
        if closing is None or not closing[1] or closing[2].lower() != opening[2].lower():
            return None
        elements.append((index, index + 2))
    return elements if 2 * len(elements) == len(tags) else None


def split_sentences(parts: list[str], lettered: set[int]) -> list[tuple[list[int], list[Element]]]:
    """The runs of ``parts`` (text and inline tags between other tags) that hold a sentence split by inline markup —
    text with letters (places ``lettered``) inside inline elements and beside them, each element's text with letters —
    each with its elements."""
    runs, run = [], []
    for index, part in enumerate(parts):
        if index % 2 == 0 or _inline(part):
            run.append(index)
        else:
            runs.append(run)
            run = []
    runs.append(run)
    found = []
    for run in runs:
        elements = _elements(parts, run) or []
        inside = {opening + 1 for opening, _ in elements}
        if inside and inside <= lettered and (set(run) - inside) & lettered:  # every element's text a sentence's part
            found.append((run, elements))
    return found


def placed(translation: str, pieces: list[str]) -> list[tuple[int, int]] | None:
    """Where each of ``pieces`` (the translations of a sentence's inline elements, in order) stands in the sentence's
    ``translation``, one after another, as whole words, case and a final full stop aside; ``None`` where one does not.
    A piece not found whole is looked for by its first words, the most first: a word translated alone may come back
    repeated ("Dog dog dog ..."), where its first word is the translation that stands in the sentence's."""
    spans, start = [], 0
    for piece in pieces:
        words = piece.split()
        for count in range(len(words), 0, -1):
            wanted = " ".join(words[:count]).rstrip(".!?。！？")
            match = re.compile(rf"(?<!\w){re.escape(wanted)}(?!\w)", re.IGNORECASE).search(translation, start)
            if wanted and match is not None:
                spans.append(match.span())
                start = match.end()
                break
        else:
            return None
    return spans


def _tagged(parts: list[str], run: list[int], elements: list[Element], translation: str, spans: list[Element]) -> None:
    """Put a sentence's ``translation`` in the place of its ``run`` of ``parts``, each element's tags around its
    span."""
    raw = "".join(parts[index] for index in run if index % 2 == 0)
    out, at = [raw[: len(raw) - len(raw.lstrip())]], 0  # the run's leading and trailing white space stay
    for (begin, end), (opening, closing) in zip(spans, elements, strict=True):
        escaped = html.escape(translation[begin:end], quote=False)
        out += [html.escape(translation[at:begin], quote=False), parts[opening], escaped, parts[closing]]
        at = end
    out += [html.escape(translation[at:], quote=False), raw[len(raw.rstrip()) :]]
    for index in run:
        parts[index] = ""
    parts[run[0]] = "".join(out)


def _replace(parts: list[str], index: int, translation: str) -> None:
    """A text node's translation in its place, with the node's leading and trailing white space."""
    part = parts[index]
    lead, trail = part[: len(part) - len(part.lstrip())], part[len(part.rstrip()) :]
    parts[index] = lead + html.escape(translation, quote=False) + trail


async def translate_html(text: str, translate: Translate) -> str:
    """``text`` as HTML, what it shows translated by ``translate`` and its tags kept (see the module's docstring)."""
    parts, nodes = html_nodes(text)
    lettered = {index for index in nodes if any(char.isalpha() for char in parts[index])}
    sentences = split_sentences(parts, lettered)
    in_sentences = {index for run, _ in sentences for index in run}
    alone = [index for index in nodes if index in lettered and index not in in_sentences]
    wanted = [shown(parts[index]) for index in alone]
    for run, elements in sentences:
        wanted += [shown("".join(parts[index] for index in run if index % 2 == 0))]
        wanted += [shown(parts[opening + 1]) for opening, _ in elements]
    got = iter(await translate(wanted))
    for index in alone:
        _replace(parts, index, next(got))
    split = []  # the text nodes of sentences whose tags could not be placed: translated one by one
    for run, elements in sentences:
        translation, pieces = next(got), [next(got) for _ in elements]
        spans = placed(translation, pieces)
        if spans is None:
            split += [index for index in run if index in lettered]
        else:
            _tagged(parts, run, elements, translation, spans)
    if split:
        for index, translation in zip(split, await translate([shown(parts[i]) for i in split]), strict=True):
            _replace(parts, index, translation)
    return "".join(parts)
