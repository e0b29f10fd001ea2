"""The attention page (``multihead/app/page.html``) in headless Chromium: static mode (its views written into the page,
as ``translate --html`` writes them), and served by ``multihead serve``'s app translating with a trained run.

The views are written by hand: 2 decoder layers of 2 heads, weights of two decimals chosen so that every mean the
page shows has at most three (no rounding ties), and one view's words hold markup that must show as text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver import ActionChains, Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

from app.browser import browser
from app.served import serving
from app.support import SAMPLES, CorpusRun, write_lines
from multihead.app import view
from multihead.app.detect import LanguageIdentifier
from multihead.app.serve import Limits, Service, create_app
from multihead.app.translate import Translator
from multihead.app.view import attention_view

EMPTY = '<script id="views" type="application/json">[]</script>'

DOG = {  # layers[l][h][t][s]: 4 target words × 3 source words
    "source": "der Hund läuft.",
    "target": "the dog runs.",
    "source_words": ["der", "Hund", "läuft."],
    "target_words": ["the", "dog", "runs.", "⟨eos⟩"],
    "layers": [
        [
            [[0.70, 0.20, 0.10], [0.10, 0.80, 0.10], [0.05, 0.15, 0.80], [0.30, 0.30, 0.40]],
            [[0.50, 0.25, 0.25], [0.20, 0.60, 0.20], [0.15, 0.25, 0.60], [0.10, 0.10, 0.80]],
        ],
        [
            [[0.90, 0.05, 0.05], [0.02, 0.96, 0.02], [0.01, 0.05, 0.94], [0.20, 0.20, 0.60]],
            [[0.60, 0.30, 0.10], [0.40, 0.40, 0.20], [0.25, 0.25, 0.50], [0.34, 0.32, 0.34]],
        ],
    ],
}
# The mean of layer 2's heads (what the page shows first), and of all four heads, worked out by hand.
DOG_LAST_LAYER = [["0.750", "0.175", "0.075"], ["0.210", "0.680", "0.110"],
                  ["0.130", "0.150", "0.720"], ["0.270", "0.260", "0.470"]]  # fmt: skip
DOG_ALL = [["0.675", "0.200", "0.125"], ["0.180", "0.690", "0.130"],
           ["0.115", "0.175", "0.710"], ["0.235", "0.230", "0.535"]]  # fmt: skip

MARKUP = {  # 2 target words × 3 source words, markup in them
    "source": "Tom <b>& Jerry</b><!--<script>",
    "target": "Tom&Jerry",
    "source_words": ["Tom", "<b>&", "Jerry</b><!--<script>"],
    "target_words": ["Tom&Jerry", "⟨eos⟩"],
    "layers": [
        [[[0.2, 0.3, 0.5], [0.6, 0.2, 0.2]], [[0.4, 0.4, 0.2], [0.1, 0.1, 0.8]]],
        [[[0.1, 0.6, 0.3], [0.3, 0.3, 0.4]], [[0.5, 0.0, 0.5], [0.9, 0.1, 0.0]]],
    ],
}

# Run before each page's own script: what the page fetches goes into window.fetched.
RECORD_FETCHES = (
    "window.fetched = []; const f = window.fetch; window.fetch = (u, o) => (fetched.push(String(u)), f(u, o));"
)


# What the file tab's progress line says, each text in turn, into window.progress (window.fetched emptied).
RECORD_PROGRESS = """
window.fetched = []; window.progress = [];
const line = document.getElementById("file-progress");
new MutationObserver(() => progress.push(line.textContent)).observe(line, { childList: true, characterData: true });
"""


def page_html() -> str:
    return (resources.files("multihead.app") / "page.html").read_text(encoding="utf-8")


def write_page(path: Path, views: list[dict[str, Any]]) -> str:
    """The page with ``views`` in it, written as ``translate --html`` writes it: its ``file://`` URL."""
    assert page_html().count(EMPTY) == 1
    return view.write_page(views, path).as_uri()


@pytest.fixture(scope="module")
def driver() -> Iterator[Chrome]:
    with browser() as chrome:
        chrome.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_FETCHES})
        yield chrome


@pytest.fixture
def static(driver: Chrome, tmp_path: Path) -> Chrome:
    """The browser on the page holding both views."""
    driver.get(write_page(tmp_path / "page.html", [DOG, MARKUP]))
    return driver


def texts(driver: Chrome, selector: str) -> list[str]:
    return [node.get_attribute("textContent") for node in driver.find_elements(By.CSS_SELECTOR, selector)]


