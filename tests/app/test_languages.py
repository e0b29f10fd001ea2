"""Language codes. An ISO code names one of a model's languages (``ko`` is NLLB's ``kor_Hang``, ``ps`` its
``pbt_Arab``) in the script it asks for, never another script (``sr-Latn`` is not ``srp_Cyrl``) nor another language
(``br`` is not French); the code clients are shown leads back to the model's own, which ``translate``, ``evaluate``
and ``serve`` say. A run of one pair refuses ``serve --langs`` of another, and ``source: "auto"`` refuses a text in a
language that nothing served translates into the target, as naming that language does.

Checked on the codes Transformers' tokenizers list (NLLB-200's 202, M2M100's 100), on a tiny NLLB-style checkpoint
of some of them (translations against Transformers' ``generate``) and on tiny Marian runs (``test_import.py``'s).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.imported import imported
from app.served import request, serving
from app.support import VALID, Cli, assert_refused, write_lines
from multihead.app.console import UserError
from multihead.app.languages import LanguageTokens, pair_text
from multihead.app.serve import Limits, Service, create_app
from multihead.app.serve.command import _served
from multihead.app.translate import Translator

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

GERMAN = [source for source, _ in VALID]
CODES = ["deu_Latn", "eng_Latn", "kor_Hang", "srp_Cyrl", "pbt_Arab", "crh_Latn"]
"""The tiny NLLB-style checkpoint's languages: German and English, and one each of Korean (Hangul, where Korean's
usual script is Kore), Serbian (Cyrillic only), Pashto (Southern, of the macrolanguage ``ps``) and Crimean Tatar
(Latin, where its usual script is Cyrillic)."""


def tokens(codes: list[str]) -> LanguageTokens:
    """The language tokens of a model of ``codes``, each a source and a target (M2M100's and NLLB's)."""
    ids = {code: index for index, code in enumerate(codes)}
    return LanguageTokens(ids, ids, True)


@functools.cache
def nllb_codes() -> LanguageTokens:
    """NLLB-200's languages, as ``NllbTokenizer`` lists them."""
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    return tokens(list(FAIRSEQ_LANGUAGE_CODES))


@functools.cache
def m2m100_codes() -> LanguageTokens:
    """M2M100's languages, as ``M2M100Tokenizer`` lists them."""
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    return tokens([token.strip("_") for token in FAIRSEQ_LANGUAGE_CODES["m2m100"]])


@pytest.mark.parametrize(
    ("requested", "code"),
    [("ko", "kor_Hang"), ("ko-KR", "kor_Hang"), ("ko-Kore", "kor_Hang"), ("ps", "pbt_Arab"), ("crh", "crh_Latn"),
     ("tzm", "tzm_Tfng"), ("acm", "acm_Arab"), ("ajp", "ajp_Arab"), ("sr", "srp_Cyrl"), ("sr-Cyrl", "srp_Cyrl"),
     ("zh", "zho_Hans"), ("zh-TW", "zho_Hant"), ("ar", "arb_Arab"), ("no", "nob_Latn"), ("fa", "pes_Arab"),
     ("fa-AF", "prs_Arab"), ("ks", "kas_Arab"), ("ks-Deva", "kas_Deva"), ("kor_Hang", "kor_Hang")],
)  # fmt: skip
def test_an_iso_code_names_the_language_nllb_has(requested: str, code: str) -> None:
    """A language NLLB has in one script is that one, whatever script ``langcodes`` finds likely (``crh``: Cyrillic)
    or whether it knows none (``acm``); a macrolanguage is the language NLLB has of it (``ps``: Southern Pashto)."""
    assert nllb_codes().choose(requested, target=True) == code


@pytest.mark.parametrize(
    ("requested", "message"),
    [("sr-Latn", "the nearest it has: srp_Cyrl"), ("sr-ME", "the nearest it has: srp_Cyrl"),  # Latin in Montenegro
     ("crh-Cyrl", "the nearest it has: crh_Latn"), ("br", "it has 202, such as"), ("gsw", "it has 202, such as")],
)  # fmt: skip
def test_another_script_or_language_is_refused(requested: str, message: str) -> None:
    """Serbian in Latin is not NLLB's Cyrillic; Breton is not French, nor Swiss German German (close as ``langcodes``
    holds them for a reader)."""
    with pytest.raises(ValueError, match=f"^the model has no language '{requested}'; {message}"):
        nllb_codes().choose(requested, target=True)


