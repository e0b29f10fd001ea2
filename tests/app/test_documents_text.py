"""Subtitles (SubRip, WebVTT) and localisation catalogues (gettext, XLIFF 1.2 and 2.0) translated as documents.

Each file is written with the library that reads it, translated by a dictionary written by hand (a word at a time,
recording the texts it was given), and read back with the same library: the file's structure is the input's, every
text to translate holds translated words, and the input is never changed."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import polib
import pytest
import srt
import webvtt
from defusedxml.ElementTree import parse as parse_xml

from app.support import CorpusRun
from multihead.app.console import UserError
from multihead.app.documents import document_format, formats, translate_document
from multihead.app.documents.subtitles import sentences, shared, wrapped

WORDS = {
    "der": "the", "die": "the", "das": "the", "Der": "The", "Die": "The", "Das": "The", "Hund": "dog",
    "Katze": "cat", "Kind": "child", "läuft": "runs", "schläft": "sleeps", "singt": "sings", "schnell": "fast",
    "heute": "today", "hier": "here", "über": "across", "grüne": "green", "Wiese": "meadow", "und": "and",
    "Datei": "file", "Dateien": "files", "Speichern": "Save", "Klicke": "Click", "auf": "on", "um": "to",
    "zu": "to", "speichern": "save", "Willkommen": "Welcome", "Hallo": "Hello", "Welt": "world",
}  # fmt: skip
TRANSLATED = set(WORDS.values())
WORD = re.compile(r"[^\W\d_]+")


class Dictionary:
    """A translator that maps each word through :data:`WORDS` (a word it lacks stays as it is), keeping everything
    else; ``calls``: the texts it was given, call by call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> list[str]:
        self.calls.append(list(texts))
        return [WORD.sub(lambda word: WORDS.get(word[0], word[0]), text) for text in texts]

    @property
    def texts(self) -> list[str]:
        return [text for call in self.calls for text in call]


def translated_words(text: str) -> bool:
    """Whether ``text`` holds words, all of them translations (tags aside)."""
    words = WORD.findall(re.sub(r"<[^>]*>", " ", text))
    return bool(words) and set(words) <= TRANSLATED


def translate(source: Path, target: Path) -> tuple[int, Dictionary]:
    """``source`` translated into ``target`` in the format its extension says, the input unchanged; the units it
    translated and the translator."""
    before, dictionary = source.read_bytes(), Dictionary()
    found = document_format(source)
    assert found is not None
    count = translate_document(source, target, found, dictionary)
    assert source.read_bytes() == before
    return count, dictionary


def seconds(start: float, end: float) -> tuple[datetime.timedelta, datetime.timedelta]:
    return datetime.timedelta(seconds=start), datetime.timedelta(seconds=end)


CUES = ["<i>Der Hund läuft</i>", "über die grüne Wiese\nund schläft.", "♪", "Die Katze singt heute!", "Das Kind"]


def write_srt(path: Path, contents: list[str] = CUES) -> list[srt.Subtitle]:
    cues = [srt.Subtitle(index + 10, *seconds(2 * index, 2 * index + 1.5), content)
            for index, content in enumerate(contents)]  # fmt: skip
    path.write_text(srt.compose(cues, reindex=False), encoding="utf-8")
    return cues


def test_a_subrip_file_keeps_its_cues_and_translates_a_sentence_across_two_whole(tmp_path: Path) -> None:
    cues = write_srt(tmp_path / "film.srt")
    count, dictionary = translate(tmp_path / "film.srt", tmp_path / "film.en.srt")
    assert count == 3
    assert dictionary.texts == ["Der Hund läuft über die grüne Wiese und schläft.", "Die Katze singt heute!",
                                "Das Kind"]  # fmt: skip
    out = list(srt.parse((tmp_path / "film.en.srt").read_text(encoding="utf-8")))
    assert [(cue.index, cue.start, cue.end) for cue in out] == [(cue.index, cue.start, cue.end) for cue in cues]
    assert re.fullmatch(r"<i>[^<>]+</i>", out[0].content)  # styling around the whole cue kept
    assert out[2].content == "♪"
    assert all(translated_words(cue.content) for place, cue in enumerate(out) if place != 2)
    sentence = " ".join(" ".join(re.sub(r"<[^>]*>", "", cue.content).split()) for cue in out[:2])
    assert sentence == "The dog runs across the green meadow and sleeps."


