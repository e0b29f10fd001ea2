"""Texts translated sentence by sentence (``multihead.app.segment``) and the guard that searches again a translation
that lost or invented text (``multihead.app.translate.doubt``): the segmenter's rules, then a paragraph through
``translate`` equal to Transformers' translations of its sentences one by one (an imported tiny Marian), and a planted
drop caught."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given
from hypothesis import strategies as st

from app.support import SAMPLES, Cli, CorpusRun, write_lines
from multihead.app.segment import join, not_text, shorter, split
from multihead.app.translate import Generate, Translator, doubt, repeats, translate_ids


def rebuilt(text: str, language: str = "en") -> str:
    """``text`` from its gaps and sentences, in turn."""
    found = split(text, language)
    return "".join(gap + sentence for gap, sentence in zip(found.gaps, found.sentences, strict=False)) + found.gaps[-1]


@given(st.lists(st.sampled_from([*"ab Z.!?\n\r\t。ภา\u3000", ". ", "Dr. ", "\r\n"]), max_size=40).map("".join))
def test_a_texts_gaps_and_sentences_give_it_back(text: str) -> None:
    found = split(text, "en")
    assert rebuilt(text) == text
    assert len(found.gaps) == len(found.sentences) + 1
    assert all(sentence and sentence == sentence.strip() for sentence in found.sentences)
    assert not any(character.isalnum() for gap in found.gaps for character in gap)  # marks alone stay in gaps


@pytest.mark.parametrize(
    ("language", "text", "expected"),
    [
        ("de", "Das kostet z. B. 3,50 Euro. Dr. Müller kommt am 3. Mai. Gut.",
         ["Das kostet z. B. 3,50 Euro.", "Dr. Müller kommt am 3. Mai.", "Gut."]),
        ("en", "The U.S. economy grew by 2.5 percent. Prices rose! Did they?",
         ["The U.S. economy grew by 2.5 percent.", "Prices rose!", "Did they?"]),
        ("zh", "我们今天去公园。天气很好！你来吗？", ["我们今天去公园。", "天气很好！", "你来吗？"]),
        ("ja", "今日は雨です。明日は晴れるでしょう。", ["今日は雨です。", "明日は晴れるでしょう。"]),
        ("th", "วันนี้อากาศดีมาก เราจะไปเที่ยวกัน", ["วันนี้อากาศดีมาก", "เราจะไปเที่ยวกัน"]),
        ("de", "Eine Zeile ohne Punkt\nDie nächste Zeile.", ["Eine Zeile ohne Punkt", "Die nächste Zeile."]),
        ("mul", "One. Two.", ["One.", "Two."]),
        ("de", "   ", []),
        ("de", "Ein Hund. 😺 Zwei Katzen. \u202e", ["Ein Hund.", "😺 Zwei Katzen."]),
        ("de", "\x00…", []),
    ],
    ids=["de-abbreviations", "en-abbreviations", "zh", "ja", "th-spaces", "line-breaks", "mul", "blank", "marks",
         "no-letters"],
)  # fmt: skip
def test_sentences_are_found_where_a_reader_sees_them(language: str, text: str, expected: list[str]) -> None:
    assert split(text, language).sentences == expected


def test_translations_are_joined_with_the_sources_spacing() -> None:
    gaps = ["  ", " ", "\n", "\t  "]
    assert join(gaps, ["A.", "B.", "C."], "en") == "A. B.\nC."  # the text's own ends left out
    assert join(["", "", ""], ["A.", "B."], "en") == "A. B."  # a CJK source's sentences get a space in English
    assert join(["", " ", ""], ["甲。", "乙。"], "zh-Hant") == "甲。乙。"  # and none in Chinese
    assert join(["", " ", ""], ["วันนี้ดี", "เราไป"], "th") == "วันนี้ดี เราไป"  # Thai ends a sentence with a space
    assert join(["", " ", ""], ["A.", ""], "en") == "A."  # a sentence translated as nothing leaves no space
    assert join(["", " 😺 ", ""], ["A.", "B."], "en") == "A. 😺 B."  # what holds no letter is kept
    assert join(["", " 😺 ", ""], ["甲。", "乙。"], "zh") == "甲。😺乙。"


@given(st.lists(st.sampled_from(["word", "a,", "long-word;", "x.", "end!", "Zebra"]), min_size=1, max_size=40))
def test_a_sentence_too_long_is_split_into_parts_that_fit_keeping_every_word(words: list[str]) -> None:
    sentence = " ".join(words)
    parts = shorter(sentence, lambda part: len(part.split()) <= 4)
    assert " ".join(parts).split() == words
    assert all(len(part.split()) <= 4 for part in parts)


def test_a_long_sentence_is_split_at_sentence_ends_before_clauses() -> None:
    sentence = "der Hund läuft, die Katze schläft. das Kind spielt, die Frau singt."
    assert shorter(sentence, lambda part: len(part) <= 40) == ["der Hund läuft, die Katze schläft.",
                                                                 "das Kind spielt, die Frau singt."]  # fmt: skip
    assert shorter(sentence, lambda part: len(part) <= 20) == ["der Hund läuft,", "die Katze schläft.",
                                                                 "das Kind spielt,", "die Frau singt."]  # fmt: skip


def test_a_lone_surrogate_is_no_text() -> None:
    assert not_text("Hallo Welt") is None
    assert not_text("ab\ud800c") == "a lone surrogate (U+D800, not a character) at character 3"
    assert not_text("\udcff") is not None  # a byte that is not UTF-8, as Python reads it from argv


def test_the_guard_doubts_what_lost_never_ended_or_repeats() -> None:
    eos = 2
    source = list(range(10, 30))  # 20 tokens
    assert doubt(source, [*range(40, 58), eos], eos, 100) is None
    assert doubt(source, [41, 42, eos], eos, 100) == "2 tokens for a source of 20"
    assert doubt(source, [*range(40, 100)], eos, 100) == "it did not end within its length limit"
    assert doubt(source, [*range(40, 57), eos], eos, 18) == "it did not end within its length limit"  # EOS forced
    assert doubt(source, [*range(40, 110), eos], eos, 100) == "70 tokens for a source of 20"
    assert doubt(source, [5, 6, 7, 6, 7, 6, 7, 6, 7, 8, eos], eos, 100) == "it repeats itself"
    assert doubt([10, 11], [40, eos], eos, 100) is None  # short sources are not judged by length
    assert repeats([1, 1, 1, 1])
    assert not repeats([1, 1, 1, 2, 1])
    assert repeats([1, 2, 3, 4] * 4)
    assert not repeats([1, 2, 3, 4, 5] * 4)


# --- on a model: an imported tiny Marian, against Transformers ---------------------------------------------------

PARAGRAPH = ["Der Hund läuft schnell.", "Der Mann spielt heute!", "Das Kind isst die Qualle gern."]


def test_a_paragraph_is_translated_sentence_by_sentence(
    marian_de_en: Any, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """Each line's sentences are translated as Transformers translates each alone, joined with the line's spacing;
    with ``--no-split`` each line is one sentence."""
    from app.test_import import transformers_translations

    lines = [" ".join(PARAGRAPH), "  ".join(PARAGRAPH[::-1]), PARAGRAPH[0]]
    alone = dict(zip(PARAGRAPH, transformers_translations(marian_de_en, PARAGRAPH), strict=True))
    source = write_lines(tmp_path / "paragraphs.de", lines)
    result = cli("translate", marian_de_en.run, "--input", source)
    assert result.status == 0, result.err
    assert result.out_lines == [
        " ".join(alone[sentence] for sentence in PARAGRAPH),
        "  ".join(alone[sentence] for sentence in PARAGRAPH[::-1]),
        alone[PARAGRAPH[0]],
    ]
    unsplit = Translator(marian_de_en.run, split_sentences=False)
    cuts, _ = unsplit.pieces(lines)
    assert [cut.ids for cut in cuts] == [[unsplit.source.encode(line)[0]] for line in lines]
    whole = cli("translate", marian_de_en.run, "--input", source, "--no-split")
    assert whole.status == 0, whole.err
    assert whole.out_lines == unsplit.translate(lines)
    assert whole.out_lines[0] != result.out_lines[0]


def with_planted_drop(run: Path, directory: Path) -> Path:
    """A copy of ``run`` whose model always ends at once: its EOS's output bias made huge."""
    copy = shutil.copytree(run, directory)
    weights = copy / "checkpoints" / "step-0000000" / "model.safetensors"
    tensors = safetensors.numpy.load_file(weights)
    eos = json.loads((weights.parent / "generation.json").read_text())["specials"]["eos"]
    tensors["output_proj.bias"][eos] = 1e4  # Marian's final_logits_bias
    safetensors.numpy.save_file(tensors, weights)
    return copy