def test_m2m100s_codes_are_iso_codes_and_keep_their_scripts() -> None:
    found = m2m100_codes()
    assert [found.choose(code, target=True) for code in ("ko-Hang", "zh-CN", "nb")] == ["ko", "zh", "no"]
    with pytest.raises(ValueError, match=r"no language 'zh-Hant'; the nearest it has: zh$"):  # zh is Simplified
        found.choose("zh-Hant", target=True)


@pytest.mark.parametrize("model", ["nllb", "m2m100"])
def test_the_code_clients_are_shown_leads_back_to_the_models(model: str) -> None:
    found = nllb_codes() if model == "nllb" else m2m100_codes()
    shown = {code: found.public(code, target=True) for code in found.targets}
    assert len(set(shown.values())) == len(shown)
    assert all(found.choose(public, target=True) == code for code, public in shown.items())
    assert all(found.own_code(public) == code for code, public in shown.items())
    expected = {"kor_Hang": "ko", "pbt_Arab": "ps", "srp_Cyrl": "sr", "zho_Hant": "zh-Hant", "crh_Latn": "crh-Latn",
                "deu_Latn": "de"} if model == "nllb" else {"ko": "ko", "zh": "zh", "de": "de"}  # fmt: skip
    assert {code: shown[code] for code in expected} == expected


def test_the_pair_names_the_models_codes() -> None:
    assert pair_text(["de", "ko"], tokens=nllb_codes()) == "de → ko (German to Korean; the model's deu_Latn → kor_Hang)"
    assert pair_text(["de", "ko"], tokens=m2m100_codes()) == "de → ko (German to Korean)"


# --- a run of an NLLB-style checkpoint -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nllb(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import M2M100ForConditionalGeneration, NllbTokenizer

    from app.test_import_nllb import Nllb, make_checkpoint

    def tokenizer(found: Path) -> object:
        return NllbTokenizer.from_pretrained(found, src_lang="deu_Latn", tgt_lang="eng_Latn")

    return imported(tmp_path_factory.mktemp("languages"), "nllb_tiny", functools.partial(make_checkpoint, codes=CODES),
                    Nllb, M2M100ForConditionalGeneration, tokenizer)  # fmt: skip


def transformers_text(nllb: Any, target: str) -> list[str]:
    """``GERMAN`` translated greedily into the NLLB code ``target`` by Transformers, decoded by ``batch_decode``."""
    tokens = nllb.generate(GERMAN, "deu_Latn", target, num_beams=1)
    return nllb.tokenizer.batch_decode(tokens[:, 2:], skip_special_tokens=True)


@pytest.mark.parametrize(
    ("requested", "code", "said"),
    [("ko", "kor_Hang", "de → ko (German to Korean; the model's deu_Latn → kor_Hang)"),
     ("ps", "pbt_Arab", "de → ps (German to Pashto; the model's deu_Latn → pbt_Arab)"),
     ("crh", "crh_Latn", "de → crh-Latn (German to Crimean Tatar (Latin); the model's deu_Latn → crh_Latn)")],
    ids=["ko", "ps", "crh"],
)  # fmt: skip
def test_translate_into_an_iso_code_is_into_the_models_language(
    nllb: Any, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch, requested: str, code: str,
    said: str,
) -> None:  # fmt: skip
    """``--target-lang ko`` translates as Transformers into ``kor_Hang``; ``translate`` says so at a terminal,
    ``evaluate`` always."""
    source = write_lines(tmp_path / "source.de", GERMAN)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    result = cli("translate", nllb.run, "--input", source, "--target-lang", requested)
    assert result.status == 0, result.err
    assert result.out_lines == transformers_text(nllb, code)
    assert result.err_lines[0].startswith(f"{said}, checkpoint "), result.err
    scored = cli("evaluate", nllb.run, source, source, "--target-lang", requested)
    assert scored.status == 0, scored.err
    assert f"languages: {said}" in scored.out_lines


def test_a_script_the_model_lacks_is_refused(nllb: Any, cli: Callable[..., Cli]) -> None:
    assert_refused(cli("translate", nllb.run, "Hund", "--target-lang", "sr-Latn"), "--target-lang sr-Latn",
                   "no language 'sr-Latn'", "the nearest it has: srp_Cyrl")  # fmt: skip
    assert_refused(cli("translate", nllb.run, "Hund", "--source-lang", "crh-Cyrl"), "--source-lang crh-Cyrl",
                   "the nearest it has: crh_Latn")  # fmt: skip


