"""Glossaries (``--glossary FILE``): how a file is read and refused, how terms are found in a sentence, and
translations that use the target terms (a constrained beam search in the engine)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.support import SAMPLES, Cli, CorpusRun, assert_refused, write_lines
from multihead.app.console import UserError
from multihead.app.glossary import Glossary, Term, read_glossary, read_glossary_file
from multihead.app.tokenizers import word_ends
from multihead.app.translate import Translator
from multihead.decoding import SearchOptions


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


# --- TBX termbases ---------------------------------------------------------------------------------------------

# TBX-Basic as terminology tools export it (a martif root, a DOCTYPE naming its DTD): a concept of several German
# terms, one deprecated, and of English ones in en-US, the preferred one in an ntig and not the first; a concept
# without English; a concept with an English term that is deprecated only.
BASIC = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE martif SYSTEM "TBXBasiccoreStructV02.dtd">
<martif type="TBX-Basic" xml:lang="en-US">
  <martifHeader><fileDesc><sourceDesc><p>exported</p></sourceDesc></fileDesc></martifHeader>
  <text><body>
    <termEntry id="dog">
      <langSet xml:lang="DE">
        <tig><term>Hund</term></tig>
        <tig><term>Köter</term><termNote type="administrativeStatus">deprecatedTerm-admn-sts</termNote></tig>
      </langSet>
      <langSet xml:lang="en-US">
        <tig><term>dog</term><termNote type="administrativeStatus">admittedTerm-admn-sts</termNote></tig>
        <ntig><termGrp><term>hound</term>
          <termNote type="administrativeStatus">preferredTerm-admn-sts</termNote></termGrp></ntig>
      </langSet>
    </termEntry>
    <termEntry id="bike">
      <langSet xml:lang="de"><tig><term>Fahrrad</term></tig></langSet>
      <langSet xml:lang="fr"><tig><term>vélo</term></tig></langSet>
    </termEntry>
    <termEntry>
      <langSet xml:lang="de"><tig><term>Katze</term></tig></langSet>
      <langSet xml:lang="en-GB"><tig><term>moggy</term>
        <termNote type="administrativeStatus">supersededTerm-admn-sts</termNote></tig></langSet>
    </termEntry>
  </body></text>
</martif>
"""

# TBX v3 (a tbx root in its namespace): conceptEntry, langSec, termSec; a term with inline markup and a line break.
V3 = """<?xml version="1.0" encoding="UTF-8"?>
<tbx style="dca" type="TBX-Core" xml:lang="en" xmlns="urn:iso:std:iso:30042:ed-2">
  <tbxHeader><fileDesc><sourceDesc><p>exported</p></sourceDesc></fileDesc></tbxHeader>
  <text><body>
    <conceptEntry id="c1">
      <langSec xml:lang="en"><termSec><term>red <hi>hat</hi></term></termSec></langSec>
      <langSec xml:lang="de"><termSec><term>roter
          Hut</term></termSec><termSec><term>rote Mütze</term></termSec></langSec>
    </conceptEntry>
  </body></text>
</tbx>
"""


def test_a_tbx_file_gives_each_concepts_source_terms_its_preferred_target(tmp_path: Path) -> None:
    basic, v3 = tmp_path / "basic.tbx", tmp_path / "v3.TBX"
    basic.write_text(BASIC, encoding="utf-8")
    v3.write_text(V3, encoding="utf-8")
    assert read_glossary(basic, ("de", "en")).terms == [Term("Hund", "hound"), Term("Köter", "hound")]
    assert read_glossary(basic, ("en", "de")).terms == [Term("dog", "Hund"), Term("hound", "Hund"),
                                                        Term("moggy", "Katze")]  # fmt: skip
    assert read_glossary(basic, ("de", "fr")).terms == [Term("Fahrrad", "vélo")]
    assert read_glossary(v3, ("de", "en")).terms == [Term("roter Hut", "red hat"), Term("rote Mütze", "red hat")]
    assert read_glossary(v3, ("en", "de")).terms == [Term("red hat", "roter Hut")]


