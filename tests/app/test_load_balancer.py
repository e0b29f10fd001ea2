"""Replicas of ``serve`` behind a load balancer: two ``multihead serve`` processes on two ports, and Debian's HAProxy
in front of them, round robin with health checks on ``/health``. The service keeps no state a request needs from
another (only each replica's own rate-limit counts), so any replica answers any request: every answer through the
balancer is ``translate``'s, both replicas answer, and when one stops the other answers everything.

HAProxy comes from Debian's ``haproxy`` package; without it the test is skipped, except in CI, which installs it.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from app.served import start
from app.support import SAMPLES, CorpusRun
from multihead.app.serve import listening_socket

CONFIG = """global
    maxconn 256
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    retries 3
    option redispatch
frontend translate
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance roundrobin
    option httpchk GET /health
    http-response set-header X-Replica %s
{servers}
"""


def ask(port: int, text: str) -> tuple[int, str, str]:
    """A translation through the balancer: its status, its text and the replica that answered."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"q": text, "source": "de", "target": "en"}).encode()
    connection.request("POST", "/translate", body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    return response.status, answer.get("translatedText", answer), response.getheader("X-Replica") or ""


def test_replicas_behind_haproxy_answer_as_one_service(corpus_run: CorpusRun, tmp_path: Path) -> None:
    binary = shutil.which("haproxy")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("no haproxy: apt-get install haproxy (CI installs it)")
        pytest.skip("no haproxy: apt-get install haproxy")
    replicas = [start(corpus_run.path) for _ in range(2)]
    balancer = None
    try:
        with listening_socket("127.0.0.1", 0) as sock:  # a free port for the balancer
            port = sock.getsockname()[1]
        servers = "\n".join(
            f"    server replica{index} {url.removeprefix('http://')} check inter 200ms fall 1 rise 1"
            for index, (_, url, _) in enumerate(replicas)
        )
        config = tmp_path / "haproxy.cfg"
        config.write_text(CONFIG.format(port=port, servers=servers))
        balancer = subprocess.Popen([binary, "-f", str(config), "-db"], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                first = ask(port, SAMPLES[0])
                break
            except OSError:
                assert time.monotonic() < deadline, "HAProxy did not listen in 30 s"
                time.sleep(0.1)
        answers = [first] + [ask(port, SAMPLES[i % len(SAMPLES)]) for i in range(1, 12)]
        assert [(status, text) for status, text, _ in answers] == [
            (200, corpus_run.translations[i % len(SAMPLES)]) for i in range(12)
        ]
        assert {replica for _, _, replica in answers} == {"replica0", "replica1"}
        stopped, _, _ = replicas[0]
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(60) == 0
        time.sleep(1.0)  # the health check marks it down
        after = [ask(port, SAMPLES[i % len(SAMPLES)]) for i in range(6)]
        assert after == [(200, corpus_run.translations[i % len(SAMPLES)], "replica1") for i in range(6)]
    finally:
        for process in [*(process for process, _, _ in replicas), *([balancer] if balancer else [])]:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=30)
