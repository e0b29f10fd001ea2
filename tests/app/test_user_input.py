"""What users send ``serve`` and the command line: paragraphs translated sentence by sentence, the guard's doubts
answered in a field of their own, and malformed input (lone surrogates, bytes that are not UTF-8, wrong types)
refused in one line or a 400, never a 500, after which the server is idle and stops on SIGTERM. The run is an
imported tiny Marian (SentencePiece, whose tokenizer is what failed on a lone surrogate)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.served import request, serving, start
from app.support import Cli, subprocess_env
from multihead.app.pretrained import import_pretrained
from multihead.app.serve import Limits, Service, create_app
from multihead.app.translate import TRANSLATION, Translator

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

PARAGRAPH = ["Der Hund läuft schnell.", "Der Mann spielt heute!", "Das Kind isst die Qualle gern."]


@pytest.fixture(scope="module")
def run(marian_de_en: Any) -> Path:
    return marian_de_en.run


@pytest.fixture(scope="module")
def translator(run: Path) -> Translator:
    return Translator(run)


@pytest.fixture(scope="module")
def url(translator: Translator) -> Iterator[str]:
    with serving(create_app(Service(translator, ["de", "en"]), Limits())) as found:
        yield found


def test_a_paragraph_is_answered_as_translate_answers_it(url: str, translator: Translator) -> None:
    """Sentence by sentence, lines kept; ``"split": false`` (JSON or a form's ``false``) translates it whole."""
    text = " ".join(PARAGRAPH) + "\n\n" + PARAGRAPH[1]
    expected = [translator.translate([line])[0] for line in text.split("\n")]
    assert expected[0] == " ".join(translator.translate(PARAGRAPH))
    answer = request(url, "/translate", {"q": [text], "source": "de", "target": "en"})
    assert answer == (200, {"translatedText": ["\n".join(expected)]})
    whole = translator.splitting(False).translate([" ".join(PARAGRAPH)])[0]
    assert whole != expected[0]
    answer = request(url, "/translate", {"q": " ".join(PARAGRAPH), "source": "de", "target": "en", "split": False})
    assert answer == (200, {"translatedText": whole})
    form = f"q={' '.join(PARAGRAPH)}&source=de&target=en&split=false".encode()
    assert request(url, "/translate", form, kind="application/x-www-form-urlencoded") == (
        200,
        {"translatedText": whole},
    )
    assert request(url, "/translate", {"q": "a", "source": "de", "target": "en", "split": "maybe"}) == (
        400, {"error": "Invalid request: split parameter must be true or false, received 'maybe'"})  # fmt: skip


def test_the_guards_doubts_are_answered_in_their_own_field(run: Path, tmp_path: Path) -> None:
    """A model that drops every sentence (planted): each sentence long enough to judge is named in ``doubtful``,
    per text for a list; a text without doubts has an empty list, an answer without any has no field."""
    from app.test_segment import with_planted_drop

    dropping = Translator(with_planted_drop(run, tmp_path / "dropping"))
    judged = [sentence for sentence in PARAGRAPH if len(dropping.source.encode(sentence)[0]) >= 6]
    assert judged
    with serving(create_app(Service(dropping, ["de", "en"]), Limits())) as url:
        status, answer = request(url, "/translate", {"q": [" ".join(PARAGRAPH), "ja"], "source": "de",
                                                     "target": "en"})  # fmt: skip
        assert status == 200
        assert answer["doubtful"] == [judged, []]
        assert request(url, "/translate", {"q": "ja", "source": "de", "target": "en"}) == (200, {"translatedText": ""})


SURROGATE = b'"a \\ud800 b"'  # valid JSON: a lone surrogate, as Python's and JavaScript's encoders write it
FUZZ: list[tuple[str, bytes, str]] = [
    ("/translate", b'{"q": ' + SURROGATE + b', "source": "de", "target": "en"}', "application/json"),
    ("/translate", b'{"q": ["ok", ' + SURROGATE + b'], "source": "de", "target": "en"}', "application/json"),
    ("/translate", b'{"q": "x", "source": ' + SURROGATE + b', "target": "en"}', "application/json"),
    ("/translate", b'{"q": "x", "source": "auto", "target": ' + SURROGATE + b"}", "application/json"),
    ("/translate", b'{"q": ' + SURROGATE + b', "source": "auto", "target": "en"}', "application/json"),
    ("/translate", b'{"q": ' + SURROGATE + b', "source": "de", "target": "en", "format": "html"}', "application/json"),
    ("/translate", b'{"q": ' + SURROGATE + b', "source": "de", "target": "en", "alternatives": 2}', "application/json"),
    ("/detect", b'{"q": ' + SURROGATE + b"}", "application/json"),
    ("/detect", b'{"q": [' + SURROGATE + b"]}", "application/json"),
    ("/attention", b'{"q": ' + SURROGATE + b"}", "application/json"),
    ("/translate", b'{"q": "\xff\xfe", "source": "de", "target": "en"}', "application/json"),
    ("/translate", b"q=%ED%A0%80&source=de&target=en", "application/x-www-form-urlencoded"),
    ("/translate", b"q=%FF&source=de&target=en", "application/x-www-form-urlencoded"),
    ("/translate", b'{"q": {"a": 1}, "source": "de", "target": "en"}', "application/json"),
    ("/translate", b'{"q": [["a"]], "source": "de", "target": "en"}', "application/json"),
    ("/translate", b'{"q": null, "source": "de", "target": "en"}', "application/json"),
    ("/translate", b'{"q": "a", "source": "de", "target": "en", "format": 5}', "application/json"),
    ("/translate", b'{"q": "a", "source": "de", "target": "en", "split": 3}', "application/json"),
    ("/translate", b'{"q": "a", "source": "de", "target": "en", "alternatives": 1e999}', "application/json"),
    ("/translate", b'{"q": "a", "source": [], "target": {}}', "application/json"),
    ("/translate", b'{"q": "a\\u0000b", "source": "xx-\\u0000", "target": "en"}', "application/json"),
    ("/translate", b"--x\r\nContent-Disposition: form-data\r\n\r\nq\r\n--x--", "multipart/form-data; boundary=x"),
    ("/translate", b"--y", "multipart/form-data"),
    ("/translate", b"", "application/json"),
    ("/translate", b"\x00\x01", "text/plain"),
    ("/detect", b"{}", "application/json"),
    ("/attention", b'{"q": "   ", "source": "de", "target": "en"}', "application/json"),
    ("/attention", b'{"q": "a", "source": "\\ud800", "target": "en"}', "application/json"),
    ("/languages", b"{", "application/json"),
]  # fmt: skip


def raw(url: str, path: str, body: bytes, kind: str) -> tuple[int, Any]:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", path, body=body, headers={"Content-Type": kind})
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    return response.status, json.loads(text)


def cpu_seconds(pid: int) -> float:
    """The CPU time a process has used (user and system), from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads a process's CPU time from /proc")
def test_no_malformed_request_gives_a_500_and_the_server_is_idle_after_them_and_stops(run: Path) -> None:
    """Every body of the fuzz list is answered (a 4xx with LibreTranslate's ``{"error": ...}``, or a translation);
    a lone surrogate names itself. Then a good request is answered, the worker uses no CPU, and SIGTERM stops the
    server within 30 seconds."""
    process, url, _ = start(run)
    try:
        for path, body, kind in FUZZ:
            status, answer = raw(url, path, body, kind)
            assert status < 500, (path, body, status, answer)
            assert status == 200 or set(answer) == {"error"}, (path, body, status, answer)
            if b"\\ud800" in body and path != "/languages":
                assert status == 400, (path, body, answer)
                assert "lone surrogate (U+D800" in answer["error"], (path, body, answer)
        status, answer = request(url, "/translate", {"q": PARAGRAPH[0], "source": "de", "target": "en"})
        assert status == 200
        assert answer["translatedText"]
        time.sleep(1)  # the last answer's bookkeeping done
        before = cpu_seconds(process.pid)
        time.sleep(3)
        assert cpu_seconds(process.pid) - before < 0.5  # idle: nothing left in the scheduler
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        process.wait(timeout=30)


def test_a_command_line_text_that_is_not_utf8_is_refused_in_one_line(run: Path, tmp_path: Path) -> None:
    """Bytes that are not UTF-8 in a TEXT argument (Python reads them as lone surrogates): one line, exit 2."""
    result = subprocess.run(
        [sys.executable.encode(), b"-m", b"multihead", b"translate", os.fsencode(run), b"Der Hund \xff l\xe4uft."],
        capture_output=True, env=subprocess_env(), timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.decode().splitlines() == [
        "multihead: error: text 1 is not UTF-8 text: it holds a lone surrogate (U+DCFF, not a character) at "
        "character 10"
    ]


def test_the_command_line_translates_a_paragraph_as_its_sentences(
    run: Path, translator: Translator, cli: Callable[..., Cli]
) -> None:
    result = cli("translate", run, " ".join(PARAGRAPH))
    assert result.status == 0, result.err
    assert result.out_lines == [" ".join(translator.translate(PARAGRAPH))]


def test_serve_searches_as_an_imported_runs_generation_config(marian_de_en: Any, tmp_path: Path) -> None:
    """``serve`` without search flags takes the first run's defaults, an imported model's generation config (here a
    beam of 4, length penalty 0.8, at most 9 tokens), as ``translate`` does; its flags override them."""
    from app.support import sentences

    texts = sentences(12, seed=5)
    run = Translator(imported_with(marian_de_en, tmp_path, num_beams=4, length_penalty=0.8, max_length=10))
    recorded = replace(TRANSLATION, **run.checkpoint.search)
    flagged = replace(recorded, beam_size=1, length_penalty=0.6)  # what the flags below give: the rest is the run's
    default, greedy = (run.translate(texts, search=search) for search in (recorded, flagged))
    assert default != greedy  # the recorded search changes these translations
    for flags, expected in (((), default), (("--beam", "1", "--length-penalty", "0.6"), greedy)):
        process, url, _ = start(run.checkpoint.path.parents[1], *flags)
        try:
            status, answer = request(url, "/translate", {"q": texts, "source": "de", "target": "en"})
            assert (status, answer["translatedText"]) == (200, expected), flags  # and the guard's doubts, if any
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


def imported_with(marian: Any, directory: Path, **generation: object) -> Path:
    """``marian``'s checkpoint with ``generation`` in its generation config, imported as ``directory / "run"``."""
    checkpoint = shutil.copytree(marian.directory, directory / "opus-mt-de-en")
    config = json.loads((checkpoint / "generation_config.json").read_text())
    (checkpoint / "generation_config.json").write_text(json.dumps({**config, **generation}))
    import_pretrained(str(checkpoint), directory / "run")
    return directory / "run"


def test_n_best_takes_an_imported_runs_beams(marian_de_en: Any, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    """``translate --n-best N`` without ``--beam`` searches the run's beams (an imported model's ``num_beams``): N
    lines when they are N or more, refused in one line when fewer."""
    run = imported_with(marian_de_en, tmp_path, num_beams=4)
    listed = cli("translate", run, PARAGRAPH[0], "--n-best", "4")
    assert listed.status == 0, listed.err
    assert len(listed.out_lines) == 4
    refused = cli("translate", run, PARAGRAPH[0], "--n-best", "5")
    assert (refused.status, refused.err_lines[-1]) == (2, "multihead: error: --n-best 5 lists the best of a beam "
                                                       "search at least as wide: add --beam 5 (or more); received "
                                                       "--beam 4")  # fmt: skip
