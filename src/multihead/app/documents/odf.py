"""OpenDocument files as documents: text documents (``.odt``), presentations (``.odp``) and spreadsheets (``.ods``).

A unit is a paragraph or heading with a letter in it: a text document's body (tables, lists, frames and text boxes,
notes too) and its page styles' headers and footers; a presentation's slides (their text boxes and tables) and notes;
a spreadsheet's cells holding text (not numbers, dates or formulas). As in :mod:`~multihead.app.documents.office`,
whose runs these are, a paragraph's formatting stands in its unit as inline elements: its own text and the spans
formatted as its first are plain, each other span (``text:span`` of a style) a ``<span>``, a link (``text:a``) an
``<a>``, a span of a code style or a monospace font a ``<code>``, kept as it is; the translation is written back into
the same spans, each keeping its style. A span holding more than text (a note, a frame, a field) is left as it is, and
so is everything that is not a paragraph's text (a field, a bookmark, an image).

The package is edited, not rebuilt: ``content.xml`` and ``styles.xml`` are parsed (lxml, as the Office formats are)
and written again, every other entry of the zip (the manifest, pictures, settings, the mimetype first) copied byte
for byte; odfpy names the OpenDocument namespaces and builds the tests' files. A package with encrypted entries is
refused.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lxml import etree
from odf.namespaces import FONS, MANIFESTNS, OFFICENS, STYLENS, TABLENS, TEXTNS, XLINKNS

from multihead.app.console import UserError
from multihead.app.documents.base import XML, Format, zip_package
from multihead.app.documents.office import (
    MONOSPACE,
    UNTRANSLATED_STYLE,
    OfficeDocument,
    Runs,
    office_document,
    runs_of,
)


def _name(namespace: str, local: str) -> str:
    return f"{{{namespace}}}{local}"


PARAGRAPHS = (_name(TEXTNS, "p"), _name(TEXTNS, "h"))
SPAN, LINK = _name(TEXTNS, "span"), _name(TEXTNS, "a")
SPACE, TAB, BREAK, PAGE_BREAK = (_name(TEXTNS, name) for name in ("s", "tab", "line-break", "soft-page-break"))
WHITE = (SPACE, TAB, BREAK, PAGE_BREAK)
"""A paragraph's white space elements: part of its text."""
STYLE_NAME = _name(TEXTNS, "style-name")
PLAIN = "{urn:multihead}plain"
"""The mark of a span made (while a file is translated) around a paragraph's own text, so that it is a run as a span
is; it is taken away again before the file is written."""
HEADERS = tuple(_name(STYLENS, f"{place}{side}") for place in ("header", "footer") for side in ("", "-left", "-first"))
SKIPPED = (_name(TEXTNS, "tracked-changes"),)
"""Where a paragraph is not the document's text: deleted text kept for tracked changes."""
CELLS = (_name(TABLENS, "table-cell"), _name(TABLENS, "covered-table-cell"))


def _text(element: Any) -> str:
    """The text a run shows: its text, its spaces, tabs and line breaks, its spans' text."""
    parts = [_collapsed(element.text)]
    for child in element:
        if child.tag == SPACE:
            parts.append(" " * int(child.get(_name(TEXTNS, "c")) or 1))
        elif child.tag in (TAB, BREAK):
            parts.append("\t" if child.tag == TAB else "\n")
        elif child.tag in (SPAN, LINK):
            parts.append(_text(child))
        parts.append(_collapsed(child.tail))
    return "".join(parts)


def _collapsed(text: str | None) -> str:
    """XML text as OpenDocument shows it: a row of white space one space."""
    return re.sub(r"[ \t\r\n]+", " ", text or "")


