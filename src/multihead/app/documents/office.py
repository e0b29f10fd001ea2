"""Office documents as documents: Word (``.docx``), PowerPoint (``.pptx``) and Excel (``.xlsx``) files, read and
written by python-docx, python-pptx and openpyxl.

A unit is a paragraph with a letter in it: a Word document's body, tables (nested ones too), text boxes, headers and
footers; a slide's shapes (groups and tables too) and its notes; a worksheet's cells holding text (not formulas or
numbers), sheet after sheet. A paragraph's runs (its stretches of one formatting) stand in its unit as inline
elements: the runs formatted as the paragraph's first are its plain text, each other stretch of one formatting an
element (``<span>``, ``<a>`` for a link, ``<code>`` for a run styled as code or not to be translated, which is kept as
it is), so that :mod:`multihead.app.markup` places each around its own words in the translation. The translation is
written back into the same runs, in the translation's order: each keeps its formatting and holds its own words (a run
whose words vanished is left empty, never removed), so that no source text is left and no formatting is lost.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import docx
import openpyxl
import pptx
from docx.opc.constants import CONTENT_TYPE as WORD_CONTENT
from docx.opc.constants import RELATIONSHIP_TYPE as WORD_RELATIONSHIP
from docx.opc.part import PartFactory, XmlPart
from docx.oxml.ns import qn as word_name
from lxml import etree
from pptx.oxml.ns import qn as slide_name

from multihead.app.console import UserError
from multihead.app.documents.base import Format
from multihead.app.markup import VOID

OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
"""How an OLE compound file starts: an encrypted Office file, or an old binary one (``.doc``, ``.ppt``, ``.xls``)."""
MONOSPACE = re.compile(r"courier|consolas|menlo|monaco|lucida console|mono|code", re.IGNORECASE)
"""Fonts that say a run is code: kept untranslated."""
UNTRANSLATED_STYLE = re.compile(r"code|verbatim|no ?translat|source", re.IGNORECASE)
"""Character style names that say a run is code or not to be translated."""
UNFORMATTING = {"lang", "altLang", "dirty", "err", "noProof", "smtClean", "rsidRPr"}
"""Run properties (attributes and elements) that do not show: runs differing only in them read as one formatting."""
GROUP = re.compile(r"g(\d+)")


def lettered(text: str) -> bool:
    return any(character.isalpha() for character in text)


@dataclass
class Runs:
    """A paragraph's runs (XML elements: a run, a link), gathered into stretches of one formatting, and how a run's
    text is read and written."""

    groups: list[list[Any]]
    """Runs in a row of one formatting, in the paragraph's order."""
    tags: list[str]
    """Each group's inline element: ``span``, ``a`` or ``code``."""
    plain: set[int]
    """The groups formatted as the paragraph's first run, written as plain text."""
    get_text: Callable[[Any], str]
    set_text: Callable[[Any, str], None]

    def html(self) -> str:
        """The paragraph as HTML: its plain text escaped, each other group an inline element (``class="gN"``)."""
        parts = []
        for index, (group, tag) in enumerate(zip(self.groups, self.tags, strict=True)):
            text = escape("".join(self.get_text(run) for run in group)).replace("\n", "<br>")
            parts.append(text if index in self.plain else f'<{tag} class="g{index}">{text}</{tag}>')
        return "".join(parts)

    def write(self, translation: str) -> None:
        """The paragraph's runs holding ``translation`` (its :meth:`html` translated): each group's first run the
        words of its element, in the translation's order; the plain text in the plain groups' runs, one after another
        (copies of the first where they are too few); every other run emptied and put after them."""
        plain = [self.groups[index][0] for index in sorted(self.plain)]
        placed: list[Any] = []
        plain_used = 0
        for group, text in _pieces(translation, len(self.groups), bool(plain)):
            if group is None:
                run = plain[plain_used] if plain_used < len(plain) else copy.deepcopy(plain[0])
                plain_used += 1
            else:
                run = self.groups[group][0]
                run = copy.deepcopy(run) if any(found is run for found in placed) else run
            self.set_text(run, text)
            placed.append(run)
        slots = [run for group in self.groups for run in group]
        for run in slots:
            if not any(found is run for found in placed):
                self.set_text(run, "")
                placed.append(run)
        _place(slots, placed)


def _place(slots: Sequence[Any], elements: Sequence[Any]) -> None:
    """``elements`` put where ``slots`` stand, one each in order, the ones left over after the last."""
    marks = []
    for slot in slots:
        mark = etree.Element("mark")
        slot.addprevious(mark)
        marks.append(mark)
    for index, element in enumerate(elements):
        marks[min(index, len(marks) - 1)].addprevious(element)
    for mark in marks:
        mark.getparent().remove(mark)