def cells(driver: Chrome, attribute: str = "data-weight") -> list[list[str]]:
    """Each row's cells' ``attribute``."""
    rows = driver.find_elements(By.CSS_SELECTOR, "#attention tr[data-index]")
    return [[cell.get_attribute(attribute) for cell in row.find_elements(By.CSS_SELECTOR, "td.cell")] for row in rows]


def source_weights(driver: Chrome) -> list[str | None]:
    return [span.get_attribute("data-weight") for span in driver.find_elements(By.CSS_SELECTOR, "#source-line span")]


def active(driver: Chrome) -> list[str]:
    """The active target words: ``line 1`` for the target line's second word, ``row 1`` for its row header."""
    found = driver.find_elements(By.CSS_SELECTOR, ".target-word.active")
    return sorted(f"{'line' if n.tag_name == 'span' else 'row'} {n.get_attribute('data-index')}" for n in found)


def options(driver: Chrome, select: str) -> list[tuple[str, str]]:
    """The value and label of each option of ``<select id=SELECT>``."""
    return [
        (option.get_attribute("value"), option.text) for option in Select(driver.find_element(By.ID, select)).options
    ]


def selected(driver: Chrome, select: str) -> str:
    return Select(driver.find_element(By.ID, select)).first_selected_option.get_attribute("value")


def choose(driver: Chrome, select: str, value: str) -> None:
    Select(driver.find_element(By.ID, select)).select_by_value(value)


def hover(driver: Chrome, selector: str) -> None:
    ActionChains(driver).move_to_element(driver.find_element(By.CSS_SELECTOR, selector)).perform()


def as_rendered(matrix: list[list[float]]) -> list[list[str]]:
    return [[f"{weight:.3f}" for weight in row] for row in matrix]


