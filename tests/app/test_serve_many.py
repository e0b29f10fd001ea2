"""``serve`` of several runs: each request goes to the run that serves its pair (the first named, where two do), a
pair no run serves goes through English, both legs translated as any request is; ``/languages`` lists every pair.

Three tiny runs, imported from checkpoints made here (offline): a Marian de → en, a Marian en → sv (the same
weights, another name) and an NLLB-style model of de, en, fr, zh and zh-Hant.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from libretranslatepy import LibreTranslateAPI

from app.served import request, serving
from app.support import beam, sentences
from multihead.app.pretrained import import_pretrained
from multihead.app.serve import Limits, Service, create_app, run_paths
from multihead.app.serve.engines import Holding
from multihead.app.serve.routing import pivots
from multihead.app.translate import Translator

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Translator]:
    from app.imported import marian_runs
    from app.test_import_nllb import make_checkpoint as nllb

    root = tmp_path_factory.mktemp("many")
    runs = marian_runs(root)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)
        import_pretrained(str(nllb(root / "checkpoints" / "nllb")), root / "runs" / "nllb", langs=["de", "en"])
    return {name: Translator(run) for name, run in {**runs, "nllb": root / "runs" / "nllb"}.items()}


@pytest.fixture(scope="module")
def url(runs: dict[str, Translator]) -> Iterator[str]:
    first, *more = runs.values()
    service = Service(first, first.langs or [], more=[(run, run.langs or []) for run in more])
    with serving(create_app(service, Limits())) as found:
        yield found


def test_languages_lists_every_pair_and_the_runs_that_serve_it(url: str) -> None:
    status, languages = request(url, "/languages")
    assert status == 200
    found = {entry["code"]: (entry["targets"], entry["runs"]) for entry in languages}
    assert list(found) == ["de", "en", "fr", "zh", "zh-Hant", "sv"]  # the sources first
    assert found["de"][0] == ["en", "sv", "fr", "zh", "zh-Hant"]
    assert found["de"][1] == {"en": ["de-en"], "sv": ["de-en", "en-sv"], "fr": ["nllb"], "zh": ["nllb"],
                              "zh-Hant": ["nllb"]}  # fmt: skip
    assert found["en"][1]["sv"] == ["en-sv"]
    assert found["fr"][1]["sv"] == ["nllb", "en-sv"]  # through English
    assert found["sv"] == ([], {})  # no run reads Swedish


def test_every_pair_answers_what_translate_gives(url: str, runs: dict[str, Translator]) -> None:
    """Direct pairs as the run that serves them translates; pivoted ones as two ``translate``s in a row; many at once,
    through LibreTranslate's own client."""
    texts = sentences(8, seed=21)
    english = runs["nllb"].for_languages("fr", "en").translate(texts)
    expected = {
        ("de", "en"): runs["de-en"].translate(texts),
        ("en", "de"): runs["nllb"].for_languages("en", "de").translate(texts),
        ("en", "sv"): runs["en-sv"].translate(texts),
        ("de", "sv"): runs["en-sv"].translate(runs["de-en"].translate(texts)),
        ("fr", "sv"): runs["en-sv"].translate(english),
        ("zh", "fr"): runs["nllb"].for_languages("zh", "fr").translate(texts),
    }
    client = LibreTranslateAPI(url)

    def ask(pair: tuple[str, str]) -> list[str]:
        return [client.translate(text, *pair) for text in texts]

    pairs = list(expected) * 2
    with ThreadPoolExecutor(len(pairs)) as pool:
        answers = list(pool.map(ask, pairs, timeout=120))
    assert answers == [expected[pair] for pair in pairs]