def test_the_guard_names_a_sentence_whose_translation_was_dropped(
    marian_de_en: Any, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """A model that drops every sentence (its EOS always first): each long enough to judge is searched again (beam,
    then in halves), still dropped, and named in one warning; the output still has a line for each input line."""
    dropping = with_planted_drop(marian_de_en.run, tmp_path / "dropping")
    line = " ".join(PARAGRAPH)
    result = cli("translate", dropping, line)
    assert result.status == 0, result.err
    assert result.out_lines == [""]
    doubted = [sentence for sentence in PARAGRAPH if f"'{sentence}' may have lost or invented words" in result.err]
    assert doubted == [sentence for sentence in PARAGRAPH if len(Translator(dropping).source.encode(sentence)[0]) >= 6]
    assert doubted, result.err


def test_the_guard_takes_a_better_search_when_it_settles_the_doubt(
    corpus_run: CorpusRun, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A first search that drops a sentence (a greedy pass whose translations are EOS alone, planted) is replaced by
    the beam's, which is what beam search translates: no warning."""
    from multihead.decoding import SearchOptions

    translator = Translator(corpus_run.path)
    beam = translator.translate(SAMPLES[:3], search=SearchOptions(beam_size=4, length_penalty=0.6))
    generate = translator.generate

    def dropping_greedy(search: SearchOptions, **given: Any) -> Generate:
        run = generate(search, **given)
        if search.beam_size > 1:
            return run

        def dropped(src: np.ndarray, limits: np.ndarray, indices: np.ndarray) -> np.ndarray:
            out = run(src, limits, indices)
            out[:, 0] = translator.specials.eos
            return out

        return dropped

    monkeypatch.setattr(translator, "generate", dropping_greedy)
    capsys.readouterr()
    assert translator.translate(SAMPLES[:3]) == beam
    assert "may have lost" not in capsys.readouterr().err


def test_the_guard_splits_a_sentence_whose_translation_lost_its_clauses(
    corpus_run: CorpusRun, capsys: pytest.CaptureFixture[str]
) -> None:
    """The little model, which learnt sentences of one clause, translates three clauses as one ("the child runs
    here."), greedy and beam alike: the guard translates the clauses one by one instead, and warns of nothing."""
    from multihead.decoding import SearchOptions

    translator = Translator(corpus_run.path)
    clauses = ["der Hund läuft hier,", "die Katze schläft gern,", "das Kind isst schnell"]
    ids = translator.source.encode(" ".join(clauses))[0]
    for search in (SearchOptions(), SearchOptions(beam_size=4, length_penalty=0.6)):
        (out,) = translate_ids(translator.generate(search), [ids], limit=translator.limit,
                               generation=translator.generation)  # fmt: skip
        assert doubt(ids, out, translator.specials.eos, translator.limit(len(ids))) is not None, out
    capsys.readouterr()
    assert translator.translate([" ".join(clauses)]) == [" ".join(translator.translate(clauses))]
    assert "may have lost" not in capsys.readouterr().err