class _Pieces(HTMLParser):
    """A translated paragraph cut into its texts, each with the group whose element holds it (``None``: plain)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[int | None] = []
        self.found: list[tuple[int | None, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "br":
            self.handle_data("\n")
        elif tag not in VOID:
            group = GROUP.fullmatch(dict(attrs).get("class") or "")
            self.open.append(int(group[1]) if group else self.open[-1] if self.open else None)

    def handle_endtag(self, tag: str) -> None:
        if self.open and tag not in VOID:
            self.open.pop()

    def handle_data(self, data: str) -> None:
        group = self.open[-1] if self.open else None
        if self.found and self.found[-1][0] == group:
            self.found[-1] = (group, self.found[-1][1] + data)
        else:
            self.found.append((group, data))


def _pieces(translation: str, groups: int, plain: bool) -> list[tuple[int | None, str]]:
    """The texts of ``translation``, each with its group (``None``: plain text); where the paragraph has no plain
    group, its plain text goes to the group before it (after it, at the start), one text with its own."""
    parser = _Pieces()
    parser.feed(translation)
    parser.close()
    pieces = [(group if group is None or group < groups else None, text) for group, text in parser.found]
    if plain or not pieces:
        return pieces
    owners = [group for group, _ in pieces if group is not None] or [0]
    merged: list[tuple[int | None, str]] = []
    for group, text in pieces:
        owner = group if group is not None else merged[-1][0] if merged else owners[0]
        if merged and merged[-1][0] == owner:
            merged[-1] = (owner, merged[-1][1] + text)
        else:
            merged.append((owner, text))
    return merged


def _formatting(properties: Any) -> str:
    """A run's properties (``w:rPr``, ``a:rPr``) as a text, without those that do not show."""
    if properties is None:
        return ""
    shown = copy.deepcopy(properties)
    for element in shown.iter():
        for name in [name for name in element.attrib if etree.QName(name).localname in UNFORMATTING]:
            del element.attrib[name]
    for element in [element for element in shown if etree.QName(element).localname in UNFORMATTING]:
        shown.remove(element)
    return etree.tostring(shown, encoding="unicode")


def runs_of(
    items: Iterable[tuple[Any, str, str]], get_text: Callable[[Any], str], set_text: Callable[..., None]
) -> Runs:
    """A paragraph's runs, from ``(run, tag, formatting)`` for each run with text: runs in a row of one formatting
    and tag gathered; those of the first run's formatting (``span``) plain."""
    groups: list[list[Any]] = []
    keys: list[tuple[str, str]] = []
    for run, tag, formatting in items:
        if keys and keys[-1] == (tag, formatting):
            groups[-1].append(run)
        else:
            groups.append([run])
            keys.append((tag, formatting))
    first = next((key for key in keys if key[0] == "span"), None)
    plain = {index for index, key in enumerate(keys) if key == first}
    return Runs(groups, [tag for tag, _ in keys], plain, get_text, set_text)


@dataclass
class OfficeDocument:
    """An Office file read: its units, what writes each unit's translation into it, and what saves it."""

    units: list[str]
    writers: list[Callable[[str], None]]
    save: Callable[[str], None]
    markup: bool = True

    def write(self, translations: Sequence[str], path: Path) -> None:
        for write, translation in zip(self.writers, translations, strict=True):
            write(translation)
        self.save(str(path))


def office_document(paragraphs: Iterable[Runs], save: Callable[[str], None]) -> OfficeDocument:
    """The document of the paragraphs ``paragraphs`` with a letter in them."""
    units: list[str] = []
    writers: list[Callable[[str], None]] = []
    for paragraph in paragraphs:
        if lettered("".join(paragraph.get_text(run) for group in paragraph.groups for run in group)):
            units.append(paragraph.html())
            writers.append(paragraph.write)
    return OfficeDocument(units, writers, save)


def _opened(path: Path, kind: str, opener: Callable[[str], Any]) -> Any:
    """The file ``path`` opened by ``opener``, refused in one line where it cannot be read, is encrypted or is not
    a file of its ``kind``."""
    try:
        with path.open("rb") as file:
            start = file.read(len(OLE))
    except OSError as error:
        raise UserError(f"--input {str(path)!r} cannot be read: {error.strerror or error}") from None
    if start == OLE:
        raise UserError(
            f"--input {str(path)!r} is encrypted (or an old binary Office file): save it unprotected as {kind}"
        )
    try:
        return opener(str(path))
    except Exception as error:  # each library refuses in its own words: a zip's, an XML parser's, its own
        raise UserError(f"--input {str(path)!r} is not {kind}: {error}") from None


