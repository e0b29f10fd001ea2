"""Localisation catalogues as documents: gettext (``.po``, ``.pot``, read and written by ``polib``) and XLIFF 1.2 and
2.x (``.xlf``, ``.xliff``, read with ``defusedxml`` and written by ElementTree).

gettext: a unit is the ``msgid`` of each entry that has no translation yet (its ``msgstr``, or every ``msgstr[n]``,
empty), and its ``msgid_plural``: ``msgstr`` (or ``msgstr[0]``) is given the ``msgid``'s translation, every other
plural form the ``msgid_plural``'s, for as many forms as the header's ``Plural-Forms`` says (else as the entry has).
Each entry so filled is marked ``fuzzy``: a machine's translation for a translator to review (``msgfmt`` leaves fuzzy
entries out of the compiled catalogue until then). Entries that have a translation, fuzzy ones too, are kept as they
are, as are obsolete entries (``#~``), comments, flags and the header (its ``Language`` too: a translator does not
know its target language).

XLIFF: a unit is the ``source`` of each ``trans-unit`` (1.2) or of each ``segment`` of a ``unit`` (2.x) that has no
``target`` text yet and is not marked ``translate="no"``; its translation is written to its ``target`` (made after the
source where there is none), marked as a machine's translation to review: ``state="needs-review-translation"`` and
``state-qualifier="mt-suggestion"`` (1.2), the segment's ``state="translated"`` (2.x, whose states go no finer).
Inline codes stay in the translation, each where the translation of its words is: a paired code (``<g>``, ``<pc>``,
``<mrk>``) as an inline element around its own words (one marked ``translate="no"``, or a 1.2 ``mrk`` of
``mtype="protected"``, kept with its text as it was), a standalone one (``<x/>``, ``<ph/>``, ``<bx/>``, ``<ex/>``,
``<bpt>``, ``<ept>``, ``<it>``, ``<sc/>``, ``<ec/>``...) as a placeholder the model reads as ``<x id="N"/>`` and
the translator keeps. The file's languages (``target-language``, ``trgLang``) are left as they are, and so is
everything else the root element holds, its namespace prefixes too (a comment or processing instruction before it
is not kept).

A message without a letter or a digit (``—``, ``→``) is its own translation, given to its entry as the others are.
"""

from __future__ import annotations

import copy
import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import polib
from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser

from multihead.app.console import UserError
from multihead.app.documents.base import Format, read_utf8
from multihead.app.segment import readable

PLURALS = re.compile(r"nplurals\s*=\s*(\d+)")
XLIFF_1 = "urn:oasis:names:tc:xliff:document:1.2"
XLIFF_2 = "urn:oasis:names:tc:xliff:document:2.0"
"""The namespaces of XLIFF 1.2 and of XLIFF 2.x (2.0, 2.1 and 2.2 share it)."""
PAIRED = {"g", "pc", "mrk"}
"""XLIFF inline elements that wrap text: placed around their words; every other inline element is a placeholder."""


@dataclass
class Messages:
    """Texts to translate, each filled back by its own translation; its units, those with a letter or a digit (a text
    without one, ``→``, is its own translation)."""

    texts: list[str]
    units: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.units = [text for text in self.texts if readable(text)]

    def filled(self, translations: Sequence[str]) -> Iterator[str]:
        """Each text's translation, in order: a unit's from ``translations``, the rest as they are."""
        done = iter(translations)
        return (next(done) if readable(text) else text for text in self.texts)


def _forms(entry: polib.POEntry, plurals: int | None) -> list[int]:
    """The plural forms an entry of ``msgid_plural`` is given: as many as the header says, else as it has."""
    return list(range(plurals)) if plurals else sorted(entry.msgstr_plural) or [0, 1]


def _untranslated(catalogue: polib.POFile) -> list[int]:
    """The places of the catalogue's entries that have no translation (none of their forms), obsolete ones left."""
    return [place for place, entry in enumerate(catalogue)
            if not entry.obsolete and not entry.msgstr and not any(entry.msgstr_plural.values())]  # fmt: skip


def _texts(entry: polib.POEntry, plurals: int | None) -> list[str]:
    """An entry's messages to translate, one a form it is given (``msgid``, then ``msgid_plural`` for the others)."""
    if not entry.msgid_plural:
        return [entry.msgid]
    return [entry.msgid if form == 0 else entry.msgid_plural for form in _forms(entry, plurals)]