def test_languages_match_in_any_case_and_a_region_or_script_reads_as_its_language(tmp_path: Path) -> None:
    """A column named exactly as the run's language first, then its variants in the file's order; never the other
    way (``zh`` is not read for ``zh-Hant``), and a built-in task's ``reverse-out`` is not a variant of ``reverse``."""
    variants = write_lines(tmp_path / "variants.tsv", ["DE\ten-GB\ten_US\tzh-Hant", "Hund\thound\tdog\t狗",
                                                       "Katze\t\tcat\t貓"])  # fmt: skip
    assert read_glossary(variants, ("de", "en")).terms == [Term("Hund", "hound"), Term("Katze", "cat")]
    assert read_glossary(variants, ("en", "de")).terms == [Term("hound", "Hund"), Term("dog", "Hund"),
                                                           Term("cat", "Katze")]  # fmt: skip
    assert read_glossary(variants, ("zh", "de")).terms == [Term("狗", "Hund"), Term("貓", "Katze")]
    exact = write_lines(tmp_path / "exact.tsv", ["en-US\tde\ten", "dog\tHund\thound"])
    assert read_glossary(exact, ("de", "en")).terms == [Term("Hund", "hound")]
    file = read_glossary_file(write_lines(tmp_path / "many.tsv", ["zh\tzh-hant\treverse\treverse-out", "a\tb\tc\td"]))
    assert (file.codes("ZH"), file.codes("zh-Hant"), file.codes("reverse")) == (["zh", "zh-hant"], ["zh-hant"],
                                                                                ["reverse"])  # fmt: skip


TBX = '<martif><text><body><termEntry id="e">{}</termEntry></body></text></martif>'
DE_EN = ('<langSet xml:lang="de"><tig><term>Hund</term></tig></langSet>'
         '<langSet xml:lang="en"><tig><term>dog</term></tig></langSet>')  # fmt: skip


@pytest.mark.parametrize(
    ("text", "langs", "message"),
    [
        ("<martif><text>", ("de", "en"), "is not well-formed XML: no element found: line 1, column 14"),
        (
            '<!DOCTYPE martif [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]>'
            + TBX.format('<langSet xml:lang="de"><tig><term>&b;</term></tig></langSet>'),
            ("de", "en"),
            "declares an XML entity, refused (an entity may expand without bound or read another file)",
        ),
        (
            '<!DOCTYPE martif [<!ENTITY secret SYSTEM "file:///etc/passwd">]>'
            + TBX.format('<langSet xml:lang="de"><tig><term>&secret;</term></tig></langSet>'),
            ("de", "en"),
            "declares an XML entity, refused",
        ),
        ("<glossary><term>Hund</term></glossary>", ("de", "en"), "is not a TBX file: its root is <glossary>"),
        ("<martif><text><body/></text></martif>", ("de", "en"), "holds no entries: no termEntry or conceptEntry"),
        (TBX.format(DE_EN), ("de", "fr"), "its terms are in de, en, none in fr (the run translates de to fr)"),
        (
            TBX.format('<langSet xml:lang="de"><tig><term>Hund</term></tig></langSet>'),
            ("de", "en"),
            "its terms are in de, none in en",
        ),
        (
            TBX.format('<langSet xml:lang="de"><tig><term>Hund</term></tig></langSet>')
            + TBX.format('<langSet xml:lang="en"><tig><term>dog</term></tig></langSet>'),
            ("de", "en"),
            "is not well-formed XML: junk after document element",
        ),
        (
            "<martif><text><body>" + '<termEntry id="a"><langSet xml:lang="de"><tig><term>Hund</term></tig></langSet>'
            '</termEntry><termEntry id="b"><langSet xml:lang="en"><tig><term>dog</term></tig></langSet></termEntry>'
            "</body></text></martif>",
            ("de", "en"),
            "holds no entry with terms in both de and en",
        ),
        (
            "<martif><text><body><termEntry>" + DE_EN + "</termEntry><termEntry>"
            + DE_EN.replace("Hund", "HUND").replace("dog", "hound") + "</termEntry></body></text></martif>",
            ("de", "en"),
            "termEntry 2: 'HUND' is given two targets, 'dog' and 'hound'",
        ),
        (TBX.format("<langSet><tig><term>Hund</term></tig></langSet>"), ("de", "en"),
         "termEntry 1 (id 'e'): a langSet without xml:lang"),
        (TBX.format(DE_EN), None, "this run records no languages, so its glossary has two columns (source, target), "
         "received a TBX file"),
    ],
)  # fmt: skip
def test_a_bad_tbx_file_is_refused_in_one_line(tmp_path: Path, text: str, langs: tuple[str, str] | None,
                                               message: str) -> None:  # fmt: skip
    path = tmp_path / "terms.tbx"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as refused:
        read_glossary(path, langs)
    assert str(refused.value).startswith(f"--glossary {str(path)!r}")
    assert "\n" not in str(refused.value)
    assert message in str(refused.value)


