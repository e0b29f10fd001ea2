"""A loopback load test of ``multihead serve``: its throughput against ``multihead translate``'s, answers, SIGTERM.
Concurrent clients, every answer checked, then malformed requests mixed in, then a SIGTERM under load. It trains
nothing and talks to 127.0.0.1 only.

    .venv/bin/python benchmarks/serve_load.py RUN SRC [--clients 32] [--seconds 60] [--limit 1000] [--port 0] [--beam 1]
        [--langs SRC TGT] [--give-up 3] [--framework torch|keras]

The sentences are the first ``--limit`` lines of SRC less the blank ones. Baseline: ``multihead translate RUN --input``
on all of them, timed, less the time the same command takes on one of them (loading the model); its lines are the
expected translations. Then ``multihead serve RUN`` on a free loopback port and four phases of ``--seconds`` each,
each client a thread with one keep-alive connection that POSTs a random sentence (seeded per client) to /translate:

* clean: every answer must be a 200 with the expected translation of the sentence sent (another is "wrong");
  sentences/s against the baseline's (target: 0.70 or more), p50 and p99 latency;
* malformed: one request in ten is malformed (invalid JSON, ``q`` a number, no ``q``, ``q`` a list holding a number,
  ``q`` empty, a form body without ``target``) and must get a 4xx whose JSON body has an ``error`` string;
* heavy: the clients as in the clean phase, beside one heavy client that posts one text of as many sentences as a
  request may hold (1 MiB, one a line) and gives up after ``--give-up`` seconds (3), again and again: every answer
  must be right, and the clients' p95 latency at most twice the clean phase's;
* alternatives: the clients as in the clean phase, beside one client that posts a text of ``ALTERNATIVE_LINES``
  sentences (one a line) asking for 3 alternatives (a beam search of each line), again and again: every answer must
  be right, and the clients' p95 latency at most twice the clean phase's;
* sigterm: SIGTERM to the server after a quarter of ``--seconds`` (2 s at least); each request must then be answered
  correctly or never reach the server: refused or reset before it is sent, or sent after the SIGTERM and reset unread
  (a TCP reset with no response: the server closed the connection without reading it). One in flight at the SIGTERM
  and not answered, or sent after it and closed or timed out, is "unanswered". The server must exit with status 0
  within 60 s.

Exit status 1 if a target is missed: an error or a wrong answer in any phase, the ratio, an unanswered request, the
server's exit status. An idle keep-alive connection the server has closed is dropped before reuse, as urllib3 does.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import math
import os
import random
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import urlencode

from multihead import cpu
from multihead.app.console import UserError
from multihead.app.corpus import iter_lines

MULTIHEAD = [sys.executable, "-m", "multihead"]
HOST = "127.0.0.1"
TIMEOUT = 30.0  # seconds: every HTTP request
START_TIMEOUT, EXIT_TIMEOUT, TRANSLATE_TIMEOUT = 120.0, 60.0, 3600.0
JSON, FORM = "application/json", "application/x-www-form-urlencoded"
TARGET_RATIO = 0.70
ALTERNATIVE_LINES = 20
HEAVY_P95 = 2.0  # the heavy phase's p95 latency over the clean phase's, at most
BODY_LIMIT = 1 << 20  # what serve accepts


class Failed(Exception):
    """The benchmark cannot go on (a command failed, the server did not start)."""


class Unsent(Exception):
    """The request never left: the connection was refused, or reset before the request was sent."""


class Unanswered(Exception):
    """The request was sent and no whole response came back (closed, reset or timed out)."""

    def __init__(self, message: str, reset: bool) -> None:
        super().__init__(message)
        self.reset = reset  # a TCP reset: the server closed the connection with the request unread


@dataclass
class Tally:
    """One client's counts in one phase (``requests``: the sentences sent; ``malformed``: the malformed requests)."""

    requests: int = 0
    ok: int = 0
    errors: int = 0
    wrong: int = 0
    malformed: int = 0
    not_refused: int = 0  # malformed requests without a 4xx JSON error
    refused: int = 0  # after SIGTERM, failed before being sent: fine
    reset: int = 0  # sent after SIGTERM, reset unread: fine
    lost_in_flight: int = 0  # sent before SIGTERM, unanswered
    lost_after: int = 0  # sent after SIGTERM, unanswered
    latencies: list[float] = field(default_factory=list)  # seconds, of the correct answers
    problems: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name in (item.name for item in fields(self)):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def note(self, problem: str) -> None:
        if len(self.problems) < 3:
            self.problems.append(problem)