@dataclass
class PoDocument:
    """A gettext catalogue; its units, the messages of its entries without a translation."""

    catalogue: polib.POFile
    places: list[int]
    plurals: int | None
    messages: Messages = field(init=False)
    units: list[str] = field(init=False)
    markup: bool = False

    def __post_init__(self) -> None:
        texts = [text for place in self.places for text in _texts(self.catalogue[place], self.plurals)]
        self.messages = Messages(texts)
        self.units = self.messages.units

    def write(self, translations: Sequence[str], path: Path) -> None:
        catalogue = copy.deepcopy(self.catalogue)
        filled = self.messages.filled(translations)
        for place in self.places:
            entry = catalogue[place]
            if entry.msgid_plural:
                entry.msgstr_plural = {form: next(filled) for form in _forms(entry, self.plurals)}
            else:
                entry.msgstr = next(filled)
            if "fuzzy" not in entry.flags:
                entry.flags.insert(0, "fuzzy")
        catalogue.save(str(path))


def read_po(path: Path) -> PoDocument:
    """The gettext catalogue ``path`` (``.po``, ``.pot``), refused in one line where it is not one or every entry has
    a translation."""
    text = read_utf8(path, "a gettext catalogue")
    try:
        catalogue = polib.pofile(text, encoding="utf-8", wrapwidth=78)
    except (OSError, ValueError) as error:
        raise UserError(f"--input {str(path)!r} is not a gettext catalogue (.po, .pot): {error}") from None
    found = PLURALS.search(catalogue.metadata.get("Plural-Forms", ""))
    document = PoDocument(catalogue, _untranslated(catalogue), int(found[1]) if found else None)
    if not document.places:
        raise UserError(f"--input {str(path)!r} holds no entry without a translation ({len(catalogue)} entries, "
                        f"obsolete ones included): nothing to translate")  # fmt: skip
    return document


def _local(element: ET.Element) -> str:
    """An element's name without its namespace (``""`` for a comment or a processing instruction)."""
    return element.tag.rpartition("}")[2] if isinstance(element.tag, str) else ""


def _html(element: ET.Element, codes: list[ET.Element]) -> str:
    """The content of an XLIFF ``source`` (or of a paired code in it) as HTML: its text escaped, each inline code an
    element naming its place in ``codes`` (where it is appended): a paired one ``<span>``, a standalone one
    ``<code>``, kept as it is, holding the placeholder the model reads."""
    parts = [html.escape(element.text or "", quote=False)]
    for child in element:
        place = len(codes)
        codes.append(child)
        if _local(child) in PAIRED:
            kept = child.get("translate") == "no" or child.get("mtype") == "protected"
            marked = ' translate="no"' if kept else ""
            parts.append(f'<span data-code="{place}"{marked}>{_html(child, codes)}</span>')
        else:
            stand_in = html.escape(f'<x id="{place}"/>')
            parts.append(f'<code data-code="{place}">{stand_in}</code>')
        parts.append(html.escape(child.tail or "", quote=False))
    return "".join(parts)


class _Target(HTMLParser):
    """A unit's translation (HTML, as :func:`_html` gives its source) read into an XLIFF ``target``: its text, each
    paired code around its words, each standalone code in its place, as they were in the source."""

    def __init__(self, target: ET.Element, codes: Sequence[ET.Element]) -> None:
        super().__init__(convert_charrefs=True)
        self.codes, self.open, self.in_code = codes, [target], False

    def _append(self, element: ET.Element) -> None:
        element.tail = None
        self.open[-1].append(element)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        code = self.codes[int(dict(attrs)["data-code"] or 0)]
        if tag == "span":
            self._append(ET.Element(code.tag, code.attrib))
            self.open.append(self.open[-1][-1])
        else:
            self._append(copy.deepcopy(code))
            self.in_code = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "span":
            self.open.pop()
        else:
            self.in_code = False

    def handle_data(self, data: str) -> None:
        parent = self.open[-1]
        if self.in_code:  # a standalone code's placeholder: the code is in place already
            return
        if len(parent):
            parent[-1].tail = (parent[-1].tail or "") + data
        else:
            parent.text = (parent.text or "") + data


