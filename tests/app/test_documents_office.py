"""Office documents (Word, PowerPoint, Excel): built here with the libraries that read them, translated by a dictionary
written by hand (a word at a time, whole sentences where a test needs words reordered), and read back: the same
structure, every text translated, each run's formatting on its own words, numbers and formulas as they were, the input
unchanged; and each file that cannot be translated refused in one line."""

from __future__ import annotations

import re
import zipfile
from datetime import date, datetime
from pathlib import Path

import docx
import openpyxl
import pptx
import pytest
from docx.opc.constants import RELATIONSHIP_TYPE
from docx.oxml import OxmlElement
from docx.oxml.ns import qn

from app.support import CorpusRun
from multihead.app.console import UserError
from multihead.app.documents import formats, translate_document

WORDS = {
    "Der": "The", "der": "the", "Hund": "dog", "läuft": "runs", "schnell": "fast", "Katze": "cat", "schläft": "sleeps",
    "Siehe": "See", "Handbuch": "manual", "Bericht": "Report", "Seite": "Page", "Name": "Name", "Preis": "Price",
    "Apfel": "Apple", "Birne": "Pear", "Summe": "Sum", "Folie": "Slide", "Notizen": "Notes", "rot": "red",
    "das": "the", "Auto": "car", "ist": "is", "Tabelle": "Table", "Führe": "Run", "aus": "out", "Kopf": "Header",
}  # fmt: skip
SENTENCES = {"das Auto ist rot": "the red car is"}
"""Sentences translated whole, their words in another order."""
SOURCE_WORDS = set(WORDS) - set(WORDS.values())


def translate(texts: list[str]) -> list[str]:
    """Each text translated: a whole sentence known, else word by word (a word not in :data:`WORDS` kept)."""
    return [SENTENCES.get(text) or re.sub(r"\w+", lambda word: WORDS.get(word[0], word[0]), text) for text in texts]


def untranslated(text: str) -> set[str]:
    return set(re.findall(r"\w+", text)) & SOURCE_WORDS


def add_link(paragraph: docx.text.paragraph.Paragraph, text: str, url: str) -> None:
    """A link around ``text`` at the end of ``paragraph`` (python-docx reads links but does not make them)."""
    link = OxmlElement("w:hyperlink")
    link.set(qn("r:id"), paragraph.part.relate_to(url, RELATIONSHIP_TYPE.HYPERLINK, is_external=True))
    run = OxmlElement("w:r")
    run.text = text
    link.append(run)
    paragraph._p.append(link)


def word_document(path: Path) -> Path:
    """A Word document: a paragraph of bold, italic and code runs and a link, an empty one, one of digits only, a
    table, a header; its paragraph with reordered words."""
    document = docx.Document()
    document.sections[0].header.paragraphs[0].text = "Kopf Seite"
    paragraph = document.add_paragraph("Der ")
    paragraph.add_run("Hund").bold = True
    paragraph.add_run(" läuft ")
    paragraph.add_run("schnell").italic = True
    paragraph.add_run(". Führe ")
    code = paragraph.add_run("Hund --schnell")
    code.font.name = "Courier New"
    paragraph.add_run(" aus. Siehe ")
    add_link(paragraph, "Handbuch", "https://example.org/handbuch")
    paragraph.add_run(".")
    document.add_paragraph("")
    document.add_paragraph("2024 - 17")
    reordered = document.add_paragraph("das Auto ist ")
    reordered.add_run("rot").bold = True
    table = document.add_table(rows=2, cols=3)
    for cell, text in zip(table._cells, ["Name", "Preis", "", "Apfel", "3", "Birne schläft"], strict=True):
        cell.text = text
    document.save(str(path))
    return path


