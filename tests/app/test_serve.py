"""``multihead serve``: LibreTranslate's API through its own client package and raw HTTP, every refusal by status
and body, answers equal to ``multihead translate``, concurrent requests, SIGTERM under load, the attention page's
data and ``translate --html``. Servers listen on 127.0.0.1 on a free port; every load is bounded."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from libretranslatepy import LibreTranslateAPI

from app.served import request, serving, start
from app.support import SAMPLES, Cli, CorpusRun, assert_refused, beam
from multihead.app.languages import from_file_names
from multihead.app.markup import translate_html
from multihead.app.serve import Limits, Service, command, create_app, limits, worker
from multihead.app.serve.jobs import Attend
from multihead.app.serve.routing import Leg
from multihead.app.translate import Translator
from multihead.app.view import attention_view


@pytest.fixture(scope="module")
def translator(corpus_run: CorpusRun) -> Translator:
    return Translator(corpus_run.path)


@pytest.fixture(scope="module")
def url(translator: Translator) -> Iterator[str]:
    """The corpus run (German to English, from its file names) served with no limits."""
    with serving(create_app(Service(translator, translator.langs), Limits())) as found:
        yield found


def test_the_run_knows_its_languages_from_its_file_names(translator: Translator) -> None:
    assert translator.langs == ["de", "en"]


def test_libretranslates_own_client_translates_lists_and_detects(url: str, corpus_run: CorpusRun) -> None:
    client = LibreTranslateAPI(url)
    assert [client.translate(text, "de", "en") for text in SAMPLES] == corpus_run.translations
    assert client.languages() == [
        {"code": "de", "name": "German", "targets": ["en"]},
        {"code": "en", "name": "English", "targets": []},
    ]
    [found] = client.detect(SAMPLES[0])
    assert found["language"] == "de"
    assert 50 < found["confidence"] <= 100


def test_answers_equal_multihead_translate(url: str, corpus_run: CorpusRun, cli: Callable[..., Cli]) -> None:
    from_cli = cli("translate", corpus_run.path, *SAMPLES)
    assert from_cli.status == 0
    status, answer = request(url, "/translate", {"q": SAMPLES, "source": "de", "target": "en"})
    assert status == 200
    assert answer == {"translatedText": from_cli.out_lines}
    status, answer = request(url, "/translate", {"q": SAMPLES[0], "source": "auto", "target": "en"})
    assert answer["translatedText"] == from_cli.out_lines[0]
    assert answer["detectedLanguage"]["language"] == "de"
    assert 50 < answer["detectedLanguage"]["confidence"] <= 100


def test_detection_names_the_language_among_the_runs_or_none(url: str, corpus_run: CorpusRun) -> None:
    """``/detect`` and ``source: "auto"`` identify the text's language among the run's: English sent to a German to
    English run is English (and kept as it is), Japanese is neither (the source at confidence 0)."""
    english, japanese = "A dog runs across a grassy field.", "今日は時間がありません。"
    status, [found] = request(url, "/detect", {"q": english})
    assert (status, found["language"]) == (200, "en")
    assert 50 < found["confidence"] <= 100
    assert request(url, "/detect", {"q": japanese}) == (200, [{"confidence": 0.0, "language": "de"}])
    status, each = request(url, "/detect", {"q": [english, japanese]})  # a list: each text's candidates
    assert (status, [candidates[0]["language"] for candidates in each]) == (200, ["en", "de"])
    assert each[1] == [{"confidence": 0.0, "language": "de"}]
    status, answer = request(url, "/translate", {"q": [english, SAMPLES[1]], "source": "auto", "target": "en"})
    assert (status, answer["translatedText"]) == (200, [english, corpus_run.translations[1]])
    assert [found["language"] for found in answer["detectedLanguage"]] == ["en", "de"]


def test_lines_blank_texts_and_html(url: str, corpus_run: CorpusRun, translator: Translator) -> None:
    one, two = corpus_run.translations[:2]
    status, answer = request(url, "/translate", {"q": f"{SAMPLES[0]}\n\n{SAMPLES[1]}", "source": "de", "target": "en"})
    assert (status, answer) == (200, {"translatedText": f"{one}\n\n{two}"})
    status, answer = request(url, "/translate", {"q": [" ", "\n"], "source": "de", "target": "en"})
    assert (status, answer) == (200, {"translatedText": [" ", "\n"]})
    page = f'<p class="x">{SAMPLES[0]}</p>\n<script>keep();</script><!-- a <b>note</b> --><b> {SAMPLES[1]} </b>'
    status, answer = request(url, "/translate", {"q": page, "source": "de", "target": "en", "format": "html"})
    assert status == 200
    expected = f'<p class="x">{one}</p>\n<script>keep();</script><!-- a <b>note</b> --><b> {two} </b>'
    assert answer == {"translatedText": expected.replace("&", "&amp;")}
    # A line break inside an element is a space; a node without a letter is kept; "auto" reads the text, not tags.
    broken = f"<p>{SAMPLES[0].replace(' ', chr(10), 1)}</p><p><b>{SAMPLES[1]}</b>.</p>"
    status, answer = request(url, "/translate", {"q": broken, "source": "auto", "target": "en", "format": "html"})
    assert status == 200
    assert answer["translatedText"] == f"<p>{one}</p><p><b>{two}</b>.</p>".replace("&", "&amp;")
    assert answer["detectedLanguage"]["language"] == "de"
    # A sentence split by inline tags: as the markup module translates it with translate's translations.
    words = SAMPLES[2].split()
    inline = f'<p>{words[0]} <b class="y">{words[1]}</b> {" ".join(words[2:])}</p>'

    async def translate(texts: list[str]) -> list[str]:
        return translator.translate(texts)

    status, answer = request(url, "/translate", {"q": inline, "source": "de", "target": "en", "format": "html"})
    assert (status, answer["translatedText"]) == (200, asyncio.run(translate_html(inline, translate)))
    english = "<p>The weather is very nice today and the children are playing in the garden.</p>"
    status, answer = request(url, "/translate", {"q": english, "source": "auto", "target": "en", "format": "html"})
    assert (status, answer["translatedText"], answer["detectedLanguage"]["language"]) == (200, english, "en")


def test_html_keeps_code_and_untranslated_elements_byte_for_byte(url: str, translator: Translator) -> None:
    words = SAMPLES[2].split()
    kept = f'<pre>{SAMPLES[0]}</pre><p translate="no">{SAMPLES[1]}</p>'
    page = f"<p>{words[0]} <b><i>{words[1]}</i></b> <code>a &lt; b</code> {' '.join(words[2:])}</p>{kept}"

    async def translate(texts: list[str]) -> list[str]:
        return translator.translate(texts)

    status, answer = request(url, "/translate", {"q": page, "source": "de", "target": "en", "format": "html"})
    assert (status, answer["translatedText"]) == (200, asyncio.run(translate_html(page, translate)))
    assert answer["translatedText"].endswith(kept)
    assert [answer["translatedText"].count(tag) for tag in ("<b>", "<i>", "<code>a &lt; b</code>")] == [1, 1, 1]


def test_alternatives_are_the_beams_next_best(url: str, translator: Translator) -> None:
    best = translator.hypotheses(SAMPLES[:2], beam(3, n_best=3))  # as serve widens greedy's
    status, answer = request(url, "/translate", {"q": SAMPLES[0], "source": "de", "target": "en", "alternatives": 2})
    assert status == 200
    assert answer == {"translatedText": best[0][0], "alternatives": [t for t in best[0][1:] if t != best[0][0]]}
    assert len(set(best[0])) == 3  # distinct, so both alternatives are there
    status, answer = request(url, "/translate", {"q": SAMPLES[:2], "source": "de", "target": "en", "alternatives": 2})
    assert answer == {"translatedText": [b[0] for b in best], "alternatives": [b[1:] for b in best]}
    # A text of lines: line by line (each line's beam search a job of its own), the i-th best of each joined.
    status, answer = request(url, "/translate", {"q": "\n".join(SAMPLES[:2]), "source": "de", "target": "en",
                                                 "alternatives": 2})  # fmt: skip
    assert answer == {"translatedText": "\n".join(b[0] for b in best),
                      "alternatives": ["\n".join(b[i] for b in best) for i in (1, 2)]}  # fmt: skip
    assert request(url, "/translate", {"q": "a", "source": "de", "target": "en", "alternatives": 5}) == (
        400, {"error": "Invalid request: alternatives parameter must be <= 4"})  # fmt: skip


def test_a_form_as_libretranslates_clients_send_it(url: str, corpus_run: CorpusRun) -> None:
    body = f"q={SAMPLES[0].replace(' ', '+')}&source=de&target=en".encode()
    status, answer = request(url, "/translate", body, kind="application/x-www-form-urlencoded")
    assert (status, answer) == (200, {"translatedText": corpus_run.translations[0]})
    status, answer = request(url, "/translate", body + b"&alternatives=0", kind="application/x-www-form-urlencoded")
    assert (status, answer) == (200, {"translatedText": corpus_run.translations[0]})  # a form's number is a string


def test_the_query_strings_parameters_count_under_the_bodys(url: str, corpus_run: CorpusRun) -> None:
    """As LibreTranslate reads ``request.values``: ``POST /translate?q=...&source=de&target=en`` translates; a
    parameter in both the query string and the body is the body's."""
    query = f"q={quote(SAMPLES[0])}&source=de&target=en"
    assert request(url, f"/translate?{query}", method="POST") == (200, {"translatedText": corpus_run.translations[0]})
    assert request(url, f"/translate?{query}&q=x", {"q": SAMPLES[1]}) == (
        200, {"translatedText": corpus_run.translations[1]})  # fmt: skip
    assert request(url, "/translate?source=fr", {"q": "a", "source": "de"}) == (
        400, {"error": "Invalid request: missing target parameter"})  # fmt: skip
    status, [found] = request(url, f"/detect?q={quote(SAMPLES[0])}", method="POST")
    assert (status, found["language"]) == (200, "de")