def test_a_pair_no_run_serves_is_refused_as_libretranslate_refuses_it(url: str) -> None:
    assert request(url, "/translate", {"q": "Hund", "source": "sv", "target": "de"}) == (
        400, {"error": "German (de) is not available as a target language from Swedish (sv)"}
    )  # fmt: skip
    assert request(url, "/translate", {"q": "Hund", "source": "de", "target": "ja"}) == (
        400, {"error": "ja is not supported"}
    )  # fmt: skip
    status, answer = request(url, "/attention", {"q": "Hund", "source": "de", "target": "sv"})
    assert (status, answer["error"]) == (400, "German (de) to Swedish (sv) goes through English: no one model's "
                                              "attention")  # fmt: skip


def test_pivots_go_through_english_first() -> None:
    direct = {("de", "en"), ("en", "sv"), ("de", "fr"), ("fr", "sv"), ("sv", "fi")}
    assert pivots(direct, ["de", "en", "sv", "fr", "fi"]) == {
        ("de", "sv"): "en", ("en", "fi"): "sv", ("fr", "fi"): "sv",
    }  # fmt: skip


def test_a_directory_of_runs_is_its_runs_by_name(runs: dict[str, Translator], tmp_path: Path) -> None:
    root = runs["de-en"].checkpoint.path.parents[2]
    assert run_paths([str(root)]) == [str(root / name) for name in ("de-en", "en-sv", "nllb")]
    assert run_paths([str(root / "nllb"), str(root / "de-en")]) == [str(root / "nllb"), str(root / "de-en")]
    assert run_paths([str(tmp_path / "none")]) == [str(tmp_path / "none")]  # refused when it is opened


def test_max_loaded_holds_one_model_and_answers_every_pair(runs: dict[str, Translator]) -> None:
    """``--max-loaded 1`` with two runs, requests alternating between their pairs: each answered as its run
    translates, one model held at a time (the other's released: no reference to it is left), ``/health`` naming it."""
    import gc
    import weakref

    paths = [str(runs[name].checkpoint.path.parents[1]) for name in ("de-en", "nllb")]
    loaders = [lambda path=path: Translator(path) for path in paths]
    first, second = (load() for load in loaders)
    service = Service(first, first.langs or [], more=[(second.described, second.langs or [])],
                      holding=Holding(loaders, max_loaded=1))  # fmt: skip
    texts = sentences(4, seed=22)
    expected = {("de", "en"): runs["de-en"].translate(texts), ("de", "fr"): runs["nllb"].for_languages(
        "de", "fr").translate(texts)}  # fmt: skip
    held = weakref.ref(first.model)
    del first, second  # the service alone holds the first run
    with serving(create_app(service, Limits())) as url:
        for turn, pair in enumerate([("de", "en"), ("de", "fr"), ("de", "en"), ("de", "fr")]):
            assert request(url, "/translate", {"q": texts, "source": pair[0], "target": pair[1]}) == (
                200, {"translatedText": expected[pair]}
            )  # fmt: skip
            loaded = service.engines.loaded()
            assert loaded == [0 if pair == ("de", "en") else 1]
            assert request(url, "/health") == (200, {"status": "ok", "loaded": [service.routes.names[loaded[0]]]})
            gc.collect()
            assert (held() is None) == (turn > 0)  # the first model, released at the first French request, is gone
        assert request(url, "/translate", {"q": texts, "source": "de", "target": "xx"})[0] == 400
        status, text = request(url, "/metrics")
    assert status == 200
    scraped = scraped_metrics(text)
    names = service.routes.names
    assert scraped["multihead_requests_total", ("/translate", "de", "en", "200")] == 2
    assert scraped["multihead_requests_total", ("/translate", "de", "fr", "200")] == 2
    assert scraped["multihead_requests_total", ("/translate", "", "", "400")] == 1  # refused before its pair
    assert scraped["multihead_request_seconds_count", ("/translate", "de", "fr")] == 2
    assert scraped["multihead_requests_total", ("other", "", "", "200")] == 4  # /health
    # The first run: held at the start, released at the first French request, loaded again and released again.
    assert [scraped["multihead_run_loads_total", (name,)] for name in names] == [2, 2]
    assert [scraped["multihead_run_releases_total", (name,)] for name in names] == [2, 1]
    assert [scraped["multihead_run_loaded", (name,)] for name in names] == [0, 1]
    second_size = sum(path.stat().st_size for path in Path(paths[1]).glob("checkpoints/*/model.safetensors"))
    assert [scraped["multihead_run_weights_bytes", (name,)] for name in names] == [0, second_size]
    assert scraped["multihead_jobs_queued", ()] == scraped["multihead_pieces_translating", ()] == 0
    assert scraped["process_resident_memory_bytes", ()] > 0


