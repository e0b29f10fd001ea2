"""Documents: files translated whole, their structure kept (``translate --input FILE --output FILE``).

A format (:data:`FORMATS`, chosen by the file's extension or ``--format``) reads a file into a :class:`Document`: its
units (a paragraph, a table cell, a subtitle cue's sentence, a catalogue's message...), each a text to translate, and
writes the document again with each unit's translation in its place, the rest of the file as it was. A document whose
units hold inline formatting (bold, links...) gives them as HTML, the formatting as inline elements, which
:mod:`multihead.app.markup` places around their words in the translation as ``serve`` places a page's. Every unit goes
through the translator's sentence splitting and its guard (a unit is many sentences, none of them lost), all of a
document's units in the same batches (:func:`translate_units`), and the file is written in one step once whole
(:func:`multihead.files.atomic_write`): an interrupted translation leaves no output, and the input is never changed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from multihead.app.console import UserError
from multihead.app.documents import catalogues, epub, html_files, markdown, odf, office, subtitles, text_files
from multihead.app.documents.base import AsyncTranslate, Document, Format, Translate, translate_units
from multihead.files import atomic_write

__all__ = [
    "AsyncTranslate",
    "Document",
    "Format",
    "Translate",
    "document_format",
    "formats",
    "translate_document",
    "translate_units",
]

FORMATS: tuple[Format, ...] = (
    *text_files.FORMATS,
    *html_files.FORMATS,
    *office.FORMATS,
    *odf.FORMATS,
    *epub.FORMATS,
    *markdown.FORMATS,
    *subtitles.FORMATS,
    *catalogues.FORMATS,
)
"""Every document format."""


def formats() -> dict[str, Format]:
    """Every document format, by name."""
    return {found.name: found for found in FORMATS}


def document_format(path: str | Path, name: str | None = None) -> Format | None:
    """The format of the file ``path``: the one named ``name`` (``--format``), else the one its extension says
    (``None``: no document format: a text file, a text a line)."""
    known = formats()
    if name is not None:
        if name not in known:
            raise UserError(f"--format {name!r} is not a document format: one of {', '.join(sorted(known))}")
        return known[name]
    suffix = Path(path).suffix.lower()
    if suffix == ".pdf":
        raise UserError(f"{str(path)!r} is a PDF, whose text cannot be translated in place: no library of a licence "
                        "like ours rewrites a PDF's text faithfully. Convert it to .docx or .odt (LibreOffice: soffice "
                        "--convert-to docx FILE.pdf) and translate that")  # fmt: skip
    return next((found for found in known.values() if suffix in found.extensions), None)


def translate_document(source: str | Path, target: str | Path, found: Format, translate: Translate) -> int:
    """The document ``source`` (of the format ``found``) translated by ``translate`` into the file ``target``, written
    in one step once whole; how many units it translated. ``source`` is read, never written."""
    document = found.read(Path(source))

    async def translated(texts: list[str]) -> list[str]:
        return translate(texts)

    translations = asyncio.run(translate_units(document, translated))
    atomic_write(target, lambda path: document.write(translations, Path(path)))
    return len(document.units)