VTT = """WEBVTT - Kinder und Tiere

NOTE Written by hand, kept as it is.

STYLE
::cue { color: yellow }

intro
00:00:01.000 --> 00:00:03.000 line:0 align:start
<v Anna>Der Hund &amp; die Katze

00:00:03.500 --> 00:00:05.000
laufen schnell.

NOTE before the last cue

00:00:06.000 --> 00:00:08.000
Hallo <b>Welt</b>!
"""


def test_a_webvtt_file_keeps_its_header_notes_styles_and_cues(tmp_path: Path) -> None:
    (tmp_path / "film.vtt").write_text(VTT, encoding="utf-8")
    source = webvtt.read(str(tmp_path / "film.vtt"))
    count, dictionary = translate(tmp_path / "film.vtt", tmp_path / "film.en.vtt")
    assert count == 2
    assert dictionary.texts == ["Der Hund & die Katze laufen schnell.", "Hallo Welt!"]
    out = webvtt.read(str(tmp_path / "film.en.vtt"))
    assert (out.header_text, out.header_comments) == (source.header_text, source.header_comments)
    assert [style.text for style in out.styles] == [style.text for style in source.styles]
    assert [(c.identifier, c.start, c.end, str(c.settings), c.comments) for c in out.captions] == [
        (c.identifier, c.start, c.end, str(c.settings), c.comments) for c in source.captions
    ]
    assert out.captions[0].raw_text.startswith("<v Anna>The dog &amp;")  # the voice kept, the text escaped
    assert out.captions[1].text == "laufen fast."  # "laufen": a word the dictionary lacks
    assert out.captions[2].text == "Hello world!"  # the tags inside a cue dropped


def test_a_translation_is_shared_out_over_its_cues_as_the_source_was() -> None:
    assert shared(list("abcdef"), [10, 10, 10]) == ["a b", "c d", "e f"]
    assert shared(list("abcdef"), [50, 5, 5]) == ["a b c d", "e", "f"]  # each cue has a word
    assert shared(["a", "b"], [5, 5, 5]) == ["a", "b", ""]  # too few words for every cue
    assert sentences(["Ein", "Satz.", "♪", "Noch", "einer", "»Ja!«", "Ende"]) == [[0, 1], [3, 4, 5], [6]]
    line = "The quick brown fox jumps over the lazy dog and runs away"
    assert wrapped(line) == ["The quick brown fox jumps over", "the lazy dog and runs away"]
    assert all(len(piece) <= 42 for piece in wrapped(" ".join([line] * 3)))
    assert wrapped("Short line.") == ["Short line."]


def write_po(path: Path) -> polib.POFile:
    catalogue = polib.POFile(wrapwidth=78)
    catalogue.metadata = {"Content-Type": "text/plain; charset=UTF-8",
                          "Plural-Forms": "nplurals=2; plural=(n != 1);"}  # fmt: skip
    catalogue.append(polib.POEntry(msgid="Willkommen", occurrences=[("app.py", "3")], comment="on the start page"))
    catalogue.append(polib.POEntry(msgid="%d Datei", msgid_plural="%d Dateien", msgstr_plural={0: "", 1: ""}))
    catalogue.append(polib.POEntry(msgid="Speichern", msgstr="Sichern (by hand)"))
    catalogue.append(polib.POEntry(msgid="Hallo {name}", flags=["python-brace-format"]))
    catalogue.append(polib.POEntry(msgid="→", msgstr=""))
    catalogue.append(polib.POEntry(msgid="Der Hund", msgstr="Alt", obsolete=True))
    catalogue.save(str(path))
    return catalogue