def _set_text(element: Any, text: str) -> None:
    """``text`` into a run: into its innermost span where it is only one (a link's span), its spaces, tabs and line
    breaks as OpenDocument writes them."""
    while not element.text and len(element) == 1 and element[0].tag == SPAN and not element[0].tail:
        element = element[0]
    for child in list(element):
        element.remove(child)
    element.text = None
    last = None
    for found in re.finditer(r"\n|\t| +|[^\n\t ]+", text):
        piece = found[0]
        if piece[0] not in "\n\t ":
            _append(element, last, piece)
            continue
        literal = piece[0] == " " and found.start() > 0 and text[found.start() - 1] not in "\n\t "
        if literal:
            _append(element, last, " ")
        if piece[0] == " " and len(piece) == int(literal):
            continue
        last = etree.SubElement(element, {"\n": BREAK, "\t": TAB, " ": SPACE}[piece[0]])
        if piece[0] == " " and len(piece) - literal > 1:
            last.set(_name(TEXTNS, "c"), str(len(piece) - literal))


def _append(element: Any, last: Any, text: str) -> None:
    if last is None:
        element.text = (element.text or "") + text
    else:
        last.tail = (last.tail or "") + text


def _is_run(element: Any) -> bool:
    """Whether an element of a paragraph is a run: a span or link holding only text (spans, white space)."""
    return element.tag in (SPAN, LINK) and all(inner.tag in (SPAN, LINK, *WHITE) for inner in element.iterdescendants())


def _wrap(paragraph: Any) -> None:
    """A paragraph's own text (with its white space elements) put in marked spans, so that each is a run."""
    wrapper = None
    if paragraph.text:
        wrapper = etree.Element(SPAN, {PLAIN: ""})
        wrapper.text, paragraph.text = paragraph.text, None
        paragraph.insert(0, wrapper)
    for child in list(paragraph):
        if child is wrapper:
            continue
        if isinstance(child.tag, str) and child.tag in WHITE:
            if wrapper is None:
                wrapper = etree.Element(SPAN, {PLAIN: ""})
                child.addprevious(wrapper)
            wrapper.append(child)
            continue
        wrapper = None
        if child.tail:
            wrapper = etree.Element(SPAN, {PLAIN: ""})
            wrapper.text, child.tail = child.tail, None
            child.addnext(wrapper)


def _unwrap(element: Any) -> None:
    """A marked span taken away, its text and elements left in its place."""
    parent, previous = element.getparent(), element.getprevious()
    _append(parent, previous, element.text or "")
    last = previous
    for child in list(element):
        element.addprevious(child)
        last = child
    _append(parent, last, element.tail or "")
    element.tail = None
    parent.remove(element)


class _Styles:
    """A package's text styles, by name: which say a span is code (kept untranslated)."""

    def __init__(self, roots: list[Any]) -> None:
        self.styles = {
            style.get(_name(STYLENS, "name")): style
            for root in roots
            for style in root.iter(_name(STYLENS, "style"))
            if style.get(_name(STYLENS, "family")) == "text"
        }

    def code(self, name: str | None, depth: int = 0) -> bool:
        """Whether the style ``name`` (or one it inherits) is a code style, or of a monospace font."""
        style = self.styles.get(name)
        if name is None or style is None or depth > 8:
            return bool(name and UNTRANSLATED_STYLE.search(name))
        properties = style.find(_name(STYLENS, "text-properties"))
        font = "" if properties is None else properties.get(_name(STYLENS, "font-name")) or ""
        font += "" if properties is None else " " + (properties.get(_name(FONS, "font-family")) or "")
        shown = style.get(_name(STYLENS, "display-name")) or name
        if UNTRANSLATED_STYLE.search(shown) or MONOSPACE.search(font):
            return True
        return self.code(style.get(_name(STYLENS, "parent-style-name")), depth + 1)