def test_a_word_document_keeps_its_structure_and_each_runs_formatting_on_its_words(tmp_path: Path) -> None:
    source = word_document(tmp_path / "bericht.docx")
    before = source.read_bytes()
    assert translate_document(source, tmp_path / "report.docx", formats()["docx"], translate) == 7
    assert source.read_bytes() == before
    original, translated = docx.Document(str(source)), docx.Document(str(tmp_path / "report.docx"))
    assert len(translated.paragraphs) == len(original.paragraphs)
    first, empty, digits, reordered = translated.paragraphs
    assert first.text == "The dog runs fast. Run Hund --schnell out. See manual."
    assert [run.text for run in first.runs if run.bold] == ["dog"]
    assert [run.text for run in first.runs if run.italic] == ["fast"]
    assert [run.text for run in first.runs if run.font.name == "Courier New"] == ["Hund --schnell"]
    [link] = first.hyperlinks
    assert (link.text, link.address) == ("manual", "https://example.org/handbuch")
    assert (empty.text, digits.text) == ("", "2024 - 17")
    assert reordered.text == "the red car is"
    assert [run.text for run in reordered.runs if run.bold] == ["red"]
    [table] = translated.tables
    assert [[cell.text for cell in row.cells] for row in table.rows] == [
        ["Name", "Price", ""],
        ["Apple", "3", "Pear sleeps"],
    ]
    assert translated.sections[0].header.paragraphs[0].text == "Header Page"


def presentation(path: Path) -> Path:
    """Two slides: a title and a text box with a bold run, notes; a table."""
    deck = pptx.Presentation()
    first = deck.slides.add_slide(deck.slide_layouts[5])
    first.shapes.title.text = "Bericht"
    frame = first.shapes.add_textbox(0, 0, 100, 100).text_frame
    frame.text = "Der "
    bold = frame.paragraphs[0].add_run()
    bold.text, bold.font.bold = "Hund", True
    frame.paragraphs[0].add_run().text = " läuft schnell."
    frame.add_paragraph().text = "42 %"
    first.notes_slide.notes_text_frame.text = "Notizen der Folie"
    second = deck.slides.add_slide(deck.slide_layouts[6])
    table = second.shapes.add_table(2, 2, 0, 0, 100, 100).table
    for cell, text in zip(table.iter_cells(), ["Tabelle", "", "Apfel", "7"], strict=True):
        cell.text = text
    deck.save(str(path))
    return path


def test_a_powerpoint_deck_keeps_its_slides_tables_and_notes(tmp_path: Path) -> None:
    source = presentation(tmp_path / "folien.pptx")
    before = source.read_bytes()
    assert translate_document(source, tmp_path / "slides.pptx", formats()["pptx"], translate) == 5
    assert source.read_bytes() == before
    first, second = pptx.Presentation(str(tmp_path / "slides.pptx")).slides
    title, box = first.shapes
    assert title.text_frame.text == "Report"
    sentence, digits = box.text_frame.paragraphs
    assert sentence.text == "The dog runs fast."
    assert [run.text for run in sentence.runs if run.font.bold] == ["dog"]
    assert digits.text == "42 %"
    assert first.notes_slide.notes_text_frame.text == "Notes the Slide"
    [table] = [shape.table for shape in second.shapes if shape.has_table]
    assert [cell.text for cell in table.iter_cells()] == ["Table", "", "Apple", "7"]


def test_an_excel_workbook_translates_its_text_cells_and_keeps_numbers_and_formulas(tmp_path: Path) -> None:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Preise"
    sheet.append(["Name", "Preis", "Datum"])
    sheet.append(["Apfel", 3, date(2024, 5, 1)])
    sheet.append(["Summe", "=SUM(B2:B2)", "3 + 4"])
    sheet["A1"].font = openpyxl.styles.Font(bold=True, size=14)
    book.create_sheet("Zweite")["B2"] = "Der Hund schläft"
    source = tmp_path / "preise.xlsx"
    book.save(source)
    before = source.read_bytes()
    assert translate_document(source, tmp_path / "prices.xlsx", formats()["xlsx"], translate) == 6
    assert source.read_bytes() == before
    translated = openpyxl.load_workbook(tmp_path / "prices.xlsx")
    assert translated.sheetnames == ["Preise", "Zweite"]
    first, second = translated.worksheets
    assert [[cell.value for cell in row] for row in first.iter_rows()] == [
        ["Name", "Price", "Datum"],
        ["Apple", 3, datetime(2024, 5, 1)],
        ["Sum", "=SUM(B2:B2)", "3 + 4"],
    ]
    assert first["A1"].font.bold
    assert second["B2"].value == "The dog sleeps"