BAD = [
    (b"{not json", 400, "Invalid JSON format"),
    (b"[1, 2]", 400, "Invalid JSON format"),
    ({"source": "de", "target": "en"}, 400, "Invalid request: missing q parameter"),
    ({"q": "", "source": "de", "target": "en"}, 400, "Invalid request: missing q parameter"),
    ({"q": 7, "source": "de", "target": "en"}, 400,
     "Invalid request: q parameter must be a string or a list of strings"),
    ({"q": ["a", 1], "source": "de", "target": "en"}, 400,
     "Invalid request: q parameter must be a string or a list of strings"),
    ({"q": "a", "target": "en"}, 400, "Invalid request: missing source parameter"),
    ({"q": "a", "source": "de"}, 400, "Invalid request: missing target parameter"),
    ({"q": "a", "source": 3, "target": "en"}, 400, "Invalid request: source parameter must be a string"),
    ({"q": "a", "source": "fr", "target": "en"}, 400, "fr is not supported"),
    ({"q": "a", "source": "en", "target": "de"}, 400,
     "German (de) is not available as a target language from English (en)"),
    ({"q": "a", "source": "de", "target": "en", "format": "xml"}, 400, "xml format is not supported"),
    ({"q": "a", "source": "de", "target": "en", "alternatives": "x"}, 400,
     "Invalid request: alternatives parameter is not a number"),
    ({"q": "a", "source": "de", "target": "en", "alternatives": -1}, 400,
     "Invalid request: alternatives parameter must be >= 0"),
    ({"q": "a", "source": "de", "target": "en", "alternatives": True}, 400,
     "Invalid request: alternatives parameter is not a number"),
    ({"q": "a", "source": "de", "target": "en", "alternatives": 1.5}, 400,
     "Invalid request: alternatives parameter is not a number"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "error"), BAD)