def _paragraph_runs(paragraph: Any, styles: _Styles) -> Runs:
    """A paragraph's runs: its own text, its spans and links (those holding only text)."""
    _wrap(paragraph)

    def items() -> Iterator[tuple[Any, str, str]]:
        for child in paragraph:
            if isinstance(child.tag, str) and _is_run(child) and _text(child):
                style = child.get(STYLE_NAME)
                inner = child[0].get(STYLE_NAME) if len(child) == 1 and child[0].tag == SPAN else None
                if child.get(PLAIN) is not None:
                    yield child, "span", ""
                elif styles.code(style) or styles.code(inner):
                    yield child, "code", f"{style} {inner}"
                elif child.tag == LINK:
                    yield child, "a", f"{child.get(_name(XLINKNS, 'href'))} {style} {inner}"
                else:
                    yield child, "span", f"{style}"

    return runs_of(items(), _text, _set_text)


def _translated(paragraph: Any) -> bool:
    """Whether a paragraph is text to translate: not deleted text, not in a cell of a number, a date or a formula."""
    for ancestor in paragraph.iterancestors():
        if ancestor.tag in SKIPPED:
            return False
        if ancestor.tag in CELLS:
            kind = ancestor.get(_name(OFFICENS, "value-type"))
            return kind in (None, "string") and ancestor.get(_name(TABLENS, "formula")) is None
    return True


def _package(path: Path, kind: str, media: str) -> tuple[bytes, zipfile.ZipFile]:
    """The bytes of the file ``path`` and its zip, refused in one line where it cannot be read, is not an
    OpenDocument file of the type ``media`` or is encrypted."""
    data, package, manifest = zip_package(path, kind, media, "META-INF/manifest.xml")
    if manifest.find(f".//{_name(MANIFESTNS, 'encryption-data')}") is not None:
        raise UserError(f"{str(path)!r} is encrypted: save it without a password as {kind}")
    return data, package


def _read(path: Path, kind: str, media: str) -> OfficeDocument:
    """The OpenDocument file ``path``: the paragraphs of its body, then its headers and footers."""
    data, package = _package(path, kind, media)
    try:
        roots = {name: etree.fromstring(package.read(name), XML) for name in ("content.xml", "styles.xml")}
    except (KeyError, etree.XMLSyntaxError, zipfile.BadZipFile) as error:
        raise UserError(f"{str(path)!r} is not {kind}: {error}") from None
    styles = _Styles(list(roots.values()))
    stories = [*roots["content.xml"].iter(_name(OFFICENS, "body"))]
    stories += [found for found in roots["styles.xml"].iter(*HEADERS)]
    found = [paragraph for story in stories for paragraph in story.iter(*PARAGRAPHS) if _translated(paragraph)]
    return office_document((_paragraph_runs(paragraph, styles) for paragraph in found), _saver(data, roots))


def _saver(data: bytes, roots: dict[str, Any]) -> Callable[[str], None]:
    """What writes the package again into a file: its parts ``roots`` as they are now (marked spans taken away),
    every other entry copied as it was, in the same order and compression."""

    def save(target: str) -> None:
        for root in roots.values():
            for wrapper in [found for found in root.iter(SPAN) if found.get(PLAIN) is not None]:
                _unwrap(wrapper)
        with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(target, "w") as written:
            for entry in source.infolist():
                part = roots.get(entry.filename)
                if part is not None:
                    written.writestr(entry, etree.tostring(part, xml_declaration=True, encoding="UTF-8"))
                else:
                    written.writestr(entry, source.read(entry))

    return save


def _format(name: str, kind: str, media: str) -> Format:
    def read(path: Path) -> OfficeDocument:
        return _read(path, kind, media)

    return Format(name, (f".{name}",), read)


MEDIA = "application/vnd.oasis.opendocument."
FORMATS = (
    _format("odt", "an OpenDocument text (.odt)", f"{MEDIA}text"),
    _format("odp", "an OpenDocument presentation (.odp)", f"{MEDIA}presentation"),
    _format("ods", "an OpenDocument spreadsheet (.ods)", f"{MEDIA}spreadsheet"),
)
"""OpenDocument files: text documents, presentations and spreadsheets, each paragraph or text cell translated, its
spans' styles kept."""
