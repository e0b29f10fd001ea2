"""Glossaries (``--glossary FILE``): how a file is read and refused, how terms are found in a sentence, and
translations that use the target terms (a constrained beam search in the engine)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from app.support import SAMPLES, Cli, CorpusRun, assert_refused, write_lines
from multihead.app.console import UserError
from multihead.app.glossary import Glossary, Term, read_glossary
from multihead.app.translate import Translator


def test_terms_are_found_as_whole_words_in_any_case_the_longest_first() -> None:
    glossary = Glossary([Term("Hund", "hound"), Term("roter Hund", "red hound"), Term("東京", "Tokyo"),
                         Term("e-mail", "mail")])  # fmt: skip
    assert glossary.found("Der ROTER hund und ein Hund, Hundehütte, 東京都") == [
        Term("roter Hund", "red hound"), Term("Hund", "hound"), Term("東京", "Tokyo")]  # fmt: skip
    assert glossary.found("Seine E-Mail kam, aber nicht die x-e-mails.") == [Term("e-mail", "mail")]
    assert glossary.found("Keine Hunde hier.") == []
    assert Glossary([]).found("Hund") == []


def test_a_file_is_read_by_its_header_or_as_two_columns(tmp_path: Path) -> None:
    tsv = write_lines(tmp_path / "g.tsv", ["fr\ten\tde", "chien\tdog\tHund", "chat\tcat\tKatze"])
    assert read_glossary(tsv, ("de", "en")).terms == [Term("Hund", "dog"), Term("Katze", "cat")]
    csv = write_lines(tmp_path / "g.csv", ["DE,EN", '"Hund, klein",puppy', "", "Katze,cat"])
    assert read_glossary(csv, ("de", "en")).terms == [Term("Hund, klein", "puppy"), Term("Katze", "cat")]
    two = write_lines(tmp_path / "two.tsv", ["source\ttarget", "abc\tcba"])
    assert read_glossary(two, None).terms == [Term("abc", "cba")]


@pytest.mark.parametrize(
    ("lines", "langs", "message"),
    [
        ([], ("de", "en"), "holds no entries: a header row naming the languages, then a row a term"),
        (["de\ten"], ("de", "en"), "holds no entries"),
        (
            ["fr\ten", "chien\tdog"],
            ("de", "en"),
            "its header ['fr', 'en'] names no column for de (the run translates de to en)",
        ),
        (["de\ten", "Hund\t"], ("de", "en"), "row 2: an entry needs both terms, received ['Hund', '']"),
        (["de\ten", "Hund\tdog", "hund\thound"], ("de", "en"), "row 3: 'hund' is given two targets, 'dog' and 'hound'"),
        (
            ["a\tb\tc", "x\ty\tz"],
            None,
            "this run records no languages, so its glossary has two columns (source, target), received 3",
        ),
    ],
)
def test_a_bad_file_is_refused_in_one_line(tmp_path: Path, lines: list[str], langs: tuple[str, str] | None,
                                           message: str) -> None:  # fmt: skip
    path = write_lines(tmp_path / "g.tsv", lines)
    with pytest.raises(UserError) as refused:
        read_glossary(path, langs)
    assert str(refused.value).startswith(f"--glossary {str(path)!r}")
    assert message in str(refused.value)
    with pytest.raises(UserError, match="cannot be read"):
        read_glossary(tmp_path / "missing.tsv", langs)


def test_translations_use_the_glossarys_target_terms(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """Unlikely terms (the dog as "cat", fast as "slowly") in every translation whose source holds them, greedy and
    with beams, in translate and evaluate; the other sentences as without the glossary."""
    glossary = write_lines(tmp_path / "g.tsv", ["de\ten", "Hund\tcat", "schnell\tslowly"])
    plain = Translator(corpus_run.path).translate(SAMPLES)
    for flags in ([], ["--beam", "3"]):
        result = cli("translate", corpus_run.path, "--glossary", glossary, *flags, *SAMPLES)
        assert result.status == 0, result.err
        for source, before, after in zip(SAMPLES, plain, result.out_lines, strict=True):
            for term, target in (("Hund", "cat"), ("schnell", "slowly")):
                if term in source:
                    assert target in after, (flags, source, after)
            if "Hund" not in source and "schnell" not in source and not flags:
                assert after == before
    assert any("Hund" in source and "cat" not in before for source, before in zip(SAMPLES, plain, strict=True))
    src, ref = write_lines(tmp_path / "test.de", SAMPLES), write_lines(tmp_path / "test.en", SAMPLES)
    assert cli("evaluate", corpus_run.path, src, ref, "--glossary", glossary).status == 0
    bad = write_lines(tmp_path / "bad.tsv", ["fr\ten", "chien\tdog"])
    assert_refused(cli("translate", corpus_run.path, "--glossary", bad, "Hallo"), "names no column for de")


def test_serve_takes_a_requests_own_glossary_as_translate_takes_a_file(corpus_run: CorpusRun, tmp_path: Path) -> None:
    """A ``glossary`` field: the answers are what ``translate --glossary`` gives, and an extra ``glossary`` field says
    which entries each text holds; requests without one, beside it, are not touched; a malformed one is a 400."""
    from app.served import request, serving
    from multihead.app.serve import Limits, Service, create_app

    translator = Translator(corpus_run.path)
    file = write_lines(tmp_path / "g.tsv", ["de\ten", "Hund\tcat", "schnell\tslowly"])
    expected = Translator(corpus_run.path, glossary=file).translate(SAMPLES)
    body = {"q": SAMPLES, "source": "de", "target": "en", "glossary": [["Hund", "cat"], ["schnell", "slowly"]]}
    with serving(create_app(Service(translator, translator.langs), Limits())) as url:
        status, answer = request(url, "/translate", body)
        assert status == 200, answer
        assert answer["translatedText"] == expected
        assert answer["glossary"] == [[[t.source, t.target] for t in read_glossary(file, ("de", "en")).found(text)]
                                      for text in SAMPLES]  # fmt: skip
        plain = request(url, "/translate", {"q": SAMPLES, "source": "de", "target": "en"})
        assert plain == (200, {"translatedText": translator.translate(SAMPLES)})
        status, answer = request(url, "/translate", {**body, "q": SAMPLES[0], "alternatives": 2})
        assert status == 200, answer
        if "Hund" in SAMPLES[0]:
            assert all("cat" in text for text in [answer["translatedText"], *answer["alternatives"]])
        refused = [
            ("Hund=cat", "glossary must be a list of [source, target] pairs of terms"),
            (["Hund", "cat"], 'glossary entry 0 must be [source, target], two terms, received "Hund"'),
            ([["Hund"]], 'glossary entry 0 must be [source, target], two terms, received ["Hund"]'),
            ([["Hund", " "]], "glossary entry 0 must be [source, target]"),
            ([["Hund", "ca\ud800t"]], "glossary entry 0's target holds a lone surrogate (U+D800, not a character)"),
        ]
        for bad, message in refused:
            status, answer = request(url, "/translate", {**body, "glossary": bad})
            assert (status, answer["error"].startswith(f"Invalid request: {message}")) == (400, True), answer