def test_the_page_loads_nothing_from_elsewhere() -> None:
    class Links(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.links: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.links += [value or "" for name, value in attrs if name in ("src", "href")]

    html = page_html()
    parser = Links()
    parser.feed(html)
    assert not [link for link in parser.links if re.match(r"(https?:)?//", link)]
    assert "@import" not in html
    assert "url(" not in html
    assert not re.search(r"<(link|img|iframe)\b", html)


def test_without_views_the_page_asks_the_server(driver: Chrome, tmp_path: Path) -> None:
    driver.get(write_page(tmp_path / "page.html", []))
    assert driver.execute_script("return fetched") == ["/frontend/settings"]  # which fails from a file
    assert driver.find_element(By.ID, "text").is_displayed()
    assert driver.find_element(By.ID, "translate").is_displayed()
    assert not driver.find_element(By.ID, "api-key").is_displayed()
    assert not driver.find_element(By.ID, "sentence").is_displayed()
    assert not driver.find_element(By.ID, "attention").is_displayed()


def test_views_hide_the_form_and_list_their_sentences(static: Chrome) -> None:
    assert static.execute_script("return fetched") == []
    for form_field in ("text", "translate", "api-key"):
        assert not static.find_element(By.ID, form_field).is_displayed()
    assert not static.find_element(By.ID, "error").is_displayed()
    assert options(static, "sentence") == [("0", DOG["source"]), ("1", MARKUP["source"])]
    assert selected(static, "sentence") == "0"
    assert static.find_element(By.ID, "translation").text == "the dog runs."


def test_the_table_shows_the_words_and_the_last_layers_heads_mean(static: Chrome) -> None:
    assert options(static, "layer") == [("0", "layer 1"), ("1", "layer 2"), ("all", "all layers (mean)")]
    assert options(static, "head") == [("0", "head 1"), ("1", "head 2"), ("mean", "all heads (mean)")]
    assert (selected(static, "layer"), selected(static, "head")) == ("1", "mean")
    assert texts(static, "#attention th.source-word") == ["der", "Hund", "läuft."]
    assert texts(static, "#attention th.target-word") == ["the", "dog", "runs.", "⟨eos⟩"]
    assert texts(static, "#source-line .source-word") == ["der", "Hund", "läuft."]
    assert texts(static, "#target-line .target-word") == ["the", "dog", "runs.", "⟨eos⟩"]
    assert len(static.find_elements(By.CSS_SELECTOR, "#attention td.cell")) == 4 * 3
    assert cells(static) == DOG_LAST_LAYER


@pytest.mark.parametrize(("layer", "head"), [("1", "0"), ("1", "1"), ("0", "1")])
def test_a_head_shows_its_own_weights(static: Chrome, layer: str, head: str) -> None:
    choose(static, "layer", layer)
    choose(static, "head", head)
    assert cells(static) == as_rendered(DOG["layers"][int(layer)][int(head)])


def test_a_cell_is_titled_with_its_words_and_weight(static: Chrome) -> None:
    choose(static, "head", "0")  # layer 2, head 1
    assert cells(static, "title")[0] == ["the → der: 0.90", "the → Hund: 0.05", "the → läuft.: 0.05"]
    assert cells(static, "textContent")[1] == ["0.02", "0.96", "0.02"]


def test_all_layers_and_heads_show_their_mean(static: Chrome) -> None:
    choose(static, "layer", "all")
    assert cells(static) == DOG_ALL
    choose(static, "head", "1")  # layer 1 and 2's head 2: (0.50 + 0.60) / 2, (0.25 + 0.30) / 2, ...
    assert cells(static)[0] == ["0.550", "0.275", "0.175"]


def test_heavier_cells_are_darker_with_light_text(static: Chrome) -> None:
    def colours(row: int, column: int) -> tuple[float, str]:
        cell = static.find_elements(By.CSS_SELECTOR, f"#attention tr[data-index='{row}'] td.cell")[column]
        red, green, blue = map(int, re.findall(r"\d+", cell.value_of_css_property("background-color"))[:3])
        return 0.2126 * red + 0.7152 * green + 0.0722 * blue, cell.value_of_css_property("color")

    (heavy, heavy_text), (middle, _), (light, light_text) = colours(0, 0), colours(0, 1), colours(0, 2)
    assert heavy < middle < light  # 0.750, 0.175, 0.075
    assert (heavy_text, light_text) == ("rgba(255, 255, 255, 1)", "rgba(0, 0, 0, 1)")


def test_hovering_a_target_word_shades_the_source_words_by_its_row(static: Chrome) -> None:
    assert active(static) == []
    assert source_weights(static) == [None, None, None]
    hover(static, "#target-line .target-word[data-index='1']")  # dog
    assert active(static) == ["line 1", "row 1"]
    assert source_weights(static) == DOG_LAST_LAYER[1]
    hover(static, "#attention tr[data-index='2'] td.cell")  # a cell of runs.
    assert active(static) == ["line 2", "row 2"]
    assert source_weights(static) == DOG_LAST_LAYER[2]
    hover(static, "#attention th.target-word[data-index='3']")  # ⟨eos⟩
    assert source_weights(static) == DOG_LAST_LAYER[3]
    hover(static, "h1")
    assert active(static) == []
    assert source_weights(static) == [None, None, None]


def test_a_click_keeps_a_target_word_until_a_second_click(static: Chrome) -> None:
    word = static.find_element(By.CSS_SELECTOR, "#target-line .target-word[data-index='0']")
    word.click()
    hover(static, "h1")
    assert active(static) == ["line 0", "row 0"]
    assert word.get_attribute("aria-pressed") == "true"
    choose(static, "head", "1")  # the kept word follows the weights shown
    assert source_weights(static) == ["0.600", "0.300", "0.100"]
    word.click()
    hover(static, "h1")
    assert active(static) == []
    assert source_weights(static) == [None, None, None]


def test_another_sentence_shows_its_view_with_markup_as_text(static: Chrome) -> None:
    choose(static, "head", "0")
    choose(static, "sentence", "1")
    assert static.find_element(By.ID, "translation").text == "Tom&Jerry"
    assert texts(static, "#attention th.source-word") == MARKUP["source_words"]
    assert texts(static, "#source-line .source-word") == MARKUP["source_words"]
    assert texts(static, "#attention th.target-word") == ["Tom&Jerry", "⟨eos⟩"]
    assert static.find_elements(By.CSS_SELECTOR, "main b") == []
    assert len(static.find_elements(By.CSS_SELECTOR, "#attention td.cell")) == 2 * 3
    assert selected(static, "head") == "0"  # the choice stays
    assert cells(static) == as_rendered(MARKUP["layers"][1][0])


def test_the_served_page_translates_and_shows_a_real_runs_attention(driver: Chrome, corpus_run: CorpusRun,
                                                                    tmp_path: Path) -> None:  # fmt: skip
    translator = Translator(corpus_run.path)
    expected = attention_view(translator.attention(SAMPLES[0]))
    with serving(create_app(Service(translator, translator.langs), Limits())) as url:
        driver.get(f"{url}/")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda _: driver.find_element(By.ID, "title").text == "German → English")
        assert options(driver, "source") == [("auto", "Detect language"), ("de", "German")]
        assert options(driver, "target") == [("en", "English")]
        driver.find_element(By.ID, "text").send_keys(SAMPLES[0])
        driver.find_element(By.ID, "translate").click()
        wait.until(lambda _: driver.find_element(By.ID, "translation").text == corpus_run.translations[0])
        wait.until(lambda _: texts(driver, "#attention th.source-word") == expected["source_words"])
        assert texts(driver, "#attention th.target-word") == expected["target_words"]
        assert driver.execute_script("return window.fetched") == [
            "/frontend/settings", "/languages", "/translate", "/attention"
        ]  # fmt: skip
        choose(driver, "layer", "0")
        choose(driver, "head", "1")
        assert cells(driver) == as_rendered(expected["layers"][0][1])
        hover(driver, "#target-line .target-word[data-index='0']")
        assert source_weights(driver) == [f"{weight:.3f}" for weight in expected["layers"][0][1][0]]
        assert driver.find_element(By.ID, "error").is_displayed() is False
        assert driver.find_element(By.ID, "note").is_displayed() is False
        assert driver.find_element(By.ID, "detected").is_displayed() is False
        assert driver.save_screenshot(str(tmp_path / "page.png"))


