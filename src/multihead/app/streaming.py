"""Texts translated as they come, for ``serve``'s worker: requests' texts cut into the pieces the model reads (as
:meth:`Translator.translate` cuts them), given out in turn (:class:`Requests`), and decoded by one
:class:`multihead.engine.Engine` that sentences join and leave at every decoding step (continuous batching),
whatever their search: greedy, sampling, beam search, and each text's best few translations
(:class:`StreamingTranslator`).

In turn: each place that frees up in the running batch goes to the next request with pieces left, so a large text
shares the batch with the short requests that come after it instead of going before all of them; and while others
are being translated, one request holds at most :data:`SHARE` more places than all of them together, so that it
cannot swell the batch (and every step's time) far past what they need. Alone, a request takes every place. A
request whose future is done before its answer (cancelled: its client left, or its time ran out) is dropped at the
next step, its sentences with it. Pieces wait in one queue, the requests' turns: the stream is given only what joins
it at the next step (``Stream.room``), so a dropped request leaves no sentence waiting elsewhere.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from multihead.app.translate import TRANSLATION, Cut, Ids, Ranked, Translated, Translator, translation
from multihead.decoding import SearchOptions
from multihead.engine import Engine

SHARE = 8
"""How many more places than all the other requests together one request may hold while they are being translated."""


class Translating(Protocol):
    """What ``serve``'s worker drives, one a run: requests' texts added as they come, translated a step at a time."""

    def __len__(self) -> int:
        """Pieces being translated or waiting for a place."""
        ...

    def add(
        self, texts: Sequence[str], future: Future[Any], translator: Translator | None = None, *, best: int = 0
    ) -> None:
        """Queue ``texts``: their translations become ``future``'s result once all have been translated (a
        :class:`~multihead.app.translate.Translated`; with ``best``, each text's ``best`` best translations,
        ``list[list[str]]``). ``translator``: the engine's translator between other languages
        (:meth:`Translator.for_languages`), or splitting otherwise (:meth:`Translator.splitting`)."""
        ...

    def step(self) -> None:
        """Drop the requests nobody waits for, then translate a step: answer the requests that are done."""
        ...

    def fail(self, error: BaseException) -> None:
        """Drop every request, ``error`` their futures' exception."""
        ...


class Cutting(Protocol):
    """What scheduling reads of a translator (:class:`Translator`'s methods): texts cut into the pieces its model
    reads, and the pieces' translations (searched as the search says) checked and joined back into texts. A fake
    one tests :class:`Requests` without a model."""

    def pieces(self, texts: Sequence[str], names: Sequence[str] | None = None) -> tuple[list[Cut], list[Ids]]: ...

    def joined(
        self,
        cuts: Sequence[Cut],
        outputs: Sequence[Ids],
        search: SearchOptions = TRANSLATION,
        *,
        again: Mapping[int, Ids] | None = None,
    ) -> Translated: ...

    def doubts(self, cuts: Sequence[Cut], outputs: Sequence[Ids], search: SearchOptions) -> dict[int, str]: ...

    def wider(self, search: SearchOptions) -> SearchOptions: ...

    def joined_best(
        self, cuts: Sequence[Cut], found: Sequence[Ranked], count: int
    ) -> list[list[tuple[float | None, str]]]: ...


C = TypeVar("C", bound=Cutting)


@dataclass(eq=False)
class _Job(Generic[C]):
    """One request: the translator of its languages, its texts not yet cut into pieces (``uncut``, with their
    places), each text's pieces as far as they are cut, the pieces cut and not yet given out (index among the
    request's pieces, ids), the hypotheses of those that have ended (ranked, best first), how many are being
    translated; ``best``: how many translations of each text it asks for (0: one, checked and joined). Texts are cut
    as their pieces are wanted, so that a large request costs the worker no long pause when it comes."""

    translator: C
    uncut: deque[tuple[int, str]]
    future: Future[Any]
    best: int = 0
    again: dict[int, Ids] | None = None  # once its pieces are checked: the second tries of those the guard doubts
    doubted: set[int] = field(default_factory=set)
    pieces: list[Cut] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # each piece's source text
    kept: list[dict[str, str]] = field(default_factory=list)  # each piece's text's kept spans, by their stand-ins
    pending: deque[tuple[int, Ids]] = field(default_factory=deque)
    outputs: list[Ranked] = field(default_factory=list)
    running: int = 0

    @property
    def done(self) -> bool:
        return not (self.uncut or self.pending or self.running)


