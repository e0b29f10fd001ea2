"""Do-not-translate spans (:mod:`multihead.app.keep`): which spans are found, how stand-ins are put back, and that every
placeholder comes back exactly once, byte for byte, in ``translate``, ``evaluate`` and ``serve``, on a run whose
vocabulary spells the stand-ins (constrained) and on one whose vocabulary does not (put back after decoding)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from app.support import CORPUS_FLAGS, SAMPLES, TRAIN, VALID, Cli, CorpusRun, assert_refused, write_corpus, write_lines
from multihead.app.cli import main
from multihead.app.keep import Keep, keep_pattern, miscounted, restored
from multihead.app.translate import Translator

SPANS = ["{name}", "{{ user }}", "%s", "%1$s", "%(count)d", "${price}", '<x id="7"/>', "https://example.com/a?b=1",
         "info@example.org"]  # fmt: skip
"""One placeholder of every kind kept by default."""
TEXTS = [" ".join([*sample.split()[:2], span, *sample.split()[2:]])
         for sample, span in zip(SAMPLES * 2, SPANS, strict=False)]  # fmt: skip
"""The samples, a placeholder inserted after their second word."""


@pytest.fixture(scope="module")
def copying_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run like the corpus run whose corpus also holds codes (``X1``... ``X9``) copied into the translations: its
    vocabulary spells the stand-ins."""
    root = tmp_path_factory.mktemp("copying")
    codes = [(f"{source[:-1]} X{d}.", f"{target[:-1]} X{d}.") for d, (source, target) in enumerate(TRAIN[:90:10])]
    data, valid = write_corpus(root / "corpus", TRAIN + codes), write_corpus(root / "corpus", VALID, "valid")
    assert main(["train", "--data", *data, "--valid", *valid, "--out", str(root / "run"), *CORPUS_FLAGS,
                 "--steps", "120"]) == 0  # fmt: skip
    shutil.rmtree(root / "corpus")
    return root / "run"


def test_every_default_placeholder_is_found_whole_and_nothing_else() -> None:
    text = ("Hallo {name}, {{ user }} hat ${count} Mails von a.b+c@example.org: %s, %1$s, %(n)d und <x id=\"1\"/>, "
            "siehe https://example.com/a?b=1. Doch 50 % der Leute, eine 5%ige Lösung, 100%, {} und {a b}.")  # fmt: skip
    expected = ["{name}", "{{ user }}", "${count}", "a.b+c@example.org", "%s", "%1$s", "%(n)d", '<x id="1"/>',
                "https://example.com/a?b=1", "{}"]  # fmt: skip
    assert [text[start:end] for start, end in Keep().spans(text)] == expected
    assert Keep(placeholders=False).spans(text) == []
    own = Keep((keep_pattern(r"ACME-\d+"), keep_pattern("example")))
    found = "ACME-12 und {x} auf https://example.com"
    assert [found[start:end] for start, end in own.spans(found)] == ["ACME-12", "{x}", "https://example.com"]
    for bad, message in (("(", "'(' is not a regular expression"), ("a*", "'a*' matches an empty text")):
        with pytest.raises(ValueError, match="^" + re.escape(message)):
            keep_pattern(bad)


def test_stand_ins_are_put_back_exactly_once() -> None:
    """Each span stands in the text once, as a stand-in the text did not hold; put back once whatever the translation
    did with it: written twice, its first place; missing, before the final punctuation; another piece's, left out."""
    masked, kept = Keep().masked("Preis X1: {n} und %s. Mehr: %d")
    assert (masked, kept) == ("Preis X1: X2 und X3. Mehr: X4", {"X2": "{n}", "X3": "%s", "X4": "%d"})
    source = "Preis X1: X2 und X3."
    cases = [
        ("Price X1: X2 and X3.", "Price X1: {n} and %s."),
        ("Price X2 X2 and X3 X3!", "Price {n} and %s!"),
        ("X2 costs X3 X4.", "{n} costs %s."),
        ("Price and X3.", "Price and %s {n}."),
        ("", "{n} %s"),
    ]
    for translation, expected in cases:
        assert restored(source, translation, kept) == expected, translation
    assert miscounted(source, "Price X1: X2 and X3.", kept) is None
    assert miscounted(source, "Price X2 X2 and X3.", kept) == "it held the kept '{n}' 2 times"
    assert miscounted(source, "Price and X3.", kept) == "it held the kept '{n}' 0 times"
    assert restored("Kein Platzhalter.", "No placeholder X2.", {}) == "No placeholder X2."


def _kept_once(texts: list[str], outputs: list[str]) -> list[bool]:
    """For each span of ``texts``, whether its translation in ``outputs`` holds it exactly once."""
    return [output.count(span) == 1 for text, output in zip(texts, outputs, strict=True)
            for span in [*SPANS, "ACME-7"] if span in text]  # fmt: skip


