"""The runs served, on the worker thread: what describes each run, whether its model is held or not; its translator
and engine while it is, and the translators of its other pairs; and, under ``--max-loaded``, which runs hold their
models. A run released lets go of its translators and engine, which hold its model: only its description stays. A
run not held is loaded off the worker (:mod:`multihead.app.serve.loader`): the jobs for it wait here meanwhile, while
the other runs' engines go on stepping."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from multihead.app.console import say
from multihead.app.languages import asked_direction
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
    that wait for it to load, and how many times it was loaded and released."""

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


class Engines:
    """The engines of ``runs`` (each a translator, or the description of a run not loaded, and its pair), one a run,
    ``make`` making each: a step steps every engine that has work, so that no run waits for another's requests to
    end. With ``max_loaded``, at most that many runs hold their models; a run not held is loaded again by its
    ``loaders`` entry, releasing first the least recently used run that has nothing to do (a job waits while none
    has)."""

    def __init__(
        self,
        runs: Sequence[tuple[Translator | Described, Sequence[str]]],
        make: Callable[[Translator], Translating],
        *,
        loaders: Sequence[Load] | None = None,
        max_loaded: int | None = None,
    ) -> None:
        if loaders is None and (max_loaded is not None or any(isinstance(run, Described) for run, _ in runs)):
            raise ValueError("runs that may be released need their loaders")
        self.make, self.max_loaded = make, max_loaded
        self.runs = [_Run(described(run), (langs[0], langs[1]), None if loaders is None else loaders[index])
                     for index, (run, langs) in enumerate(runs)]  # fmt: skip
        for held, (run, _) in zip(self.runs, runs, strict=True):
            if isinstance(run, Translator):
                held.translator, held.engine, held.loads = run, make(run), 1

    def __len__(self) -> int:
        """Pieces the engines have to translate."""
        return sum(len(run.engine) for run in self.runs if run.engine is not None)

    def loaded(self) -> list[int]:
        """The runs whose models are held."""
        return [index for index, run in enumerate(self.runs) if run.translator is not None]

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
        """The runs to load now, marked loading: those that jobs wait for, where ``max_loaded`` leaves room for them
        (or does once an idle run is released: one whose engine has nothing to translate, that no job alone on the
        worker is ``pinned`` to)."""
        found = []
        for index, run in enumerate(self.runs):
            if not run.waiting or run.held:
                continue
            run.waiting = [job for job in run.waiting if not job.answer.done()]  # those cancelled meanwhile: gone
            if run.waiting and run.load is not None and self._room(pinned):
                run.loading = True
                found.append((index, run.load))
        return found

    def _room(self, pinned: Collection[int]) -> bool:
        """Whether a run may be loaded, releasing the least recently used idle run where that makes room."""
        held = [index for index, run in enumerate(self.runs) if run.held]
        if self.max_loaded is None or len(held) < self.max_loaded:
            return True
        idle = [index for index in held if self.runs[index].idle and index not in pinned]
        if not idle:
            return False
        released = self.runs[min(idle, key=lambda index: self.runs[index].used)]
        released.translator, released.engine, released.views = None, None, {}  # its model with them
        released.releases += 1
        say(f"released {released.name} (--max-loaded {self.max_loaded})", sys.stderr)
        return True

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
