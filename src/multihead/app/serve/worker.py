"""The worker: the one thread that translates (``serve`` gives it the main thread: PyTorch's CPU threads wake
fastest for it). It owns the runs' engines (:class:`~multihead.app.serve.engines.Engines`) and takes typed jobs from
one queue (:mod:`multihead.app.serve.jobs`): texts join their run's engine between its steps; a job that runs alone
(the page's attention) takes its turn between steps; a run whose model is not held is loaded off the
worker (:mod:`multihead.app.serve.loader`), its jobs waiting meanwhile. A job's answer, or the error it met, is its
future's: what that means to a client is the event loop's to say.

A job nobody waits for any more (its future cancelled: its client left, or its time ran out) is dropped: before it
starts, or, for texts, at the engine's next step, with its sentences.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any

from multihead.app.devices import fit_threads
from multihead.app.serve.engines import Engines
from multihead.app.serve.jobs import Alone, Loaded, Message, Stop, Streamed, Work
from multihead.app.serve.loader import start_loading
from multihead.app.streaming import settle
from multihead.app.translate import TRANSLATION, Translator
from multihead.decoding import SearchOptions

ALONE_SHARE = 0.3
"""The share of the worker's time that jobs which run alone (the page's attention) take while requests
are being translated: each waits until the steps since the last have taken (1 - share) / share of its time."""
STALLED_AFTER = 60.0
"""Seconds on one step or job after which ``/health`` reports the worker stalled."""
WAKE = 0.5
"""The longest an idle worker waits for a job at once: on the main thread, a signal another thread received is
handled only when it wakes."""


class Worker:
    """Takes the jobs :meth:`submit` queues and translates them with ``engines``, searching as ``search`` says; on a
    thread of its own, or, with ``thread=False``, on whichever thread calls :meth:`work`. :meth:`close` lets it finish
    what was queued, then stop."""

    def __init__(self, engines: Engines, *, search: SearchOptions = TRANSLATION, thread: bool = True) -> None:
        self.engines, self.search = engines, search
        self.jobs: queue.Queue[Message] = queue.Queue()
        self.busy_since: float | None = None  # when the worker began the step or job it is on; None when idle
        self.alone: collections.deque[Alone] = collections.deque()  # jobs waiting their turn
        self.credit = 0.0  # seconds a job that runs alone may take now (< 0: the steps' time it must wait)
        self.thread = threading.Thread(target=self.work, name="translation worker", daemon=True) if thread else None
        if self.thread is not None:
            self.thread.start()

    def submit(self, job: Work) -> None:
        """Queue ``job`` (from any thread)."""
        self.jobs.put(job)

    def close(self) -> None:
        self.jobs.put(Stop())
        if self.thread is not None:
            self.thread.join()

    def stalled(self) -> float | None:
        """How long the worker has been on one step or job, when that is over :data:`STALLED_AFTER` seconds."""
        since = self.busy_since
        busy = None if since is None else time.monotonic() - since
        return busy if busy is not None and busy > STALLED_AFTER else None

    def work(self) -> None:
        """Take the jobs until :meth:`close`: texts added to their run's engine as they come, between its steps; a
        job that runs alone when its turn comes: at once when nothing is being translated, else once the steps since
        the last such job have had their share of the worker's time (:data:`ALONE_SHARE` to the jobs)."""
        engines, stopping = self.engines, False
        while not stopping or len(engines) or self.alone or engines.waiting():
            stopping = self._take(stopping)
            if not len(engines):
                self.credit = 0.0  # nothing to be fair to
            if self.alone and self.credit >= 0:
                started = time.monotonic()
                self._run_alone(self.alone.popleft())
                self.credit -= time.monotonic() - started
            if len(engines):
                fit_threads()
                started = time.monotonic()
                self._step()
                self.credit = min(0.0, self.credit + (time.monotonic() - started) * ALONE_SHARE / (1 - ALONE_SHARE))

    def _take(self, stopping: bool) -> bool:
        """Take what is queued, waiting for it only when there is nothing else to do; whether the worker stops. The
        runs that jobs wait for begin to load first, where there is room for them."""
        taken = False
        while True:
            pinned = {job.leg.run for job in self.alone}
            self.engines.shrink(pinned)
            for run, load in self.engines.to_load(pinned):
                start_loading(run, load, self.jobs.put)
            idle = not (taken or len(self.engines) or self.alone)
            try:
                message = self.jobs.get(timeout=WAKE) if idle else self.jobs.get_nowait()
            except queue.Empty:
                if not idle or stopping:
                    return stopping
                continue
            if isinstance(message, Stop):
                stopping = True
                if not self.engines.waiting():
                    return stopping
            else:
                self._give(message)
                taken = True

    def _give(self, message: Work | Loaded) -> None:
        """``message`` where it goes: a run loaded gives back the jobs that waited for it; texts join their run's
        engine (or wait for their run); a job that runs alone waits its turn."""
        if isinstance(message, Loaded):
            for job in self.engines.arrived(message):
                self._give(job)
        elif message.answer.done():  # cancelled while it was queued
            return
        elif isinstance(message, Streamed):
            try:
                translator = self.engines.translator(message)
                if translator is not None:
                    self.engines.add(message, translator)
            except Exception as error:  # the request's to answer; the worker goes on
                settle(message.answer, error=error)
        else:
            self.alone.append(message)

    def _step(self) -> None:
        """A step of every engine with work; an error it meets is every request's in them."""
        self.busy_since = time.monotonic()
        try:
            self.engines.step()
        except Exception as error:
            self.engines.fail(error)
        self.busy_since = None

    def _run_alone(self, job: Alone) -> None:
        """``job`` computed, its run loaded (else it waits for it), unless it was cancelled meanwhile."""
        if job.answer.done():
            return
        translator = self.engines.translator(job)
        if translator is None:
            return
        self.busy_since = time.monotonic()
        try:
            settle(job.answer, self._compute(job, translator))
        except Exception as error:  # the request's to answer; the worker goes on
            settle(job.answer, error=error)
        self.busy_since = None

    def _compute(self, job: Alone, translator: Translator) -> Any:
        """The page's attention of one sentence."""
        return translator.attention(job.sentence, search=self.search)