def texts(path: Path) -> list[str]:
    """Every text of an Office file, as its library reads it: paragraphs (tables, headers, slides, notes) and cells."""
    if path.suffix == ".docx":
        document = docx.Document(str(path))
        cells = [cell for table in document.tables for row in table.rows for cell in row.cells]
        stories = [document, *cells, *(section.header for section in document.sections)]
        return [paragraph.text for story in stories for paragraph in story.paragraphs]
    if path.suffix == ".pptx":
        slides = pptx.Presentation(str(path)).slides
        found = [shape.text_frame.text for slide in slides for shape in slide.shapes if shape.has_text_frame]
        found += [
            cell.text
            for slide in slides
            for shape in slide.shapes
            if shape.has_table
            for cell in shape.table.iter_cells()
        ]
        return found + [slide.notes_slide.notes_text_frame.text for slide in slides if slide.has_notes_slide]
    book = openpyxl.load_workbook(path)
    return [str(cell.value) for sheet in book.worksheets for row in sheet.iter_rows() for cell in row]


@pytest.mark.parametrize(("build", "name"), [(word_document, "a.docx"), (presentation, "a.pptx")])
def test_no_source_word_is_left(tmp_path: Path, build: object, name: str) -> None:
    source = build(tmp_path / name)  # type: ignore[operator]
    target = tmp_path / f"translated{source.suffix}"
    translate_document(source, target, formats()[source.suffix[1:]], translate)
    assert untranslated(" ".join(texts(source)))  # there was something to translate
    kept = {"Hund", "schnell"}  # the code run's, "Hund --schnell", kept as it is
    assert untranslated(" ".join(texts(target))) <= kept


def test_a_trained_run_translates_a_document(tmp_path: Path, corpus_run: CorpusRun) -> None:
    from multihead.app.translate import Translator

    source = word_document(tmp_path / "bericht.docx")
    translate_document(source, tmp_path / "report.docx", formats()["docx"], Translator(corpus_run.path).translate)
    original, translated = docx.Document(str(source)), docx.Document(str(tmp_path / "report.docx"))
    assert len(translated.paragraphs) == len(original.paragraphs)
    pairs = zip(translated.paragraphs, original.paragraphs, strict=True)
    assert all(len(paragraph.runs) >= len(before.runs) for paragraph, before in pairs)  # runs kept, none removed
    shapes = [(len(table.rows), len(table.columns)) for table in original.tables]
    assert [(len(table.rows), len(table.columns)) for table in translated.tables] == shapes
    assert translated.paragraphs[2].text == "2024 - 17"
    assert any(run.bold for run in translated.paragraphs[0].runs)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"^--input '.*missing\.docx' cannot be read: No such file"):
        formats()["docx"].read(tmp_path / "missing.docx")


def test_a_file_that_is_not_a_zip_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.xlsx").write_text("Der Hund läuft.\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"^--input '.*notes\.xlsx' is not an Excel workbook \(\.xlsx\): "):
        formats()["xlsx"].read(tmp_path / "notes.xlsx")


@pytest.mark.parametrize("name", ["docx", "pptx", "xlsx"])
def test_a_mislabelled_file_is_refused(tmp_path: Path, name: str) -> None:
    """A file of another Office format (a presentation named ``.docx``...), or a zip of something else."""
    other = presentation(tmp_path / "deck.pptx") if name != "pptx" else word_document(tmp_path / "doc.docx")
    mislabelled = tmp_path / f"mislabelled.{name}"
    mislabelled.write_bytes(other.read_bytes())
    with pytest.raises(UserError, match=rf"^--input '.*mislabelled\.{name}' is not an? \w+ \w+ \(\.{name}\): "):
        formats()[name].read(mislabelled)
    with zipfile.ZipFile(mislabelled, "w") as archive:
        archive.writestr("readme.txt", "Der Hund")
    with pytest.raises(UserError, match=rf"^--input '.*mislabelled\.{name}' is not "):
        formats()[name].read(mislabelled)