def settle(future: Future[Any], result: Any = None, error: BaseException | None = None) -> None:
    """``future``'s result (or ``error``), unless it is already done: cancelled while it was being translated."""
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError:  # cancelled meanwhile: nobody reads it
        pass


class Requests(Generic[C]):
    """Requests' pieces (token ids), given out in turn: one piece of each request with pieces left, round and round,
    each request holding at most :data:`SHARE` more than the others together while others are being translated.
    ``search``: what translated them (the guard searches again from it, :meth:`Translator.joined`)."""

    def __init__(self, translator: C, search: SearchOptions = TRANSLATION) -> None:
        self.translator, self.search = translator, search
        self.turns: deque[_Job[C]] = deque()  # the requests with pieces not yet given out, in turn
        self.live: list[_Job[C]] = []  # every request not yet answered
        self.running = 0  # pieces given out, not yet ended

    def __len__(self) -> int:
        """Pieces not yet given out, a text not yet cut counting as one."""
        return sum(len(job.pending) + len(job.uncut) for job in self.turns)

    def add(self, texts: Sequence[str], future: Future[Any], translator: C | None = None, *, best: int = 0) -> None:
        job = _Job(translator or self.translator, deque(enumerate(texts)), future, best)
        self.live.append(job)
        self._cut(job)  # its first piece, or the answer of blank texts
        if job.pending:
            self.turns.append(job)
        elif not job.running:  # answered (blank texts) or failed
            self.live.remove(job)

    def _cut(self, job: _Job[C]) -> None:
        """Cut ``job``'s texts until one of their pieces is pending, or none is left: then, if nothing of it is being
        translated, answer it. A text that cannot be cut fails its request alone, which the next step drops."""
        try:
            while job.uncut and not job.pending:
                index, text = job.uncut.popleft()
                (cut,), _ = job.translator.pieces([text], [f"text {index + 1}"])
                job.pending.extend(enumerate(cut.ids, start=len(job.outputs)))
                job.outputs += [[] for _ in cut.ids]
                job.pieces.append(cut)
                job.sources += cut.sources
                job.kept += [cut.kept] * len(cut.sources)
        except Exception as error:
            settle(job.future, error=error)
            return
        if job.done:
            self._finish(job)

    def _finish(self, job: _Job[C]) -> bool:
        """``job``'s pieces all translated: once, those the guard doubts are queued again, to be searched wider in the
        stream beside the others; else it is answered. Whether it was answered."""
        if not job.best and job.again is None:
            job.again = {}
            try:
                doubts = job.translator.doubts(job.pieces, [ranked[0][1] for ranked in job.outputs], self.search)
            except Exception as error:
                settle(job.future, error=error)
                return True
            if doubts:
                flat = [ids for cut in job.pieces for ids in cut.ids]
                job.doubted = set(doubts)
                job.pending.extend((index, flat[index]) for index in doubts)
                return False
        self._answer(job)
        return True

    def _answer(self, job: _Job[C]) -> None:
        """Answer ``job``, all of its pieces translated: their translations checked and joined, or each text's best
        joined (or the error that gave, its alone)."""
        try:
            if job.best:
                found = job.translator.joined_best(job.pieces, job.outputs, job.best)
                answer: Any = [[text for _, text in texts] for texts in found]
            else:
                outputs = [ranked[0][1] for ranked in job.outputs]
                answer = job.translator.joined(job.pieces, outputs, self.search, again=job.again)
        except Exception as error:
            settle(job.future, error=error)
            return
        settle(job.future, answer)

    def take(self, count: int, rows: Callable[[_Job[C], int], int] | None = None) -> list[tuple[_Job[C], int, Ids]]:
        """Pieces, in turn, that take at most ``count`` rows (``rows``: how many a request's piece takes; default
        one): (request, the piece's index in it, its ids)."""
        taken: list[tuple[_Job[C], int, Ids]] = []
        held_back: list[_Job[C]] = []
        while count > 0 and self.turns:
            job = self.turns.popleft()
            if len(self.live) > 1 and job.running >= self.running - job.running + SHARE:
                held_back.append(job)  # its share taken: its turn comes again when the others hold more
                continue
            count -= 1 if rows is None else rows(job, job.pending[0][0])
            if count < 0:  # its rows do not fit: its turn comes first next time
                held_back.append(job)
                break
            index, ids = job.pending.popleft()
            taken.append((job, index, ids))
            job.running += 1
            self.running += 1
            self._cut(job)
            if job.pending:
                self.turns.append(job)
        self.turns.extendleft(reversed(held_back))
        return taken

    def ended(self, job: _Job[C], index: int, hypotheses: Ranked) -> None:
        """Piece ``index`` of ``job`` translated as ``hypotheses`` (ranked, best first): the request answered once all
        of its pieces are."""
        if index in job.doubted and job.again is not None:
            job.again[index] = hypotheses[0][1]  # its second try
        else:
            job.outputs[index] = hypotheses
        job.running -= 1
        self.running -= 1
        if job.done:
            if self._finish(job):
                self.live.remove(job)
            else:
                self.turns.append(job)

    def drop_abandoned(self) -> set[_Job[C]]:
        """Forget the requests whose future is done before their answer (cancelled); those requests."""
        gone = {job for job in self.live if job.future.done()}
        if gone:
            self.live = [job for job in self.live if job not in gone]
            self.turns = deque(job for job in self.turns if job not in gone)
            self.running = sum(job.running for job in self.live)
        return gone

    def fail(self, error: BaseException) -> None:
        for job in self.live:
            settle(job.future, error=error)
        self.turns, self.live, self.running = deque(), [], 0