def test_one_file_gives_each_pair_the_entries_of_its_two_languages(tmp_path: Path) -> None:
    """A table of three languages for four pairs served: each pair of its languages gets its entries, a pair of a
    language it lacks none; a file that gives no pair served any entry is refused in one line."""
    file = read_glossary_file(write_lines(tmp_path / "g.tsv", ["de\ten\tfr", "Hund\thound\tchien",
                                                              "Fahrrad\tbike\tvélo"]))  # fmt: skip
    found = file.glossaries([("de", "en"), ("en", "de"), ("fr", "en"), ("de", "sv")])
    assert {pair: glossary.terms for pair, glossary in found.items()} == {
        ("de", "en"): [Term("Hund", "hound"), Term("Fahrrad", "bike")],
        ("en", "de"): [Term("hound", "Hund"), Term("bike", "Fahrrad")],
        ("fr", "en"): [Term("chien", "hound"), Term("vélo", "bike")],
    }
    with pytest.raises(UserError) as refused:
        file.glossaries([("de", "sv"), ("sv", "de")])
    assert str(refused.value) == (f"--glossary {str(tmp_path / 'g.tsv')!r} gives no pair served any entry: its "
                                  "languages are ['de', 'en', 'fr'], the pairs served de-sv, sv-de")  # fmt: skip


def test_a_requests_own_terms_join_the_servers_and_win_for_the_same_source() -> None:
    served = Glossary([Term("Hund", "hound"), Term("Katze", "cat")])
    joined = served.joined([Term("hund", "puppy"), Term("schnell", "fast")])
    assert joined.terms == [Term("hund", "puppy"), Term("Katze", "cat"), Term("schnell", "fast")]
    assert joined.found("Der HUND ist schnell.") == [Term("hund", "puppy"), Term("schnell", "fast")]
    assert served.joined([]) is served


def test_serve_glossary_gives_every_request_of_a_pair_its_terms_and_a_requests_own_win(
    corpus_run: CorpusRun, tmp_path: Path
) -> None:
    """A server's glossary (a file of three languages, for a run serving de -> en): every request translates as
    ``translate --glossary`` does and is told the entries each text holds; a request's own entries join the server's,
    its target winning for the same source term."""
    from app.served import request, serving
    from multihead.app.serve import Limits, Service, create_app

    translator = Translator(corpus_run.path)
    served = write_lines(tmp_path / "served.tsv", ["fr\tde\ten", "chien\tHund\tcat"])
    service = Service(translator, translator.langs, glossary=read_glossary_file(served))
    assert {pair: glossary.terms for pair, glossary in service.glossaries.items()} == {
        ("de", "en"): [Term("Hund", "cat")]
    }
    joined = write_lines(tmp_path / "joined.tsv", ["de\ten", "hund\tmouse", "schnell\tslowly"])
    with serving(create_app(service, Limits())) as url:
        status, answer = request(url, "/translate", {"q": SAMPLES, "source": "de", "target": "en"})
        assert status == 200, answer
        assert answer == {"translatedText": Translator(corpus_run.path, glossary=served).translate(SAMPLES),
                          "glossary": [[["Hund", "cat"]]] * 4 + [[]] * 2}  # fmt: skip
        own = [["hund", "mouse"], ["schnell", "slowly"]]
        status, answer = request(url, "/translate", {"q": SAMPLES, "source": "de", "target": "en", "glossary": own})
        assert status == 200, answer
        assert answer["translatedText"] == Translator(corpus_run.path, glossary=joined).translate(SAMPLES)
        assert answer["glossary"] == [[["hund", "mouse"]], [["hund", "mouse"], ["schnell", "slowly"]],
                                      [["hund", "mouse"]], [["hund", "mouse"]], [], []]  # fmt: skip
        status, answer = request(url, "/translate", {"q": SAMPLES[1], "source": "de", "target": "en"})
        assert (status, answer["glossary"]) == (200, [["Hund", "cat"]])


