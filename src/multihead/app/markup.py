"""HTML as ``serve`` translates it (``format: "html"``): the text a page shows, translated, its tags kept.

A page is cut at its tags and comments (a ``script`` or ``style`` element whole). The text that shows between them is
translated; the rest is kept as it was: tags, comments, and whole elements not to be translated, byte for byte:
``code``, ``kbd``, ``pre``, ``samp``, ``script``, ``style``, ``var`` and any element with ``translate="no"`` or the
class ``notranslate``.

A sentence runs between block-level tags (``<p>``, ``<li>``...), ``<br>`` (a line break: lines are translated one
by one) and comments; inline elements (``<b>``, ``<a>``, ``<span>``..., one inside another too), kept inline elements
(``<code>``) and images stand inside it, and a ``<wbr>`` (where a word may break) is dropped, its word read whole.
A sentence so split is translated whole, and each inline element's tags go around its own translation, where that
is found in the sentence's:

- as the element's text translated alone, as whole words, case, a final full stop and a word repeated aside; where
  those words stand several times in the sentence's translation, the element's text must stand as many times in the
  sentence, and the element's rank among them gives its translation's;
- else as the one run of words that the sentence's translation has more than that of the sentence without the
  element's text (a run that could stand one word earlier is not taken).

An element found neither way keeps its tags around nothing, after its parent's translation: its text is translated
in the sentence and never wrapped by tags that are not its own. A kept element stands in the sentence the model reads
as its own text (an image as its ``alt``; an element without a letter is kept too), is found in the sentence's
translation the same ways and replaced there by the element as it was; where one is not found, or has no text, the
sentence is cut there and its parts on either side translated one by one, the element kept between them. A text
without a letter (the full stop after a ``</b>``) is kept as it is: a model reads no sentence in it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field

Translate = Callable[[list[str]], Awaitable[list[str]]]
"""What translates texts, in order (a request's translators)."""
Step = Generator[list[str], list[str], None]
"""A part of a page's translation: it yields the texts it needs translated and is sent their translations, round after
round, until it has put its translation in the page."""
Span = tuple[int, int]
INLINE = {
    "a", "abbr", "b", "bdi", "bdo", "cite", "code", "data", "dfn", "em", "font", "i", "kbd", "mark", "q", "s", "samp",
    "small", "span", "strong", "sub", "sup", "time", "u", "var",
}  # fmt: skip
"""HTML elements that stand inside a sentence: the sentence around them is translated with their text."""
IN_WORDS = {"img", "wbr"}
"""Void HTML elements that stand inside a sentence: an image, a place where a word may break."""
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
"""HTML elements without content or closing tag."""
KEPT = {"code", "kbd", "pre", "samp", "var"}
"""HTML elements kept as they are, their text not translated (as is any with ``translate="no"`` or the class
``notranslate``, LibreTranslate's and Google's conventions)."""
RAW = {"script", "style"}
"""HTML elements whose content is not HTML: each cut from a page whole, as one tag, and kept."""
TAG = re.compile(r"<(/?)([A-Za-z][\w-]*)")
UNTRANSLATED = re.compile(
    r"""\s(?:translate\s*=\s*["']?no(?![\w-])|class\s*=\s*(?:"[^"]*|'[^']*|)(?<![\w-])notranslate(?![\w-]))""",
    re.IGNORECASE,
)
ALT = re.compile(r"""\salt\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""", re.IGNORECASE)
TOKEN = re.compile(r"\w+|[^\w\s]")
"""A word or another sign: what the translations of a sentence with and without an element's text are compared by."""


def _cut(text: str) -> list[str]:
    """``text`` cut at its tags, comments and ``script`` and ``style`` elements, which stand at the odd places."""
    raw = "|".join(RAW)
    return re.split(rf"(<!--.*?-->|<(?:{raw})\b.*?</(?:{raw})\s*>|<[^>]*>)", text, flags=re.DOTALL | re.IGNORECASE)


def _name(part: str) -> str:
    """The name of a tag, lower case; ``""`` for a comment."""
    tag = TAG.match(part)
    return tag[2].lower() if tag else ""


def _kept(parts: list[str]) -> dict[int, int]:
    """The elements of a cut page kept as they are: the place of each one's opening tag, to that of its closing tag
    (the page's last part, where it is not closed)."""
    kept, index = {}, 1
    while index < len(parts):
        part, name = parts[index], _name(parts[index])
        opening = name and not part.startswith("</") and name not in VOID | RAW and not part.endswith("/>")
        if opening and (name in KEPT or UNTRANSLATED.search(part)):
            depth, end = 1, len(parts) - 1
            for other in range(index + 2, len(parts), 2):
                if _name(parts[other]) == name and not parts[other].endswith("/>"):
                    depth += -1 if parts[other].startswith("</") else 1
                if not depth:
                    end = other
                    break
            kept[index] = end
            index = end
        index += 2
    return kept


def shown(text: str) -> str:
    """A text node as it shows: its entities read, its line breaks and runs of spaces one space."""
    return " ".join(html.unescape(text).split())


def _lettered(text: str) -> bool:
    return any(char.isalpha() for char in text)


def visible_text(text: str) -> str:
    """What an HTML ``text`` shows and is translated, its nodes' text one space apart: what its language is told
    from."""
    parts = _cut(text)
    kept = {index for start, end in _kept(parts).items() for index in range(start, end + 1)}
    return " ".join(filter(None, (shown(parts[index]) for index in range(0, len(parts), 2) if index not in kept)))


def _alt(tag: str) -> str:
    """The ``alt`` attribute of an image's ``tag``, as written; ``""`` where it has none."""
    found = ALT.search(tag)
    return next(filter(None, found.groups()), "") if found else ""


def _inline(part: str) -> bool:
    name = _name(part)
    return name in IN_WORDS or (name in INLINE and not part.endswith("/>"))


def _runs(parts: list[str], kept: dict[int, int]) -> list[range]:
    """The runs of a cut page's parts that a sentence may span: its texts, inline tags and kept inline elements
    between other tags and kept elements."""
    runs, start, index = [], 0, 0
    while index < len(parts):
        end = kept.get(index, index)
        if index % 2 and not _inline(parts[index]):
            runs.append(range(start, index))
            start = end + 1
        index = end + 1
    runs.append(range(start, len(parts)))
    return runs


@dataclass(eq=False)
class _Node:
    """An inline element of a sentence, or a thing in it kept as it is (``kept``): a kept element, an image, an element
    without a letter, a tag that closes nothing. ``first`` and ``last`` are the places of its first and last parts (an
    element's tags; ``None``: a tag outside the sentence's run), ``start`` and ``end`` those of its text in the
    sentence's."""

    name: str
    first: int | None
    start: int
    last: int | None = None
    end: int = 0
    kept: bool = False
    children: list[_Node] = field(default_factory=list)


class _Sentence:
    """A run of a cut page's parts read as one sentence: its text as the model reads it (a kept element's own text, an
    image's ``alt`` in its place) and its inline elements and kept things, a tree under :attr:`root`."""

    def __init__(self, parts: list[str], run: range, kept: dict[int, int]) -> None:
        self.parts, self.run, self.source = parts, run, ""
        self.lettered: list[int] = []  # the places of its texts with a letter
        self.root = _Node("", None, 0)
        stack, index = [self.root], run.start
        while index < run.stop:
            end = kept.get(index, index)
            if index % 2 == 0:
                text = html.unescape(parts[index])
                self.source += text
                if _lettered(text):
                    self.lettered.append(index)
            else:
                self._tag(stack, index, end)
            index = end + 1
        while len(stack) > 1:  # left open in this run
            self._close(stack, None)
        self.root.end = len(self.source)

    def _tag(self, stack: list[_Node], index: int, end: int) -> None:
        part, name, inside = self.parts[index], _name(self.parts[index]), stack[-1].children
        if index != end or name == "img":  # a kept element's text, an image's alt, in their places
            inside.append(_Node(name, index, len(self.source), end, kept=True))
            self.source += html.unescape("".join(self.parts[index + 1 : end + 1 : 2]) if index != end else _alt(part))
            inside[-1].end = len(self.source)
        elif name == "wbr":
            return
        elif not part.startswith("</"):
            stack.append(_Node(name, index, len(self.source)))
            inside.append(stack[-1])
        elif stack[-1].name == name:
            self._close(stack, index)
        elif len(stack) == 1:  # it closes an element opened before this run: around all before it
            stack.append(_Node(name, None, 0, children=inside[:]))
            self.root.children = [stack[-1]]
            self._close(stack, index)
        else:  # it closes nothing here
            inside.append(_Node(name, index, len(self.source), index, len(self.source), kept=True))

    def _close(self, stack: list[_Node], last: int | None) -> None:
        node = stack.pop()
        node.last, node.end = last, len(self.source)
        if not _lettered(self.source[node.start : node.end]):
            node.kept, node.children = True, []

    def nodes(self, node: _Node | None = None) -> Iterator[_Node]:
        """The sentence's elements and kept things, each before those inside it."""
        for child in (node or self.root).children:
            yield child
            yield from self.nodes(child)

    def text(self, node: _Node) -> str:
        """The text of ``node`` as the model reads it."""
        return " ".join(self.source[node.start : node.end].split())

    def without(self, node: _Node) -> str:
        """The sentence's text without that of ``node``."""
        left, right = self.source[: node.start].rstrip(), self.source[node.end :].lstrip()
        return " ".join((left + (" " if right[:1].isalnum() else "") + right).split())

    def places(self, node: _Node) -> range:
        """The places of the parts of ``node``, in this sentence's run."""
        last = self.run.stop - 1 if node.last is None else node.last
        return range(self.run.start if node.first is None else node.first, last + 1)

    def tags(self, node: _Node) -> tuple[str, str]:
        """An element's opening and closing tags (``""`` for one outside this run)."""
        first, last = node.first, node.last
        return "" if first is None else self.parts[first], "" if last is None else self.parts[last]

    def cut(self, nodes: Iterable[_Node]) -> list[range]:
        """The runs of this sentence's parts between ``nodes`` (kept things)."""
        runs, start = [], self.run.start
        for places in sorted((self.places(node) for node in nodes), key=lambda places: places.start):
            runs.append(range(start, places.start))
            start = places.stop
        return [*runs, range(start, self.run.stop)]


def _pattern(text: str) -> re.Pattern[str] | None:
    """What finds the words of ``text`` as whole words, case and spacing aside; ``None`` for a text without one."""
    words = text.split()
    return re.compile(r"(?<!\w)" + r"\s+".join(map(re.escape, words)) + r"(?!\w)", re.IGNORECASE) if words else None


def _core(translation: str) -> str:
    """An element's translation as it may stand in its sentence's: without a final full stop, and a word (or words)
    said again and again ("Black black black ...", as a model may translate one word alone) said once."""
    words = translation.rstrip(".!?。！？").split()
    folded = [word.casefold() for word in words]
    for size in range(1, len(words) // 2 + 1):
        if len(words) % size == 0 and folded == folded[:size] * (len(words) // size):
            return " ".join(words[:size])
    return " ".join(words)


def _occurrence(source: str, at: int, text: str, translation: str, wanted: str) -> Span | None:
    """Where ``wanted`` (the translation of ``text``, which stands in ``source`` at ``at``) stands in ``translation``
    (``source``'s): where it stands as many times as ``text`` does there, at the same rank."""
    mine, theirs = _pattern(text), _pattern(wanted)
    if mine is None or theirs is None:
        return None
    starts = [found.start() for found in mine.finditer(source)]
    found = list(theirs.finditer(translation))
    at += len(text) - len(text.lstrip())
    return found[starts.index(at)].span() if at in starts and len(starts) == len(found) else None


def _inserted(translation: str, other: str) -> Span | None:
    """The one run of words (and signs) that ``translation`` has more than ``other``, where it can stand nowhere
    else; ``None`` where they differ otherwise."""
    mine = list(TOKEN.finditer(translation))
    words, others = [token[0].casefold() for token in mine], [token.casefold() for token in TOKEN.findall(other)]
    head = tail = 0
    while head < min(len(words), len(others)) and words[head] == others[head]:
        head += 1
    while tail < min(len(words), len(others)) - head and words[-1 - tail] == others[-1 - tail]:
        tail += 1
    last = len(words) - tail - 1
    if head + tail != len(others) or last < head or (head and words[head - 1] == words[last]):
        return None
    return mine[head].start(), mine[last].end()


def _across(span: Span) -> Callable[[Span], bool]:
    """Whether a span goes across ``span``."""
    return lambda other: other[0] < span[1] and span[0] < other[1]


@dataclass
class _Placed:
    """A sentence's ``translation`` with the spans of its elements and kept things in it, found by their own
    ``pieces`` (their texts' translations) and, where those are not found, by ``without`` (the translations of the
    sentence without their texts)."""

    sentence: _Sentence
    translation: str
    pieces: dict[_Node, str]
    without: dict[_Node, str]
    spans: dict[_Node, Span] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.spans[self.sentence.root] = (0, len(self.translation))
        self._fill(self.sentence.root, self.sentence.root, [])

    def _fill(self, node: _Node, around: _Node, taken: list[Span]) -> None:
        """Spans for the nodes inside ``node``, inside that of ``around`` (``node`` or, where it has none, the nearest
        node around it that has one) and none across one ``taken``."""
        begin, end = self.spans[around]
        for child in node.children:
            span = self._find(child, around)
            if span is not None and begin <= span[0] <= span[1] <= end and not any(map(_across(span), taken)):
                self.spans[child] = span
                taken.append(span)
                if not child.kept:
                    self._fill(child, child, [])
            elif not child.kept:
                self._fill(child, around, taken)

    def _find(self, node: _Node, around: _Node) -> Span | None:
        source, (begin, end) = self.sentence.source, self.spans[around]
        if not (source[around.start : node.start] + source[node.end : around.end]).strip():  # all of its text
            inside = self.translation[begin:end]
            return begin + len(inside) - len(inside.lstrip()), end - len(inside) + len(inside.rstrip())
        wanted = self.sentence.text(node) if node.kept else _core(self.pieces[node])
        text = source[node.start : node.end]
        found = _occurrence(source[around.start : around.end], node.start - around.start, text,
                            self.translation[begin:end], wanted)  # fmt: skip
        if found is not None:
            return begin + found[0], begin + found[1]
        return _inserted(self.translation, self.without[node]) if node in self.without else None

    def html(self) -> str:
        """The sentence's translation as HTML, its white space around it as the sentence's."""
        source = self.sentence.source
        lead, trail = source[: len(source) - len(source.lstrip())], source[len(source.rstrip()) :]
        return lead + self._inside(self.sentence.root) + trail

    def _inside(self, node: _Node) -> str:
        """What stands inside ``node``: its span of the translation, the nodes found in it in place, those not found
        after it, their tags around nothing."""
        out, (at, end) = [], self.spans[node]
        for child in sorted(self._under(node), key=self.spans.__getitem__):
            start, stop = self.spans[child]
            out += [html.escape(self.translation[at:start], quote=False), self._whole(child)]
            at = stop
        out.append(html.escape(self.translation[at:end], quote=False))
        return "".join(out + [self._empty(child) for child in node.children if child not in self.spans])

    def _under(self, node: _Node) -> Iterator[_Node]:
        """The nodes found inside ``node`` and not inside another found node."""
        for child in node.children:
            if child in self.spans:
                yield child
            else:
                yield from self._under(child)

    def _whole(self, node: _Node) -> str:
        if node.kept:
            return "".join(self.sentence.parts[index] for index in self.sentence.places(node))
        opening, closing = self.sentence.tags(node)
        return opening + self._inside(node) + closing

    def _empty(self, node: _Node) -> str:
        opening, closing = self.sentence.tags(node)
        return opening + "".join(self._empty(child) for child in node.children if child not in self.spans) + closing


def _replace(parts: list[str], index: int, translation: str) -> None:
    """A text node's translation in its place, with the node's leading and trailing white space."""
    part = parts[index]
    lead, trail = part[: len(part) - len(part.lstrip())], part[len(part.rstrip()) :]
    parts[index] = lead + html.escape(translation, quote=False) + trail


def _alone(parts: list[str], index: int) -> Step:
    """The text at ``index`` translated alone, in its place."""
    (translation,) = yield [shown(parts[index])]
    _replace(parts, index, translation)


def _translated(sentence: _Sentence, kept: dict[int, int]) -> Step:
    """``sentence`` translated whole, its elements and kept things placed in its translation (see the module's
    docstring); else cut at the kept things not placed, its runs between them translated one by one."""
    elements = [node for node in sentence.nodes() if not node.kept]
    translation, *pieces = yield [sentence.text(sentence.root), *map(sentence.text, elements)]
    placed = _Placed(sentence, translation, dict(zip(elements, pieces, strict=True)), {})
    missing = [node for node in sentence.nodes() if node not in placed.spans]
    if missing:
        without = {node: sentence.without(node) for node in missing}
        asked = [node for node in missing if _lettered(without[node])]
        if asked:
            without.update(zip(asked, (yield [without[node] for node in asked]), strict=True))
        placed = _Placed(sentence, translation, placed.pieces, without)
    lost = [node for node in sentence.nodes() if node.kept and node not in placed.spans]
    if lost:
        yield from _together(step for run in sentence.cut(lost) for step in _steps(sentence.parts, run, kept))
        return
    translated = placed.html()
    for index in sentence.run:
        sentence.parts[index] = ""
    sentence.parts[sentence.run.start] = translated


def _steps(parts: list[str], run: range, kept: dict[int, int]) -> list[Step]:
    """What translates a ``run`` of a cut page: a sentence split by inline markup whole, a text alone, or nothing."""
    sentence = _Sentence(parts, run, kept)
    blank = [node for node in sentence.nodes() if node.kept and not sentence.text(node)]
    if blank:  # nothing to find them by: the sentence cut at them
        return [step for piece in sentence.cut(blank) for step in _steps(parts, piece, kept)]
    if len(sentence.lettered) == 1 and not any(node.kept for node in sentence.nodes()):
        return [_alone(parts, sentence.lettered[0])]
    return [_translated(sentence, kept)] if sentence.lettered else []


def _ask(step: Step, translations: list[str] | None = None) -> list[str] | None:
    """What ``step`` asks next, sent ``translations`` (started where ``None``); ``None`` once it is done."""
    try:
        return next(step) if translations is None else step.send(translations)
    except StopIteration:
        return None


def _together(steps: Iterable[Step]) -> Step:
    """``steps`` side by side: each round, what they all ask at once."""
    asking = [(step, texts) for step in steps if (texts := _ask(step)) is not None]
    while asking:
        got = iter((yield [text for _, texts in asking for text in texts]))
        answers = [(step, [next(got) for _ in texts]) for step, texts in asking]
        asking = [(step, texts) for step, answer in answers if (texts := _ask(step, answer)) is not None]


async def translate_html(text: str, translate: Translate) -> str:
    """``text`` as HTML, what it shows translated by ``translate`` and its tags kept (see the module's docstring)."""
    parts = _cut(text)
    kept = _kept(parts)
    page = _together(step for run in _runs(parts, kept) for step in _steps(parts, run, kept))
    texts = _ask(page)
    while texts is not None:
        texts = _ask(page, await translate(texts))
    return "".join(parts)
