"""``multihead serve``, on the main thread: the runs loaded for their languages, the socket, the event loop started
on a thread of its own (uvicorn), the worker run on this one, and the signals that stop them."""

from __future__ import annotations

import functools
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from multihead.app.console import UserError, plural, say
from multihead.app.glossary import GlossaryFile, read_glossary_file
from multihead.app.keep import Keep
from multihead.app.languages import asked_direction, pair_text
from multihead.app.memory import hand_back_memory, peak_resident_bytes
from multihead.app.runs import has_checkpoints
from multihead.app.serve.document_jobs import DocumentJobs
from multihead.app.serve.engines import Holding, mib
from multihead.app.serve.http import create_app
from multihead.app.serve.limits import Limits
from multihead.app.serve.service import Service
from multihead.app.translate import Described, Translator
from multihead.decoding import SearchOptions

DRAIN = 30.0
"""Seconds the server waits, once told to stop, for the requests in flight before it drops them."""

Loading = Callable[[], tuple[Translator, Sequence[str]]]
"""What loads a run: its translator, and the pair it serves by default."""


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
    ensemble: Sequence[str] = (),
    framework: str = "torch",
    glossary_bonus: float | None = None,
    keep: Keep | None = Keep(),  # noqa: B008 (immutable)
) -> tuple[Translator, Sequence[str]]:
    """A run's translator (with ``ensemble``: of it and those runs together) in the direction it serves by default,
    and that pair (:func:`_served`)."""
    translator = Translator(run, checkpoint, device=device, quantize=quantize, normalize=normalize,
                            split_sentences=split_sentences, guard=guard, ensemble=ensemble, framework=framework,
                            glossary_bonus=glossary_bonus, keep=keep)  # fmt: skip
    return _served(translator, langs, run)


def _service(
    loaders: Sequence[Loading],
    search: Callable[[Translator], SearchOptions],
    glossary: GlossaryFile | None,
    *,
    max_loaded: int | None,
    memory: int | None,
) -> Service:
    """The service of the runs ``loaders`` load: each loaded in turn for its languages, those past ``max_loaded``, or
    past what ``memory`` (bytes of resident memory) holds, released at once (only their descriptions kept; loaded again
    when asked), searching as ``search`` says of the first run, each pair it serves directly taking ``glossary``'s
    entries of its languages. Under ``memory`` each run's cost is measured as it first loads (:func:`_measured`); a
    run is held where it leaves room for one as costly as any so far (to measure the next; after the last, for what
    the held runs take as they decode: see :attr:`~multihead.app.serve.engines.Holding.room`), and a run that does
    not fit alone beside the server's own memory is refused in one line."""
    costs: list[int] | None = None
    if memory is not None:
        if peak_resident_bytes(reset=True) is None:
            raise UserError("--memory needs the system to report the process's resident memory (Linux's /proc)")
        costs = []
        loaders[0]()  # once unmeasured: what the framework keeps once loaded (itself, its threads) is no run's cost
    budget = None if memory is None else (_settled(), memory)  # the server's own memory, and the budget
    translator, langs = _measured(loaders[0], costs, budget)
    more: list[tuple[Translator | Described, Sequence[str]]] = []
    for load in loaders[1:]:
        run, pair = _measured(load, costs, budget)
        held = 1 + sum(isinstance(other, Translator) for other, _ in more)
        room = max(costs or [0])  # for measuring the next run, or for what the held runs take as they decode
        fits = memory is None or _settled() + room <= memory
        more.append((run if fits and (max_loaded is None or held < max_loaded) else run.described, pair))
        del run  # a run released: its model goes before the next loads
    reload = [functools.partial(_translator_only, load, prepared=memory is not None) for load in loaders]
    holding = Holding(reload, max_loaded=max_loaded, memory=memory, costs=costs or ())
    return Service(translator, langs, more=more, search=search(translator), thread=False, holding=holding,
                   glossary=glossary)  # fmt: skip


def _settled() -> int:
    """The process's resident memory in bytes (0 where unknown) once what is free is handed back
    (:func:`~multihead.app.memory.hand_back_memory`)."""
    return hand_back_memory() or 0