def test_serve_glossary_names_its_pairs_at_start_and_a_file_for_no_pair_served_is_refused(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    from app.served import request, start

    tbx = tmp_path / "terms.tbx"
    tbx.write_text(BASIC, encoding="utf-8")
    process, url, _ = start(corpus_run.path, "--glossary", tbx)
    try:
        assert process.stderr is not None
        assert process.stderr.readline() == "  glossary terms for 1 of 1 pair served directly: de → en (2 entries)\n"
        status, answer = request(url, "/translate", {"q": "der Hund läuft hier.", "source": "de", "target": "en"})
        assert status == 200, answer
        assert "hound" in answer["translatedText"]
        assert answer["glossary"] == [["Hund", "hound"]]
    finally:
        process.terminate()
        process.wait(timeout=60)
    french = write_lines(tmp_path / "fr.tsv", ["fr\ten", "chien\tdog"])
    assert_refused(cli("serve", corpus_run.path, "--port", "0", "--glossary", french),
                   f"--glossary {str(french)!r} gives no pair served any entry: its languages are ['fr', 'en'], the "
                   "pairs served de-en")  # fmt: skip
    broken = tmp_path / "broken.tbx"
    broken.write_text("<martif><text>", encoding="utf-8")
    assert_refused(cli("serve", corpus_run.path, "--port", "0", "--glossary", broken), "is not well-formed XML")
    assert_refused(cli("translate", corpus_run.path, "--glossary", broken, "Hallo"), "is not well-formed XML")


def test_a_term_is_held_as_a_whole_word_unless_the_glossary_prefers_it(corpus_run: CorpusRun, tmp_path: Path) -> None:
    """A term ending in a letter or digit is followed by what may follow a whole word (the target tokenizer's word
    starts and marks: :func:`word_ends`), so that "ca" is never written as the start of "cat"; a term ending in a mark
    or written without spaces is followed by anything; with a bonus, terms are preferred, not held."""
    translator = Translator(corpus_run.path, glossary=write_lines(tmp_path / "g.tsv", ["de\ten", "Hund\tca"]))
    cutter, vocab = translator.cutter, translator.checkpoint.config.tgt_vocab
    ends = word_ends(cutter.target, vocab)
    ids = cutter.target.encode("cat sat.")[0]
    pieces = cutter.target.pieces(ids)
    assert [bool(ends[i]) for i in ids] == [p.startswith("▁") or not p[:1].isalnum() for p in pieces]
    assert ends[ids[0]]  # a word's start may follow
    assert not all(ends[i] for i in ids)  # a continuation may not
    (own,) = replace(cutter, glossary=Glossary([Term("Hund", "ca"), Term("Firma", "Inc."), Term("Katze", "猫")])
                     ).constraints(["Hund Firma Katze"]) or [[]]  # fmt: skip
    assert [phrase.followed_by is ends for phrase in own] == [True, False, False]
    (preferred,) = replace(cutter, bonus=2.5).constraints(["der Hund"]) or [[]]
    assert [(phrase.bonus, phrase.followed_by) for phrase in preferred] == [(2.5, None)]
    out = translator.translate([source for source in SAMPLES if "Hund" in source], search=SearchOptions(beam_size=3))
    assert out
    assert all(re.search(r"(?<!\w)ca(?!\w)", text) for text in out), out


def test_glossary_bonus_prefers_terms_and_needs_a_glossary(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """``--glossary-bonus``: a bonus of almost nothing translates as without the glossary, a large one writes the
    term; without ``--glossary`` it is refused in one line."""
    glossary = write_lines(tmp_path / "g.tsv", ["de\ten", "Hund\tslowly"])
    texts = [source for source in SAMPLES if "Hund" in source]
    plain = cli("translate", corpus_run.path, *texts)
    slight = cli("translate", corpus_run.path, "--glossary", glossary, "--glossary-bonus", "1e-9", *texts)
    strong = cli("translate", corpus_run.path, "--glossary", glossary, "--glossary-bonus", "50", *texts)
    assert (plain.status, slight.status, strong.status) == (0, 0, 0), (slight.err, strong.err)
    assert slight.out_lines == plain.out_lines
    assert all("slowly" in line for line in strong.out_lines), strong.out_lines
    assert not all("slowly" in line for line in plain.out_lines)
    assert_refused(cli("translate", corpus_run.path, "--glossary-bonus", "2", "Hallo"),
                   "--glossary-bonus 2 needs --glossary FILE")  # fmt: skip
    assert_refused(cli("translate", corpus_run.path, "--glossary", glossary, "--glossary-bonus", "0", "Hallo"),
                   "must be a finite number above 0")  # fmt: skip


def test_terms_the_model_cannot_write_are_refused_before_any_work(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """A target term longer than the model writes (or of no token) is refused when the glossary is read, naming the
    entry; a sentence whose terms together take more is refused naming them (``serve``: a 400)."""
    plain = Translator(corpus_run.path)
    max_len, target = plain.max_len, plain.cutter.target
    long = " ".join(["dog"] * max_len)
    glossary = write_lines(tmp_path / "g.tsv", ["de\ten", "Katze\tcat", f"Hund\t{long}"])
    assert_refused(cli("translate", corpus_run.path, "--glossary", glossary, "Hallo"),
                   f"the target term {long!r} (for 'Hund') is {len(target.encode(long)[0])} tokens, and this model "
                   f"writes 1 to {max_len - 1}")  # fmt: skip
    half = " ".join(["dog"] * (max_len // 2 // len(target.encode("dog")[0]) + 1))  # each fits, not both
    assert len(target.encode(half)[0]) < max_len - 1 < 2 * len(target.encode(half)[0])
    many = write_lines(tmp_path / "many.tsv", ["de\ten", f"Hund\t{half}", f"Katze\t{half} cat"])
    translator = Translator(corpus_run.path, glossary=many)
    with pytest.raises(UserError, match=r"the terms and kept spans of 'Hund und Katze' \('"):
        translator.translate(["Hund und Katze"])


def test_an_imported_marian_run_uses_the_glossarys_terms(marian_de_en: Any, tmp_path: Path) -> None:
    """A glossary on an imported OPUS-MT-style run (SentencePiece, separate vocabularies): each sentence holding the
    source term holds its target term (a word the target vocabulary spells) as a whole word, greedy and with beams;
    the others translate as without the glossary."""
    translator = Translator(marian_de_en.run)
    target = translator.cutter.target
    words = [piece[1:] for piece in target.pieces(range(len(target))) if piece[:1] == "▁" and piece[1:].isalpha()]
    term = next(word for word in words if len(word) >= 3 and not target.encode(word)[1])
    glossary = write_lines(tmp_path / "g.tsv", ["de\ten", f"Hund\t{term}"])
    texts = ["Der Hund schläft.", "Die Katze schläft.", "Ein Hund und eine Katze."]
    plain = translator.translate(texts)
    for search in (SearchOptions(), SearchOptions(beam_size=3)):
        out = Translator(marian_de_en.run, glossary=glossary).translate(texts, search=search)
        assert [bool(re.search(rf"(?<!\w){term}(?!\w)", text)) for text in out[::2]] == [True, True], out
        if search.beam_size == 1:
            assert out[1] == plain[1]