@dataclass
class Load:
    """What every client sends and expects."""

    port: int
    bodies: list[bytes]  # the JSON request of each sentence
    expected: list[str]  # multihead translate's translation of each
    bad: list[tuple[bytes, str]]  # malformed bodies and their content types


@dataclass
class Phase:
    name: str
    deadline: float  # time.monotonic(): no request starts after it
    malformed: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    sigterm_at: float | None = None


def _closed_by_server(sock: socket.socket) -> bool:
    """An idle keep-alive connection is readable only if the server closed it (or sent something unasked)."""
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class Client:
    """One keep-alive connection to the server, opened again after a failure or a close."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT)

    def post(self, body: bytes, content_type: str) -> tuple[int, bytes]:
        connection = self.connection
        if connection.sock is not None and _closed_by_server(connection.sock):
            connection.close()
        try:
            connection.request("POST", "/translate", body, {"Content-Type": content_type})
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise Unsent(repr(error)) from error
        try:
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise Unanswered(repr(error), isinstance(error, ConnectionResetError)) from error


def get_json(port: int, path: str, timeout: float = TIMEOUT) -> object:
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise Failed(f"GET {path}: status {response.status}: {body[:200]!r}")
        return json.loads(body)
    finally:
        connection.close()


def is_refusal(status: int, data: bytes) -> bool:
    """A 4xx whose body is a JSON object with an ``error`` string."""
    try:
        body = json.loads(data)
    except ValueError:
        return False
    return 400 <= status < 500 and isinstance(body, dict) and isinstance(body.get("error"), str)


def client_loop(load: Load, phase: Phase, index: int, tally: Tally) -> None:
    rng, client = random.Random(f"{phase.name} {index}"), Client(load.port)
    for count in itertools.count(1):
        if phase.stop.is_set() or time.monotonic() >= phase.deadline:
            break
        malformed = phase.malformed and count % 10 == 0
        if malformed:
            body, content_type = load.bad[(count // 10 + index) % len(load.bad)]
            tally.malformed += 1
        else:
            sentence = rng.randrange(len(load.bodies))
            body, content_type = load.bodies[sentence], JSON
            tally.requests += 1
        begin = time.monotonic()
        try:
            status, data = client.post(body, content_type)
        except Unsent as error:
            if phase.sigterm_at is None:
                tally.errors += 1
                tally.note(f"{phase.name}: not sent: {error}")
            else:
                tally.refused += 1
            time.sleep(0.05)  # no busy loop against a closed port
            continue
        except Unanswered as error:
            if phase.sigterm_at is None:
                tally.errors += 1
            elif begin < phase.sigterm_at:
                tally.lost_in_flight += 1
            elif error.reset:
                tally.reset += 1
                continue
            else:
                tally.lost_after += 1
            tally.note(f"{phase.name}: sent, unanswered: {error}")
            continue
        latency = time.monotonic() - begin
        if malformed:
            if not is_refusal(status, data):
                tally.not_refused += 1
                tally.note(f"{phase.name}: malformed {body[:60]!r} got status {status}: {data[:200]!r}")
            continue
        if status != 200:
            tally.errors += 1
            tally.note(f"{phase.name}: status {status}: {data[:200]!r}")
            continue
        try:
            answer = json.loads(data)["translatedText"]
        except (ValueError, KeyError, TypeError):
            tally.errors += 1
            tally.note(f"{phase.name}: status 200 without translatedText: {data[:200]!r}")
            continue
        if answer == load.expected[sentence]:
            tally.ok += 1
            tally.latencies.append(latency)
        else:
            tally.wrong += 1
            tally.note(f"{phase.name}: sentence {sentence}: expected {load.expected[sentence]!r}, got {answer!r}")
    client.connection.close()


def run_phase(
    load: Load, phase: Phase, clients: int, meanwhile: Callable[[], None] | None = None
) -> tuple[Tally, float]:
    """The clients' tallies together and the phase's seconds (until the last client is done)."""
    tallies = [Tally() for _ in range(clients)]
    threads = [
        threading.Thread(target=client_loop, args=(load, phase, index, tally), daemon=True)
        for index, tally in enumerate(tallies)
    ]
    begin = time.monotonic()
    for thread in threads:
        thread.start()
    if meanwhile is not None:
        meanwhile()
    limit = max(phase.deadline, time.monotonic()) + 2 * TIMEOUT
    for thread in threads:
        thread.join(max(0.0, limit - time.monotonic()))
    seconds = time.monotonic() - begin
    phase.stop.set()
    total = Tally()
    for tally in tallies:
        total.add(tally)
    if stuck := sum(thread.is_alive() for thread in threads):
        total.errors += stuck
        total.note(f"{phase.name}: {stuck} clients still waiting {2 * TIMEOUT:.0f} s after the phase")
    return total, seconds


def translate(run: str, path: Path, beam: int) -> tuple[list[str], float]:
    """``multihead translate``'s lines for the lines of ``path``, and its wall time."""
    command = [*MULTIHEAD, "translate", run, "--input", str(path), "--beam", str(beam)]
    begin = time.monotonic()
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=TRANSLATE_TIMEOUT)
    seconds = time.monotonic() - begin
    if done.returncode != 0:
        raise Failed(f"multihead translate exited with status {done.returncode}:\n{done.stderr.decode()[-2000:]}")
    lines = done.stdout.decode("utf-8").split("\n")
    if lines and not lines[-1]:
        lines.pop()
    return lines, seconds


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def wait_until_up(server: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise Failed(f"multihead serve exited with status {server.returncode} before answering GET /health")
        try:
            get_json(port, "/health", timeout=5)
            return
        except (OSError, http.client.HTTPException, ValueError, Failed):
            time.sleep(0.5)
    raise Failed(f"multihead serve did not answer GET /health within {START_TIMEOUT:.0f} s")


def language_pair(port: int) -> tuple[str, str]:
    languages = get_json(port, "/languages")
    for entry in languages if isinstance(languages, list) else []:
        targets = [code for code in entry.get("targets") or [] if code != entry.get("code")]
        if targets:
            return entry["code"], targets[0]
    raise Failed(f"GET /languages names no source with a target: {languages!r}"[:500])


def malformed_bodies(sentence: str, source: str, target: str) -> list[tuple[bytes, str]]:
    pair = {"source": source, "target": target}
    payloads = [{"q": 42, **pair}, pair, {"q": [sentence, 7], **pair}, {"q": "", **pair}]
    return [
        (b'{"q": "' + sentence[:20].encode() + b'", "source": ', JSON),  # invalid JSON
        *[(json.dumps(payload).encode(), JSON) for payload in payloads],
        (urlencode({"q": sentence, "source": source}).encode(), FORM),  # no target
    ]


def heavy_body(sentences: list[str], source: str, target: str) -> tuple[bytes, int]:
    """One request holding as many of ``sentences`` (over and over, one a line) as a body may; and their count."""
    lines, size = [], 100
    for sentence in itertools.cycle(sentences):
        size += len(json.dumps(sentence))  # its characters as JSON escapes them; the newline's two for the quotes
        if size > BODY_LIMIT:
            break
        lines.append(sentence)
    return json.dumps({"q": "\n".join(lines), "source": source, "target": target}).encode(), len(lines)


def heavy_client(port: int, body: bytes, give_up: float, phase: Phase) -> int:
    """``body`` posted again and again until the phase ends, each time leaving ``give_up`` seconds later without
    reading the answer (as a client whose timeout has passed); how many times."""
    sent = 0
    while time.monotonic() < phase.deadline and not phase.stop.is_set():
        with socket.create_connection((HOST, port), timeout=TIMEOUT) as sock:
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
                         % (HOST.encode(), JSON.encode(), len(body)) + body)  # fmt: skip
            sent += 1
            phase.stop.wait(min(give_up, max(0.0, phase.deadline - time.monotonic())))
    return sent


