"""Continuous batching (``multihead.torch.streaming``, through ``multihead.app.streaming``): sentences join and leave a
running batch at every step and get what ``Translator.translate`` gives them, whatever their search; ``serve``'s
worker over it."""

from __future__ import annotations

import random
from collections import Counter
from concurrent.futures import Future
from dataclasses import replace

import numpy as np
import pytest
import torch

from app.support import SAMPLES, VALID, CorpusRun, beam
from multihead.app.loaded import LoadedRun
from multihead.app.serve import Service
from multihead.app.serve.jobs import Attend, Stop, Translate
from multihead.app.serve.parse import Lines
from multihead.app.serve.routing import Leg
from multihead.app.streaming import SHARE, StreamingTranslator
from multihead.app.tokenizers import EOS
from multihead.app.translate import TRANSLATION, Translator
from multihead.torch import streaming
from multihead.torch.streaming import Stream, StreamRows

SOURCES = [source for source, _ in VALID]


@pytest.fixture(scope="module")
def translator(corpus_run: CorpusRun) -> Translator:
    return Translator(corpus_run.path)


def run(streaming_translator: StreamingTranslator, requests: list[list[str]], *, seed: int, in_flight: int) -> list:
    """The requests added a few at a time between steps, at most ``in_flight`` texts waiting or decoding, in a
    seeded random rhythm; each one's result."""
    rng, futures, pending, steps = random.Random(seed), [], list(requests), 0
    while pending or len(streaming_translator):
        while pending and len(streaming_translator) < in_flight and rng.random() < 0.7:
            futures.append(Future())
            streaming_translator.add(pending.pop(0), futures[-1])
        streaming_translator.step()
        assert not streaming_translator.stream.waiting  # pieces wait in the requests' queue only, never the stream's
        steps += 1
        assert steps < 10_000
    return [future.result(timeout=0).texts for future in futures]


@pytest.mark.parametrize(("rows", "in_flight"), [(1, 4), (3, 5), (4, 40), (256, 40)])
def test_each_text_gets_what_translate_gives_it(translator: Translator, rows: int, in_flight: int) -> None:
    """Texts joining a running batch of at most ``rows`` rows, one text or several a request, blank ones among them:
    every request gets, in its order, what ``translate`` gives its texts."""
    texts = SOURCES * 2
    requests = [texts[i : i + 1 + i % 3] for i in range(0, len(texts), 2)] + [["", SAMPLES[0], " "]]
    answers = run(StreamingTranslator(translator, rows=rows), requests, seed=rows, in_flight=in_flight)
    assert answers == [translator.translate(request) for request in requests]


def test_sampled_texts_get_what_translate_samples_for_them(translator: Translator) -> None:
    """Sampling in the stream: a request's piece ``i`` draws with key ``i`` from the search's seed, as ``translate``
    draws for that request's texts, whatever joins the batch beside it."""
    search = replace(TRANSLATION, sampling_topk=0, sampling_temperature=1.5, seed=3)
    texts = SOURCES * 2
    requests = [texts[i : i + 1 + i % 3] for i in range(0, len(texts), 2)]
    answers = run(StreamingTranslator(translator, rows=4, search=search), requests, seed=5, in_flight=9)
    assert answers == [translator.translate(request, search=search) for request in requests]
    assert answers != [translator.translate(request) for request in requests]  # it did sample


