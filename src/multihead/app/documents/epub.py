"""EPUB books as documents (``.epub``): each XHTML document of the book (its chapters, its navigation document) one
unit, translated as an HTML file is (:mod:`multihead.app.markup`: the text it shows, its tags kept); the labels of an
EPUB 2 table of contents (``toc.ncx``) one unit each.

The book is edited, not rebuilt: the translated documents replace theirs in the zip, every other entry (the package
document with its metadata, title and language included, images, style sheets, fonts) copied byte for byte, the
mimetype first and stored. A book with encrypted content (DRM: an ``encryption.xml`` that encrypts more than fonts, or
a ``rights.xml``) is refused.
"""

from __future__ import annotations

import io
import posixpath
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape, unescape
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from lxml import etree

from multihead.app.console import UserError
from multihead.app.documents.base import XML, Format, zip_package

KIND = "an EPUB book (.epub)"
CONTAINER = "{urn:oasis:names:tc:opendocument:xmlns:container}"
OPF = "{http://www.idpf.org/2007/opf}"
NCX = "{http://www.daisy.org/z3986/2005/ncx/}"
ENCRYPTION = "{http://www.w3.org/2001/04/xmlenc#}"
FONT_OBFUSCATION = {"http://www.idpf.org/2008/embedding", "http://ns.adobe.com/pdf/enc#RC"}
"""Encryption algorithms that only obfuscate embedded fonts: not DRM, the text readable."""


@dataclass
class EpubDocument:
    """A book read: its XHTML documents' names (their text a unit each), its NCX table of contents (its labels a unit
    each), and the zip they are written back into."""

    data: bytes
    pages: list[str]
    units: list[str]
    ncx: tuple[str, Any] | None = None
    labels: list[Any] = field(default_factory=list)
    markup: bool = True

    def write(self, translations: Sequence[str], path: Path) -> None:
        replaced = {name: text.encode("utf-8") for name, text in zip(self.pages, translations, strict=False)}
        for label, translation in zip(self.labels, translations[len(self.pages) :], strict=True):
            label.text = unescape(translation)
        if self.ncx is not None:
            replaced[self.ncx[0]] = etree.tostring(self.ncx[1], xml_declaration=True, encoding="UTF-8")
        with zipfile.ZipFile(io.BytesIO(self.data)) as source, zipfile.ZipFile(path, "w") as written:
            for entry in source.infolist():
                written.writestr(entry, replaced.pop(entry.filename, b"") or source.read(entry))


def _refused(path: Path, why: object) -> UserError:
    return UserError(f"{str(path)!r} is not {KIND}: {why}")


def _package(path: Path) -> tuple[bytes, zipfile.ZipFile, str]:
    """The book's bytes, its zip and its package document's name, refused in one line where it cannot be read, is not
    an EPUB book or is encrypted."""
    data, book, container = zip_package(path, KIND, "application/epub+zip", "META-INF/container.xml")
    names = set(book.namelist())
    if "META-INF/rights.xml" in names or _encrypted(book, names):
        raise UserError(f"{str(path)!r} is encrypted (DRM): only a book without DRM can be translated")
    rootfile = container.find(f".//{CONTAINER}rootfile")
    if rootfile is None or rootfile.get("full-path") not in names:
        raise _refused(path, "its container names no package document")
    return data, book, rootfile.get("full-path")


def _encrypted(book: zipfile.ZipFile, names: set[str]) -> bool:
    """Whether the book encrypts more than its fonts."""
    if "META-INF/encryption.xml" not in names:
        return False
    try:
        encryption = etree.fromstring(book.read("META-INF/encryption.xml"), XML)
    except etree.XMLSyntaxError:
        return True
    methods = [method.get("Algorithm") for method in encryption.iter(f"{ENCRYPTION}EncryptionMethod")]
    return any(method not in FONT_OBFUSCATION for method in methods)


def read_epub(path: Path) -> EpubDocument:
    """The EPUB book ``path``: its XHTML documents, in the package's manifest order, then its NCX's labels."""
    data, book, opf_name = _package(path)
    try:
        package = etree.fromstring(book.read(opf_name), XML)
    except etree.XMLSyntaxError as error:
        raise _refused(path, error) from None
    base = posixpath.dirname(opf_name)
    items = package.iter(f"{OPF}item")
    manifest = [(posixpath.join(base, unquote(item.get("href") or "")), item.get("media-type")) for item in items]
    pages = [name for name, media in manifest if media == "application/xhtml+xml" and name in book.namelist()]
    units = []
    for name in pages:
        try:
            units.append(book.read(name).decode("utf-8-sig"))
        except UnicodeDecodeError as error:
            raise _refused(path, f"{name} is not UTF-8 ({error.reason} at byte {error.start})") from None
    document = EpubDocument(data, pages, units)
    ncx = next((name for name, media in manifest if media == "application/x-dtbncx+xml"), None)
    if ncx is not None and ncx in book.namelist():
        try:
            root = etree.fromstring(book.read(ncx), XML)
        except etree.XMLSyntaxError as error:
            raise _refused(path, f"{ncx}: {error}") from None
        document.ncx = (ncx, root)
        document.labels = [label for label in root.iter(f"{NCX}text") if label.getparent().tag == f"{NCX}navLabel"]
        document.units += [escape(label.text or "") for label in document.labels]
    return document


FORMATS = (Format("epub", (".epub",), read_epub),)
"""EPUB books: each XHTML document translated as an HTML page, the rest of the book kept."""
