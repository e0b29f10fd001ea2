"""OpenDocument files (text, presentation, spreadsheet), EPUB books and Markdown files: built here (odfpy, a zip, a
text), translated by the Office tests' dictionary and read back: the same structure, every text translated, each
span's style on its own words, numbers, formulas, code and the rest of the file as they were, the input unchanged;
and each file that cannot be translated refused in one line."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from odf import teletype
from odf.draw import Frame, Page, TextBox
from odf.opendocument import OpenDocumentPresentation, OpenDocumentSpreadsheet, OpenDocumentText, load
from odf.presentation import Notes
from odf.style import Footer, MasterPage, PageLayout, Style, TextProperties
from odf.table import Table, TableCell, TableColumn, TableRow
from odf.text import A, H, P, Span

from app.support import CorpusRun
from app.test_documents_office import translate, untranslated
from multihead.app.console import UserError
from multihead.app.documents import formats, translate_document


def odf_texts(path: Path) -> list[str]:
    """Every paragraph's and heading's text of an OpenDocument file, as odfpy reads it (body, then styles)."""
    document = load(str(path))
    found = [document.body, document.masterstyles]
    return [teletype.extractText(paragraph) for part in found for paragraph in part.getElementsByType(P)] + [
        teletype.extractText(heading) for heading in document.body.getElementsByType(H)
    ]


def text_document(path: Path) -> Path:
    """A text document: a heading, a paragraph of a bold span, a code span and a link, one of digits only, a table,
    a text box in a frame, a footer."""
    document = OpenDocumentText()
    bold = Style(name="Bold", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    code = Style(name="Code", family="text")
    code.addElement(TextProperties(fontfamily="Courier New"))
    for style in (bold, code):
        document.automaticstyles.addElement(style)
    layout = PageLayout(name="Layout")
    document.automaticstyles.addElement(layout)
    master = MasterPage(name="Standard", pagelayoutname=layout)
    footer = Footer()
    footer.addElement(P(text="Seite"))
    master.addElement(footer)
    document.masterstyles.addElement(master)
    document.text.addElement(H(outlinelevel=1, text="Bericht"))
    paragraph = P(text="Der ")
    paragraph.addElement(Span(stylename=bold, text="Hund"))
    paragraph.addText(" läuft schnell. Führe ")
    paragraph.addElement(Span(stylename=code, text="Hund --schnell"))
    paragraph.addText(" aus. Siehe ")
    paragraph.addElement(A(href="https://example.org/handbuch", text="Handbuch"))
    paragraph.addText(".")
    document.text.addElement(paragraph)
    document.text.addElement(P(text="2024 - 17"))
    table = Table(name="Preise")
    table.addElement(TableColumn(numbercolumnsrepeated=2))
    for texts in (["Name", "Preis"], ["Apfel", "Birne schläft"]):
        row = TableRow()
        for text in texts:
            cell = TableCell(valuetype="string")
            cell.addElement(P(text=text))
            row.addElement(cell)
        table.addElement(row)
    document.text.addElement(table)
    holder = P()
    frame = Frame(width="5cm", height="2cm", anchortype="paragraph")
    box = TextBox()
    box.addElement(P(text="Die Katze schläft"))
    frame.addElement(box)
    holder.addElement(frame)
    document.text.addElement(holder)
    document.save(str(path))
    return path


def test_a_text_document_keeps_its_structure_and_each_spans_style_on_its_words(tmp_path: Path) -> None:
    source = text_document(tmp_path / "bericht.odt")
    before = source.read_bytes()
    target = tmp_path / "report.odt"
    assert translate_document(source, target, formats()["odt"], translate) == 8
    assert source.read_bytes() == before
    assert odf_texts(target) == [  # the frame's paragraph shows its text box's text too
        "The dog runs fast. Run Hund --schnell out. See manual.", "2024 - 17", "Name", "Price", "Apple",
        "Pear sleeps", "Die cat sleeps", "Die cat sleeps", "Page", "Report",
    ]  # fmt: skip
    body = load(str(target)).body
    spans = {span.getAttribute("stylename"): teletype.extractText(span) for span in body.getElementsByType(Span)}
    assert spans == {"Bold": "dog", "Code": "Hund --schnell"}
    assert [(link.getAttribute("href"), teletype.extractText(link)) for link in body.getElementsByType(A)] == [
        ("https://example.org/handbuch", "manual")
    ]
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target) as translated:
        assert translated.namelist() == original.namelist()
        assert translated.infolist()[0].compress_type == zipfile.ZIP_STORED
        assert translated.read("META-INF/manifest.xml") == original.read("META-INF/manifest.xml")
        assert b"urn:multihead" not in translated.read("content.xml")


def presentation(path: Path) -> Path:
    """A presentation: a slide with a text box, and notes."""
    document = OpenDocumentPresentation()
    layout = PageLayout(name="Layout")
    document.automaticstyles.addElement(layout)
    master = MasterPage(name="Master", pagelayoutname=layout)
    document.masterstyles.addElement(master)
    slide = Page(masterpagename=master)
    frame = Frame(width="20cm", height="3cm", x="1cm", y="1cm")
    box = TextBox()
    box.addElement(P(text="Der Hund läuft"))
    frame.addElement(box)
    slide.addElement(frame)
    notes = Notes()
    notes_frame = Frame(width="20cm", height="3cm", x="1cm", y="1cm")
    notes_box = TextBox()
    notes_box.addElement(P(text="Notizen der Folie"))
    notes_frame.addElement(notes_box)
    notes.addElement(notes_frame)
    slide.addElement(notes)
    document.presentation.addElement(slide)
    document.save(str(path))
    return path


def test_a_presentation_translates_its_slides_and_notes(tmp_path: Path) -> None:
    source = presentation(tmp_path / "folien.odp")
    translate_document(source, tmp_path / "slides.odp", formats()["odp"], translate)
    assert odf_texts(tmp_path / "slides.odp") == ["The dog runs", "Notes the Slide"]


def test_a_spreadsheet_translates_its_text_cells_and_keeps_numbers_and_formulas(tmp_path: Path) -> None:
    document = OpenDocumentSpreadsheet()
    table = Table(name="Tabelle")
    row = TableRow()
    for cell in (
        TableCell(valuetype="string"),
        TableCell(valuetype="float", value="3"),
        TableCell(valuetype="float", value="3", formula="of:=[.B1]"),
    ):
        row.addElement(cell)
    for cell, text in zip(row.getElementsByType(TableCell), ["Apfel Summe", "3", "Summe"], strict=True):
        cell.addElement(P(text=text))
    table.addElement(row)
    document.spreadsheet.addElement(table)
    document.save(str(tmp_path / "a.ods"))
    translate_document(tmp_path / "a.ods", tmp_path / "b.ods", formats()["ods"], translate)
    assert odf_texts(tmp_path / "b.ods") == ["Apple Sum", "3", "Summe"]


def epub_book(path: Path) -> Path:
    """An EPUB book: a chapter, a navigation document, an NCX, a style sheet and an image."""
    chapter = (
        '<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n<html xmlns="http://www.w3.org/1999/xhtml">'
        '<head><title>Bericht</title><link rel="stylesheet" href="style.css"/></head><body><h1>Bericht</h1>'
        '<p>Der <em>Hund</em> läuft schnell.<br/>Siehe <code>Hund --schnell</code>.</p><img src="a.png" alt="Hund"/>'
        "</body></html>"
    )
    nav = (
        '<?xml version="1.0" encoding="utf-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml" '
        'xmlns:epub="http://www.idpf.org/2007/ops"><head><title>Bericht</title></head><body>'
        '<nav epub:type="toc"><ol><li><a href="chapter.xhtml">Bericht</a></li></ol></nav></body></html>'
    )
    ncx = (
        '<?xml version="1.0" encoding="utf-8"?><ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1">'
        "<docTitle><text>Bericht</text></docTitle><navMap><navPoint id='p1' playOrder='1'><navLabel><text>Der Hund"
        "</text></navLabel><content src='chapter.xhtml'/></navPoint></navMap></ncx>"
    )
    package = (
        '<?xml version="1.0" encoding="utf-8"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" '
        'unique-identifier="id"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Bericht</dc:title>'
        '<dc:identifier id="id">x</dc:identifier><dc:language>de</dc:language></metadata><manifest>'
        '<item id="c" href="chapter.xhtml" media-type="application/xhtml+xml"/>'
        '<item id="n" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>'
        '<item id="t" href="toc.ncx" media-type="application/x-dtbncx+xml"/>'
        '<item id="s" href="style.css" media-type="text/css"/><item id="i" href="a.png" media-type="image/png"/>'
        '</manifest><spine toc="t"><itemref idref="c"/></spine></package>'
    )
    container = (
        '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
        '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
        "</rootfiles></container>"
    )
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as book:
        book.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        book.writestr("META-INF/container.xml", container)
        entries = {"content.opf": package, "chapter.xhtml": chapter, "nav.xhtml": nav, "toc.ncx": ncx}
        for name, text in {**entries, "style.css": "p { color: red }", "a.png": "\x89PNG"}.items():
            book.writestr(f"OEBPS/{name}", text)
    return path


def test_an_epub_book_translates_its_pages_and_keeps_the_rest(tmp_path: Path) -> None:
    source = epub_book(tmp_path / "buch.epub")
    before = source.read_bytes()
    assert translate_document(source, tmp_path / "book.epub", formats()["epub"], translate) == 3
    assert source.read_bytes() == before
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(tmp_path / "book.epub") as book:
        assert book.namelist() == original.namelist()
        assert book.infolist()[0].compress_type == zipfile.ZIP_STORED
        for name in ("META-INF/container.xml", "OEBPS/content.opf", "OEBPS/style.css", "OEBPS/a.png"):
            assert book.read(name) == original.read(name)
        chapter = book.read("OEBPS/chapter.xhtml").decode()
        assert "<h1>Report</h1><p>The <em>dog</em> runs fast.<br/>See <code>Hund --schnell</code>.</p>" in chapter
        assert '<img src="a.png" alt="Hund"/>' in chapter
        assert '<a href="chapter.xhtml">Report</a>' in book.read("OEBPS/nav.xhtml").decode()
        ncx = book.read("OEBPS/toc.ncx").decode()
        assert "<text>The dog</text>" in ncx
        assert "<text>Bericht</text>" in ncx  # the book's title, as the package's metadata keeps it


MARKDOWN = """---
title: Der Hund
---
# Der *Hund* läuft #