def test_an_encrypted_file_is_refused(tmp_path: Path) -> None:
    """An encrypted Office file is an OLE compound file (as an old ``.doc`` is), not a zip."""
    encrypted = tmp_path / "secret.docx"
    encrypted.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504))
    with pytest.raises(UserError, match=r"^--input '.*secret\.docx' is encrypted .*: save it unprotected as a Word"):
        formats()["docx"].read(encrypted)


def test_a_paragraph_all_link_or_all_bold_stays_one_element(tmp_path: Path) -> None:
    """A paragraph that is all a link, or all bold in two runs: its translation in its first run, the link one link."""
    document = docx.Document()
    add_link(document.add_paragraph(), "Siehe Handbuch", "https://example.org/handbuch")
    bold = document.add_paragraph()
    for text in ("Der Hund", " läuft"):
        bold.add_run(text).bold = True
    document.save(str(tmp_path / "a.docx"))
    translate_document(tmp_path / "a.docx", tmp_path / "b.docx", formats()["docx"], translate)
    link, bold = docx.Document(str(tmp_path / "b.docx")).paragraphs
    assert [(found.text, found.address) for found in link.hyperlinks] == [
        ("See manual", "https://example.org/handbuch")
    ]
    assert [(run.text, run.bold) for run in bold.runs] == [("The dog runs", True), ("", True)]


FOOTNOTES = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<w:footnotes xmlns:w="http://schemas.openxmlformats.org/'
    'wordprocessingml/2006/main"><w:footnote w:id="1"><w:p><w:r><w:t>Siehe Handbuch</w:t></w:r></w:p></w:footnote>'
    "</w:footnotes>"
)
NOTES_TYPE = (
    b'<Override PartName="/word/footnotes.xml" ContentType="application/vnd.openxmlformats-officedocument.'
    b'wordprocessingml.footnotes+xml"/></Types>'
)
NOTES_RELATIONSHIP = (
    b'<Relationship Id="rIdNotes" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/footnotes"'
    b' Target="footnotes.xml"/></Relationships>'
)


def test_a_word_documents_footnotes_and_comments_are_translated(tmp_path: Path) -> None:
    """A comment (made with python-docx) and a footnote (its part added to the package by hand, as Word writes it)
    are translated with the body; the package keeps every other part."""
    made = docx.Document()
    paragraph = made.add_paragraph("Der Hund schläft")
    made.add_comment(paragraph.runs, text="der Hund läuft", author="A")
    plain = tmp_path / "plain.docx"
    made.save(str(plain))
    source = tmp_path / "bericht.docx"
    with zipfile.ZipFile(plain) as old, zipfile.ZipFile(source, "w") as new:
        for item in old.infolist():
            data = old.read(item.filename)
            if item.filename == "[Content_Types].xml":
                data = data.replace(b"</Types>", NOTES_TYPE)
            if item.filename == "word/_rels/document.xml.rels":
                data = data.replace(b"</Relationships>", NOTES_RELATIONSHIP)
            new.writestr(item, data)
        new.writestr("word/footnotes.xml", FOOTNOTES)
    before = source.read_bytes()
    translate_document(source, tmp_path / "report.docx", formats()["docx"], translate)
    out = docx.Document(str(tmp_path / "report.docx"))
    assert [p.text for p in out.paragraphs] == ["The dog sleeps"]
    assert [p.text for comment in out.comments for p in comment.paragraphs] == ["the dog runs"]
    with zipfile.ZipFile(tmp_path / "report.docx") as package:
        assert "<w:t>See manual</w:t>" in package.read("word/footnotes.xml").decode("utf-8")
        assert set(package.namelist()) >= set(zipfile.ZipFile(source).namelist())
    assert source.read_bytes() == before