def test_columns_in_use_move_to_the_front_when_they_run_out(
    translator: Translator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream that never empties runs far longer than its self-attention buffers are wide: the columns still in use
    move to the front (the buffers widening when they must), and every sentence still gets what ``translate`` gives
    it."""
    moves = []
    move_columns = streaming._Buffers.move_columns
    monkeypatch.setattr(
        streaming._Buffers, "move_columns", lambda self, *args: (moves.append(args), move_columns(self, *args))
    )
    requests = [[source] for source in SOURCES * 3]
    answers = run(StreamingTranslator(translator, rows=4), requests, seed=3, in_flight=40)
    assert answers == [translator.translate(request) for request in requests]
    assert len([start for _, start, _ in moves if start > 0]) >= 3  # columns moved, not only widened


def test_a_sentence_ends_at_its_own_length_limit(translator: Translator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Limits that bind (a few tokens less than the source), sentences of every length in one batch."""
    monkeypatch.setattr(LoadedRun, "limit", lambda self, length: max(1, length - 3))
    requests = [[source] for source in sorted(SOURCES, key=len)]
    answers = run(StreamingTranslator(translator, rows=8), requests, seed=1, in_flight=8)
    assert answers == [translator.translate(request) for request in requests]
    lengths = [len(translator.target.encode(answer[0])[0]) for answer in answers]
    assert lengths == [max(1, len(translator.source.encode(text)[0]) - 3) for (text,) in requests]  # all bound


def test_rows_wait_to_join_until_a_quarter_or_a_few_steps(
    translator: Translator, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = StreamRows.step

    def never_ending(self: StreamRows, tokens: np.ndarray) -> torch.Tensor:
        logits = step(self, tokens).whole()
        return torch.where(torch.arange(logits.shape[1]) == EOS, float("-inf"), logits)  # no sentence ends

    monkeypatch.setattr(StreamRows, "step", never_ending)
    stream = Stream(translator.model, rows=64, generation=translator.spec(TRANSLATION))

    def add(index: int) -> None:
        ids = translator.source.encode(SOURCES[index])[0]
        stream.add(ids, index, limit=translator.limit(len(ids)))

    for index in range(8):
        add(index)
    stream.step()  # nothing decoding: all join
    assert len(stream.decoding) == 8
    add(8)  # one is less than a quarter of 8
    for _ in range(streaming.JOIN_AFTER):
        stream.step()
        assert [entry.sentence.owner for entry in stream.waiting] == [8]
    stream.step()
    assert not stream.waiting
    assert 8 in [sentence.owner for sentence in stream.of_row]


def test_a_large_request_shares_the_batch_and_takes_it_all_alone(translator: Translator) -> None:
    """Short requests added after a large one join at the next step; while they are being translated the large one
    holds at most ``SHARE`` places more than they do; alone, it takes every place."""
    streaming_translator = StreamingTranslator(translator, rows=64)
    large, short = Future(), [Future() for _ in range(3)]
    streaming_translator.add(SOURCES * 20, large)  # far more pieces than rows
    for future, text in zip(short, SOURCES, strict=False):
        streaming_translator.add([text], future)

    def held() -> Counter:
        stream = streaming_translator.stream
        assert not stream.waiting  # the requests' pieces wait in one queue: Requests'
        owners = stream.decoding
        return Counter(job.future for job, _ in owners)

    streaming_translator.step()
    assert held() == {large: 3 + SHARE, **{future: 1 for future in short}}
    while not all(future.done() for future in short):
        streaming_translator.step()
    assert not large.done()
    streaming_translator.step()
    assert held() == {large: 64}
    expected = [translator.translate([text]) for text in SOURCES[:3]]
    assert [future.result(timeout=0).texts for future in short] == expected


def test_a_cancelled_request_is_dropped_at_the_next_step(translator: Translator) -> None:
    """Requests cancelled while decoding or waiting leave the stream (library ``Stream.drop``) at the next step; the
    others get what ``translate`` gives them."""
    streaming_translator = StreamingTranslator(translator, rows=8)
    requests = [[text] * 3 for text in SOURCES[:8]]
    futures = [Future() for _ in requests]
    for texts, future in zip(requests, futures, strict=True):
        streaming_translator.add(texts, future)
    streaming_translator.step()
    for future in futures[::2]:
        assert future.cancel()
    streaming_translator.step()
    owners = streaming_translator.stream.decoding
    assert not any(job.future.cancelled() for job, _ in owners)
    while len(streaming_translator):
        streaming_translator.step()
    assert all(future.cancelled() for future in futures[::2])
    kept = range(1, len(requests), 2)
    assert [futures[i].result(timeout=0).texts for i in kept] == [translator.translate(requests[i]) for i in kept]


@pytest.mark.parametrize("failing_part", ["encoding", "decoding"])
def test_a_failed_step_fails_every_request_in_the_stream_and_the_next_ones_work(
    translator: Translator, monkeypatch: pytest.MonkeyPatch, failing_part: str
) -> None:
    """A step that fails while the sentences waiting join (encoding their sources) or while it decodes: every request
    in the stream, joining ones included, gets the error, and the stream goes on."""
    streaming_translator = StreamingTranslator(translator, rows=4)
    failing = [Future() for _ in range(3)]
    for index, future in enumerate(failing):
        streaming_translator.add([SAMPLES[index]], future)
    with monkeypatch.context() as patched:
        if failing_part == "encoding":
            patched.setattr(translator.model, "_encode", lambda *args: 1 / 0)
        else:
            patched.setattr(StreamRows, "step", lambda self, tokens: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            streaming_translator.step()
    streaming_translator.fail(RuntimeError("boom"))
    assert all(isinstance(future.exception(timeout=0), RuntimeError) for future in failing)
    assert len(streaming_translator) == 0
    assert run(streaming_translator, [[SAMPLES[0]]], seed=0, in_flight=1) == [translator.translate([SAMPLES[0]])]


@pytest.mark.parametrize("size", [1, 3], ids=["greedy", "beam"])
def test_the_worker_answers_every_request_with_its_own_translations(
    translator: Translator, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve``'s worker: greedy or beam search through the stream; jobs that run alone (the page's attention)
    between them; a failing job answers its own request only; after close, what was queued is answered."""
    service = Service(translator, ["de", "en"], search=beam(size), thread=False)
    worker, leg = service.worker, Leg(0, ("de", "en"))
    assert isinstance(service.engines.runs[0].engine, StreamingTranslator)
    monkeypatch.setattr(translator, "attention", lambda *args, **kwargs: 1 / 0)
    requests = [[f"{SAMPLES[i % 6]}\n\n{SAMPLES[(i + 1) % 6]}", " "] for i in range(10)]
    jobs = []
    for index, texts in enumerate(requests):
        lines = Lines.of(texts)  # as the handlers give the worker a request's texts: line by line
        jobs.append((lines, Translate(leg, lines.flat)))
        worker.submit(jobs[-1][1])
        if index == 4:
            failing = Attend(leg, SAMPLES[0])
            worker.submit(failing)
    worker.jobs.put(Stop())
    worker.work()
    assert isinstance(failing.answer.exception(timeout=0), ZeroDivisionError)
    expected = translator.translate(SAMPLES, search=beam(size))
    for i, (lines, job) in enumerate(jobs):
        answer = lines.joined(job.answer.result(timeout=0).texts)
        assert answer == [f"{expected[i % 6]}\n\n{expected[(i + 1) % 6]}", " "]
