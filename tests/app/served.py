"""A service in the tests' own process (``from app.served import serving, request``): an app on uvicorn in a
thread, on a free loopback port, and one plain HTTP request to it; and ``multihead serve`` in a subprocess
(``start``)."""

from __future__ import annotations

import http.client
import json
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from app.support import subprocess_env
from multihead.app.serve import listening_socket


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` on uvicorn in a thread, on a free loopback port: its URL."""
    sock = listening_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start in 30 s"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def request(url: str, path: str, body: bytes | dict | None = None, *, kind: str = "application/json",
            method: str | None = None, timeout: float = 30) -> tuple[int, Any]:  # fmt: skip
    """One request: its status and its JSON answer (the text where it is not JSON); ``timeout`` seconds at most."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    headers = {"Content-Type": kind} if data is not None else {}
    connection.request(method or ("GET" if body is None else "POST"), path, body=data, headers=headers)
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    try:
        return response.status, json.loads(text)
    except ValueError:
        return response.status, text


def start(run: Path, *flags: str) -> tuple[subprocess.Popen, str, str]:
    """``multihead serve RUN --port 0 FLAGS`` in a subprocess, its URL once it listens, and the line naming it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "multihead", "serve", str(run), "--port", "0", *flags],
        stderr=subprocess.PIPE, text=True, env=subprocess_env(),
    )  # fmt: skip
    line, found, before = "", None, 0
    while found is None and before < 3:  # the line naming it, after any warning (a lock taken over)
        ready, _, _ = select.select([process.stderr], [], [], 120)
        line = process.stderr.readline() if ready else ""
        found, before = re.search(r"http://127\.0\.0\.1:\d+", line), before + 1 if line.startswith("warning") else 3
    if found is None:
        process.kill()
        raise AssertionError(f"no URL in {line!r}: {process.communicate(timeout=30)[1]}")
    return process, found[0], line