def alternatives(search: SearchOptions, count: int) -> SearchOptions:
    """The search of a text's ``count`` best translations: a beam at least 2 and ``count`` wide, ``search``'s length
    penalty and limits otherwise."""
    return SearchOptions(
        beam_size=max(search.beam_size, count, 2), length_penalty=search.length_penalty, n_best=count,
        max_length=search.max_length, min_length=search.min_length,
    )  # fmt: skip


class StreamingTranslator:
    """Texts translated as they come (the :class:`~multihead.engine.Engine` over the translator's
    :meth:`~Translator.stream_rows`: its model's, or its ensemble's), as :meth:`Translator.translate` translates them
    with ``search`` (greedy, sampling or beam search), or each text's best few: every request's pieces share one
    running batch, whatever they ask. A request's piece ``i`` is sampled with key ``i``, as
    ``translate`` samples that request's texts. A :class:`Translating`."""

    def __init__(self, translator: Translator, *, rows: int = 256, search: SearchOptions = TRANSLATION) -> None:
        self.translator, self.rows, self.search = translator, rows, search
        self.requests: Requests[Translator] = Requests(translator, search)
        self.stream: Engine[tuple[_Job[Translator], int]] = Engine(
            translator.stream_rows(), translator.spec(search), capacity=rows
        )

    def __len__(self) -> int:
        return len(self.stream) + len(self.requests)

    def add(
        self, texts: Sequence[str], future: Future[Any], translator: Translator | None = None, *, best: int = 0
    ) -> None:
        """Queue ``texts``: their translations become ``future``'s result in :meth:`step` (at once, when they hold no
        piece to translate). Each request's pieces start their translations with its translator's forced tokens (its
        target language's)."""
        self.requests.add(texts, future, translator, best=best)

    def step(self) -> None:
        gone = self.requests.drop_abandoned()
        if gone:
            self.stream.drop(lambda owner: owner[0] in gone)
        rows = self.stream.room(len(self.requests))
        for job, index, ids in self.requests.take(rows, lambda job, index: self._search(job, index).beam_size):
            search = self._search(job, index)  # they join at this step
            forced = job.translator.generation.forced
            limit = job.translator.limits(search)(len(ids))
            # its glossary's terms it holds, and the stand-ins of its kept spans
            phrases = job.translator.constraints([job.sources[index]], [job.kept[index]],
                                                 sampled=search.strategy.draws)  # fmt: skip
            self.stream.add(ids, (job, index), limit=limit, key=index, forced=forced, search=search,
                            constraints=phrases[0] if phrases else ())  # fmt: skip
        for finished in self.stream.step():
            job, index = finished.owner
            hypotheses = [(rank, translation(tokens, len(tokens), job.translator.generation))
                          for rank, tokens in finished.hypotheses] or [(float("nan"), [])]  # fmt: skip
            self.requests.ended(job, index, hypotheses)

    def _search(self, job: _Job[Translator], index: int) -> SearchOptions:
        """How piece ``index`` of ``job`` is searched: its request's alternatives, the guard's second try, or the
        service's search."""
        if job.best:
            return alternatives(self.search, job.best)
        return job.translator.wider(self.search) if index in job.doubted else self.search

    def fail(self, error: BaseException) -> None:
        self.stream.clear()
        self.requests.fail(error)