def scraped_metrics(text: str) -> dict[tuple[str, tuple[str, ...]], float]:
    """``/metrics``' text read by Prometheus' own parser: each sample's value by its name and its label values, in the
    order endpoint, source, target, status, run."""
    from prometheus_client.parser import text_string_to_metric_families

    order = ("endpoint", "source", "target", "status", "run")
    return {
        (sample.name, tuple(sample.labels[label] for label in order if label in sample.labels)): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_serve_says_how_many_pairs_each_run_serves_in_words(
    runs: dict[str, Translator], capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    from multihead.app.serve.command import _say_serving

    first, *more = runs.values()
    service = Service(first, first.langs or [], more=[(run, run.langs or []) for run in more])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        _say_serving(service, list(runs), sock)
    lines = capsys.readouterr().err.splitlines()
    assert lines[1:3] == [
        "  de-en: de → en (German to English); 1 pair",
        "  en-sv: en → sv (English to Swedish); 1 pair",
    ]


def test_a_run_loading_does_not_stop_another_runs_requests(runs: dict[str, Translator]) -> None:
    """A released run loads off the worker: while its load is held back (a slow load, stood in for), the loaded run's
    requests are answered as it translates them; once it has loaded, the request that waited for it is answered as
    its run translates, and ``/health`` names both runs."""
    import threading

    paths = [str(runs[name].checkpoint.path.parents[1]) for name in ("de-en", "nllb")]
    started, go_on = threading.Event(), threading.Event()

    def slow(path: str) -> Translator:
        started.set()
        assert go_on.wait(60), "the test never let the load finish"
        return Translator(path)

    first, second = Translator(paths[0]), Translator(paths[1])
    loaders = [lambda: Translator(paths[0]), lambda: slow(paths[1])]
    service = Service(first, first.langs or [], more=[(second.described, second.langs or [])],
                      holding=Holding(loaders, max_loaded=2))  # fmt: skip
    texts = sentences(3, seed=23)
    french = runs["nllb"].for_languages("de", "fr").translate(texts)
    with serving(create_app(service, Limits(timeout=20))) as url, ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(request, url, "/translate", {"q": texts, "source": "de", "target": "fr"})
        assert started.wait(30)
        for text in texts:  # the load still held back: each answered, one after another
            assert request(url, "/translate", {"q": text, "source": "de", "target": "en"}) == (
                200, {"translatedText": runs["de-en"].translate([text])[0]}
            )  # fmt: skip
        assert not waiting.done()
        assert service.engines.loaded() == [0]
        go_on.set()
        assert waiting.result(timeout=60) == (200, {"translatedText": french})
        assert request(url, "/health") == (200, {"status": "ok", "loaded": ["de-en", "nllb"]})


def test_jobs_alone_wait_for_their_run_to_load(runs: dict[str, Translator]) -> None:
    """Under ``--max-loaded 1`` the page's attention and alternatives of a run not held load it first, as texts do:
    each answered as its run computes it."""
    from multihead.app.view import attention_view

    paths = [str(runs[name].checkpoint.path.parents[1]) for name in ("de-en", "nllb")]
    loaders = [lambda path=path: Translator(path) for path in paths]
    first, second = (load() for load in loaders)
    service = Service(first, first.langs or [], more=[(second.described, second.langs or [])],
                      holding=Holding(loaders, max_loaded=1))  # fmt: skip
    (text,) = sentences(1, seed=24)
    french = runs["nllb"].for_languages("de", "fr")
    with serving(create_app(service, Limits())) as url:
        status, view = request(url, "/attention", {"q": text, "source": "de", "target": "fr"})
        assert (status, view) == (200, json.loads(json.dumps(attention_view(french.attention(text)))))
        assert service.engines.loaded() == [1]
        best = runs["de-en"].hypotheses([text], beam(3, n_best=3))[0]  # as serve widens greedy's
        status, answer = request(url, "/translate", {"q": text, "source": "de", "target": "en", "alternatives": 2})
        others = list(dict.fromkeys(other for other in best[1:] if other != best[0]))  # distinct, as LibreTranslate
        assert (status, answer) == (200, {"translatedText": best[0], "alternatives": others})
        assert service.engines.loaded() == [0]


class Ledger:
    """A stand-in for the process's resident memory (:func:`multihead.app.memory.resident_bytes`): 100 MiB, and 10
    MiB for each model its loaders made that is still alive."""

    def __init__(self) -> None:
        import weakref

        self.models: weakref.WeakSet[object] = weakref.WeakSet()

    grown = 0
    """MiB the held models took as they decoded, beyond their costs."""

    def __call__(self) -> int:
        return (100 + 10 * len(self.models) + self.grown) << 20

    def loader(self, path: str, langs: list[str]) -> Callable[[], tuple[Translator, list[str]]]:
        def load() -> tuple[Translator, list[str]]:
            translator = Translator(path)
            self.models.add(translator.model)
            return translator, langs

        return load


@pytest.fixture
def ledger(monkeypatch: pytest.MonkeyPatch) -> Ledger:
    from multihead.app import memory
    from multihead.app.serve import command, engines

    found = Ledger()
    for module in (memory, engines):
        monkeypatch.setattr(module, "resident_bytes", found)
    monkeypatch.setattr(command, "peak_resident_bytes", lambda reset=False: found())
    return found


def test_memory_holds_the_runs_that_fit_and_answers_every_pair(runs: dict[str, Translator], ledger: Ledger) -> None:
    """``--memory`` of 135 MiB where the server takes 100 and each run 10 (as :class:`Ledger` counts), a budget that
    keeps room for one run's cost beside those held: each run's cost measured as it first loads; at the start the first
    and second runs held, the third released (holding it would leave no room); requests cycling over the three pairs
    each answered as its run translates, never more than two models alive, the least recently used idle run released
    for the one asked for; ``/health`` and ``/metrics`` say what is held and what it costs."""
    import gc
    import threading

    from multihead.app.serve.command import _service
    from multihead.app.translate import TRANSLATION

    names = ("de-en", "en-sv", "nllb")
    pairs = [("de", "en"), ("en", "sv"), ("de", "fr")]
    loaders = [ledger.loader(str(runs[name].checkpoint.path.parents[1]), runs[name].langs or []) for name in names]
    service = _service(loaders, lambda translator: TRANSLATION, None, max_loaded=None, memory=135 << 20)
    assert service.engines.loaded() == [0, 1]
    assert [run.cost for run in service.engines.runs] == [10 << 20] * 3
    texts = sentences(2, seed=25)
    expected = {("de", "en"): runs["de-en"].translate(texts), ("en", "sv"): runs["en-sv"].translate(texts),
                ("de", "fr"): runs["nllb"].for_languages("de", "fr").translate(texts)}  # fmt: skip
    worker = threading.Thread(target=service.worker.work, daemon=True)  # the command's own runs on its main thread
    worker.start()
    with serving(create_app(service, Limits())) as url:
        held = []
        for pair in [*pairs, *pairs]:
            body = {"q": texts, "source": pair[0], "target": pair[1]}
            assert request(url, "/translate", body) == (200, {"translatedText": expected[pair]})
            gc.collect()
            assert len(ledger.models) <= 2
            held.append(service.engines.loaded())
        status, health = request(url, "/health")
        status_metrics, text = request(url, "/metrics")
    service.worker.close()
    worker.join(30)
    # Each request's run loaded where it was not, releasing the run asked for least recently.
    assert held == [[0, 1], [0, 1], [1, 2], [0, 2], [0, 1], [1, 2]]
    assert status == 200
    assert health == {"status": "ok", "loaded": ["en-sv", "nllb"],
                      "memory": {"budget": 135 << 20, "resident": 120 << 20, "runs": {"en-sv": 10 << 20,
                                                                                      "nllb": 10 << 20}}}  # fmt: skip
    scraped = scraped_metrics(text)
    assert status_metrics == 200
    assert scraped["multihead_memory_budget_bytes", ()] == 135 << 20
    assert [scraped["multihead_run_memory_bytes", (name,)] for name in names] == [0, 10 << 20, 10 << 20]
    assert [scraped["multihead_run_releases_total", (name,)] for name in names] == [2, 1, 1]


def test_held_runs_that_grow_past_the_room_release_the_least_recently_used_idle_one(
    runs: dict[str, Translator], ledger: Ledger
) -> None:
    """The budget of the test above holds two runs (120 MiB, room 10); once they take 6 MiB more as they decode, the
    room is short: the idle run used least recently goes (not one a job is pinned to), and no more; a run held alone
    stays, whatever it grows to."""
    from multihead.app.serve.command import _service
    from multihead.app.translate import TRANSLATION

    names = ("de-en", "en-sv", "nllb")
    loaders = [ledger.loader(str(runs[name].checkpoint.path.parents[1]), runs[name].langs or []) for name in names]
    service = _service(loaders, lambda translator: TRANSLATION, None, max_loaded=None, memory=135 << 20)
    engines = service.engines
    engines.runs[0].used, engines.runs[1].used = 2.0, 1.0
    engines.shrink(set())
    assert engines.loaded() == [0, 1]  # 120 + 10 fits in 135
    ledger.grown = 6
    engines.shrink({1})
    assert engines.loaded() == [1]  # 126 + 10 did not: run 0 goes (run 1, used less recently, is pinned)
    ledger.grown = 30
    engines.shrink(set())
    assert engines.loaded() == [1]
    assert [run.releases for run in engines.runs] == [1, 0, 0]  # the third was not held from the start


def test_a_memory_budget_too_small_for_a_run_is_refused(runs: dict[str, Translator], ledger: Ledger) -> None:
    from multihead.app.console import UserError
    from multihead.app.serve.command import _service
    from multihead.app.translate import TRANSLATION

    loaders = [ledger.loader(str(runs["de-en"].checkpoint.path.parents[1]), ["de", "en"])]
    with pytest.raises(UserError) as refused:
        _service(loaders, lambda translator: TRANSLATION, None, max_loaded=None, memory=105 << 20)
    assert str(refused.value) == (
        "--memory 105M is too small for 'de-en': it takes 10M beside the server's own 100M (give --memory 110M or more)"
    )


@pytest.mark.parametrize(
    ("text", "size"), [("4G", 4 << 30), ("1536M", 1536 << 20), ("2.5g", 5 << 29), ("4GiB", 4 << 30), ("512kb", 1 << 19),
                       ("1000", 1000)],
)  # fmt: skip
def test_memory_sizes_read_as_docker_reads_them(text: str, size: int) -> None:
    from multihead.app.options import byte_size

    assert byte_size(text) == size


@pytest.mark.parametrize("text", ["0", "lots", "-1G", "4X", ""])
def test_a_memory_that_is_no_size_is_refused_before_any_run_loads(
    text: str, cli: Callable[..., Any], tmp_path: Path
) -> None:
    from app.support import assert_refused

    assert_refused(cli("serve", tmp_path / "none", f"--memory={text}"), "--memory", "must be a size such as 4G")