@pytest.mark.parametrize("which", ["constrained", "put back"])
def test_placeholders_come_back_exactly_once_byte_for_byte(
    which: str, copying_run: Path, corpus_run: CorpusRun, cli: Callable[..., Cli], tmp_path: Path
) -> None:
    """Greedy, beams, sampled and n-best lists, a regex of one's own too; without keeping them, the run whose
    vocabulary lacks braces, dollars and at signs loses some."""
    run = copying_run if which == "constrained" else corpus_run.path
    texts = [*TEXTS, "der Hund ACME-7 läuft {name} schnell."]
    for flags in ([], ["--beam", "3"], ["--sampling-topk", "5", "--seed", "1"]):
        result = cli("translate", run, "--keep", r"ACME-\d+", *flags, *texts)
        assert result.status == 0, result.err
        assert all(_kept_once(texts, result.out_lines)), (flags, result.out_lines)
    result = cli("translate", run, "--n-best", "2", "--beam", "3", *TEXTS)
    assert result.status == 0, result.err
    assert all(_kept_once([text for text in TEXTS for _ in "ab"], [line.split("\t")[2] for line in result.out_lines]))
    src, ref = write_lines(tmp_path / "test.de", TEXTS), write_lines(tmp_path / "test.en", TEXTS)
    output = tmp_path / "out.en"
    assert cli("evaluate", run, src, ref, "--output", output).status == 0
    assert all(_kept_once(TEXTS, output.read_text(encoding="utf-8").splitlines()))
    if which == "put back":
        plain = cli("translate", run, "--no-keep-placeholders", *TEXTS)
        assert not all(_kept_once(TEXTS, plain.out_lines)), plain.out_lines


def test_texts_without_spans_translate_as_before(corpus_run: CorpusRun) -> None:
    keeping, plain = Translator(corpus_run.path), Translator(corpus_run.path, keep=None)
    assert keeping.translate(SAMPLES) == plain.translate(SAMPLES) == corpus_run.translations
    cuts, _ = keeping.pieces(SAMPLES)
    assert keeping.constraints(SAMPLES, [cut.kept for cut in cuts]) is None


def test_a_bad_keep_regex_is_refused_in_one_line(
    corpus_run: CorpusRun, cli: Callable[..., Cli], tmp_path: Path
) -> None:
    assert_refused(cli("translate", corpus_run.path, "--keep", "(", "Hallo"),
                   "--keep '(' is not a regular expression")  # fmt: skip
    src = write_lines(tmp_path / "test.de", SAMPLES)
    output = tmp_path / "out.en"
    assert_refused(cli("evaluate", corpus_run.path, src, src, "--keep", "a*", "--output", output),
                   "--keep 'a*' matches an empty text")  # fmt: skip
    assert not output.exists()


def test_serve_keeps_placeholders_and_a_requests_own_spans(copying_run: Path) -> None:
    """A ``keep`` field: a list of regular expressions, whose matches come back as placeholders do, in texts, HTML
    and alternatives; a malformed one is a 400 naming the entry."""
    from app.served import request, serving
    from multihead.app.serve import Limits, Service, create_app

    translator = Translator(copying_run)
    texts = [*TEXTS, "der Hund ACME-7 läuft {name} schnell."]
    body = {"q": texts, "source": "de", "target": "en", "keep": [r"ACME-\d+"]}
    with serving(create_app(Service(translator, translator.langs), Limits())) as url:
        status, answer = request(url, "/translate", body)
        assert status == 200, answer
        assert all(_kept_once(texts, answer["translatedText"])), answer
        status, answer = request(url, "/translate", {**body, "q": texts[-1], "alternatives": 2})
        assert status == 200, answer
        assert all(_kept_once([texts[-1]] * 3, [answer["translatedText"], *answer["alternatives"]])), answer
        html = "<p>der Hund <b>läuft</b> {name} schnell.</p>"
        status, answer = request(url, "/translate", {**body, "q": html, "format": "html"})
        assert status == 200, answer
        assert answer["translatedText"].count("{name}") == 1, answer
        refused = [
            ("ACME", "keep must be a list of regular expressions"),
            (["("], "keep entry 0: '(' is not a regular expression"),
            ([r"\d", 3], "keep entry 1 must be a regular expression, received 3"),
            ([r"\d", "x?"], "keep entry 1: 'x?' matches an empty text"),
        ]
        for bad, message in refused:
            status, answer = request(url, "/translate", {**body, "keep": bad})
            assert (status, answer["error"].startswith(f"Invalid request: {message}")) == (400, True), answer


def test_serve_takes_the_keep_and_glossary_options_as_translate_does(copying_run: Path) -> None:
    """``serve --keep REGEX --no-keep-placeholders --glossary-bonus B``: the translators it loads keep what those
    say (a bonus without a server glossary is for requests' own); a bad regex is refused in one line (exit 2)."""
    from multihead.app.cli import _terminology, build_parser
    from multihead.app.serve.command import _load_run

    args = build_parser().parse_args(["serve", str(copying_run), "--keep", r"ACME-\d+", "--no-keep-placeholders",
                                      "--glossary-bonus", "2"])  # fmt: skip
    options = _terminology(args, serving=True)
    translator, _ = _load_run(str(copying_run), checkpoint=None, device=None, quantize=None, normalize=None,
                              langs=None, glossary_bonus=options["glossary_bonus"], keep=options["keep"])  # fmt: skip
    keep = translator.cutter.keep
    assert keep is not None
    assert (keep.placeholders, [p.pattern for p in keep.patterns], translator.cutter.bonus) == (
        False,
        [r"ACME-\d+"],
        2.0,
    )
    assert keep.spans("call ACME-7 at {name}") == [(5, 11)]
    assert main(["serve", str(copying_run), "--keep", "("]) == 2
