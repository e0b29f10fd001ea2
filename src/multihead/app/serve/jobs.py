"""What crosses between the service's threads, typed: the jobs the event loop gives the worker (each along one leg of
a route, its answer in a future the event loop awaits and cancels when nobody waits any more), and the message the
loader thread sends the worker when a run it loaded is ready."""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from multihead.app.glossary import Glossary
from multihead.app.serve.routing import Leg
from multihead.app.translate import Translated, Translation, Translator

T = TypeVar("T")
Load = Callable[[], Translator]
"""What loads a run's translator again, its model released."""


@dataclass(frozen=True, eq=False)
class Job(Generic[T]):
    """A job along ``leg``: its result, or the error it met, is ``answer``'s."""

    leg: Leg
    answer: Future[T] = field(default_factory=Future, kw_only=True)


@dataclass(frozen=True, eq=False)
class Translate(Job[Translated]):
    """Texts to translate, split into sentences as ``split`` says (``None``: as the server does), using ``glossary``
    (the server's for the leg's pair joined by the request's own; ``None``: none): they join the run's engine between
    its steps. ``keep``: what the request asks to keep as it is too, beside the server's placeholders
    (:mod:`multihead.app.keep`)."""

    texts: list[str]
    split: bool | None = None
    glossary: Glossary | None = None
    keep: tuple[re.Pattern[str], ...] = ()


@dataclass(frozen=True, eq=False)
class Hypotheses(Job[list[list[str]]]):
    """Each text's ``count`` best translations, from a beam search whose sentences step in the run's engine with the
    others (texts that hold text: the handlers keep a blank line as it is), using ``glossary`` and ``keep`` as
    :class:`Translate` does."""

    texts: list[str]
    count: int
    glossary: Glossary | None = None
    keep: tuple[re.Pattern[str], ...] = ()


@dataclass(frozen=True, eq=False)
class Attend(Job[Translation]):
    """One sentence's translation with its cross-attention (the page's), computed alone."""

    sentence: str


@dataclass(frozen=True)
class Loaded:
    """Run ``run``, loaded off the worker: its translator, or the error loading it met."""

    run: int
    translator: Translator | None
    error: BaseException | None = None


@dataclass(frozen=True)
class Stop:
    """The last message: the worker finishes what it holds, then returns."""


Alone = Attend
"""The jobs that take the worker alone, in turn with the engines' steps."""
Streamed = Translate | Hypotheses
"""The jobs whose sentences join their run's engine."""
Work = Streamed | Alone
"""Every job."""
Message = Work | Loaded | Stop
"""What the worker's queue holds."""