Der **Hund** läuft `Hund --schnell` schnell.
Siehe [Handbuch](https://example.org/h "Handbuch") und [Auto][ref].

> Der Hund\\
> läuft

- Der Hund
- Siehe ![Hund](a.png) <https://example.org>

| Name | Preis |
|------|-------|
| Hund | 3 |

<p>Der Hund</p>

```
Der Hund
```

[ref]: https://example.org/auto
"""


def test_a_markdown_file_keeps_its_syntax_and_every_other_line(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(MARKDOWN, encoding="utf-8")
    assert translate_document(tmp_path / "a.md", tmp_path / "b.md", formats()["markdown"], translate) == 8
    assert (tmp_path / "b.md").read_text(encoding="utf-8") == MARKDOWN.replace(
        "# Der *Hund* läuft #", "# The *dog* runs #"
    ).replace(
        'Der **Hund** läuft `Hund --schnell` schnell.\nSiehe [Handbuch](https://example.org/h "Handbuch") und '
        "[Auto][ref].",
        'The **dog** runs `Hund --schnell` fast. See [manual](https://example.org/h "Handbuch") und '
        "[car](https://example.org/auto).",
    ).replace("> Der Hund\\\n> läuft", "> The dog\\\n> runs").replace("- Der Hund", "- The dog").replace(
        "- Siehe", "- See"
    ).replace("| Name | Preis |", "| Name | Price |").replace("| Hund | 3 |", "| dog | 3 |")


def test_markdown_text_that_reads_as_syntax_is_escaped(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("Der Hund\n", encoding="utf-8")
    document = formats()["markdown"].read(tmp_path / "a.md")
    document.write(["# 2 * 3 [a] <b>"], tmp_path / "b.md")
    assert (tmp_path / "b.md").read_text(encoding="utf-8") == "\\# 2 \\* 3 \\[a\\] <b>\n"


@pytest.mark.parametrize(("name", "build"), [("odt", text_document), ("odp", presentation), ("epub", epub_book)])
def test_no_source_word_is_left(tmp_path: Path, name: str, build: object) -> None:
    source = build(tmp_path / f"a.{name}")  # type: ignore[operator]
    target = tmp_path / f"b.{name}"
    translate_document(source, target, formats()[name], translate)
    with zipfile.ZipFile(source) as original:
        assert untranslated(" ".join(original.read(entry).decode("utf-8", "replace") for entry in original.namelist()))
    with zipfile.ZipFile(target) as translated:
        parts = [entry for entry in translated.namelist() if entry.endswith(("content.xml", "xhtml", ".ncx"))]
        left = untranslated(" ".join(translated.read(entry).decode() for entry in parts))
    assert left <= {"Hund", "schnell", "Bericht", "Die", "und"}  # code, the book's title, words not in the dictionary
    if name != "epub":
        assert "Hund" not in " ".join(odf_texts(target)).replace("Hund --schnell", "")


def test_a_trained_run_translates_a_document(tmp_path: Path, corpus_run: CorpusRun) -> None:
    from multihead.app.translate import Translator

    source = text_document(tmp_path / "bericht.odt")
    target = tmp_path / "report.odt"
    translate_document(source, target, formats()["odt"], Translator(corpus_run.path).translate)
    assert len(odf_texts(target)) == len(odf_texts(source))
    assert odf_texts(target)[1] == "2024 - 17"
    styles = [span.getAttribute("stylename") for span in load(str(target)).body.getElementsByType(Span)]
    assert "Code" in styles


@pytest.mark.parametrize("name", ["odt", "epub", "markdown"])
def test_a_missing_file_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(UserError, match=r"^'.*missing\.x' cannot be read: No such file"):
        formats()[name].read(tmp_path / "missing.x")


@pytest.mark.parametrize(("name", "kind"), [("ods", "an OpenDocument spreadsheet"), ("epub", "an EPUB book")])
def test_a_file_that_is_not_a_zip_is_refused(tmp_path: Path, name: str, kind: str) -> None:
    (tmp_path / f"notes.{name}").write_text("Der Hund läuft.\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"^'.*notes\.{name}' is not {kind} \(\.{name}\): "):
        formats()[name].read(tmp_path / f"notes.{name}")


def test_a_mislabelled_file_is_refused(tmp_path: Path) -> None:
    """A text document named ``.ods``, an OpenDocument file named ``.epub``, a zip of something else."""
    mislabelled = tmp_path / "mislabelled.ods"
    mislabelled.write_bytes(text_document(tmp_path / "a.odt").read_bytes())
    with pytest.raises(UserError, match=r"^'.*\.ods' is not an OpenDocument spreadsheet \(\.ods\): it is .*\.text$"):
        formats()["ods"].read(mislabelled)
    with pytest.raises(UserError, match=r"^'.*\.ods' is not an EPUB book \(\.epub\): "):
        formats()["epub"].read(mislabelled)
    with zipfile.ZipFile(mislabelled, "w") as archive:
        archive.writestr("readme.txt", "Der Hund")
    with pytest.raises(UserError, match=r"^'.*\.ods' is not an OpenDocument spreadsheet \(\.ods\): "):
        formats()["ods"].read(mislabelled)


def test_an_encrypted_opendocument_file_is_refused(tmp_path: Path) -> None:
    source = text_document(tmp_path / "a.odt")
    encrypted = tmp_path / "secret.odt"
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(encrypted, "w") as archive:
        for entry in original.infolist():
            data = original.read(entry)
            if entry.filename == "META-INF/manifest.xml":
                data = data.replace(b"</manifest:manifest>", b"").replace(
                    b'manifest:full-path="content.xml" manifest:media-type="text/xml"/>',
                    b'manifest:full-path="content.xml" manifest:media-type="text/xml"><manifest:encryption-data/>'
                    b"</manifest:file-entry>",
                )
                data += b"</manifest:manifest>"
            archive.writestr(entry, data)
    with pytest.raises(UserError, match=r"^'.*secret\.odt' is encrypted: save it without a password as an Open"):
        formats()["odt"].read(encrypted)


def test_an_epub_book_with_drm_is_refused_and_obfuscated_fonts_are_not(tmp_path: Path) -> None:
    book = epub_book(tmp_path / "a.epub")
    encryption = (
        '<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
        'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData><enc:EncryptionMethod Algorithm="{}"/>'
        "</enc:EncryptedData></encryption>"
    )
    with zipfile.ZipFile(book, "a") as archive:
        archive.writestr("META-INF/encryption.xml", encryption.format("http://www.idpf.org/2008/embedding"))
    assert formats()["epub"].read(book).units
    with zipfile.ZipFile(book, "a") as archive:
        archive.writestr("META-INF/rights.xml", "<rights/>")
    with pytest.raises(UserError, match=r"^'.*a\.epub' is encrypted \(DRM\): only a book without DRM"):
        formats()["epub"].read(book)


def test_a_markdown_file_not_utf8_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_bytes("Der Hund läuft".encode("latin-1"))
    with pytest.raises(UserError, match=r"^'.*a\.md' is not Markdown: not UTF-8 \(invalid continuation byte"):
        formats()["markdown"].read(tmp_path / "a.md")
