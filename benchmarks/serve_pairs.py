"""A loopback load test of ``multihead serve`` with several runs: clients on several pairs (a pivoted one among them),
each pair's rate and p95 latency, then the same beside one heavy client on the first pair that gives up.

    .venv/bin/python benchmarks/serve_pairs.py RUN [RUN ...] --pair SRC TGT FILE [--pair ...] [--clients 8]
        [--seconds 30] [--limit 500] [--give-up 3] [--no-guard] [--no-split]

Each ``--pair`` names a pair the runs serve (directly or through English) and a file of sentences in its source
language (the first ``--limit`` lines, blank ones left out). ``multihead serve RUN ...`` runs on a free loopback
port. First each pair's sentences are translated one request at a time: those answers are what every later answer
must equal. Then two phases of ``--seconds`` each, ``--clients`` client threads a pair, each with one keep-alive
connection posting a random sentence of its pair (seeded per client):

* clean: each pair's sentences/s and p50/p95/p99 latency;
* heavy: the same, beside one client that posts to the first pair one text of as many sentences as a request may hold
  (1 MiB, one a line) and leaves ``--give-up`` seconds later without reading the answer, again and again: every other
  pair's p95 must stay within twice its clean p95.

Exit status 1 if a target is missed: an error or a wrong answer, or a pair's p95 ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from serve_load import (
    HEAVY_P95,
    HOST,
    MULTIHEAD,
    TIMEOUT,
    Client,
    Failed,
    Load,
    Phase,
    Tally,
    client_loop,
    free_port,
    heavy_body,
    heavy_client,
    percentile,
    wait_until_up,
)

from multihead.app.corpus import iter_lines


def reference(port: int, bodies: list[bytes]) -> list[str]:
    """Each body's answer, one request at a time."""
    client, answers = Client(port), []
    for body in bodies:
        status, data = client.post(body, "application/json")
        if status != 200:
            raise Failed(f"status {status} for {body[:80]!r}: {data[:200]!r}")
        answers.append(json.loads(data)["translatedText"])
    client.connection.close()
    return answers


def run_pairs(loads: list[Load], phase: Phase, clients: int, heavy: bytes | None, give_up: float) -> list[Tally]:
    """``clients`` threads a pair (and the heavy client on the first pair's, with ``heavy``): each pair's tally."""
    tallies = [[Tally() for _ in range(clients)] for _ in loads]
    threads = [
        threading.Thread(target=client_loop, args=(load, phase, index, tally), daemon=True)
        for load, pair_tallies in zip(loads, tallies, strict=True)
        for index, tally in enumerate(pair_tallies)
    ]
    for thread in threads:
        thread.start()
    if heavy is not None:
        heavy_client(loads[0].port, heavy, give_up, phase)
    limit = max(phase.deadline, time.monotonic()) + 2 * TIMEOUT
    for thread in threads:
        thread.join(max(0.0, limit - time.monotonic()))
    phase.stop.set()
    found = []
    for pair_tallies in tallies:
        total = Tally()
        for tally in pair_tallies:
            total.add(tally)
        found.append(total)
    return found


def benchmark(args: argparse.Namespace) -> int:
    texts = []
    for source, _, path in args.pair:
        lines = [line for index, line in zip(range(args.limit), iter_lines(path, source), strict=False) if line.strip()]
        texts.append(lines)
    port = free_port()
    command = [*MULTIHEAD, "serve", *args.run, "--host", HOST, "--port", str(port),
               *(["--no-guard"] * args.no_guard), *(["--no-split"] * args.no_split)]  # fmt: skip
    log_path = Path(tempfile.mkdtemp()) / "serve.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        wait_until_up(server, port)
        loads = []
        for (source, target, _), lines in zip(args.pair, texts, strict=True):
            bodies = [json.dumps({"q": line, "source": source, "target": target}).encode() for line in lines]
            print(f"reference: {source} -> {target}, {len(bodies)} sentences ...", file=sys.stderr)
            loads.append(Load(port, bodies, reference(port, bodies), []))
        source, target, _ = args.pair[0]
        heavy, lines = heavy_body(texts[0], source, target)
        results = {}
        for name in ("clean", "heavy"):
            print(f"phase {name}: {args.clients} clients a pair, {args.seconds:g} s ...", file=sys.stderr)
            phase = Phase(name, time.monotonic() + args.seconds)
            results[name] = run_pairs(loads, phase, args.clients, heavy if name == "heavy" else None, args.give_up)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(60)
    print(f"\nserver: {' '.join(command[2:])}; heavy: texts of {lines} sentences on the first pair, each left after "
          f"{args.give_up:g} s\n")  # fmt: skip
    print(f"{'pair':12s} {'phase':6s} {'ok':>6s} {'errors':>7s} {'wrong':>6s} {'sent/s':>7s} {'p50 ms':>7s} "
          f"{'p95 ms':>7s} {'p99 ms':>7s}")  # fmt: skip
    missed = 0
    for index, (source, target, _) in enumerate(args.pair):
        for name in ("clean", "heavy"):
            tally = results[name][index]
            lat = [percentile(tally.latencies, q) for q in (0.5, 0.95, 0.99)]  # ms
            print(f"{source + ' -> ' + target:12s} {name:6s} {tally.ok:6d} {tally.errors:7d} {tally.wrong:6d} "
                  f"{tally.ok / args.seconds:7.2f} {lat[0]:7.0f} {lat[1]:7.0f} {lat[2]:7.0f}")  # fmt: skip
            missed += tally.errors + tally.wrong > 0
        clean, heavy_tally = results["clean"][index], results["heavy"][index]
        ratio = percentile(heavy_tally.latencies, 0.95) / percentile(clean.latencies, 0.95)
        met = index == 0 or ratio <= HEAVY_P95
        missed += not met
        print(f"{'':12s} p95 heavy / clean {ratio:.2f}{'' if index else ' (the heavy pair)'}"
              f"{'' if met else f'  MISSED (target <= {HEAVY_P95})'}")  # fmt: skip
    print(f"\n{'all targets met' if not missed else f'{missed} targets missed'}")
    return 1 if missed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="+", help="run directories, served together")
    parser.add_argument("--pair", nargs=3, action="append", required=True, metavar=("SRC", "TGT", "FILE"),
                        help="a pair served and sentences in its source language (repeat)")  # fmt: skip
    parser.add_argument("--clients", type=int, default=8, help="client threads a pair (default: 8)")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase (default: 30)")
    parser.add_argument("--limit", type=int, default=500, help="read the first N lines of each FILE (default: 500)")
    parser.add_argument("--give-up", type=float, default=3.0, help="seconds the heavy client waits (default: 3)")
    parser.add_argument("--no-guard", action="store_true",
                        help="serve --no-guard: no second searches of doubted translations")  # fmt: skip
    parser.add_argument("--no-split", action="store_true",
                        help="serve --no-split: each line translated whole, not split into sentences")  # fmt: skip
    return benchmark(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