def test_a_gettext_catalogue_fills_the_entries_without_a_translation_and_marks_them_fuzzy(tmp_path: Path) -> None:
    source = write_po(tmp_path / "de.po")
    count, dictionary = translate(tmp_path / "de.po", tmp_path / "en.po")
    assert count == 4
    assert dictionary.texts == ["Willkommen", "%d Datei", "%d Dateien", "Hallo {name}"]
    out = polib.pofile(str(tmp_path / "en.po"))
    assert out.metadata == source.metadata
    entries = {entry.msgid: entry for entry in out}
    assert [entry.msgid for entry in out] == [entry.msgid for entry in source]
    assert (entries["Willkommen"].msgstr, entries["Willkommen"].comment) == ("Welcome", "on the start page")
    assert entries["%d Datei"].msgstr_plural == {0: "%d file", 1: "%d files"}
    assert entries["Hallo {name}"].msgstr == "Hello {name}"
    assert entries["Hallo {name}"].flags == ["fuzzy", "python-brace-format"]
    assert entries["→"].msgstr == "→"  # no word: its own translation
    assert all("fuzzy" in entries[msgid].flags for msgid in ("Willkommen", "%d Datei", "→"))
    assert (entries["Speichern"].msgstr, entries["Speichern"].flags) == ("Sichern (by hand)", [])  # kept
    assert (entries["Der Hund"].obsolete, entries["Der Hund"].msgstr) == (1, "Alt")


XLIFF_12 = """<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2" xmlns:my="urn:example:mine">
  <file source-language="de" target-language="en" datatype="plaintext" original="app">
    <body>
      <!-- the buttons -->
      <trans-unit id="save" my:note="kept">
        <source>Klicke <x id="1"/> auf <g id="2">Speichern</g>, um zu speichern.</source>
      </trans-unit>
      <trans-unit id="done">
        <source>Hallo</source>
        <target state="final">Hi there</target>
      </trans-unit>
      <trans-unit id="code" translate="no">
        <source>Die Katze</source>
      </trans-unit>
    </body>
  </file>
</xliff>
"""
XLIFF_20 = """<?xml version="1.0" encoding="UTF-8"?>
<xliff version="2.0" xmlns="urn:oasis:names:tc:xliff:document:2.0" srcLang="de" trgLang="en">
  <file id="f1">
    <unit id="u1">
      <segment>
        <source>Klicke auf <pc id="1">Speichern</pc><ph id="2"/></source>
      </segment>
      <segment>
        <source>Der Hund schläft.</source>
        <target></target>
      </segment>
    </unit>
  </file>
</xliff>
"""
NAMES = {"1.2": "urn:oasis:names:tc:xliff:document:1.2", "2.0": "urn:oasis:names:tc:xliff:document:2.0"}


def test_an_xliff_1_2_file_gets_targets_with_its_inline_codes_in_place(tmp_path: Path) -> None:
    (tmp_path / "app.xlf").write_text(XLIFF_12, encoding="utf-8")
    count, dictionary = translate(tmp_path / "app.xlf", tmp_path / "app.en.xlf")
    assert count == 1
    assert dictionary.texts == ['Klicke <x id="0"/> auf Speichern, um zu speichern.', "Speichern"]
    x = f"{{{NAMES['1.2']}}}"
    root = parse_xml(tmp_path / "app.en.xlf").getroot()
    assert root.find(f"{x}file").get("target-language") == "en"
    units = {unit.get("id"): unit for unit in root.iter(f"{x}trans-unit")}
    assert units["save"].get("{urn:example:mine}note") == "kept"
    target = units["save"].find(f"{x}target")
    assert (target.get("state"), target.get("state-qualifier")) == ("needs-review-translation", "mt-suggestion")
    assert [(child.tag, child.attrib) for child in target] == [(f"{x}x", {"id": "1"}), (f"{x}g", {"id": "2"})]
    assert (target.text, target[1].text) == ("Click ", "Save")
    assert "".join(target.itertext()) == "Click  on Save, to to save."
    assert units["done"].find(f"{x}target").text == "Hi there"  # a target is kept
    assert units["code"].find(f"{x}target") is None  # translate="no"
    written = (tmp_path / "app.en.xlf").read_text(encoding="utf-8")
    assert "xmlns:my=" in written
    assert "<!-- the buttons -->" in written


