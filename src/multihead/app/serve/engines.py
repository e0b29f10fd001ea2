"""The runs served, on the worker thread: what describes each run, whether its model is held or not; its translator
and engine while it is, and the translators of its other pairs; and, under ``--max-loaded`` or ``--memory``
(:class:`Holding`), which runs hold their models. A run released lets go of its translators and engine, which hold its
model: only its description stays. A run not held is loaded off the worker (:mod:`multihead.app.serve.loader`): the
jobs for it wait here meanwhile, while the other runs' engines go on stepping."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from multihead.app.console import say
from multihead.app.languages import asked_direction
from multihead.app.memory import hand_back_memory, resident_bytes
from multihead.app.serve.jobs import Hypotheses, Load, Loaded, Streamed, Work
from multihead.app.serve.routing import Leg, Pair
from multihead.app.streaming import Translating, settle
from multihead.app.translate import Described, Translator


def described(run: Translator | Described) -> Described:
    """What describes ``run``: a loaded translator's description, or a run's without its model."""
    return run.described if isinstance(run, Translator) else run


@dataclass(eq=False)
class _Run:
    """A run served: what describes it (its languages and the direction it serves by default, held or not), its own
    pair, how to load it again, while loaded its translator, engine and translators of its other pairs, the jobs
    that wait for it to load, how many times it was loaded and released, and under ``--memory`` its cost: the most
    resident memory its loading and first decoding took (bytes, measured when it first loaded)."""

    about: Described
    own: Pair
    load: Load | None
    translator: Translator | None = None
    engine: Translating | None = None
    views: dict[Pair, Translator] = field(default_factory=dict)
    used: float = 0.0
    loading: bool = False
    waiting: list[Work] = field(default_factory=list)
    loads: int = 0
    releases: int = 0
    cost: int = 0

    @property
    def name(self) -> str:
        return self.about.name

    @property
    def idle(self) -> bool:
        """Whether its model is held with nothing to translate."""
        return self.translator is not None and not len(self.engine or ())

    @property
    def held(self) -> bool:
        """Whether its model is held, or being loaded."""
        return self.translator is not None or self.loading


@dataclass(frozen=True)
class Holding:
    """Which runs hold their models: a run not held is loaded again by its ``loaders`` entry; at most ``max_loaded``
    runs are held at once; with ``memory`` (bytes), runs are loaded while the process's resident memory, with the
    ``costs`` of those being loaded (each run's bytes, measured when it first loaded) and :attr:`room`, stays within
    it."""

    loaders: Sequence[Load]
    max_loaded: int | None = None
    memory: int | None = None
    costs: Sequence[int] = ()

    @property
    def room(self) -> int:
        """The bytes a budget keeps free beside the runs held and those loading: the costliest run's cost, for what
        the held runs go on to take as they decode (the pages of their files they first read, their buffers)."""
        return max(self.costs, default=0)

    def __str__(self) -> str:
        """The flags that set it."""
        flags = [] if self.max_loaded is None else [f"--max-loaded {self.max_loaded}"]
        return " ".join(flags if self.memory is None else [*flags, f"--memory {mib(self.memory)}"])


def mib(size: int) -> str:
    """``size`` bytes in MiB, as ``--memory`` reads them."""
    return f"{size / (1 << 20):.0f}M"


class Engines:
    """The engines of ``runs`` (each a translator, or the description of a run not loaded, and its pair), one a run,
    ``make`` making each: a step steps every engine that has work, so that no run waits for another's requests to
    end. ``holding`` says which runs hold their models (:class:`Holding`); a run not held is loaded again, releasing
    first the least recently used runs that have nothing to do where that makes room (a job waits while none has)."""

    def __init__(
        self,
        runs: Sequence[tuple[Translator | Described, Sequence[str]]],
        make: Callable[[Translator], Translating],
        *,
        holding: Holding | None = None,
    ) -> None:
        if holding is None and any(isinstance(run, Described) for run, _ in runs):
            raise ValueError("runs that may be released need their loaders")
        self.make, self.holding = make, holding
        self.runs = [_Run(described(run), (langs[0], langs[1]), None if holding is None else holding.loaders[index])
                     for index, (run, langs) in enumerate(runs)]  # fmt: skip
        for run, cost in zip(self.runs, () if holding is None else holding.costs, strict=False):
            run.cost = cost
        for held, (given, _) in zip(self.runs, runs, strict=True):
            if isinstance(given, Translator):
                held.translator, held.engine, held.loads = given, make(given), 1

    def __len__(self) -> int:
        """Pieces the engines have to translate."""
        return sum(len(run.engine) for run in self.runs if run.engine is not None)

    def loaded(self) -> list[int]:
        """The runs whose models are held."""
        return [index for index, run in enumerate(self.runs) if run.translator is not None]

    def held(self) -> dict[str, Any]:
        """What ``/health`` says of the runs held: where it serves several, their names (``loaded``); under
        ``--memory``, the budget, the process's resident memory and each held run's measured cost, in bytes
        (``memory``)."""
        held = [run for run in self.runs if run.translator is not None]
        found: dict[str, Any] = {"loaded": [run.name for run in held]} if len(self.runs) > 1 else {}
        if self.holding is not None and self.holding.memory is not None:
            costs = {run.name: run.cost for run in held}
            found["memory"] = {"budget": self.holding.memory, "resident": resident_bytes(), "runs": costs}
        return found

    def waiting(self) -> bool:
        """Whether a job waits for a run to load."""
        return any(run.waiting or run.loading for run in self.runs)

    def translator(self, job: Work) -> Translator | None:
        """The translator of ``job``'s leg, its run loaded; ``None`` where its run is not: the job then waits until
        :meth:`arrived` gives it back."""
        run = self.runs[job.leg.run]
        if run.translator is None:
            run.waiting.append(job)
            return None
        run.used = time.monotonic()
        return self._view(run, run.translator, job.leg)

    def _view(self, run: _Run, translator: Translator, leg: Leg) -> Translator:
        """The translator of ``leg``'s pair: the run's own, or one in the direction its languages give that pair
        (:func:`~multihead.app.languages.asked_direction`), sharing its model (made once while it is held)."""
        if leg.pair == run.own:
            return translator
        found = run.views.get(leg.pair)
        if found is None:
            about = run.about
            found = translator.toward(asked_direction(about.language_tokens, about.direction, leg.pair))
            run.views[leg.pair] = found
        return found

    def add(self, job: Streamed, translator: Translator) -> None:
        """``job``'s texts into its run's engine, translated by ``translator`` (:meth:`translator`): each text's best
        translation, or its ``count`` best."""
        engine = self.runs[job.leg.run].engine
        assert engine is not None  # its translator is loaded
        translator = translator.glossing(job.glossary).keeping(job.keep)
        if isinstance(job, Hypotheses):
            engine.add(job.texts, job.answer, translator, best=job.count)
        else:
            engine.add(job.texts, job.answer, translator if job.split is None else translator.splitting(job.split))

    def step(self) -> None:
        for run in self.runs:
            if run.engine is not None and len(run.engine):
                run.engine.step()

    def fail(self, error: BaseException) -> None:
        """Every request in an engine answered with ``error``."""
        for run in self.runs:
            if run.engine is not None:
                run.engine.fail(error)

    def to_load(self, pinned: Collection[int]) -> list[tuple[int, Load]]:
        """The runs to load now, marked loading: those that jobs wait for, where the :class:`Holding` leaves room for
        them (or does once idle runs are released: those whose engines have nothing to translate, that no job alone
        on the worker is ``pinned`` to)."""
        found = []
        for index, run in enumerate(self.runs):
            if not run.waiting or run.held:
                continue
            run.waiting = [job for job in run.waiting if not job.answer.done()]  # those cancelled meanwhile: gone
            if run.waiting and run.load is not None and self._room(run, pinned):
                run.loading = True
                found.append((index, run.load))
        return found

    def shrink(self, pinned: Collection[int]) -> None:
        """Under ``--memory``: the least recently used idle runs (not ``pinned``) released while the process's resident
        memory leaves less than the :attr:`Holding.room` free: held runs grow as they decode (their first sentences'
        buffers), past what their costs, measured on one token, said. A run held alone stays (as a run alone is
        loaded whatever the room)."""
        holding = self.holding
        if holding is not None and holding.memory is not None:
            budget = holding.memory - holding.room
            self._release_until(
                lambda: (resident_bytes() or 0) <= budget or sum(run.held for run in self.runs) <= 1, pinned
            )

    def _room(self, wanted: _Run, pinned: Collection[int]) -> bool:
        """Whether ``wanted`` may be loaded now, releasing the least recently used idle runs while that makes room;
        with no other run held or loading, it may (the server checked at its start that each run fits alone)."""
        return self._release_until(lambda: self._fits(wanted), pinned) or not any(run.held for run in self.runs)

    def _release_until(self, done: Callable[[], bool], pinned: Collection[int]) -> bool:
        """The least recently used idle runs not ``pinned`` released until ``done()``; whether it is."""
        while not done():
            idle = [run for index, run in enumerate(self.runs) if run.idle and index not in pinned]
            if not idle:
                return False
            self._release(min(idle, key=lambda run: run.used))
        return True

    def _fits(self, wanted: _Run) -> bool:
        """Whether ``wanted`` fits beside the runs held and being loaded (see :class:`Holding`)."""
        holding = self.holding
        assert holding is not None  # a run to load has its loader
        held = [run for run in self.runs if run.held]
        if holding.max_loaded is not None and len(held) >= holding.max_loaded:
            return False
        if holding.memory is None:
            return True
        loading = sum(run.cost for run in held if run.loading)
        return (resident_bytes() or 0) + loading + wanted.cost + holding.room <= holding.memory

    def _release(self, run: _Run) -> None:
        """``run``'s model let go (with its translators and engine); under ``--memory``, its memory handed back to the
        system at once (:func:`~multihead.app.memory.hand_back_memory`), so that the process's resident memory shows it
        gone."""
        run.translator, run.engine, run.views = None, None, {}
        run.releases += 1
        assert self.holding is not None
        if self.holding.memory is not None:
            hand_back_memory()
        say(f"released {run.name} ({self.holding})", sys.stderr)

    def arrived(self, loaded: Loaded) -> list[Work]:
        """The jobs that waited for ``loaded``'s run, to give the worker again: its engine made; where loading it
        failed, each of them answered with the error (none given back)."""
        run = self.runs[loaded.run]
        waiting, run.waiting, run.loading = run.waiting, [], False
        if loaded.translator is None:
            for job in waiting:
                settle(job.answer, error=loaded.error)
            return []
        run.translator, run.engine = loaded.translator, self.make(loaded.translator)
        run.loads += 1
        say(f"loaded {run.name}", sys.stderr)
        return waiting
