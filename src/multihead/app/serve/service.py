"""The service: the runs served, their routes and their worker, which the event loop's handlers and the command
share."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from multihead.app.glossary import Glossary, GlossaryFile, Term
from multihead.app.serve.engines import Engines, Holding, described
from multihead.app.serve.routing import Pair, Routes
from multihead.app.serve.worker import Worker
from multihead.app.streaming import StreamingTranslator
from multihead.app.translate import TRANSLATION, Described, Translator
from multihead.decoding import SearchOptions

GATHER = 256
"""The most rows a run's engine decodes together (a beam-search sentence takes its beam's)."""


class Service:
    """The runs served (``translator`` and its pair ``langs``, the default; ``more``: other runs, each with its pair,
    a translator or, for a run not loaded, its description), what describes them (:attr:`runs`), their
    :class:`~multihead.app.serve.routing.Routes`, and the worker that translates with them as ``search`` says, on a
    thread of its own unless ``thread`` is false (then :meth:`Worker.work` is the caller's to run). ``holding``: which
    runs hold their models, and how each is loaded again (:class:`~multihead.app.serve.engines.Holding`; default: every
    run's, never released); :class:`~multihead.app.serve.engines.Engines` alone holds the translators. ``glossary``:
    the server's glossary file, whose entries each pair a run serves directly takes (:attr:`glossaries`; refused in
    one line where it gives none any)."""

    def __init__(
        self,
        translator: Translator,
        langs: Sequence[str],
        *,
        more: Sequence[tuple[Translator | Described, Sequence[str]]] = (),
        search: SearchOptions = TRANSLATION,
        thread: bool = True,
        holding: Holding | None = None,
        glossary: GlossaryFile | None = None,
    ) -> None:
        runs = [(translator, langs), *more]
        self.runs = [(described(run), pair) for run, pair in runs]
        self.routes = Routes(self.runs)
        self.glossaries: dict[Pair, Glossary] = glossary.glossaries(self.routes.direct) if glossary else {}
        """The server's glossary of each pair served directly that its file gives entries."""
        make = functools.partial(StreamingTranslator, rows=GATHER, search=search)
        self.engines = Engines(runs, make, holding=holding)
        self.worker = Worker(self.engines, search=search, thread=thread)

    def glossary(self, pair: Pair, terms: Sequence[Term]) -> Glossary | None:
        """What a request's texts of the pair ``pair`` (one a run serves directly) use: the server's glossary of the
        pair joined by the request's own ``terms``, whose targets win (``None``: neither has any)."""
        served = self.glossaries.get(pair)
        if served is None:
            return Glossary(terms) if terms else None
        return served.joined(terms)