def test_an_xliff_2_0_file_gets_targets_with_its_inline_codes_in_place(tmp_path: Path) -> None:
    (tmp_path / "app.xliff").write_text(XLIFF_20, encoding="utf-8")
    count, dictionary = translate(tmp_path / "app.xliff", tmp_path / "app.en.xliff")
    assert count == 2
    assert dictionary.calls[0] == ['Klicke auf Speichern<x id="1"/>', "Speichern", "Der Hund schläft."]
    x = f"{{{NAMES['2.0']}}}"
    root = parse_xml(tmp_path / "app.en.xliff").getroot()
    assert (root.get("srcLang"), root.get("trgLang")) == ("de", "en")
    first, second = root.iter(f"{x}segment")
    assert first.get("state") == second.get("state") == "translated"
    target = first.find(f"{x}target")
    assert [(child.tag, child.attrib) for child in target] == [(f"{x}pc", {"id": "1"}), (f"{x}ph", {"id": "2"})]
    assert (target.text, target[0].text) == ("Click on ", "Save")
    assert second.find(f"{x}target").text == "The dog sleeps."
    assert (tmp_path / "app.en.xliff").read_text(encoding="utf-8").count("<source>") == 2  # the default namespace


def test_a_trained_model_translates_a_subtitle_file_into_the_same_cues(tmp_path: Path, corpus_run: CorpusRun) -> None:
    from multihead.app.translate import Translator

    cues = write_srt(tmp_path / "film.srt", ["Der Hund läuft", "schnell.", "Die Katze schläft heute."])
    before = (tmp_path / "film.srt").read_bytes()
    count = translate_document(tmp_path / "film.srt", tmp_path / "film.en.srt", formats()["srt"],
                               Translator(corpus_run.path).translate)  # fmt: skip
    assert count == 2
    assert (tmp_path / "film.srt").read_bytes() == before
    out = list(srt.parse((tmp_path / "film.en.srt").read_text(encoding="utf-8")))
    assert [(cue.index, cue.start, cue.end) for cue in out] == [(cue.index, cue.start, cue.end) for cue in cues]
    assert all(cue.content.strip() for cue in out)


REFUSED = {
    "unreadable": ("film.srt", None, "cannot be read"),
    "not UTF-8": ("film.srt", "1\n00:00:01,000 --> 00:00:02,000\nGrüße\n".encode("latin-1"), "is not UTF-8"),
    "SubRip in a .vtt": ("film.vtt", b"1\n00:00:01,000 --> 00:00:02,000\nHallo\n", "is not a WebVTT (.vtt) file"),
    "WebVTT in a .srt": ("film.srt", VTT.encode(), "is not a SubRip (.srt) file"),
    "SubRip in a .po": ("de.po", b"1\n00:00:01,000 --> 00:00:02,000\nHallo\n", "is not a gettext catalogue"),
    "HTML in a .xlf": ("app.xlf", b"<html><body><p>Hallo</p></body></html>", "is not XLIFF 1.2 or 2.x"),
    "broken XML": ("app.xlf", XLIFF_12[:200].encode(), "is not XML"),
    "an entity": ("app.xlf", b'<!DOCTYPE x [<!ENTITY e "Hallo">]><xliff>&e;</xliff>', "declares entities"),
    "no subtitle text": ("film.srt", "1\n00:00:01,000 --> 00:00:02,000\n♪\n".encode(), "holds no subtitle text"),
    "every entry translated": ("de.po", b'msgid "Hallo"\nmsgstr "Hello"\n', "holds no entry without a translation"),
    "every source translated": ("app.xlf", XLIFF_12.replace("n.</source>", "n.</source><target>Ja</target>").encode(),
                                "holds no source without a translation"),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSED)
def test_what_cannot_be_translated_is_refused_in_one_line_quoting_the_file(tmp_path: Path, case: str) -> None:
    name, data, message = REFUSED[case]
    path = tmp_path / name
    if data is None:
        path.mkdir()  # a directory: no file to read
    else:
        path.write_bytes(data)
    found = document_format(path)
    assert found is not None
    with pytest.raises(UserError) as refused:
        translate_document(path, tmp_path / f"out-{name}", found, Dictionary())
    assert message in str(refused.value)
    assert repr(str(path)) in str(refused.value)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / f"out-{name}").exists()
