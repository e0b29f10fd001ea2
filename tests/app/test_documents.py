"""Documents (``translate --input FILE --output FILE``): the format chosen, every unit of a document translated in
shared batches, the file written once whole, the input never changed, and what cannot be done refused in one line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from app.support import Cli, CorpusRun, assert_refused
from multihead.app.console import UserError
from multihead.app.documents import document_format, translate_document

WORDS = {"Der": "The", "Hund": "dog", "schläft.": "sleeps.", "Die": "The", "Katze": "cat", "läuft.": "runs.",
         "Ein": "A", "Haus": "house", "Zwei": "Two", "Häuser": "houses", "rote": "red"}  # fmt: skip
PAGE = (
    '<!doctype html>\n<html lang="de"><head><title>Der Hund</title><style>p { color: red }</style></head>\n'
    '<body><p>Der <b>Hund</b> schläft. Die Katze läuft.</p>\n<ul><li>Ein Haus</li><li>Zwei <a href="h.html">Häuser'
    '</a></li></ul>\n<p translate="no">Der Hund</p><!-- Der Hund --></body></html>\n'
)


class Dictionary:
    """A translator of words (through :data:`WORDS`), recording each call's texts."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> list[str]:
        self.calls.append(list(texts))
        return [" ".join(WORDS.get(word, word) for word in text.split()) for text in texts]


def test_an_html_document_is_translated_whole_its_tags_and_kept_elements_as_they_were(tmp_path: Path) -> None:
    """Every text a page shows translated (its title too), inline elements around their words, scripts, styles,
    comments and ``translate="no"`` elements byte for byte, every text of a round in one call; the input unchanged."""
    source, target = tmp_path / "page.html", tmp_path / "page.en.html"
    source.write_text(PAGE, encoding="utf-8")
    found = document_format(source)
    assert found is not None
    assert found.name == "html"
    translate = Dictionary()
    assert translate_document(source, target, found, translate) == 1
    assert target.read_text(encoding="utf-8") == (
        '<!doctype html>\n<html lang="de"><head><title>The dog</title><style>p { color: red }</style></head>\n'
        '<body><p>The <b>dog</b> sleeps. The cat runs.</p>\n<ul><li>A house</li><li>Two <a href="h.html">houses'
        '</a></li></ul>\n<p translate="no">Der Hund</p><!-- Der Hund --></body></html>\n'
    )
    assert len(translate.calls) == 1
    assert source.read_text(encoding="utf-8") == PAGE


def test_a_document_interrupted_leaves_no_output(tmp_path: Path) -> None:
    """A translation that fails writes nothing: the file appears only once whole, and an earlier one stays."""
    source, target = tmp_path / "page.html", tmp_path / "page.en.html"
    source.write_text(PAGE, encoding="utf-8")
    target.write_text("earlier", encoding="utf-8")

    def failing(texts: list[str]) -> list[str]:
        raise KeyboardInterrupt

    html = document_format(source)
    assert html is not None
    with pytest.raises(KeyboardInterrupt):
        translate_document(source, target, html, failing)
    assert target.read_text(encoding="utf-8") == "earlier"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["page.en.html", "page.html"]


