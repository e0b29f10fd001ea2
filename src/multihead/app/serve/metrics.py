"""``GET /metrics``: the service in Prometheus' text format (``prometheus_client``), as LibreTranslate offers one:

- ``multihead_requests_total`` and ``multihead_request_seconds`` (a histogram), by endpoint (``/translate``,
  ``/translate_file``, ``/detect``, ``/attention``; every other path counts as ``other``), by the pair asked for (a
  request's ``source``, ``auto`` included, and ``target``; empty where it names none or was refused before) and, for
  the count, by status;
- per run served: ``multihead_run_loaded`` (1 while its model is held), ``multihead_run_weights_bytes`` (its weights
  files' size while held: what it maps, an upper bound on what its weights keep resident), and the counts
  ``multihead_run_loads_total`` and ``multihead_run_releases_total`` (under ``--max-loaded`` or ``--memory``); under
  ``--memory``, ``multihead_memory_budget_bytes`` and each run's ``multihead_run_memory_bytes`` while held (its cost:
  the most resident memory its loading and first decoding took, measured when it first loaded);
- ``multihead_jobs_queued`` (requests waiting for the worker) and ``multihead_pieces_translating`` (pieces in the
  engines);
- the process's own (``process_resident_memory_bytes``, CPU seconds...), where the system has ``/proc``.

Each application has its own registry: two servers in one process do not share counts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from multihead.app.runs import WEIGHTS
from multihead.app.serve.engines import Engines
from multihead.app.serve.service import Service

ENDPOINTS = ("/translate", "/translate_file", "/detect", "/attention")
"""The endpoints counted by name; the others as ``other``."""
PAIR = "pair"
"""The request state's entry a handler sets to the pair asked for, ``(source, target)``."""


class _Served:
    """The runs' and the worker's state, read when Prometheus scrapes (on the event loop's thread: each a number the
    worker thread writes whole)."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        engines = self.service.engines
        loaded = GaugeMetricFamily("multihead_run_loaded", "1 while the run's model is held", labels=["run"])
        held = GaugeMetricFamily(
            "multihead_run_weights_bytes", "the run's weights files' size while its model is held", labels=["run"]
        )
        loads = CounterMetricFamily("multihead_run_loads", "times the run's model was loaded", labels=["run"])
        releases = CounterMetricFamily(
            "multihead_run_releases", "times the run's model was released (--max-loaded, --memory)", labels=["run"]
        )
        for run in engines.runs:
            holding = run.translator is not None
            size = sum((path / WEIGHTS).stat().st_size for path in run.about.paths) if holding else 0
            loaded.add_metric([run.name], float(holding))
            held.add_metric([run.name], float(size))
            loads.add_metric([run.name], float(run.loads))
            releases.add_metric([run.name], float(run.releases))
        yield from (loaded, held, loads, releases)
        yield from _budget(engines)
        yield GaugeMetricFamily(
            "multihead_jobs_queued", "requests waiting for the worker", value=self.service.worker.jobs.qsize()
        )
        yield GaugeMetricFamily("multihead_pieces_translating", "pieces in the engines", value=len(engines))


def _budget(engines: Engines) -> Iterator[Metric]:
    """Under ``--memory``: the budget, and each held run's cost."""
    holding = engines.holding
    if holding is None or holding.memory is None:
        return
    yield GaugeMetricFamily("multihead_memory_budget_bytes", "the server's --memory", value=holding.memory)
    cost = GaugeMetricFamily(
        "multihead_run_memory_bytes", "the run's cost while held: the most resident memory its loading and first "
        "decoding took", labels=["run"],
    )  # fmt: skip
    for run in engines.runs:
        cost.add_metric([run.name], float(run.cost if run.translator is not None else 0))
    yield cost


class Metrics:
    """The registry of one application: the requests counted by :meth:`measured` (an ASGI middleware), the service
    read at each scrape, and :meth:`endpoint`, ``GET /metrics``."""

    def __init__(self, service: Service) -> None:
        self.registry = CollectorRegistry()
        labels = ["endpoint", "source", "target"]
        self.requests = Counter("multihead_requests", "requests answered", [*labels, "status"], registry=self.registry)
        self.seconds = Histogram("multihead_request_seconds", "time to answer", labels, registry=self.registry)
        self.registry.register(_Served(service))
        ProcessCollector(registry=self.registry)

    async def endpoint(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    def measured(self, app: ASGIApp) -> ASGIApp:
        """``app`` with each HTTP request counted and timed."""

        async def measuring(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            begin, status = time.perf_counter(), [500]

            async def sending(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status[0] = message["status"]
                await send(message)

            try:
                await app(scope, receive, sending)
            finally:
                self._count(scope, status[0], time.perf_counter() - begin)

        return measuring

    def _count(self, scope: Scope, status: int, seconds: float) -> None:
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        pair: Any = scope.get("state", {}).get(PAIR) or ("", "")
        source, target = (str(code) for code in pair)
        self.requests.labels(endpoint, source, target, str(status)).inc()
        self.seconds.labels(endpoint, source, target).observe(seconds)