def alternatives_client(port: int, body: bytes, phase: Phase) -> int:
    """``body`` (asking for alternatives) posted again and again until the phase ends, each answer read; how many
    answers were a 200."""
    answered = 0
    while time.monotonic() < phase.deadline and not phase.stop.is_set():
        connection = http.client.HTTPConnection(HOST, port, timeout=TRANSLATE_TIMEOUT)
        connection.request("POST", "/translate", body=body, headers={"Content-Type": JSON})
        response = connection.getresponse()
        response.read()
        connection.close()
        answered += response.status == 200
    return answered


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)] * 1000 if ordered else math.nan


def shutdown(server: subprocess.Popen, phase: Phase, delay: float, result: dict[str, float | int | None]) -> None:
    """SIGTERM to the server after ``delay`` s of load; its exit status and seconds to exit into ``result``."""
    time.sleep(delay)
    phase.sigterm_at = time.monotonic()
    server.send_signal(signal.SIGTERM)
    try:
        result["status"] = server.wait(EXIT_TIMEOUT)
        result["seconds"] = time.monotonic() - phase.sigterm_at
    except subprocess.TimeoutExpired:
        result["status"] = None
    phase.stop.set()


def benchmark(args: argparse.Namespace, directory: Path) -> int:
    sentences = [line for line in itertools.islice(iter_lines(args.src, "SRC"), args.limit) if line.strip()]
    if not sentences:
        raise UserError(f"SRC: no sentence in the first {args.limit} lines of {args.src}")
    (directory / "one.txt").write_text(sentences[0] + "\n", encoding="utf-8")
    (directory / "all.txt").write_text("".join(line + "\n" for line in sentences), encoding="utf-8")
    n = len(sentences)
    print(f"baseline: multihead translate on 1, then {n} sentences ...", file=sys.stderr)
    _, load_seconds = translate(args.run, directory / "one.txt", args.beam)
    expected, wall = translate(args.run, directory / "all.txt", args.beam)
    if len(expected) != n:
        raise Failed(f"multihead translate wrote {len(expected)} lines for {n} sentences")
    compute = wall - load_seconds if wall > load_seconds else wall
    raw_rate, baseline = n / wall, n / compute

    port = args.port or free_port()
    log_path = directory / "serve.log"
    command = [*MULTIHEAD, "serve", args.run, "--host", HOST, "--port", str(port), "--beam", str(args.beam),
               "--framework", args.framework]  # fmt: skip
    command += ["--langs", *args.langs] if args.langs else []
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        print(f"server: {' '.join(command[2:])} ...", file=sys.stderr)
        wait_until_up(server, port)
        source, target = language_pair(port)
        load = Load(
            port,
            [json.dumps({"q": text, "source": source, "target": target}).encode() for text in sentences],
            expected,
            malformed_bodies(sentences[0], source, target),
        )
        results: dict[str, tuple[Tally, float]] = {}
        body, heavy_lines = heavy_body(sentences, source, target)
        heavy = {"lines": heavy_lines, "sent": 0}
        asking = json.dumps({"q": "\n".join(sentences[:ALTERNATIVE_LINES]), "source": source, "target": target,
                             "alternatives": 3}).encode()  # fmt: skip
        for name in ("clean", "malformed", "heavy", "alternatives"):
            if server.poll() is not None:
                raise Failed(f"multihead serve exited with status {server.returncode} before the {name} phase")
            print(f"phase {name}: {args.clients} clients, {args.seconds:g} s ...", file=sys.stderr)
            phase = Phase(name, time.monotonic() + args.seconds, malformed=name == "malformed")

            def meanwhile(phase: Phase = phase) -> None:
                heavy["sent"] = heavy_client(port, body, args.give_up, phase)

            def asks(phase: Phase = phase) -> None:
                heavy["alternatives"] = alternatives_client(port, asking, phase)

            beside = {"heavy": meanwhile, "alternatives": asks}.get(name)
            results[name] = run_phase(load, phase, args.clients, beside)
        delay = max(args.seconds / 4, 2.0)
        print(f"phase sigterm: SIGTERM after {delay:g} s, up to {EXIT_TIMEOUT:.0f} s to exit ...", file=sys.stderr)
        phase = Phase("sigterm", time.monotonic() + delay + EXIT_TIMEOUT + 5)
        exit_result: dict[str, float | int | None] = {"status": None}
        results["sigterm"] = run_phase(load, phase, args.clients, lambda: shutdown(server, phase, delay, exit_result))
    except Failed:
        print(log_path.read_text(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
    return report(args, n, wall, load_seconds, raw_rate, baseline, f"{source} -> {target}", results, exit_result,
                  heavy)  # fmt: skip


def report(
    args: argparse.Namespace,
    n: int,
    wall: float,
    load_seconds: float,
    raw_rate: float,
    baseline: float,
    pair: str,
    results: dict[str, tuple[Tally, float]],
    exit_result: dict[str, float | int | None],
    heavy_sent: dict[str, int],
) -> int:
    clean, malformed, heavy, asking, sigterm = (
        results[name][0] for name in ("clean", "malformed", "heavy", "alternatives", "sigterm")
    )
    rates = {name: tally.ok / seconds for name, (tally, seconds) in results.items()}
    print(f"\nbaseline: multihead translate, {n} sentences in {wall:.2f} s, {load_seconds:.2f} s of it loading "
          f"(the time for 1 sentence): {raw_rate:.2f} sentences/s with loading, {baseline:.2f} without")  # fmt: skip
    print(f"server: multihead serve --framework {args.framework}, {pair}, beam {args.beam}, {args.clients} clients\n")
    print(f"{'phase':10s} {'seconds':>8s} {'requests':>9s} {'ok':>7s} {'errors':>7s} {'wrong':>6s} "
          f"{'sent/s':>7s} {'/ base':>7s} {'p50 ms':>8s} {'p95 ms':>8s} {'p99 ms':>8s}")  # fmt: skip
    for name, (tally, seconds) in results.items():
        print(f"{name:10s} {seconds:8.1f} {tally.requests:9d} {tally.ok:7d} {tally.errors:7d} {tally.wrong:6d} "
              f"{rates[name]:7.2f} {rates[name] / baseline:7.2f} {percentile(tally.latencies, 0.5):8.0f} "
              f"{percentile(tally.latencies, 0.95):8.0f} {percentile(tally.latencies, 0.99):8.0f}")  # fmt: skip
    print(f"\nmalformed: {malformed.malformed} malformed requests, {malformed.not_refused} without a 4xx JSON error; "
          f"good requests at {rates['malformed'] / rates['clean'] if rates['clean'] else math.nan:.2f} times the "
          f"clean phase's rate, p50 and p99 at "
          f"{percentile(malformed.latencies, 0.5) / percentile(clean.latencies, 0.5):.2f} and "
          f"{percentile(malformed.latencies, 0.99) / percentile(clean.latencies, 0.99):.2f} times its")  # fmt: skip
    heavy_p95 = percentile(heavy.latencies, 0.95) / percentile(clean.latencies, 0.95)
    print(f"heavy: {heavy_sent['sent']} texts of {heavy_sent['lines']} sentences, each left after {args.give_up:g} s; "
          f"the clients' p95 at {heavy_p95:.2f} times the clean phase's")  # fmt: skip
    asking_p95 = percentile(asking.latencies, 0.95) / percentile(clean.latencies, 0.95)
    print(f"alternatives: {heavy_sent.get('alternatives', 0)} texts of {ALTERNATIVE_LINES} sentences with 3 "
          f"alternatives answered; the clients' p95 at {asking_p95:.2f} times the clean phase's")  # fmt: skip
    status = exit_result["status"]
    exited = f"exit status {status} after {exit_result['seconds']:.2f} s" if status is not None else "no exit: killed"
    unanswered = sigterm.lost_in_flight + sigterm.lost_after
    print(f"sigterm: {exited}; {sigterm.refused} requests refused before being sent, {sigterm.reset} reset unread, "
          f"{unanswered} unanswered ({sigterm.lost_in_flight} in flight at SIGTERM, {sigterm.lost_after} sent "
          "after)")  # fmt: skip
    problems = [problem for tally, _ in results.values() for problem in tally.problems]
    if problems:
        print(f"\nproblems (the first {min(len(problems), 10)} of those kept):")
        for problem in problems[:10]:
            print(f"  {problem}")
    targets = [
        ("clean: errors = 0", clean.errors, clean.errors == 0),
        ("clean: wrong = 0", clean.wrong, clean.wrong == 0),
        (f"clean: sentences/s / baseline >= {TARGET_RATIO}", f"{rates['clean'] / baseline:.2f}",
         rates["clean"] / baseline >= TARGET_RATIO),
        ("malformed: errors = 0", malformed.errors, malformed.errors == 0),
        ("malformed: wrong = 0", malformed.wrong, malformed.wrong == 0),
        ("malformed: without a 4xx JSON error = 0", malformed.not_refused, malformed.not_refused == 0),
        ("heavy: errors = 0", heavy.errors, heavy.errors == 0),
        ("heavy: wrong = 0", heavy.wrong, heavy.wrong == 0),
        (f"heavy: p95 / clean p95 <= {HEAVY_P95}", f"{heavy_p95:.2f}", heavy_p95 <= HEAVY_P95),
        ("alternatives: errors = 0", asking.errors, asking.errors == 0),
        ("alternatives: wrong = 0", asking.wrong, asking.wrong == 0),
        (f"alternatives: p95 / clean p95 <= {HEAVY_P95}", f"{asking_p95:.2f}", asking_p95 <= HEAVY_P95),
        ("sigterm: errors = 0", sigterm.errors, sigterm.errors == 0),
        ("sigterm: wrong = 0", sigterm.wrong, sigterm.wrong == 0),
        ("sigterm: unanswered = 0", unanswered, unanswered == 0),
        ("sigterm: exit status = 0", "none" if status is None else status, status == 0),
    ]  # fmt: skip
    print(f"\n{'target':44s} {'value':>8s}  result")
    for label, value, met in targets:
        print(f"{label:44s} {value!s:>8s}  {'ok' if met else 'MISSED'}")
    missed = sum(not met for _, _, met in targets)
    print(f"\n{'all targets met' if not missed else f'{missed} targets missed'}")
    return 1 if missed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run directory written by multihead train")
    parser.add_argument("src", help="source sentences (plain or .gz)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent client threads (default: 32)")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each phase (default: 60)")
    parser.add_argument("--limit", type=int, default=1000, help="read the first N lines of SRC (default: 1000)")
    parser.add_argument("--port", type=int, default=0, help="the server's loopback port (default: 0, a free one)")
    parser.add_argument("--beam", type=int, default=1, help="beam size of translate and serve (default: 1)")
    parser.add_argument("--langs", nargs=2, metavar=("SRC", "TGT"), help="serve's, for a run that records none")
    parser.add_argument(
        "--framework",
        choices=("torch", "keras"),
        default="torch",
        help="what serve decodes with (default: torch; the baseline is translate's, in PyTorch)",
    )
    parser.add_argument("--give-up", type=float, default=3.0, help="seconds the heavy client waits (default: 3)")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}", flush=True)
    if args.clients < 1 or args.seconds <= 0 or args.limit < 1 or not 0 <= args.port < 65536 or args.give_up <= 0:
        parser.error("--clients and --limit must be 1 or more, --seconds and --give-up above 0, --port 0 to 65535")
    return run_benchmark("serve_load", benchmark, args)


def run_benchmark(name: str, benchmark: Callable[[argparse.Namespace, Path], int], args: argparse.Namespace) -> int:
    """``benchmark(args, directory)`` in a temporary directory, its exit status; the ``finally`` clauses that stop its
    servers run on SIGTERM too; a failure is one line on stderr and status 1."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with tempfile.TemporaryDirectory(prefix=f"{name}-") as directory:
            return benchmark(args, Path(directory))
    except (UserError, Failed, subprocess.TimeoutExpired) as error:
        print(f"{name}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