def test_translate_writes_a_document_to_its_output(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """``translate RUN --input page.html --output page.en.html`` with a real run: the page's structure kept, its
    text translated, nothing on stdout, one line saying what was done; ``--format`` names a format an extension does
    not."""
    source = tmp_path / "page.html"
    source.write_text(PAGE, encoding="utf-8")
    result = cli("translate", corpus_run.path, "--input", source, "--output", tmp_path / "page.en.html")
    assert result.status == 0, result.err
    assert result.out == ""
    assert "translated html document" in result.err
    out = (tmp_path / "page.en.html").read_text(encoding="utf-8")
    assert out.count("<li>") == 2
    assert '<p translate="no">Der Hund</p><!-- Der Hund -->' in out
    assert "Die Katze läuft" not in out
    named = tmp_path / "page.txt"
    named.write_text(PAGE, encoding="utf-8")
    result = cli("translate", corpus_run.path, "--input", named, "--output", tmp_path / "out.txt", "--format", "html")
    assert result.status == 0, result.err
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == out


def test_what_a_document_cannot_take_is_refused_before_any_work(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    source = tmp_path / "page.html"
    source.write_text(PAGE, encoding="utf-8")
    run = corpus_run.path
    assert_refused(cli("translate", run, "--input", source), "is a html document: give --output FILE")
    assert_refused(cli("translate", run, "--input", source, "--output", source), "never overwrites it")
    for flag in (["--n-best", "2"], ["--html", str(tmp_path / "a.html")]):
        assert_refused(cli("translate", run, "--input", source, "--output", tmp_path / "o.html", *flag),
                       f"{flag[0]} is for texts, not for a html document")  # fmt: skip
    assert_refused(cli("translate", run, "--input", tmp_path / "none.html", "--output", tmp_path / "o.html"),
                   "is not a file")  # fmt: skip
    assert_refused(cli("translate", run, "--input", source, "--output", tmp_path / "o", "--format", "pdf"),
                   "--format 'pdf' is not a document format: one of")  # fmt: skip
    assert_refused(cli("translate", run, "--format", "html", "Hallo"), "--format html names the format of --input")
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(b"%PDF-1.4\n")
    assert_refused(cli("translate", run, "--input", pdf, "--output", tmp_path / "o.pdf"),
                   "is a PDF, whose text cannot be translated in place", "Convert it to .docx or .odt")  # fmt: skip
    (tmp_path / "bad.html").write_bytes(b"\xff\xfe\x00bad")
    html = document_format("x.html")
    assert html is not None
    with pytest.raises(UserError, match="cannot be read as an HTML file"):
        translate_document(tmp_path / "bad.html", tmp_path / "o.html", html, Dictionary())
    assert not (tmp_path / "o.html").exists()


def test_a_text_document_keeps_its_blank_lines_and_line_endings(tmp_path: Path) -> None:
    """``--format text``: a line a unit, translated together; blank lines, lines of marks and line endings (CRLF
    too) kept as they were."""
    source, target = tmp_path / "notes.txt", tmp_path / "notes.en.txt"
    source.write_bytes("Der Hund schläft.\r\n\r\n* * *\nEin Haus\n".encode())
    found = document_format(source, "text")
    assert found is not None
    translate = Dictionary()
    assert translate_document(source, target, found, translate) == 2
    assert target.read_bytes() == b"The dog sleeps.\r\n\r\n* * *\nA house\n"
    assert translate.calls == [["Der Hund schläft.", "Ein Haus"]]
    assert document_format(source) is None  # a .txt file is a text a line, unless --format says otherwise


def multipart(name: str, data: bytes, **fields: str) -> tuple[bytes, str]:
    """A multipart form of ``fields`` and a ``file`` named ``name`` holding ``data``: its body and content type."""
    boundary = "multihead-test-boundary"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'.encode()
             for key, value in fields.items()]  # fmt: skip
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")  # fmt: skip
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_serve_translates_a_file_as_libretranslate_does(corpus_run: CorpusRun, tmp_path: Path) -> None:
    """``POST /translate_file`` (``file``, ``source``, ``target``) answers ``translatedFileUrl``, where ``GET
    /download_file/<name>`` gives the document translated as ``translate --input --output`` translates it; the
    settings name the formats; what cannot be translated is a 400 naming it, a name never served a 404."""
    import urllib.request

    from app.served import request, serving
    from multihead.app.serve import Limits, Service, create_app
    from multihead.app.translate import Translator

    translator = Translator(corpus_run.path)
    source = tmp_path / "seite.html"
    source.write_text(PAGE, encoding="utf-8")
    translate_document(source, tmp_path / "cli.html", document_format(source), translator.translate)  # type: ignore[arg-type]
    with serving(create_app(Service(translator, translator.langs), Limits(char_limit=5000))) as url:
        body, kind = multipart("seite.html", PAGE.encode(), source="de", target="en")
        status, answer = request(url, "/translate_file", body, kind=kind)
        assert status == 200, answer
        link = answer["translatedFileUrl"]
        assert link.startswith(f"{url}/download_file/"), link
        assert link.endswith("-seite.html"), link
        with urllib.request.urlopen(link, timeout=30) as response:
            assert response.read().decode("utf-8") == (tmp_path / "cli.html").read_text(encoding="utf-8")
            assert 'filename="seite.html"' in response.headers["content-disposition"]
        body, kind = multipart(
            "notes.txt", "Der Hund schläft.\n\nDie Katze läuft.\n".encode(), source="de", target="en"
        )
        status, answer = request(url, "/translate_file", body, kind=kind)
        assert status == 200, answer
        status, settings = request(url, "/frontend/settings")
        assert settings["filesTranslation"] is True
        assert {".txt", ".html"} <= set(settings["supportedFilesFormat"])
        refused = [
            (multipart("a.pdf", b"%PDF-1.4", source="de", target="en"), "'a.pdf' is a PDF, whose text cannot be"),
            (multipart("a.odg", b"x", source="de", target="en"), "file format not supported ('a.odg'; one of"),
            (multipart("a.html", b"", source="de", target="en"), "Invalid request: empty file"),
            (multipart("a.html", b"\xff\xfe\x00", source="de", target="en"), "'a.html' cannot be read as an HTML"),
            (multipart("a.html", b"<p>" + b"Hund " * 2000, source="de", target="en"), "exceeds text limit (5000)"),
            (multipart("a.html", PAGE.encode(), source="de"), "Invalid request: missing target parameter"),
        ]
        for (body, kind), message in refused:
            status, answer = request(url, "/translate_file", body, kind=kind)
            assert status == 400, answer
            assert message in answer["error"], answer
        status, answer = request(url, "/translate_file", {"q": "x"})
        assert (status, answer["error"]) == (400, "Invalid request: missing file parameter")
        status, answer = request(url, "/download_file/0000-nothing.html")
        assert status == 404, answer


def test_an_interrupted_document_goes_on_with_resume(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C half-way: no output, the parts done kept beside it; ``--resume`` translates only the others and writes
    what an uninterrupted translation writes, then the partial file goes; a changed input is refused."""
    from multihead.app.documents import partial
    from multihead.app.translate import Translator

    lines = [f"{word} Nummer {number}." for number in range(30) for word in ("Hund", "Katze")]
    source = tmp_path / "lines.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run, flags = corpus_run.path, ["--format", "text", "--input", str(source)]
    assert cli("translate", run, *flags, "--output", tmp_path / "whole.txt").status == 0
    monkeypatch.setattr(partial, "PART", 20)
    original, asked = Translator.translate, []

    def counted(self: Translator, texts: list[str], **options: object) -> list[str]:
        asked.append(len(texts))
        if len(asked) == 3 and interrupt:
            raise KeyboardInterrupt
        return original(self, texts, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(Translator, "translate", counted)
    interrupt, out = True, tmp_path / "out.txt"
    assert cli("translate", run, *flags, "--output", out).status == 130
    assert not out.exists()
    assert (tmp_path / ".out.txt.partial").exists()
    interrupt, asked[:] = False, []
    result = cli("translate", run, *flags, "--output", out, "--resume")
    assert result.status == 0, result.err
    assert asked == [20]  # the third part only
    assert out.read_text(encoding="utf-8") == (tmp_path / "whole.txt").read_text(encoding="utf-8")
    assert not (tmp_path / ".out.txt.partial").exists()
    interrupt, asked[:] = True, []
    assert cli("translate", run, *flags, "--output", out).status == 130
    source.write_text("Ein Haus.\n", encoding="utf-8")
    assert_refused(cli("translate", run, *flags, "--output", out, "--resume"),
                   "is the partial translation of another input or by another run or search")  # fmt: skip