def test_the_served_page_chooses_a_pair_of_a_multilingual_runs_languages(driver: Chrome, tmp_path: Path) -> None:
    """A run of many languages (a tiny NLLB-style checkpoint, imported): the selectors list its languages, the
    target's those of the source chosen, and the page translates and draws the pair chosen."""
    pytest.importorskip("transformers")
    import warnings

    from app.support import sentences
    from app.test_import_nllb import make_checkpoint
    from multihead.app.pretrained import import_pretrained

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)
        directory = make_checkpoint(tmp_path / "nllb")
    import_pretrained(str(directory), tmp_path / "run", langs=["de", "en"])
    translator = Translator(tmp_path / "run")
    text = sentences(1, seed=16)[0]
    chosen = translator.for_languages("fr", "zh-Hant")
    with serving(create_app(Service(translator, translator.langs or []), Limits())) as url:
        driver.get(f"{url}/")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda _: driver.find_element(By.ID, "title").text == "German → English")
        names = {"de": "German", "en": "English", "fr": "French", "zh": "Chinese", "zh-Hant": "Chinese (Traditional)"}
        assert options(driver, "source") == [("auto", "Detect language"), *names.items()]
        assert options(driver, "target") == [(code, name) for code, name in names.items() if code != "de"]
        choose(driver, "source", "fr")
        assert options(driver, "target") == [(code, name) for code, name in names.items() if code != "fr"]
        assert selected(driver, "target") == "en"  # the target chosen before, which French has too
        choose(driver, "target", "zh-Hant")
        assert driver.find_element(By.ID, "title").text == "French → Chinese (Traditional)"
        driver.find_element(By.ID, "text").send_keys(text)
        driver.find_element(By.ID, "translate").click()
        wait.until(lambda _: driver.find_element(By.ID, "translation").text == chosen.translate([text])[0])
        expected = attention_view(chosen.attention(text))
        wait.until(lambda _: texts(driver, "#attention th.target-word") == expected["target_words"])


def translate_on_the_page(driver: Chrome, text: str) -> None:
    """``text`` typed into the page's form, whatever was there before, and sent."""
    driver.execute_script("window.fetched = []")
    box = driver.find_element(By.ID, "text")
    box.clear()
    box.send_keys(text)
    driver.find_element(By.ID, "translate").click()