def _segments(root: ET.Element, namespace: str) -> list[tuple[ET.Element, ET.Element]]:
    """Each place of the file with a source to translate: its ``trans-unit`` (1.2) or ``segment`` (2.x), and its
    ``source``; those with a target holding text, or marked ``translate="no"``, left out."""
    name = f"{{{namespace}}}"
    if namespace == XLIFF_1:
        places = [unit for unit in root.iter(f"{name}trans-unit") if unit.get("translate") != "no"]
    else:
        units = [unit for unit in root.iter(f"{name}unit") if unit.get("translate") != "no"]
        places = [segment for unit in units for segment in unit.iter(f"{name}segment")]
    found = []
    for place in places:
        source, target = place.find(f"{name}source"), place.find(f"{name}target")
        if source is not None and (target is None or not "".join(target.itertext()).strip()):
            found.append((place, source))
    return found


def _write_target(place: ET.Element, source: ET.Element, translation: str, namespace: str) -> None:
    """``translation`` (HTML) written into the target of ``place`` (made after its source where it has none), with
    its inline codes as they were in ``source``; the place marked as translated by a machine."""
    target = place.find(f"{{{namespace}}}target")
    if target is None:
        target = ET.Element(f"{{{namespace}}}target")
        segmented = place.find(f"{{{namespace}}}seg-source")
        after = source if segmented is None else segmented
        index = list(place).index(after)
        target.tail, after.tail = after.tail, place[index - 1].tail if index else place.text  # indented as it is
        place.insert(index + 1, target)
    else:
        target.text = None
        target[:] = []
    codes: list[ET.Element] = []
    _html(source, codes)
    reader = _Target(target, codes)
    reader.feed(translation)
    reader.close()
    if namespace == XLIFF_1:
        target.set("state", "needs-review-translation")
        target.set("state-qualifier", "mt-suggestion")
    else:
        place.set("state", "translated")


class _Builder(ET.TreeBuilder):
    """ElementTree's tree builder, recording the namespace prefixes a file declares."""

    def __init__(self) -> None:
        super().__init__(insert_comments=True, insert_pis=True)
        self.prefixes: dict[str, str] = {}

    def start_ns(self, prefix: str, uri: str) -> None:
        self.prefixes.setdefault(prefix, uri)


@dataclass
class XliffDocument:
    """An XLIFF file (its root element, the namespace that says its version, the namespace prefixes it declares);
    its units, the sources to translate, as HTML."""

    root: ET.Element
    namespace: str
    prefixes: dict[str, str]
    messages: Messages = field(init=False)
    units: list[str] = field(init=False)
    markup: bool = True

    def __post_init__(self) -> None:
        self.messages = Messages([_html(source, []) for _, source in _segments(self.root, self.namespace)])
        self.units = self.messages.units

    def write(self, translations: Sequence[str], path: Path) -> None:
        root = copy.deepcopy(self.root)
        filled = self.messages.filled(translations)
        for place, source in _segments(root, self.namespace):
            _write_target(place, source, next(filled), self.namespace)
        for prefix, uri in self.prefixes.items():  # each namespace written with the prefix the file gave it
            if not re.fullmatch(r"ns\d+", prefix):  # ElementTree's own names, which it refuses
                ET.register_namespace(prefix, uri)
        ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def read_xliff(path: Path) -> XliffDocument:
    """The XLIFF 1.2 or 2.x file ``path``, refused in one line where it is not one or holds nothing to translate."""
    named = f"--input {str(path)!r}"
    builder = _Builder()
    parser = DefusedXMLParser(target=builder)
    try:
        parser.feed(read_utf8(path, "an XLIFF file"))
        root = parser.close()
    except ET.ParseError as error:
        raise UserError(f"{named} is not XML, as an XLIFF file is: {error}") from None
    except DefusedXmlException as error:
        raise UserError(f"{named} declares entities or external references, which are not read: {error}") from None
    namespace = root.tag[1:].partition("}")[0] if root.tag.startswith("{") else ""
    if _local(root) != "xliff" or namespace not in (XLIFF_1, XLIFF_2):
        raise UserError(f"{named} is not XLIFF 1.2 or 2.x: its root element is {root.tag!r}, version "
                        f"{root.get('version')!r}")  # fmt: skip
    document = XliffDocument(root, namespace, builder.prefixes)
    if not document.messages.texts:
        raise UserError(f"{named} holds no source without a translation (or all are marked translate=\"no\"): "
                        "nothing to translate")  # fmt: skip
    return document


FORMATS = (
    Format("po", (".po", ".pot"), read_po),
    Format("xliff", (".xlf", ".xliff"), read_xliff),
)