def _measured(
    load: Loading, costs: list[int] | None, budget: tuple[int, int] | None
) -> tuple[Translator, Sequence[str]]:
    """``load()``; with ``costs``, the run laid out for decoding (:meth:`Translator.prepare`) and its cost appended to
    them: the most resident memory its loading and first decoding took above what the process held before. Refused
    in one line where that does not fit the ``budget`` (the server's own bytes, the bytes ``--memory`` gives) alone."""
    if costs is None:
        return load()
    before = _settled()
    peak_resident_bytes(reset=True)
    translator, pair = load()
    translator.prepare()
    cost = max((peak_resident_bytes() or 0) - before, 0)
    if budget is not None and budget[0] + cost > budget[1]:
        base, memory = budget
        raise UserError(
            f"--memory {mib(memory)} is too small for {translator.described.name!r}: it takes {mib(cost)} beside the "
            f"server's own {mib(base)} (give --memory {mib(base + cost)} or more)"
        )
    costs.append(cost)
    return translator, pair


def _loaders(
    load: Callable[..., tuple[Translator, Sequence[str]]],
    runs: Sequence[str],
    langs: Sequence[str] | None,
    *,
    ensemble: bool,
) -> list[Loading]:
    """What loads each run served (:func:`run_paths`), ``langs`` the first's pair; with ``ensemble``, what loads
    them as one (refused in one line for fewer than two)."""
    paths = run_paths(runs)
    if not ensemble:
        return [functools.partial(load, run, langs=None if index else langs) for index, run in enumerate(paths)]
    if len(paths) < 2:
        raise UserError(f"--ensemble serves several runs as one: received {len(paths)} run ({' '.join(runs)})")
    return [functools.partial(load, paths[0], langs=langs, ensemble=paths[1:])]


def _translator_only(load: Loading, *, prepared: bool) -> Translator:
    """What ``load`` loads, without its pair: a released run loaded again (its pair is known); ``prepared`` (under
    ``--memory``): laid out for decoding at once, and what loading left free handed back to the system."""
    translator = load()[0]
    if prepared:
        translator.prepare()
        hand_back_memory()
    return translator


def _served(translator: Translator, langs: Sequence[str] | None, run: str) -> tuple[Translator, Sequence[str]]:
    """The translator of the pair ``serve`` defaults to, and that pair: ``langs``, in the direction the run's
    languages give it (:func:`~multihead.app.languages.asked_direction`: of a model of many languages, the pair it
    chooses; of a run that records its one pair, that pair, another refused in one line; else the names of the run's
    languages), else the run's, else a built-in task's; refused in one line where there is none."""
    task = translator.checkpoint.options.get("task")
    if langs:
        named = f"--langs {' '.join(langs)}"
        translator = translator.toward(asked_direction(translator.language_tokens, translator.direction, langs,
                                                       named=named, task=task))  # fmt: skip
    langs = translator.langs or langs or ([task, f"{task}-out"] if task else None)
    if not langs:
        raise UserError(f"the run {run} does not record its languages: give --langs SRC TGT (ISO 639-1 codes)")
    return translator, langs


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
    routes, first, many = service.routes, service.runs[0][0], len(service.runs) > 1
    served = f"{len(service.runs)} runs" if many else f"{runs[0]} (checkpoint {first.paths[0].name})"
    if len(first.paths) > 1:
        served = f"an ensemble of {len(first.paths)} runs ({', '.join(str(path.parents[1]) for path in first.paths)})"
    pairs = sum(map(len, routes.pairs.values()))
    others = f"; {pairs} pairs of {len(routes.languages())} languages" if pairs > 1 else ""
    say(f"serving {served}, by default {pair_text([routes.source, routes.target])}{others}, at "
        f"http://{shown}:{port} (Ctrl-C stops)", sys.stderr)  # fmt: skip
    for index in range(len(service.runs)) if many else ():
        count = sum(owner == index for owner in routes.direct.values())
        said = plural(count, "pair") if count else "no pair: the runs named before it serve all of its"
        say(f"  {routes.names[index]}: {pair_text(service.runs[index][1])}; {said}", sys.stderr)
    if service.glossaries:
        _say_glossaries(service)