def test_the_served_page_detects_the_language(driver: Chrome, corpus_run: CorpusRun) -> None:
    """The source "Detect language" sends ``source: "auto"``, names the language found and draws the attention of
    the pair it was translated from; a text already in the target language is kept as it is, with a note instead."""
    translator = Translator(corpus_run.path)
    english = "A dog runs across a grassy field."
    identifier = LanguageIdentifier(["de", "en"])
    german, found_english = identifier.detect(SAMPLES[0])[0], identifier.detect(english)[0]
    assert (german.language, found_english.language) == ("de", "en")
    expected = attention_view(translator.attention(SAMPLES[0]))
    with serving(create_app(Service(translator, translator.langs), Limits())) as url:
        driver.get(f"{url}/")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda _: driver.find_element(By.ID, "title").text == "German → English")
        choose(driver, "source", "auto")
        assert options(driver, "target") == [("en", "English")]
        assert driver.find_element(By.ID, "title").text == "Detect language → English"
        translate_on_the_page(driver, SAMPLES[0])
        wait.until(lambda _: texts(driver, "#attention th.target-word") == expected["target_words"])
        assert driver.find_element(By.ID, "translation").text == corpus_run.translations[0]
        assert driver.find_element(By.ID, "detected").text == f"Detected: German ({round(german.confidence)}%)"
        assert driver.execute_script("return window.fetched") == ["/translate", "/attention"]
        assert texts(driver, "#attention th.source-word") == expected["source_words"]
        translate_on_the_page(driver, english)
        wait.until(lambda _: driver.find_element(By.ID, "note").is_displayed())
        assert driver.find_element(By.ID, "note").text == "The text is already in English: it is kept as it is."
        assert driver.find_element(By.ID, "translation").text == english
        assert driver.find_element(By.ID, "detected").text == f"Detected: English ({round(found_english.confidence)}%)"
        assert driver.execute_script("return window.fetched") == ["/translate"]
        assert not driver.find_element(By.ID, "view").is_displayed()
        assert not driver.find_element(By.ID, "error").is_displayed()


def test_the_served_page_sends_its_glossary_box_and_lists_the_terms_used(driver: Chrome, corpus_run: CorpusRun,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    """The glossary box's lines (``source = target``, or tab-separated as pasted from a table) go as the request's
    glossary: the translation is the one ``translate --glossary`` gives, and the entries the text holds are listed
    under it; a line that is neither is refused on the page, nothing sent."""
    file = write_lines(tmp_path / "g.tsv", ["de\ten", "Hund\tcat", "schnell\tslowly"])
    text = SAMPLES[1]  # holds Hund and schnell, not Katze
    expected = Translator(corpus_run.path, glossary=file).translate([text])[0]
    translator = Translator(corpus_run.path)
    with serving(create_app(Service(translator, translator.langs), Limits())) as url:
        driver.get(f"{url}/")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda _: driver.find_element(By.ID, "title").text == "German → English")
        box = driver.find_element(By.ID, "glossary")
        box.send_keys("Hund = cat\n\nKatze=mouse\n")
        driver.execute_script("arguments[0].value += 'schnell\\tslowly'", box)
        translate_on_the_page(driver, text)
        wait.until(lambda _: driver.find_element(By.ID, "view").is_displayed())
        assert driver.find_element(By.ID, "translation").text == expected
        assert driver.find_element(By.ID, "applied").text == (
            "Glossary terms used: Hund → cat, schnell → slowly. The attention below is of the model's translation "
            "without them."
        )
        assert driver.execute_script("return window.fetched") == ["/translate", "/attention"]
        box.clear()
        box.send_keys("Hund = cat\nHund cat")
        translate_on_the_page(driver, text)
        wait.until(lambda _: driver.find_element(By.ID, "error").is_displayed())
        assert driver.find_element(By.ID, "error").text == 'Glossary line 2 is not "source = target": "Hund cat"'
        assert driver.execute_script("return window.fetched") == []
        assert not driver.find_element(By.ID, "applied").is_displayed()


def test_the_served_page_translates_a_pivot_pair_with_a_note_for_its_attention(driver: Chrome,
                                                                               tmp_path: Path) -> None:  # fmt: skip
    """Two runs, de → en and en → sv: German into Swedish goes through English, two models in turn, so the page shows
    the translation and a note (no error, no attention); German into English draws its one model's attention."""
    pytest.importorskip("transformers")
    import warnings

    from app.support import sentences
    from app.test_import import make_checkpoint
    from multihead.app.pretrained import import_pretrained

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)
        made = make_checkpoint(tmp_path / "checkpoints" / "opus-mt-de-en", shared=True)
        import_pretrained(str(made), tmp_path / "runs" / "de-en")
        import_pretrained(str(made), tmp_path / "runs" / "en-sv", langs=["en", "sv"])
    first, second = Translator(tmp_path / "runs" / "de-en"), Translator(tmp_path / "runs" / "en-sv")
    text = sentences(1, seed=17)[0]
    service = Service(first, first.langs or [], more=[(second, second.langs or [])])
    with serving(create_app(service, Limits())) as url:
        driver.get(f"{url}/")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda _: driver.find_element(By.ID, "title").text == "German → English")
        assert options(driver, "target") == [("en", "English"), ("sv", "Swedish")]
        choose(driver, "target", "sv")
        translate_on_the_page(driver, text)
        wait.until(lambda _: driver.find_element(By.ID, "note").is_displayed())
        assert driver.find_element(By.ID, "translation").text == second.translate(first.translate([text]))[0]
        assert driver.find_element(By.ID, "note").text == (
            "German → Swedish is translated by two models in turn (de-en, then en-sv): no one model's attention to "
            "show."
        )
        assert driver.execute_script("return window.fetched") == ["/translate"]
        assert not driver.find_element(By.ID, "error").is_displayed()
        assert not driver.find_element(By.ID, "view").is_displayed()
        choose(driver, "target", "en")
        translate_on_the_page(driver, text)
        expected = attention_view(first.attention(text))
        wait.until(lambda _: texts(driver, "#attention th.target-word") == expected["target_words"])
        assert driver.find_element(By.ID, "translation").text == first.translate([text])[0]
        assert not driver.find_element(By.ID, "note").is_displayed()


