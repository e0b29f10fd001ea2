"""``multihead serve``: runs behind LibreTranslate's HTTP API, and a page that shows their attention.

Its modules are its threads and its concerns; each line of code runs on the thread its module names:

- :mod:`~multihead.app.serve.http` (the event loop): the endpoints; a request read into a typed one
  (:mod:`~multihead.app.serve.parse`), checked against the limits and keys (:mod:`~multihead.app.serve.limits`),
  routed (:mod:`~multihead.app.serve.routing`: a pair no run serves goes through a pivot language, one
  :class:`~multihead.app.serve.routing.Route` of two legs), and given to the worker as typed jobs
  (:mod:`~multihead.app.serve.jobs`); every error mapped to its HTTP answer there. Each request counted and timed,
  and ``GET /metrics`` (:mod:`~multihead.app.serve.metrics`), which reads the runs' and the worker's state as it is.
- :mod:`~multihead.app.serve.document_jobs` (the event loop): the document jobs (``POST /documents``), translated in
  the background a chunk at a time through the endpoints' path, their state kept in ``serve --jobs DIR``.
- :mod:`~multihead.app.serve.worker` (the worker, ``serve``'s main thread): the one thread that translates, stepping
  each run's engine (:mod:`~multihead.app.serve.engines`, over :mod:`multihead.app.streaming`) and running the jobs
  that take it alone in turn with the steps.
- :mod:`~multihead.app.serve.loader` (a thread a load): a run released under ``--max-loaded`` loaded again while the
  other runs' requests go on streaming.
- :mod:`~multihead.app.serve.command` (the main thread, before and after the worker): the runs loaded, the socket,
  the signals; :mod:`~multihead.app.serve.service` ties the runs, their routes and the worker together.
"""

from multihead.app.serve.command import listening_socket, run_paths, serve
from multihead.app.serve.http import create_app
from multihead.app.serve.limits import Limits, read_api_keys
from multihead.app.serve.service import Service

__all__ = ["Limits", "Service", "create_app", "listening_socket", "read_api_keys", "run_paths", "serve"]