def test_a_bad_request_is_refused_as_libretranslate_refuses_it(url: str, body: Any, status: int, error: str) -> None:
    assert request(url, "/translate", body) == (status, {"error": error})


def test_a_browsers_icon_request_is_answered_without_an_error(url: str) -> None:
    assert request(url, "/favicon.ico") == (204, "")


def test_unknown_paths_methods_and_huge_bodies_are_json_errors(url: str) -> None:
    assert request(url, "/nowhere") == (404, {"error": "Not Found"})
    assert request(url, "/translate", method="GET") == (405, {"error": "Method Not Allowed"})
    status, answer = request(url, "/translate", b'{"q": "' + b"a" * (1 << 20) + b'"}')
    assert status == 413
    assert answer["error"].startswith("Request body too large")


def test_a_long_text_of_unknown_characters_is_translated_not_refused(url: str) -> None:
    status, answer = request(url, "/translate", {"q": "漢" * 100_000, "source": "de", "target": "en"})
    assert status == 200
    assert isinstance(answer["translatedText"], str)


def test_limits_and_keys(translator: Translator, tmp_path: Path, corpus_run: CorpusRun) -> None:
    limits = Limits(char_limit=40, batch_limit=2, req_limit=8, api_keys=frozenset({"sesame"}))
    service = Service(translator, ["de", "en"])
    with serving(create_app(service, limits)) as url:
        good = {"q": SAMPLES[0], "source": "de", "target": "en"}
        assert request(url, "/translate", good) == (400, {"error": "Please contact the server operator to get an "
                                                                   "API key"})  # fmt: skip
        assert request(url, "/translate", {**good, "api_key": "guess"}) == (403, {"error": "Invalid API key"})
        assert request(url, "/translate", {**good, "api_key": "sesame"}) == (
            200, {"translatedText": corpus_run.translations[0]})  # fmt: skip
        assert LibreTranslateAPI(url, api_key="sesame").translate(SAMPLES[1], "de", "en") == corpus_run.translations[1]
        assert request(url, "/translate", {**good, "q": "x" * 41, "api_key": "sesame"}) == (
            400, {"error": "Invalid request: request (41) exceeds text limit (40)"})  # fmt: skip
        assert request(url, "/translate", {**good, "q": ["a", "b", "c"], "api_key": "sesame"}) == (
            400, {"error": "Invalid request: request (3) exceeds text limit (2)"})  # fmt: skip
        statuses = [request(url, "/translate", {**good, "api_key": "sesame"})[0] for _ in range(5)]
        assert statuses == [200, 200, 200, 200, 429]  # 4 of the 8 a minute were taken above (not those without a key)
        assert request(url, "/translate", {**good, "api_key": "sesame"}) == (429, {"error": "Slowdown: 8 per 1 minute"})
        assert request(url, "/health") == (200, {"status": "ok"})  # not limited
        settings = request(url, "/frontend/settings")[1]
        assert (settings["charLimit"], settings["apiKeys"], settings["language"]["source"]["code"]) == (40, True, "de")