def test_the_served_page_translates_a_file_into_a_download_link(driver: Chrome, corpus_run: CorpusRun,
                                                                tmp_path: Path) -> None:  # fmt: skip
    """The "Files" tab takes a document of the formats the settings list: the page posts it to ``/translate_file``,
    says it is translating, then links the translation, named as the file uploaded, which downloads the document
    ``translate --input --output`` writes (its tags kept); a format the server does not take shows its error."""
    import urllib.request

    from app.test_documents import PAGE
    from multihead.app.documents import document_format, translate_document

    translator = Translator(corpus_run.path)
    source = tmp_path / "seite.html"
    source.write_text(PAGE, encoding="utf-8")
    html = document_format(source)
    assert html is not None
    translate_document(source, tmp_path / "cli.html", html, translator.translate)
    (tmp_path / "notes.bin").write_bytes(b"\x00\x01 binary")
    with serving(create_app(Service(translator, translator.langs), Limits())) as url:
        driver.get(f"{url}/")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda _: driver.find_element(By.ID, "file-tab").is_displayed())
        assert not driver.find_element(By.ID, "file").is_displayed()
        tab = driver.find_element(By.ID, "file-tab")
        tab.click()
        assert tab.get_attribute("aria-selected") == "true"
        assert not driver.find_element(By.ID, "text").is_displayed()
        assert not driver.find_element(By.ID, "glossary").is_displayed()
        upload = driver.find_element(By.ID, "file")
        assert {".txt", ".html", ".docx", ".srt"} <= set((upload.get_attribute("accept") or "").split(","))
        assert driver.find_element(By.CSS_SELECTOR, "label[for='file']").text == "Document"
        driver.execute_script(RECORD_PROGRESS)
        upload.send_keys(str(source))
        driver.find_element(By.ID, "translate").click()
        link = wait.until(lambda _: (found := driver.find_element(By.ID, "download")).is_displayed() and found)
        assert (link.text, link.get_attribute("download")) == ("seite.html", "seite.html")
        assert driver.find_element(By.ID, "file-result").text == "Translated: seite.html"
        assert driver.execute_script("return window.fetched") == ["/translate_file"]
        assert driver.execute_script("return window.progress") == ["Translating seite.html…", "Translated: "]
        href = link.get_attribute("href") or ""
        assert href.startswith(f"{url}/download_file/"), href
        assert href.endswith("-seite.html"), href
        with urllib.request.urlopen(href, timeout=30) as response:
            translated = response.read().decode("utf-8")
        assert translated == (tmp_path / "cli.html").read_text(encoding="utf-8")
        assert translated.count("<li>") == 2
        assert '<p translate="no">Der Hund</p><!-- Der Hund -->' in translated
        assert "Die Katze läuft" not in translated
        assert not driver.find_element(By.ID, "error").is_displayed()
        upload.clear()
        upload.send_keys(str(tmp_path / "notes.bin"))
        driver.find_element(By.ID, "translate").click()
        wait.until(lambda _: driver.find_element(By.ID, "error").is_displayed())
        error = driver.find_element(By.ID, "error").text
        assert error.startswith("Invalid request: file format not supported ('notes.bin'; one of .txt"), error
        assert not driver.find_element(By.ID, "file-result").is_displayed()
        tab.send_keys(Keys.ARROW_LEFT)  # the arrow keys move between the tabs
        assert driver.switch_to.active_element.get_attribute("id") == "text-tab"
        assert driver.find_element(By.ID, "text").is_displayed()
        assert not driver.find_element(By.ID, "file").is_displayed()
        assert not driver.find_element(By.ID, "error").is_displayed()