def test_serve_lists_iso_codes_with_the_models_own(nllb: Any) -> None:
    """``/languages``: ISO codes (a script only where the model's is not the language's usual one), each with the
    model's code; ``/translate`` into ``ko`` or ``ko-Hang`` is into ``kor_Hang``, into ``sr-Latn`` refused."""
    translator = Translator(nllb.run)
    with serving(create_app(Service(translator, translator.langs or []), Limits())) as url:
        status, languages = request(url, "/languages")
        assert status == 200
        assert [(entry["code"], entry["model_codes"]) for entry in languages] == [
            (code, {"run": own}) for code, own in zip(["de", "en", "ko", "sr", "ps", "crh-Latn"], CODES, strict=True)
        ]
        expected = transformers_text(nllb, "kor_Hang")
        for target in ("ko", "ko-Hang"):
            status, answer = request(url, "/translate", {"q": GERMAN, "source": "de", "target": target})
            assert (status, answer["translatedText"]) == (200, expected)
        assert request(url, "/translate", {"q": "Hund", "source": "de", "target": "sr-Latn"}) == (
            400, {"error": "sr-Latn is not supported"}
        )  # fmt: skip


# --- serve: runs of one pair -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def marians(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Translator]:
    """A Marian de → en run (its languages from its OPUS-MT name) and, of the same weights, en → sv."""
    from app.imported import marian_runs

    return {name: Translator(run) for name, run in marian_runs(tmp_path_factory.mktemp("marians")).items()}


def test_serve_langs_of_another_pair_is_refused_for_a_run_of_one(
    marians: dict[str, Translator], cli: Callable[..., Cli]
) -> None:
    """A run without language tokens translates its own pair: ``--langs`` names it (in any spelling), or is refused
    in one line, as ``translate --target-lang`` is, not taken as the run's languages."""
    run = marians["de-en"]
    path = str(run.checkpoint.path.parents[1])
    assert _served(run, ["de-DE", "en"], path)[1] == ["de", "en"]
    with pytest.raises(UserError, match=r"^--langs fr en: this run translates de → en \(German to English\) only"):
        _served(run, ["fr", "en"], path)
    assert_refused(cli("serve", path, "--port", "0", "--langs", "fr", "en"), "--langs fr en",
                   "this run translates de → en (German to English) only")  # fmt: skip


@pytest.fixture(scope="module")
def url(marians: dict[str, Translator]) -> Iterator[str]:
    """de → en and en → sv served together (de → sv through English): nothing translates Swedish."""
    first, second = marians["de-en"], marians["en-sv"]
    with serving(create_app(Service(first, ["de", "en"], more=[(second, ["en", "sv"])]), Limits())) as found:
        yield found


SWEDISH = "Två barn leker i vattnet medan hunden springer längs stranden."


def test_auto_refuses_a_text_in_a_language_nothing_translates_into_the_target(url: str) -> None:
    """Swedish found in a text (``source: "auto"``) is refused as ``source: "sv"`` is: German's model would garble
    it."""
    status, detected = request(url, "/detect", {"q": SWEDISH})
    assert status == 200
    assert detected[0]["language"] == "sv"
    assert detected[0]["confidence"] > 50
    named = request(url, "/translate", {"q": SWEDISH, "source": "sv", "target": "en"})
    assert named == (400, {"error": "English (en) is not available as a target language from Swedish (sv)"})
    assert request(url, "/translate", {"q": SWEDISH, "source": "auto", "target": "en"}) == named
    assert request(url, "/translate", {"q": [GERMAN[0], SWEDISH], "source": "auto", "target": "en"}) == named


def test_auto_translates_what_it_cannot_identify_from_the_runs_source(url: str, marians: dict[str, Translator]) -> None:
    """German goes to the German model; a text in no language (digits) to the first run's source's; a text already
    in the target is kept as it is."""
    texts = [GERMAN[0], "1234", "The children are playing in the water."]
    status, answer = request(url, "/translate", {"q": texts, "source": "auto", "target": "en"})
    assert status == 200
    assert [found["language"] for found in answer["detectedLanguage"]] == ["de", "de", "en"]
    assert answer["detectedLanguage"][1]["confidence"] == 0
    assert answer["translatedText"] == [*marians["de-en"].translate(texts[:2]), texts[2]]