def test_the_rate_limit_counts_a_minute_per_address_and_forgets_quiet_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(limits.time, "monotonic", lambda: now[0])
    limiter = limits.RateLimiter(2)
    limiter.check("a")
    limiter.check("a")
    limiter.check("b")
    with pytest.raises(limits.ApiError, match="Slowdown: 2 per 1 minute"):
        limiter.check("a")
    now[0] += 60.5
    limiter.check("a")  # a minute later
    for address in range(limits.ADDRESSES):
        limiter.check(str(address))
    assert set(limiter.seen) == {"a", *map(str, range(limits.ADDRESSES))}  # "b" was quiet for a minute


def test_concurrent_requests_each_get_their_own_answers(url: str, translator: Translator) -> None:
    texts = [SAMPLES[i % len(SAMPLES)] for i in range(48)]
    expected = dict(zip(SAMPLES, translator.translate(SAMPLES), strict=True))

    def ask(text: str) -> tuple[str, Any]:
        return text, request(url, "/translate", {"q": [text, text], "source": "de", "target": "en"})

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, texts, timeout=120))
    assert all(answer == (200, {"translatedText": [expected[text]] * 2}) for text, answer in answers)


def test_the_page_and_its_attention(url: str, translator: Translator) -> None:
    status, page = request(url, "/")
    assert status == 200
    assert '<script id="views" type="application/json">[]</script>' in page
    status, view = request(url, "/attention", {"q": f"\n{SAMPLES[0]}\nsomething else"})
    assert status == 200
    assert view == json.loads(json.dumps(attention_view(translator.attention(SAMPLES[0]))))
    assert request(url, "/attention", {"q": " \n "}) == (400, {"error": "Invalid request: q holds no text"})