def _word_runs(paragraph: Any, styles: dict[str, str]) -> Runs:
    """A Word paragraph's runs and links (its direct children: not those of tracked changes, fields or content
    controls)."""

    def items() -> Iterator[tuple[Any, str, str]]:
        for child in paragraph:
            if child.tag == word_name("w:hyperlink") and _word_text(child):
                first = child.r_lst[0] if child.r_lst else None
                yield child, "a", f"{child.rId} {child.get(word_name('w:anchor'))} {_word_formatting(first)}"
            elif child.tag == word_name("w:r") and child.text:
                style = styles.get(child.style or "", child.style or "")
                fonts = child.rPr.rFonts if child.rPr is not None else None
                font = (fonts.get(word_name("w:ascii")) or "") if fonts is not None else ""
                code = bool(UNTRANSLATED_STYLE.search(style) or MONOSPACE.search(font))
                yield child, "code" if code else "span", _word_formatting(child)

    return runs_of(items(), _word_text, _set_word_text)


def _word_formatting(run: Any) -> str:
    return "" if run is None else f"{run.style} {_formatting(run.rPr)}"


def _word_text(element: Any) -> str:
    """A Word run's or link's text."""
    return "".join(run.text for run in element.r_lst) if element.tag == word_name("w:hyperlink") else element.text


def _set_word_text(element: Any, text: str) -> None:
    """``text`` into a Word run, or a link's first run (its others emptied)."""
    for index, run in enumerate(element.r_lst if element.tag == word_name("w:hyperlink") else [element]):
        run.text = "" if index else text


for _notes in (WORD_CONTENT.WML_FOOTNOTES, WORD_CONTENT.WML_ENDNOTES):  # python-docx keeps them as bytes otherwise
    PartFactory.part_type_for.setdefault(_notes, XmlPart)
WORD_STORIES = (WORD_RELATIONSHIP.HEADER, WORD_RELATIONSHIP.FOOTER, WORD_RELATIONSHIP.FOOTNOTES,
                WORD_RELATIONSHIP.ENDNOTES, WORD_RELATIONSHIP.COMMENTS)  # fmt: skip
"""The parts of a Word document whose paragraphs are translated beside its body's."""


def read_docx(path: Path) -> OfficeDocument:
    """The Word document ``path``: the paragraphs of its body (tables and text boxes too), headers and footers,
    footnotes, endnotes and comments."""
    document = _opened(path, "a Word document (.docx)", docx.Document)
    styles = {style.style_id: style.name or "" for style in document.styles}
    stories = [document.part.element]
    for relationship in document.part.rels.values():
        if relationship.reltype in WORD_STORIES and not relationship.is_external:
            stories.append(relationship.target_part.element)
    paragraphs = (_word_runs(paragraph, styles) for story in stories for paragraph in story.iter(word_name("w:p")))
    return office_document(paragraphs, document.save)


def _slide_runs(paragraph: Any) -> Runs:
    """A PowerPoint paragraph's runs (not its fields: a slide number, a date)."""

    def items() -> Iterator[tuple[Any, str, str]]:
        for run in paragraph.iterchildren(slide_name("a:r")):
            if run.text:
                font = run.rPr.find(slide_name("a:latin")) if run.rPr is not None else None
                link = run.rPr is not None and run.rPr.hlinkClick is not None
                code = font is not None and bool(MONOSPACE.search(font.get("typeface") or ""))
                yield run, "code" if code else "a" if link else "span", _formatting(run.rPr)

    return runs_of(items(), lambda run: run.text, lambda run, text: setattr(run, "text", text))


def read_pptx(path: Path) -> OfficeDocument:
    """The PowerPoint presentation ``path``: every slide's shapes (groups and tables too), then its notes."""
    presentation = _opened(path, "a PowerPoint presentation (.pptx)", pptx.Presentation)
    stories = []
    for slide in presentation.slides:
        stories.append(slide.element)
        if slide.has_notes_slide:
            stories.append(slide.notes_slide.element)
    paragraphs = (_slide_runs(paragraph) for story in stories for paragraph in story.iter(slide_name("a:p")))
    return office_document(paragraphs, presentation.save)


def _set_cell(cell: Any, text: str) -> None:
    """``text`` into a cell, as text (never read as a formula)."""
    cell.value = text
    cell.data_type = "s"


def read_xlsx(path: Path) -> OfficeDocument:
    """The Excel workbook ``path``: every cell holding text with a letter, sheet after sheet (formulas, numbers and
    dates kept)."""
    book = _opened(path, "an Excel workbook (.xlsx)", openpyxl.load_workbook)
    cells = [
        cell
        for sheet in book.worksheets
        for row in sheet.iter_rows()
        for cell in row
        if cell.data_type == "s" and isinstance(cell.value, str) and lettered(cell.value)
    ]
    writers: list[Callable[[str], None]] = [partial(_set_cell, cell) for cell in cells]
    return OfficeDocument([cell.value for cell in cells], writers, book.save, markup=False)


FORMATS = (
    Format("docx", (".docx",), read_docx),
    Format("pptx", (".pptx",), read_pptx),
    Format("xlsx", (".xlsx",), read_xlsx),
)
"""Office documents: Word, PowerPoint and Excel files (Office Open XML), each paragraph or text cell translated, its
runs' formatting kept."""