def _say_glossaries(service: Service) -> None:
    """Which pairs served directly take the server's glossary, and how many entries each (the first 12 named)."""
    found = service.glossaries
    named = [f"{source} → {target} ({len(terms)} {'entry' if len(terms) == 1 else 'entries'})"
             for (source, target), terms in list(found.items())[:12]]  # fmt: skip
    more = f" and {len(found) - 12} more" if len(found) > 12 else ""
    say(f"  glossary terms for {len(found)} of {plural(len(service.routes.direct), 'pair')} served directly: "
        f"{', '.join(named)}{more}", sys.stderr)  # fmt: skip


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
    memory: int | None = None,
    normalize: str | None = None,
    split_sentences: bool = True,
    guard: bool = True,
    ensemble: bool = False,
    framework: str = "torch",
    glossary: str | None = None,
    glossary_bonus: float | None = None,
    keep: Keep | None = Keep(),  # noqa: B008 (immutable)
    jobs: str | None = None,
) -> int:
    """Serve ``runs`` (:func:`run_paths`; with ``ensemble``, as one ensemble of the first run's pairs, every step's
    log-probabilities averaged over their models) until SIGINT or SIGTERM: then new requests are refused, those in
    flight answered within :data:`DRAIN` seconds (those whose clients have left dropped), and it returns 0. ``search``:
    how every run searches, given the first run's translator (its defaults under the flags); ``langs``: the first run's
    pair; ``max_loaded``: the most runs whose models are held at once; ``memory``: the bytes of resident memory the
    runs held keep the process within (:class:`~multihead.app.serve.engines.Holding`);
    ``glossary``: the server's glossary file (read before any run loads; each pair served directly takes the entries
    of its two languages, refused in one line where no pair takes any); the others as :class:`Translator` takes them
    (``split_sentences`` and ``keep``: unless a request says otherwise). A run of a built-in task serves its inputs as
    the language ``TASK`` and its outputs as ``TASK-out`` unless ``langs`` says otherwise. ``jobs``: the directory
    that keeps the document jobs (``None``: a temporary one), locked before any run loads, its unfinished jobs
    resumed once the server listens."""
    import uvicorn

    load = functools.partial(_load_run, checkpoint=checkpoint, device=device, quantize=quantize, normalize=normalize,
                             split_sentences=split_sentences, guard=guard, framework=framework,
                             glossary_bonus=glossary_bonus, keep=keep)  # fmt: skip
    loaders = _loaders(load, runs, langs, ensemble=ensemble)
    terms = read_glossary_file(glossary) if glossary is not None else None
    store = DocumentJobs(Path(jobs) if jobs is not None else None)
    store.lock()
    sock = listening_socket(host, port)
    try:
        service = _service(loaders, search, terms, max_loaded=max_loaded, memory=memory)
    except UserError:
        sock.close()
        store.release()
        raise
    config = uvicorn.Config(create_app(service, limits, store), log_level="warning", lifespan="on",
                            timeout_keep_alive=5, timeout_graceful_shutdown=int(DRAIN))  # fmt: skip
    server = uvicorn.Server(config)
    _say_serving(service, runs, sock)
    _stop_on_signals(server)

    def run_server() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            service.worker.close()  # stops the worker below, if the server's shutdown has not
            store.release()

    # The event loop on a thread, the translation on this (main) one.
    thread = threading.Thread(target=run_server, name="event loop")
    thread.start()
    service.worker.work()
    thread.join()
    say("stopped", sys.stderr)
    return 0


def _stop_on_signals(server: Any) -> None:
    """SIGINT and SIGTERM stop ``server`` (a ``uvicorn.Server``): the first signal drains; a second stops without
    waiting for the requests in flight, quietly: uvicorn's reports of the tasks it then cancels (the requests', the
    application's lifespan) are not errors."""

    def stop(sig: int, frame: Any) -> None:
        if server.should_exit:
            logging.getLogger("uvicorn.error").disabled = True
            server.force_exit = True
        server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