def test_a_client_that_leaves_mid_request_harms_nothing(url: str, corpus_run: CorpusRun) -> None:
    host, port = url.removeprefix("http://").split(":")
    for body in (b'{"q": "der Hu', b""):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 400\r\n\r\n" + body)  # fmt: skip
    client = LibreTranslateAPI(url)
    assert client.translate(SAMPLES[0], "de", "en") == corpus_run.translations[0]


def test_translate_html_writes_a_standalone_page(corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli],
                                                 translator: Translator) -> None:  # fmt: skip
    (tmp_path / "in.txt").write_text(f"{SAMPLES[0]}\n\n{SAMPLES[1]}\n", encoding="utf-8")  # a blank line: no view
    result = cli("translate", corpus_run.path, "--input", tmp_path / "in.txt", "--html", tmp_path / "view.html")
    assert result.status == 0, result.err
    html = (tmp_path / "view.html").read_text(encoding="utf-8")
    views = json.loads(re.search(r'<script id="views" type="application/json">(.*?)</script>', html, re.S)[1])
    assert views == json.loads(json.dumps([attention_view(translator.attention(text)) for text in SAMPLES[:2]]))
    assert "http://" not in html
    assert "https://" not in html


# --- one heavy client ------------------------------------------------------------------------------------------

HEAVY = "\n".join(SAMPLES[i % len(SAMPLES)] for i in range(8000))
"""A text of 8,000 lines: far more sentences than the worker translates at once."""


def send_heavy(url: str, text: str = HEAVY) -> socket.socket:
    """``text`` posted for translation on a socket of its own, whose answer is never read."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"q": text, "source": "de", "target": "en"}).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    return sock


def until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Stepped:
    """A :class:`Service` whose worker, after each step of its engines, records how many pieces they still hold
    (``left``: ``None`` before the first step), each step first slowed by ``delay`` seconds. The engines are the
    worker's own: read from another thread, they may be caught in the middle of a step."""

    def __init__(self, service: Service, monkeypatch: pytest.MonkeyPatch, delay: float = 0.0) -> None:
        self.service, self.delay = service, delay
        self.left: int | None = None
        engines = service.engines
        step = engines.step

        def stepped() -> None:
            time.sleep(self.delay)
            step()
            self.left = len(engines)

        monkeypatch.setattr(engines, "step", stepped)


