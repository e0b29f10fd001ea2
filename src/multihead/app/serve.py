"""``multihead serve``: a run behind LibreTranslate's HTTP API, and a page that shows its attention.

LibreTranslate's endpoints, field for field and error for error (its clients work unchanged): ``POST /translate``,
``GET /languages``, ``POST /detect``, ``GET /health``, ``GET /frontend/settings``. Ours: ``GET /`` (the page,
self-contained) and ``POST /attention`` (one sentence's cross-attention, as the page draws it).

Requests wait in one queue for a worker, so the event loop never computes. With greedy search or sampling the worker
keeps one batch that sentences join and leave at every decoding step (:mod:`multihead.app.streaming`): each answer
goes out as soon as its sentences end. With beam search it takes what has gathered (up to :data:`GATHER` texts) and
translates it together, in the translator's token-bounded batches. Every error a user can cause
is ``{"error": "..."}`` with a 4xx status, as LibreTranslate words it; a 500 would be a bug of ours.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from multihead.app.console import UserError, plural, say
from multihead.app.detect import Detected, LanguageIdentifier
from multihead.app.languages import closest_code, language_name, pair_text
from multihead.app.markup import translate_html, visible_text
from multihead.app.runs import has_checkpoints
from multihead.app.segment import not_text
from multihead.app.streaming import Finish, RoundTranslator, StreamingTranslator, settle
from multihead.app.translate import TRANSLATION, Translated, Translator
from multihead.app.view import attention_view, page
from multihead.decoding import SearchOptions

GATHER = 256
"""The most sentences the worker translates together (in one running batch, or one round of beam search)."""
ALONE_SHARE = 0.3
"""The share of the worker's time that jobs which run alone (alternatives, the page's attention) take while requests
are being translated: each waits until the steps since the last have taken (1 - share) / share of its time."""
STALLED_AFTER = 60.0
"""Seconds on one step or job after which ``/health`` reports the worker stalled."""
WAKE = 0.5
"""The longest an idle worker waits for a job at once: on the main thread, a signal another thread received is
handled only when it wakes."""
DRAIN = 30.0
"""Seconds the server waits, once told to stop, for the requests in flight before it drops them."""
BODY_LIMIT = 1 << 20
"""The largest request body accepted (bytes): LibreTranslate's clients send text, not files."""
ADDRESSES = 4096
"""Client addresses the rate limit remembers before it forgets those quiet for a minute."""


