"""Short requests beside a long document job: ``/translate``'s latency while ``serve`` translates a Word document in
the background (``POST /documents``), against the same requests with nothing else running.

    .venv/bin/python benchmarks/document_jobs.py RUN SRC [--paragraphs 1000] [--clients 2] [--requests 60]

``serve RUN`` starts on a free port of 127.0.0.1 (its jobs in a temporary directory). ``--clients`` threads each send
``--requests`` one-sentence requests (SRC's last lines, each its own), one after another: first with the server idle
("clean"), then while a job translates a .docx of ``--paragraphs`` paragraphs of three of SRC's sentences each (built
with python-docx; SRC's lines in turn, from the first again where they run out). Reported: each phase's p50 and p95
latency, their ratio, and the job's time.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from multihead.app.corpus import iter_lines


def start(run: str, jobs: Path) -> tuple[subprocess.Popen, str]:
    """``multihead serve RUN --port 0 --jobs JOBS``, and its URL once it listens."""
    process = subprocess.Popen([sys.executable, "-m", "multihead", "serve", run, "--port", "0", "--jobs", str(jobs)],
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert process.stderr is not None
    for line in process.stderr:
        found = re.search(r"http://127\.0\.0\.1:\d+", line)
        if found:
            return process, found[0]
    raise SystemExit(f"serve did not start: {process.communicate()[1]}")


def post(url: str, body: bytes, kind: str) -> dict:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": kind})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.loads(answer.read())


def load(url: str, texts: list[str], clients: int) -> list[float]:
    """Each of ``clients`` threads sends its share of ``texts``, one request after another: every latency."""
    latencies: list[float] = []

    def client(mine: list[str]) -> None:
        for text in mine:
            begin = time.perf_counter()
            post(
                f"{url}/translate", json.dumps({"q": text, "source": "de", "target": "en"}).encode(), "application/json"
            )
            latencies.append(time.perf_counter() - begin)

    threads = [threading.Thread(target=client, args=(texts[i::clients],)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies


def upload(name: str, data: bytes) -> tuple[bytes, str]:
    """A multipart form of the file ``name`` holding ``data``, from German into English: its body and type."""
    boundary = "benchmark-boundary"
    fields = "".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'
                     for key, value in (("source", "de"), ("target", "en")))  # fmt: skip
    head = f'{fields}--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n\r\n'
    return head.encode() + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def document(lines: list[str], paragraphs: int, path: Path) -> bytes:
    import docx

    made = docx.Document()
    for start in range(0, 3 * paragraphs, 3):  # SRC's lines in turn, again from the first where they run out
        made.add_paragraph(" ".join(lines[(start + k) % len(lines)] for k in range(3)))
    made.save(str(path))
    return path.read_bytes()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("src")
    parser.add_argument("--paragraphs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--requests", type=int, default=60)
    args = parser.parse_args()
    lines = [line for line in iter_lines(args.src, "SRC") if line.strip()]
    short = lines[-args.clients * args.requests :]
    folder = Path(tempfile.mkdtemp())
    data = document(lines, args.paragraphs, folder / "handbuch.docx")
    process, url = start(args.run, folder / "jobs")
    try:
        load(url, short[: args.clients * 4], args.clients)  # warm
        clean = load(url, short, args.clients)
        begin = time.perf_counter()
        job = post(f"{url}/documents", *upload("handbuch.docx", data))
        beside = load(url, short, args.clients)
        with urllib.request.urlopen(f"{url}/documents/{job['id']}", timeout=60) as answer:
            during = json.loads(answer.read())
        while during["status"] in ("queued", "running"):
            time.sleep(0.5)
            with urllib.request.urlopen(f"{url}/documents/{job['id']}", timeout=60) as answer:
                during = json.loads(answer.read())
        seconds = time.perf_counter() - begin
    finally:
        process.terminate()
        process.wait(timeout=60)
    for name, found in (("clean", clean), ("beside", beside)):
        print(f"{name:7} p50 {np.percentile(found, 50) * 1000:7.1f} ms  p95 {np.percentile(found, 95) * 1000:7.1f} ms"
              f"  ({len(found)} requests)")  # fmt: skip
    ratio = np.percentile(beside, 95) / np.percentile(clean, 95)
    print(f"p95 beside / clean: {ratio:.2f}; the job ({args.paragraphs} paragraphs, {3 * args.paragraphs} sentences) "
          f"{during['status']} in {seconds:.1f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