class Counted(Stepped):
    """A :class:`Stepped` service whose worker also counts the pieces it has translated."""

    def __init__(self, translator: Translator, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(Service(translator, ["de", "en"]), monkeypatch)
        self.engine = self.service.engines.runs[0].engine
        self.translated = 0
        ended = self.engine.requests.ended

        def counted(*args: Any) -> None:
            self.translated += 1
            ended(*args)

        monkeypatch.setattr(self.engine.requests, "ended", counted)


def test_a_short_request_shares_the_batch_with_a_large_one_and_a_client_that_leaves_is_dropped(
    translator: Translator, corpus_run: CorpusRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short request sent while a large text is being translated is answered while that text is still being
    translated (not after it); once the large text's client disconnects, its work is dropped at the next step."""
    counted = Counted(translator, monkeypatch)
    with serving(create_app(counted.service, Limits())) as url:
        heavy = send_heavy(url)
        assert until(lambda: counted.translated > 0, 60)  # the text is being translated
        assert request(url, "/translate", {"q": SAMPLES[1], "source": "de", "target": "en"}) == (
            200, {"translatedText": corpus_run.translations[1]})  # fmt: skip
        assert counted.engine.requests.live  # the large text was still being translated (read between steps or not)
        heavy.close()
        assert until(lambda: counted.engine.requests.live == [] and counted.left == 0, 30)
        assert counted.translated < 8000  # it was dropped, not finished
        assert request(url, "/translate", {"q": SAMPLES[0], "source": "de", "target": "en"}) == (
            200, {"translatedText": corpus_run.translations[0]})  # fmt: skip


@pytest.mark.parametrize("size", [1, 3], ids=["greedy", "beam"])
def test_a_request_over_the_time_limit_is_answered_503_and_its_work_dropped(
    translator: Translator, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    service = Service(translator, ["de", "en"], search=beam(size))
    stepped = Stepped(service, monkeypatch, delay=0.05)  # the large text takes > 1.5 s
    with serving(create_app(service, Limits(timeout=0.5))) as url:
        start = time.monotonic()
        status, answer = request(url, "/translate", {"q": HEAVY, "source": "de", "target": "en"})
        assert time.monotonic() - start < 10
        assert (status, answer) == (503, {"error": "Translation took longer than this server allows (0.5 seconds): "
                                                   "try shorter texts"})  # fmt: skip
        assert until(lambda: stepped.left == 0 and service.worker.busy_since is None, 30)  # dropped
        # Steps at their own speed again: slowed, a sentence's steps (beam search's most) would race the limit too.
        stepped.delay = 0.0
        status, answer = request(url, "/translate", {"q": SAMPLES[0], "source": "de", "target": "en"})
        assert status == 200


def test_health_reports_a_stalled_worker(translator: Translator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "STALLED_AFTER", 0.2)
    service = Service(translator, ["de", "en"])
    release = threading.Event()
    monkeypatch.setattr(translator, "attention", lambda *args, **kwargs: release.wait(30))  # a job that hangs
    with serving(create_app(service, Limits())) as url:
        assert request(url, "/health") == (200, {"status": "ok"})
        service.worker.submit(Attend(Leg(0, ("de", "en")), SAMPLES[0]))
        time.sleep(0.5)
        status, answer = request(url, "/health")
        release.set()
        assert status == 503
        assert answer["status"] == "stalled"
        assert re.fullmatch(r"the translation worker has been on one step for \d+ seconds", answer["error"])
        assert until(lambda: request(url, "/health") == (200, {"status": "ok"}), 10)


def test_a_built_in_task_is_served_as_its_own_languages(short_run: Path) -> None:
    process, url, line = start(short_run)
    try:
        assert "reverse → reverse-out" in line
        assert request(url, "/languages")[1] == [
            {"code": "reverse", "name": "reverse", "targets": ["reverse-out"]},
            {"code": "reverse-out", "name": "reverse-out", "targets": []},
        ]
        status, answer = request(url, "/translate", {"q": "abc", "source": "reverse", "target": "reverse-out"})
        assert status == 200
        assert isinstance(answer["translatedText"], str)
    finally:
        process.terminate()
        process.wait(timeout=60)


# --- the command ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_answers_under_load_and_sigterm_answers_every_accepted_request(corpus_run: CorpusRun, sig: int) -> None:
    process, url, line = start(corpus_run.path)
    assert "de → en (German to English)" in line
    try:
        expected = dict(zip(SAMPLES, corpus_run.translations, strict=True))
        stop = time.monotonic() + 20

        def client(index: int) -> list[str]:
            outcomes = []
            while time.monotonic() < stop:
                text = SAMPLES[(index + len(outcomes)) % len(SAMPLES)]
                try:
                    status, answer = request(url, "/translate", {"q": text, "source": "de", "target": "en"})
                # After SIGTERM the server takes no new connection; one still waiting in the listening socket's
                # queue, never read, is reset without an answer, or closed before the request is written (a broken
                # pipe): none was a request it accepted.
                except (ConnectionRefusedError, ConnectionResetError, BrokenPipeError):
                    outcomes.append("refused")
                    break
                outcomes.append("right" if (status, answer) == (200, {"translatedText": expected[text]}) else "wrong")
            return outcomes

        with ThreadPoolExecutor(8) as pool:
            running = [pool.submit(client, index) for index in range(8)]
            time.sleep(2)
            process.send_signal(sig)
            outcomes = [outcome for future in running for outcome in future.result(timeout=60)]
        assert process.wait(timeout=60) == 0
        err = process.stderr.read()
    finally:
        process.kill()
    assert "wrong" not in outcomes
    assert outcomes.count("right") >= 8
    assert "Traceback" not in err
    assert err.rstrip().endswith("stopped")


class Unlabelled(Translator):
    """A run that records no languages."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.direction = replace(self.direction, langs=None)


def test_sigterm_does_not_wait_for_work_nobody_waits_for(corpus_run: CorpusRun) -> None:
    """A large text whose client has left is dropped, not drained: SIGTERM stops the server at once."""
    process, url, _ = start(corpus_run.path)
    try:
        heavy = send_heavy(url)
        time.sleep(1)
        heavy.close()
        status, answer = request(url, "/translate", {"q": SAMPLES[0], "source": "de", "target": "en"})
        assert (status, answer) == (200, {"translatedText": corpus_run.translations[0]})
        heavy = send_heavy(url)  # and one that leaves as the server is told to stop
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        heavy.close()
        assert process.wait(timeout=15) == 0
    finally:
        process.kill()


def test_a_second_sigterm_stops_at_once_and_quietly(corpus_run: CorpusRun) -> None:
    """The first SIGTERM waits for a request in flight (its body half sent, for up to 30 s); a second, once the server
    has stopped listening, stops it at once, with no traceback."""
    process, url, _ = start(corpus_run.path)
    host, port = url.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 400\r\n\r\n{\"q\": ")  # fmt: skip
            time.sleep(0.5)
            process.send_signal(signal.SIGTERM)

            def refused() -> bool:
                try:
                    socket.create_connection((host, int(port)), timeout=1).close()
                except ConnectionRefusedError:
                    return True
                return False

            assert until(refused, 10)  # draining
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=10) == 0
            assert time.monotonic() - started < 5
        err = process.stderr.read()
    finally:
        process.kill()
    assert "Traceback" not in err
    assert "ERROR" not in err
    assert err.rstrip().endswith("stopped")


def test_serve_refuses_what_it_cannot_do_in_one_line(corpus_run: CorpusRun, tmp_path: Path,
                                                        cli: Callable[..., Cli]) -> None:  # fmt: skip
    with pytest.MonkeyPatch.context() as patched:  # a corpus run whose files' names gave no languages
        patched.setattr(command, "Translator", Unlabelled)
        assert_refused(cli("serve", corpus_run.path, "--port", "0"), "does not record its languages", "--langs SRC")
    assert_refused(cli("serve", corpus_run.path, "--timeout", "0"), "--timeout", "-1 (no limit) or a number")
    assert_refused(cli("serve", corpus_run.path, "--api-keys", tmp_path / "none"), "--api-keys", "cannot read")
    (tmp_path / "keys").write_text("# no keys yet\n\n")
    assert_refused(cli("serve", corpus_run.path, "--api-keys", tmp_path / "keys"), "holds no key")
    assert_refused(cli("serve", corpus_run.path, "--langs", "german", "en"), "--langs", "ISO 639-1")
    assert_refused(cli("serve", corpus_run.path, "--langs", "xx", "yy"), "--langs", "'xx', which names no language")
    assert_refused(cli("serve", corpus_run.path, "--char-limit", "-2"), "--char-limit", "-1 (no limit)")
    assert_refused(cli("serve", corpus_run.path, "--port", "70000"), "--port", "0 (a free one) to 65535")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_refused(cli("serve", corpus_run.path, "--port", port), f"--port {port}", "in use")


# --- the run's languages ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("paths", "found"),
    [
        (["c/train.de.gz", "c/train.en.gz"], ["de", "en"]),
        (["train.zh", "train.en"], ["zh", "en"]),
        (["a.de.gz", "b.en.gz"], None),  # not one corpus's two sides
        (["train.de", "train.de"], None),
        (["train.de.gz", "train.en"], None),
        (["pairs.tsv"], None),
        (["src.txt", "tgt.txt"], None),
    ],
)
def test_languages_are_read_from_the_corpus_file_names(paths: list[str], found: list[str] | None) -> None:
    assert from_file_names(paths) == found


def test_langs_are_given_as_two_codes_for_a_corpus(cli: Callable[..., Cli], tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert_refused(cli("train", "--task", "dates", "--langs", "de", "en", "--out", out, "--steps", "1"),
                   "--langs goes with --data")  # fmt: skip
    assert_refused(cli("train", "--data", "a.txt", "b.txt", "--langs", "German", "en", "--out", out, "--steps", "1"),
                   "--langs", "'German'")  # fmt: skip
    assert not out.exists()