class ApiError(Exception):
    """A request refused: its HTTP status and LibreTranslate's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class Limits:
    """What one request may ask (``-1``: no limit): characters per text, texts per request, requests per minute from
    one address, alternatives, seconds of translation (answered 503 when over); ``api_keys``: when given,
    ``/translate`` and ``/attention`` require one of them."""

    char_limit: int = -1
    batch_limit: int = -1
    req_limit: int = -1
    alternatives_limit: int = 4
    api_keys: frozenset[str] | None = None
    timeout: float = -1


def read_api_keys(path: str) -> frozenset[str]:
    """The keys in ``path``, one a line (blank lines and ``#`` comments ignored)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"--api-keys {path}: cannot read it ({error})") from None
    keys = frozenset(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise UserError(f"--api-keys {path} holds no key: one key a line")
    return keys


# --- the worker ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Texts:
    """A request's texts for the worker, their pair of languages (``None``: the first run's own), and whether they
    are split into sentences (``None``: as the server does)."""

    texts: list[str]
    pair: tuple[str, str] | None
    split: bool | None = None


class Batcher:
    """Texts from concurrent requests, translated together by ``engine`` (:class:`Lines`, which takes each
    request's texts line by line); each request gets its own answers, in order. ``run`` jobs (the page's attention,
    alternatives) take the worker alone, in turn with the engine's steps. The worker is :meth:`work`: on a thread of
    its own, or, with
    ``thread=False``, on whichever thread calls it (``serve`` gives it the main thread: PyTorch's CPU threads wake
    fastest for it). :meth:`close` lets it finish what was queued, then stop.

    A request that nobody waits for any more (its client left, or its ``timeout`` passed) is cancelled: the worker
    drops it at its next step, with its sentences."""

    STOP = object()

    def __init__(self, engine: Lines, *, thread: bool = True) -> None:
        self.engine = engine
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.busy_since: float | None = None  # when the worker began the step or job it is on; None when idle
        self.alone: collections.deque[tuple[Callable[[], Any], Future]] = collections.deque()  # jobs waiting their turn
        self.credit = 0.0  # seconds a job that runs alone may take now (< 0: the steps' time it must wait)
        self.thread = threading.Thread(target=self.work, name="translation worker", daemon=True) if thread else None
        if self.thread is not None:
            self.thread.start()

    async def texts(
        self,
        texts: list[str],
        *,
        pair: tuple[str, str] | None = None,
        split: bool | None = None,
        request: Request | None = None,
        timeout: float = -1,
    ) -> Translated:
        """``texts`` translated (from ``pair[0]`` into ``pair[1]``; ``None``: the first run's pair), sentence by
        sentence unless ``split`` is ``False`` (``None``: as the server does); an :class:`ApiError` when
        ``request``'s client leaves first (499) or ``timeout`` seconds (``-1``: no limit) pass first (503), and then
        the worker drops them."""
        return await self._submit(Texts(texts, pair, split), request, timeout)

    async def run(self, call: Callable[[], Any], *, request: Request | None = None, timeout: float = -1) -> Any:
        """``call()`` on the worker, alone; cancelled as :meth:`texts` is, unless it has begun."""
        return await self._submit(call, request, timeout)

    async def _submit(self, work: Any, request: Request | None, timeout: float) -> Any:
        future: Future = Future()
        self.jobs.put((work, future))
        answer = asyncio.wrap_future(future)
        waits = [answer] if request is None else [answer, asyncio.ensure_future(_client_left(request))]
        try:
            done, _ = await asyncio.wait(
                waits, timeout=None if timeout < 0 else timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:  # also when this request's task is cancelled (the server stopping)
            for waiting in waits[1:]:
                waiting.cancel()
            future.cancel()  # nobody waits for it now: the worker drops it (done already: no effect)
        if answer in done:
            return answer.result()
        if done:
            raise ApiError(499, "Client closed request")  # nobody reads it
        raise ApiError(503, f"Translation took longer than this server allows ({timeout:g} seconds): try shorter texts")

    def close(self) -> None:
        self.jobs.put(self.STOP)
        if self.thread is not None:
            self.thread.join()

    def stalled(self) -> float | None:
        """How long the worker has been on one step or job, when that is over :data:`STALLED_AFTER` seconds."""
        since = self.busy_since
        busy = None if since is None else time.monotonic() - since
        return busy if busy is not None and busy > STALLED_AFTER else None

    def work(self) -> None:
        """Take the jobs until :meth:`close`: each request's texts added to the engine as they come, between its
        steps; a job that runs alone (alternatives, attention) when its turn comes: at once when nothing is being
        translated, else once the steps since the last such job have had their share of the worker's time
        (:data:`ALONE_SHARE` to the jobs)."""
        engine, stopping = self.engine, False
        while not stopping or len(engine) or self.alone:
            while not stopping:  # what is queued; waiting for it only when there is nothing to do
                busy = bool(len(engine) or self.alone)
                try:
                    job = self.jobs.get_nowait() if busy else self.jobs.get(timeout=WAKE)
                except queue.Empty:
                    if busy:
                        break
                    continue
                if job is self.STOP:
                    stopping = True
                    break
                work, future = job
                if callable(work):
                    self.alone.append((work, future))
                elif not future.done():  # not cancelled while it was queued
                    add = functools.partial(engine.add, work.texts, future, pair=work.pair, split=work.split)
                    self._run(future, add)
            if not len(engine):
                self.credit = 0.0  # nothing to be fair to
            if self.alone and self.credit >= 0:
                work, future = self.alone.popleft()
                if not future.done():
                    started = time.monotonic()
                    self._run(future, work, answer=True)
                    self.credit -= time.monotonic() - started
            if len(engine):
                started = time.monotonic()
                self._run(None, engine.step)
                self.credit = min(0.0, self.credit + (time.monotonic() - started) * ALONE_SHARE / (1 - ALONE_SHARE))

    def _run(self, future: Future | None, call: Callable[[], Any], *, answer: bool = False) -> None:
        """``call()``, its time marked busy; its result ``future``'s with ``answer``, its error ``future``'s (``None``:
        every request being translated)."""
        self.busy_since = time.monotonic()
        try:
            result = call()
            if answer and future is not None:
                settle(future, result)
        except Exception as error:  # the request's to answer (or the engine's); the worker goes on
            if future is None:
                self.engine.fail(error)
            else:
                settle(future, error=error)
        self.busy_since = None


async def _client_left(request: Request) -> None:
    """Returns when ``request``'s client disconnects (its body already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


Pair = tuple[str, str]
"""A source and a target language, as clients name them."""


@dataclass
class _Slot:
    """A run served: as first loaded (its languages and tokenizers; its model released beyond ``--max-loaded``), how
    to load it again, and while loaded its translator, engine and translators of its pairs."""

    first: Translator
    load: Callable[[], Translator] | None
    translator: Translator | None = None
    engine: StreamingTranslator | RoundTranslator | None = None
    views: dict[Pair, Translator] = field(default_factory=dict)
    used: float = 0.0


class Engines:
    """The engines of the runs served (each a :class:`Translating`), one a run, as one whose requests name their pair
    (the default: the first run's): a request goes to the engine of the run ``owner`` says serves its pair, loading the
    run where it is not loaded (with ``max_loaded``, the least recently used idle run is released first; a request
    waits while none is idle); a step steps every engine that has work, so that no run waits for another's requests
    to end."""

    def __init__(
        self,
        runs: Sequence[tuple[Translator, Sequence[str]]],
        make: Callable[[Translator], StreamingTranslator | RoundTranslator],
        owner: Callable[[Pair], int],
        *,
        loaders: Sequence[Callable[[], Translator]] | None = None,
        max_loaded: int | None = None,
    ) -> None:
        self.make, self.owner, self.max_loaded = make, owner, max_loaded
        self.slots = [_Slot(run, None if loaders is None else loaders[index]) for index, (run, _) in enumerate(runs)]
        self.own = [(langs[0], langs[1]) for _, langs in runs]  # each run's pair, its translator's own
        for slot in self.slots:
            if slot.first.model is not None:
                slot.translator, slot.engine = slot.first, make(slot.first)
        self.deferred: list[tuple[Sequence[str], Future, Finish, Pair | None, bool | None]] = []

    def __len__(self) -> int:
        return sum(len(slot.engine) for slot in self.slots if slot.engine is not None) + len(self.deferred)

    def loaded(self) -> list[int]:
        return [index for index, slot in enumerate(self.slots) if slot.translator is not None]

    def translator(self, pair: Pair | None) -> Translator | None:
        """The translator of ``pair`` (``None``: the first run's own), its run loaded; ``None`` while its run cannot
        be loaded (every loaded run busy at ``max_loaded``)."""
        index = 0 if pair is None else self.owner(pair)
        slot = self.slots[index]
        if slot.translator is None and not self._load(index):
            return None
        slot.used = time.monotonic()
        if pair is None or self.own[index] == pair:
            return slot.translator
        found = slot.views.get(pair)
        if found is None and slot.translator is not None:
            marked = slot.translator.language_tokens
            found = slot.translator.for_languages(pair[0] if marked and marked.sources else None, pair[1])
            slot.views[pair] = found
        return found

    def _load(self, index: int) -> bool:
        loaded = self.loaded()
        if self.max_loaded is not None and len(loaded) >= self.max_loaded:
            idle = [i for i in loaded if not len(self.slots[i].engine or ())]
            if len(loaded) - len(idle) >= self.max_loaded:
                return False
            gone = min(idle, key=lambda i: self.slots[i].used)
            released = self.slots[gone]
            if released.translator is not None:
                released.translator.release()
            released.translator, released.engine, released.views = None, None, {}
            say(f"released {self.slots[gone].first.checkpoint.path.parents[1].name} (--max-loaded "
                f"{self.max_loaded})", sys.stderr)  # fmt: skip
        slot = self.slots[index]
        if slot.load is None:
            raise RuntimeError("a run released without a way to load it again")
        slot.translator = slot.load()
        slot.engine = self.make(slot.translator)
        say(f"loaded {slot.first.checkpoint.path.parents[1].name}", sys.stderr)
        return True

    def add(
        self,
        texts: Sequence[str],
        future: Future,
        finish: Finish = lambda translated: translated,
        pair: Pair | None = None,
        split: bool | None = None,
    ) -> None:
        translator = self.translator(pair)
        if translator is None:
            self.deferred.append((texts, future, finish, pair, split))
            return
        index = 0 if pair is None else self.owner(pair)
        engine = self.slots[index].engine
        assert engine is not None  # loaded just now
        engine.add(texts, future, finish, translator if split is None else translator.splitting(split))

    def step(self) -> None:
        waiting, self.deferred = self.deferred, []
        for texts, future, finish, pair, split in waiting:
            if not future.done():
                self.add(texts, future, finish, pair, split)
        for slot in self.slots:
            if slot.engine is not None and len(slot.engine):
                slot.engine.step()

    def fail(self, error: BaseException) -> None:
        for slot in self.slots:
            if slot.engine is not None:
                slot.engine.fail(error)
        for _, future, *_ in self.deferred:
            settle(future, error=error)
        self.deferred = []


class Lines:
    """An :class:`Engines` whose requests' texts are translated line by line, as ``translate`` translates lines (a
    blank line stays blank)."""

    def __init__(self, engine: Engines) -> None:
        self.engine = engine

    def __len__(self) -> int:
        return len(self.engine)

    def add(
        self,
        texts: Sequence[str],
        future: Future,
        finish: Finish = lambda translated: translated,
        pair: Pair | None = None,
        split: bool | None = None,
    ) -> None:
        lines, flat = split_lines(texts)
        self.engine.add(flat, future, lambda translated: finish(join_lines(texts, lines, translated)), pair, split)

    def step(self) -> None:
        self.engine.step()

    def fail(self, error: BaseException) -> None:
        self.engine.fail(error)


def split_lines(texts: Sequence[str]) -> tuple[list[list[str]], list[str]]:
    """Each text's lines, and all of them in one list."""
    lines = [text.replace("\r\n", "\n").replace("\r", "\n").split("\n") for text in texts]
    return lines, [line for text_lines in lines for line in text_lines]


def join_lines(texts: Sequence[str], lines: list[list[str]], translated: Translated) -> Translated:
    """Each text's translation from its lines' ``translated`` (all of them, in order; a blank text as it came), and
    the sentences of its lines that the guard doubts."""
    each, doubts = iter(translated.texts), iter(translated.doubtful)
    joined = ["\n".join(next(each) for _ in text_lines) for text_lines in lines]
    doubtful = [[found for _ in text_lines for found in next(doubts)] for text_lines in lines]
    return Translated([text if not text.strip() else out for text, out in zip(texts, joined, strict=True)], doubtful)


class RateLimiter:
    """At most ``per_minute`` requests from one address in any 60 seconds."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self.seen: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)

    def check(self, address: str) -> None:
        if self.per_minute < 0:
            return
        now, times = time.monotonic(), self.seen[address]
        while times and times[0] <= now - 60:
            times.popleft()
        if len(times) >= self.per_minute:
            raise ApiError(429, f"Slowdown: {self.per_minute} per 1 minute")
        times.append(now)
        if len(self.seen) > ADDRESSES:  # forget the addresses quiet for a minute
            recent = {seen: times for seen, times in self.seen.items() if times[-1] > now - 60}
            self.seen = collections.defaultdict(collections.deque, recent)


# --- the service ----------------------------------------------------------------------------------------------


class Service:
    """The runs served (``translator`` and its pair ``langs``, the default; ``more``: other runs, each with its pair),
    the pairs of languages they serve (a model that marks its languages with tokens serves every pair it has; a pair
    two runs serve goes to the one named first; a pair none serves goes through a language both legs share, English
    first: :meth:`legs`), the search they translate with, and the worker, which steps each run's engine in turn."""

    def __init__(
        self,
        translator: Translator,
        langs: Sequence[str],
        *,
        more: Sequence[tuple[Translator, Sequence[str]]] = (),
        search: SearchOptions = TRANSLATION,
        thread: bool = True,
        loaders: Sequence[Callable[[], Translator]] | None = None,
        max_loaded: int | None = None,
    ) -> None:
        self.translator, self.source, self.target = translator, langs[0], langs[1]
        self.search = search
        self.runs = [(translator, langs), *more]
        self.direct: dict[tuple[str, str], int] = {}
        """Each pair a run serves (the codes clients send) -> the first run named that serves it."""
        for index, (run, (source, target, *_)) in enumerate(self.runs):
            for code, targets in served_pairs(run, source, target).items():
                for other in targets:
                    if other != code:  # a multilingual OPUS-MT model's own source among its targets
                        self.direct.setdefault((code, other), index)
        codes = list(dict.fromkeys(code for pair in self.direct for code in pair))
        self.pivots = pivots(self.direct, codes)
        reachable = {*self.direct, *self.pivots}
        self.pairs = {
            source: [target for target in codes if (source, target) in reachable]
            for source in codes
            if any(pair[0] == source for pair in reachable)
        }
        """Each source language's targets, the first run's source first."""
        self.identifier = LanguageIdentifier(list(dict.fromkeys([self.source, *codes])))
        kind = StreamingTranslator if search.strategy.one_row else RoundTranslator
        self.engines = Engines(
            self.runs, lambda run: kind(run, rows=GATHER, search=search), self.direct.__getitem__,
            loaders=loaders, max_loaded=max_loaded,
        )  # fmt: skip
        self.batcher = Batcher(Lines(self.engines), thread=thread)

    def loaded(self, leg: Pair) -> Translator:
        """On the worker: the translator of ``leg``, its run loaded (a job that runs alone may release another)."""
        found = self.engines.translator(leg)
        if found is None:
            raise ApiError(503, "Every model this server may hold at once is busy: try again shortly")
        return found

    def hypotheses(self, legs: Sequence[Pair], texts: list[str], count: int) -> list[list[str]]:
        """On the worker: each text's ``count`` best translations through ``legs`` (a pair, or a pivot's two: those of
        the first leg's best translation) from a beam search at least 2 and ``count`` wide, with the service's length
        penalty and limit (a blank text: itself)."""
        search = SearchOptions(
            beam_size=max(self.search.beam_size, count, 2), length_penalty=self.search.length_penalty, n_best=count,
            max_length=self.search.max_length,
        )  # fmt: skip
        sources = texts
        for leg in legs[:-1]:
            sources = self.loaded(leg).translate(sources, search=self.search)
        found = self.loaded(legs[-1]).hypotheses(sources, search)
        return [[text] if not text.strip() else best for text, best in zip(texts, found, strict=True)]

    def targets(self) -> list[str]:
        return list(dict.fromkeys(code for targets in self.pairs.values() for code in targets))

    def languages(self) -> list[dict[str, Any]]:
        """LibreTranslate's ``/languages``: every language served, with the targets it translates into; beyond
        LibreTranslate's keys, ``model_codes``, each run's model's own code of it, where its model marks languages with
        tokens (NLLB's ``kor_Hang`` for ``ko``), and, with several runs, ``runs``, which runs serve each target (two for
        a pivot)."""
        found = []
        for code in dict.fromkeys([*self.pairs, *self.targets()]):
            targets = self.pairs.get(code, [])
            entry: dict[str, Any] = {"code": code, "name": language_name(code), "targets": targets}
            owns = {self.name(index): own for index, (run, _) in enumerate(self.runs) if (own := own_code(run, code))}
            if owns:
                entry["model_codes"] = owns
            if len(self.runs) > 1:
                entry["runs"] = {target: [self.name(run) for run in self.route_of(code, target)] for target in targets}
            found.append(entry)
        return found

    def name(self, index: int) -> str:
        """Run ``index``'s name: its directory's."""
        return self.runs[index][0].checkpoint.path.parents[1].name

    def route_of(self, source: str, target: str) -> list[int]:
        """The runs a pair goes through: one, or two through its pivot."""
        if (source, target) in self.direct:
            return [self.direct[(source, target)]]
        middle = self.pivots[(source, target)]
        return [self.direct[(source, middle)], self.direct[(middle, target)]]

    def code(self, requested: str) -> str:
        """The served code of the language ``requested`` (:func:`closest_code`: ``zh-TW`` is ``zh-Hant``)."""
        found = closest_code(requested, list(dict.fromkeys([*self.pairs, *self.targets()])))
        if found is None:
            raise ApiError(400, f"{requested} is not supported")
        return found

    def legs(self, source: str, target: str) -> list[Pair]:
        """The pairs a translation from ``source`` into ``target`` (served codes) goes through: itself, or its pivot's
        two; refused as LibreTranslate refuses a pair it lacks."""
        if target not in self.pairs.get(source, []):
            raise ApiError(
                400,
                f"{language_name(target)} ({target}) is not available as a target language from "
                f"{language_name(source)} ({source})",
            )
        if (source, target) in self.pivots:
            middle = self.pivots[(source, target)]
            return [(source, middle), (middle, target)]
        return [(source, target)]

    def route(self, texts: list[str], source: str, target: str) -> tuple[str, list[Detected] | None, list[str]]:
        """A request's ``target`` as served, each text's language as ``/detect`` finds it (``source: "auto"``, else
        ``None``), and each text's source language as served."""
        chosen, target = None if source == "auto" else self.code(source), self.code(target)
        if chosen is not None:
            return target, None, [chosen] * len(texts)
        detected = [self.identifier.detect(text)[0] for text in texts]
        return target, detected, [self.source_of(found, target) for found in detected]

    def source_of(self, found: Detected, target: str) -> str:
        """The source language of a text ``found`` in (``source: "auto"``): the language it is identified in, refused
        as ``source`` naming it is where nothing translates it into ``target`` (as LibreTranslate does: another
        language's model would only garble it); for a text identified in none, or in ``target`` (kept as it is), the
        run's source where it translates into ``target``, else the first that does."""
        if found.identified and found.language != target:
            self.legs(found.language, target)  # refused where no run, nor a pivot, goes into target
            return found.language
        if target in self.pairs.get(self.source, []):
            return self.source
        return next((code for code, targets in self.pairs.items() if target in targets), self.source)


PIVOT = "en"
"""The language a pair no run serves goes through first, where both legs are served (as Argos Translate does)."""


def pivots(direct: Collection[tuple[str, str]], codes: Sequence[str]) -> dict[tuple[str, str], str]:
    """The pairs of ``codes`` that no run serves (``direct``) but two do through one language: that language,
    :data:`PIVOT` where it can, else the first that can."""
    found = {}
    for source in codes:
        for target in codes:
            if source == target or (source, target) in direct:
                continue
            middles = [code for code in (PIVOT, *codes) if (source, code) in direct and (code, target) in direct]
            if middles:
                found[(source, target)] = middles[0]
    return found


def served_pairs(translator: Translator, source: str, target: str) -> dict[str, list[str]]:
    """The pairs a run serves, as the codes clients send (:meth:`LanguageTokens.public`: NLLB's ``kor_Hang`` is
    ``ko``): its own, ``source`` into ``target``; with a model that marks its languages with tokens, every pair it has
    (M2M100's and NLLB's: each language into every other; a multilingual OPUS-MT model's: ``source`` into each of its
    targets)."""
    tokens = translator.language_tokens
    if tokens is None:
        return {source: [target]}
    targets = list(dict.fromkeys(tokens.public(code, target=True) for code in tokens.targets))
    targets += [] if target in targets else [target]
    if not tokens.sources:
        return {source: targets}
    sources = list(dict.fromkeys([source, *(tokens.public(code, target=False) for code in tokens.sources)]))
    return {code: [other for other in targets if other != code] for code in sources}


def own_code(translator: Translator, code: str) -> str | None:
    """The run's model's own code of the served language ``code`` (NLLB's ``kor_Hang`` for ``ko``), where the model
    marks languages with tokens and has it."""
    tokens = translator.language_tokens
    return None if tokens is None else tokens.own_code(code)


async def _arguments(request: Request) -> dict[str, Any]:
    """The request's parameters, as LibreTranslate's ``request.values``: its query string's, under its body's."""
    return {**_fields(request.scope.get("query_string", b""), "query string"), **await _body_arguments(request)}


def _fields(encoded: bytes, what: str) -> dict[str, str]:
    """The fields of URL-encoded ``encoded`` (a form, or a query string), the first of a name repeated."""
    try:
        fields = parse_qs(encoded.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        raise ApiError(400, f"Invalid request: the {what} is not UTF-8") from None
    return {key: values[0] for key, values in fields.items()}


async def _body_arguments(request: Request) -> dict[str, Any]:
    """The request body's parameters: its JSON object, or its form fields; refused when too large or malformed."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > BODY_LIMIT:
        raise ApiError(413, f"Request body too large: {length} bytes, at most {BODY_LIMIT}")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > BODY_LIMIT:
            raise ApiError(413, f"Request body too large: more than {BODY_LIMIT} bytes")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json":
        try:
            arguments = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "Invalid JSON format") from None
        if not isinstance(arguments, dict):
            raise ApiError(400, "Invalid JSON format")
        return arguments
    if kind == "multipart/form-data":

        async def replay() -> dict[str, Any]:  # the body already read, for Starlette to parse the form from
            return {"type": "http.request", "body": body, "more_body": False}

        form = await Request(request.scope, replay).form()
        return {key: value for key, value in form.items() if isinstance(value, str)}
    return _fields(body, "form")


def _require_q(q: Any) -> None:
    if q is None or q == "" or q == []:
        raise ApiError(400, "Invalid request: missing q parameter")


def _texts(q: Any, limits: Limits) -> list[str]:
    """``q`` as a list of texts, checked against the limits."""
    _require_q(q)
    texts = q if isinstance(q, list) else [q]
    if not all(isinstance(text, str) for text in texts):
        raise ApiError(400, "Invalid request: q parameter must be a string or a list of strings")
    if isinstance(q, list) and limits.batch_limit != -1 and len(q) > limits.batch_limit:
        raise ApiError(400, f"Invalid request: request ({len(q)}) exceeds text limit ({limits.batch_limit})")
    for number, text in enumerate(texts, start=1):
        if limits.char_limit != -1 and len(text) > limits.char_limit:
            raise ApiError(400, f"Invalid request: request ({len(text)}) exceeds text limit ({limits.char_limit})")
        if (problem := not_text(text)) is not None:
            where = f"text {number} of q" if isinstance(q, list) else "q"
            raise ApiError(400, f"Invalid request: {where} holds {problem}")
    return texts


class Endpoints:
    """The HTTP endpoints of ``service`` under ``limits``: each a Starlette handler."""

    def __init__(self, service: Service, limits: Limits) -> None:
        self.service, self.limits = service, limits
        self.rate = RateLimiter(limits.req_limit)
        self.page = page()

    def checked_access(self, arguments: dict[str, Any], request: Request) -> None:
        """LibreTranslate's order: the API key, then the rate limit."""
        if self.limits.api_keys is not None:
            key = arguments.get("api_key")
            if key and key not in self.limits.api_keys:
                raise ApiError(403, "Invalid API key")
            if not key:
                raise ApiError(400, "Please contact the server operator to get an API key")
        self.rate.check(request.client.host if request.client else "")

    async def translate(self, request: Request) -> JSONResponse:
        arguments = await _arguments(request)
        self.checked_access(arguments, request)
        service, q = self.service, arguments.get("q")
        _require_q(q)
        source, target = _text_argument(arguments, "source"), _text_argument(arguments, "target")
        if source is None or target is None:
            raise ApiError(400, f"Invalid request: missing {'source' if source is None else 'target'} parameter")
        alternatives = self.alternatives(arguments)
        texts = _texts(q, self.limits)
        text_format = _text_argument(arguments, "format") or "text"
        if text_format not in ("text", "html"):
            raise ApiError(400, f"{text_format} format is not supported")
        shown = [visible_text(text) for text in texts] if text_format == "html" else texts  # what detection reads
        target, detected, sources = service.route(shown, source, target)
        translators = {code: service.legs(code, target) for code in dict.fromkeys(sources)}
        others: list[list[str]] = [[] for _ in texts]  # alternatives: none for HTML, as LibreTranslate
        # A text already in the target language (source "auto") is kept as it is; the others go by their sources.
        kept = [found.language == target for found in detected] if detected else [False] * len(texts)
        groups: dict[str, list[int]] = {}
        for index, (code, keep) in enumerate(zip(sources, kept, strict=True)):
            if not keep:
                groups.setdefault(code, []).append(index)

        split = _flag_argument(arguments, "split")
        doubtful: list[list[str]] = [[] for _ in texts]  # each text's sentences whose translation the guard doubts
        translated = list(texts)
        if text_format == "html":
            for code, indices in groups.items():
                for index in indices:
                    through = self.through(translators[code], request, split, doubtful, [index])
                    translated[index] = await translate_html(texts[index], through)
        elif alternatives:
            for code, indices in groups.items():
                for index in indices:
                    found = await self.best(translators[code], texts[index], alternatives + 1, request)
                    translated[index] = found[0]
                    others[index] = [other for other in dict.fromkeys(found[1:]) if other != found[0]]
        else:
            done = await asyncio.gather(*(
                self.through(translators[code], request, split, doubtful, indices)([texts[i] for i in indices])
                for code, indices in groups.items()
            ))  # fmt: skip
            for indices, outputs in zip(groups.values(), done, strict=True):
                for index, output in zip(indices, outputs, strict=True):
                    translated[index] = output
        return JSONResponse(_answer(q, translated, detected=detected, alternatives=alternatives and others,
                                    doubtful=doubtful))  # fmt: skip

    def through(
        self, legs: list[Pair], request: Request, split: bool | None, doubtful: list[list[str]], into: Sequence[int]
    ) -> Callable[[list[str]], Awaitable[list[str]]]:
        """What translates a request's texts through ``legs`` (a pivot's second leg translates the first's texts),
        split into sentences as ``split`` says, adding the source sentences the guard doubts in its ``i``-th text to
        ``doubtful[into[i]]`` (an HTML text's pieces, all of them to ``doubtful[into[0]]``)."""

        async def translate(texts: list[str]) -> list[str]:
            for leg in legs:
                done = await self.service.batcher.texts(
                    texts, pair=leg, split=split, request=request, timeout=self.limits.timeout
                )
                for index, found in enumerate(done.doubtful):
                    doubtful[into[min(index, len(into) - 1)]] += [sentence for sentence, _ in found]
                texts = done.texts
            return texts

        return translate

    async def best(self, legs: list[Pair], text: str, count: int, request: Request) -> list[str]:
        """The ``count`` best translations of ``text`` through ``legs``, line by line (the ``i``-th best of each line,
        joined): each line's beam search is a job of its own on the worker, so that the requests being streamed take
        their steps between them."""
        lines, _ = split_lines([text])
        found = []
        for line in lines[0]:
            job = functools.partial(self.service.hypotheses, legs, [line], count)
            (best,) = await self.service.batcher.run(job, request=request, timeout=self.limits.timeout)
            found.append(best)
        return ["\n".join(line[min(i, len(line) - 1)] for line in found) for i in range(count)]

    def alternatives(self, arguments: dict[str, Any]) -> int:
        """The ``alternatives`` asked: a JSON integer, or a form's string of one (``true``, ``1.5``: not a number)."""
        count = arguments.get("alternatives", 0)
        if isinstance(count, str):
            with contextlib.suppress(ValueError):
                count = int(count)
        if isinstance(count, bool) or not isinstance(count, int):
            raise ApiError(400, "Invalid request: alternatives parameter is not a number")
        if count < 0:
            raise ApiError(400, "Invalid request: alternatives parameter must be >= 0")
        if self.limits.alternatives_limit != -1 and count > self.limits.alternatives_limit:
            raise ApiError(400, f"Invalid request: alternatives parameter must be <= {self.limits.alternatives_limit}")
        return count

    async def attention(self, request: Request) -> JSONResponse:
        arguments = await _arguments(request)
        self.checked_access(arguments, request)
        (text,) = _texts(_text_argument(arguments, "q"), self.limits)
        sentence = next((line for line in text.splitlines() if line.strip()), None)
        if sentence is None:
            raise ApiError(400, "Invalid request: q holds no text")
        service = self.service
        source, target = _text_argument(arguments, "source"), _text_argument(arguments, "target")
        source, target = service.code(source or service.source), service.code(target or service.target)
        legs = service.legs(source, target)
        if len(legs) > 1:
            middle = language_name(service.pivots[(source, target)])
            raise ApiError(400, f"{language_name(source)} ({source}) to {language_name(target)} ({target}) goes "
                           f"through {middle}: no one model's attention")  # fmt: skip
        found = await service.batcher.run(
            lambda: service.loaded(legs[0]).attention(sentence, search=service.search),
            request=request, timeout=self.limits.timeout,
        )  # fmt: skip
        return JSONResponse(attention_view(found))

    async def detect(self, request: Request) -> JSONResponse:
        arguments = await _arguments(request)
        self.checked_access(arguments, request)
        q = arguments.get("q")
        texts = _texts(q, self.limits)
        found = [[each.as_json() for each in self.service.identifier.detect(text)] for text in texts]
        return JSONResponse(found if isinstance(q, list) else found[0])  # a list of texts: each text's candidates

    async def languages(self, request: Request) -> JSONResponse:
        return JSONResponse(self.service.languages())

    async def health(self, request: Request) -> JSONResponse:
        """``{"status": "ok"}`` (LibreTranslate's answer) while the worker makes progress; 503 with how long it has
        been on one step or job once that is over :data:`STALLED_AFTER` seconds."""
        stalled, service = self.service.batcher.stalled(), self.service
        if stalled is None:
            loaded = {"loaded": [service.name(index) for index in service.engines.loaded()]}
            return JSONResponse({"status": "ok", **(loaded if len(service.runs) > 1 else {})})
        message = f"the translation worker has been on one step for {stalled:.0f} seconds"
        return JSONResponse({"status": "stalled", "error": message}, status_code=503)

    async def settings(self, request: Request) -> JSONResponse:
        keys, service = self.limits.api_keys is not None, self.service
        return JSONResponse(
            {
                "charLimit": self.limits.char_limit, "frontendTimeout": 500, "apiKeys": keys, "keyRequired": keys,
                "suggestions": False, "filesTranslation": False, "supportedFilesFormat": [],
                "language": {
                    "source": {"code": service.source, "name": language_name(service.source)},
                    "target": {"code": service.target, "name": language_name(service.target)},
                },
            }
        )  # fmt: skip

    async def favicon(self, request: Request) -> Response:
        """No icon (204): a browser's request for one is answered without an error in the log."""
        return Response(status_code=204)

    async def index(self, request: Request) -> HTMLResponse:
        return HTMLResponse(self.page)

    @staticmethod
    async def refused(request: Request, error: Exception) -> JSONResponse:
        if isinstance(error, ApiError):
            return JSONResponse({"error": error.message}, status_code=error.status)
        if isinstance(error, HTTPException):
            return JSONResponse({"error": str(error.detail)}, status_code=error.status_code)
        if isinstance(error, UserError):  # the translator's own refusal (e.g. a sentence too long to plot)
            return JSONResponse({"error": str(error)}, status_code=400)
        return JSONResponse({"error": f"Internal error: {type(error).__name__}"}, status_code=500)


def _text_argument(arguments: dict[str, Any], name: str) -> str | None:
    value = arguments.get(name)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"Invalid request: {name} parameter must be a string")
    if value and (problem := not_text(value)) is not None:
        raise ApiError(400, f"Invalid request: {name} holds {problem}")
    return value or None


def _answer(
    q: Any, translated: list[str], *, detected: list[Detected] | None, alternatives: Any, doubtful: list[list[str]]
) -> dict[str, Any]:
    """``/translate``'s answer, each field one value or, where ``q`` is a list, a list: ``translatedText``, and
    where there are any ``detectedLanguage``, ``alternatives`` (each text's list) and ``doubtful`` (each text's
    sentences the guard doubts, each once: an HTML text's pieces may translate one more than once)."""
    fields: dict[str, Any] = {"translatedText": translated}
    if detected:
        fields["detectedLanguage"] = [found.as_json() for found in detected]
    if alternatives:
        fields["alternatives"] = alternatives
    if any(doubtful):
        fields["doubtful"] = [list(dict.fromkeys(sentences)) for sentences in doubtful]
    return {name: value if isinstance(q, list) else value[0] for name, value in fields.items()}


def _flag_argument(arguments: dict[str, Any], name: str) -> bool | None:
    """A yes/no parameter: JSON's ``true``/``false``, or a form's ``true``/``false``/``1``/``0``; ``None`` when
    absent."""
    value = arguments.get(name)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise ApiError(400, f"Invalid request: {name} parameter must be true or false, received {value!r}")


def create_app(service: Service, limits: Limits) -> Starlette:
    """The Starlette application of ``service`` under ``limits``."""
    endpoints = Endpoints(service, limits)
    routes = [
        Route("/", endpoints.index, methods=["GET"]),
        Route("/translate", endpoints.translate, methods=["POST"]),
        Route("/attention", endpoints.attention, methods=["POST"]),
        Route("/detect", endpoints.detect, methods=["POST"]),
        Route("/favicon.ico", endpoints.favicon, methods=["GET"]),
        Route("/languages", endpoints.languages, methods=["GET", "POST"]),
        Route("/health", endpoints.health, methods=["GET"]),
        Route("/frontend/settings", endpoints.settings, methods=["GET"]),
    ]
    handlers = {error: endpoints.refused for error in (ApiError, HTTPException, UserError, Exception)}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(service.batcher.close)  # after the last request: what was queued is answered

    return Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)


# --- the command ----------------------------------------------------------------------------------------------


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: a free port), listening; refused in one line when it cannot be."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, protocol)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as error:
        raise UserError(f"cannot listen on --host {host} --port {port}: {error.strerror or error}") from None
    sock.set_inheritable(True)
    return sock


def _load_run(
    run: str,
    *,
    checkpoint: str | None,
    device: str | None,
    quantize: str | None,
    normalize: str | None,
    langs: Sequence[str] | None,
    split_sentences: bool = True,
    guard: bool = True,
) -> tuple[Translator, Sequence[str]]:
    """A run's translator, and the pair it serves by default (:func:`_served_langs`)."""
    translator = Translator(run, checkpoint, device=device, quantize=quantize, normalize=normalize,
                            split_sentences=split_sentences, guard=guard)  # fmt: skip
    return translator, _served_langs(translator, langs, run)


def _service(
    loaders: Sequence[Callable[[], tuple[Translator, Sequence[str]]]],
    search: Callable[[Translator], SearchOptions],
    max_loaded: int | None,
) -> Service:
    """The service of the runs ``loaders`` load: each loaded in turn for its languages, those past ``max_loaded``
    released at once (loaded again when asked), searching as ``search`` says of the first run."""
    loaded: list[tuple[Translator, Sequence[str]]] = []
    for index, load in enumerate(loaders):
        loaded.append(load())
        if max_loaded is not None and index >= max_loaded:
            loaded[-1][0].release()
    (translator, langs), more = loaded[0], loaded[1:]
    reload = [functools.partial(_translator_only, load) for load in loaders]
    return Service(translator, langs, more=more, search=search(translator), thread=False, loaders=reload,
                   max_loaded=max_loaded)  # fmt: skip


def _translator_only(load: Callable[[], tuple[Translator, Sequence[str]]]) -> Translator:
    """What ``load`` loads, without its pair: a released run loaded again (its pair is known)."""
    return load()[0]


def _served_langs(translator: Translator, langs: Sequence[str] | None, run: str) -> Sequence[str]:
    """The pair ``serve`` defaults to: ``langs`` (of a model of many languages: the pair it chooses; of a run that
    records its one pair: that pair, another refused in one line; else the names of the run's languages), else the
    run's, else a built-in task's; refused in one line where there is none."""
    marked, named = translator.language_tokens, f"--langs {' '.join(langs or [])}"
    if langs and marked is not None:
        translator.choose_languages(langs[0] if marked.sources else None, langs[1], named=named)
        langs = translator.langs
    elif langs and translator.langs:
        if any(closest_code(code, [own]) != own for code, own in zip(langs, translator.langs, strict=True)):
            translator.choose_languages(*langs, named=named)  # refused, as translate --target-lang is: no tokens
        langs = translator.langs
    task = translator.checkpoint.options.get("task")
    langs = langs or translator.langs or ([task, f"{task}-out"] if task else None)
    if not langs:
        raise UserError(f"the run {run} does not record its languages: give --langs SRC TGT (ISO 639-1 codes)")
    return langs


def run_paths(given: Sequence[str]) -> list[str]:
    """The runs ``given`` names, in order: each a run directory, or a directory holding runs (those in it, by
    name)."""
    found = []
    for name in given:
        path = Path(name)
        inside = sorted(child for child in path.iterdir() if has_checkpoints(child)) if path.is_dir() else []
        found += [name] if has_checkpoints(path) or not inside else [str(child) for child in inside]
    return found


def _say_serving(service: Service, runs: Sequence[str], sock: socket.socket) -> None:
    """Where the service listens, what it serves by default, and each run's pairs."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    first, many = service.runs[0][0], len(service.runs) > 1
    served = f"{len(service.runs)} runs" if many else f"{runs[0]} (checkpoint {first.checkpoint.path.name})"
    pairs = sum(map(len, service.pairs.values()))
    others = f"; {pairs} pairs of {len(service.languages())} languages" if pairs > 1 else ""
    say(f"serving {served}, by default {pair_text([service.source, service.target])}{others}, at "
        f"http://{shown}:{port} (Ctrl-C stops)", sys.stderr)  # fmt: skip
    for index in range(len(service.runs)) if many else ():
        count = sum(owner == index for owner in service.direct.values())
        said = plural(count, "pair") if count else "no pair: the runs named before it serve all of its"
        say(f"  {service.name(index)}: {pair_text(service.runs[index][1])}; {said}", sys.stderr)


def serve(
    runs: Sequence[str],
    *,
    host: str,
    port: int,
    checkpoint: str | None,
    device: str | None,
    quantize: str | None,
    search: Callable[[Translator], SearchOptions],
    langs: Sequence[str] | None,
    limits: Limits,
    max_loaded: int | None = None,
    normalize: str | None = None,
    split_sentences: bool = True,
    guard: bool = True,
) -> int:
    """Serve ``runs`` (:func:`run_paths`) until SIGINT or SIGTERM: then new requests are refused, those in flight
    answered within :data:`DRAIN` seconds (those whose clients have left dropped), and it returns 0. ``search``: how
    every run searches, given the first run's translator (its defaults under the flags); ``langs``: the first run's
    pair; ``max_loaded``: the most runs whose models are held at once (:class:`Engines`); ``normalize``:
    the sources' punctuation normalizer, ``split_sentences``: whether texts are translated sentence by sentence unless
    a request says otherwise, ``guard``: whether doubted translations are searched again (:class:`Translator`). A run
    of a built-in task serves its inputs as the language ``TASK`` and its outputs as ``TASK-out`` unless ``langs`` says
    otherwise."""
    import uvicorn

    sock = listening_socket(host, port)
    load = functools.partial(_load_run, checkpoint=checkpoint, device=device, quantize=quantize, normalize=normalize,
                             split_sentences=split_sentences, guard=guard)  # fmt: skip
    loaders = [
        functools.partial(load, run, langs=None if index else langs) for index, run in enumerate(run_paths(runs))
    ]
    try:
        service = _service(loaders, search, max_loaded)
    except UserError:
        sock.close()
        raise
    config = uvicorn.Config(create_app(service, limits), log_level="warning", lifespan="on", timeout_keep_alive=5,
                            timeout_graceful_shutdown=int(DRAIN))  # fmt: skip
    server = uvicorn.Server(config)
    _say_serving(service, runs, sock)

    def stop(sig: int, frame: Any) -> None:
        """The first signal drains; a second stops without waiting for the requests in flight, quietly: uvicorn's
        reports of the tasks it then cancels (the requests', the application's lifespan) are not errors."""
        if server.should_exit:
            logging.getLogger("uvicorn.error").disabled = True
            server.force_exit = True
        server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)

    def run_server() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            service.batcher.close()  # stops the worker below, if the server's shutdown has not

    # The event loop on a thread, the translation on this (main) one.
    thread = threading.Thread(target=run_server, name="event loop")
    thread.start()
    service.batcher.work()
    thread.join()
    say("stopped", sys.stderr)
    return 0
