"""The loader's threads: a run released under ``--max-loaded`` loaded again off the worker, so that the other runs'
requests go on streaming meanwhile; the worker hears of it as a :class:`~multihead.app.serve.jobs.Loaded` message."""

from __future__ import annotations

import threading
from collections.abc import Callable

from multihead.app.serve.jobs import Load, Loaded


def start_loading(run: int, load: Load, done: Callable[[Loaded], None]) -> None:
    """``load()`` of run ``run`` on a thread of its own; ``done`` told of it, on that thread, when it is ready."""
    threading.Thread(target=_load, args=(run, load, done), name=f"loading run {run}", daemon=True).start()


def _load(run: int, load: Load, done: Callable[[Loaded], None]) -> None:
    try:
        translator = load()
    except Exception as error:  # the jobs waiting for it get it; the worker goes on
        done(Loaded(run, None, error))
        return
    done(Loaded(run, translator))
