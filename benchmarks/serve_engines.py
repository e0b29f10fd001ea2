"""``multihead serve`` against a LibreTranslate-style CTranslate2 server on the same weights and machine: sentences/s
and latency under closed-loop load, each server in turn. It trains nothing and talks to 127.0.0.1 only.

    .venv/bin/python benchmarks/serve_engines.py RUN SRC [--ct2 DIR] [--hf-tokenizer DIR] [--clients 16 64]
        [--seconds 30] [--limit 1000] [--threads 2] [--ct2-split 2x1] [--rounds 1] [--warmup 2] [--check 50]
        [--langs SRC TGT] [--guard] [--neighbours 0] [--json OUT]

The sentences are the first ``--limit`` lines of SRC less the blank ones. The CTranslate2 model is ``--ct2 DIR``,
written by ``multihead export RUN DIR --format ctranslate2`` when DIR is missing (a temporary one without
``--ct2``). Both servers run at once, each in a process of its own, computing with ``--threads`` CPU threads in all:

* ``multihead serve RUN --host 127.0.0.1 --port P --threads T --beam 1 --no-guard`` (``--guard`` keeps serve's guard,
  its default, which searches doubtful translations again with a beam of 4; CTranslate2 has none): greedy, every
  request's sentences joining one running batch;
* the LibreTranslate-style server, built as LibreTranslate and argos-translate use CTranslate2: this script again
  (``--serve-ct2 PORT``, hidden), a Starlette app under uvicorn (one worker, uvicorn's defaults) whose ``POST
  /translate`` takes LibreTranslate's JSON (``q``, ``source``, ``target``) and answers ``{"translatedText": ...}``.
  Each request is translated on its own, off the event loop (``run_in_threadpool``), by one
  ``ctranslate2.Translator(DIR, device="cpu", inter_threads=I, intra_threads=J)`` that all requests share
  (``--ct2-split IxJ``, default ``Tx1``: on a few cores, one request per thread is the fastest split), with
  ``translate_batch([tokens], beam_size=1, max_decoding_length=L)``: no batching across requests, as LibreTranslate
  has none. The tokens are the run's own tokenizer's pieces of the text (``source.encode``: a Marian model's end with
  ``</s>``), the answer its target tokenizer's decoding of the pieces CTranslate2 gives back; ``L`` is the length
  limit ``multihead translate`` gives a source of that many tokens (one less where the run ends a translation at its
  limit with EOS, which CTranslate2 does not). ``--hf-tokenizer DIR``: tokenize with Transformers' MarianTokenizer of
  DIR instead (a model CTranslate2's ``TransformersConverter`` converted from that checkpoint).

First the first ``--check`` sentences go through both servers one request at a time: how many answers are identical
(both are greedy on the same weights; fewer than 80% is a failure). Then ``--rounds`` rounds, each running every
server at every ``--clients`` count in turn: ``--warmup`` seconds of load not counted, then ``--seconds`` measured.
Each client is a thread with one keep-alive connection that POSTs a random sentence (seeded per client: both servers
get the same sequence) and waits for the answer; every answer must be a 200 with a non-empty ``translatedText``.
Reported: each server's answered sentences/s (over the phases' seconds, until the last answer), p50 and p99 latency,
the CPU seconds the server's process used per sentence, and multihead's sentences/s over CTranslate2's at the same
client count; the CPU and the command line. ``--json OUT`` writes it all, phase by phase.

``--threads 0``: ``multihead serve`` without ``--threads`` (its default: the cores other processes leave free, followed
while it serves), CTranslate2's split the usable cores × 1. ``--neighbours N``: N busy processes (a Python loop each)
run beside each phase, its warm-up included: the machine shared, as servers share it.

Exit status 1 if an answer was an error or fewer than 80% of the checked sentences agree.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from deployed_sizes import busy_neighbours
from serve_load import (
    HOST,
    JSON,
    MULTIHEAD,
    START_TIMEOUT,
    Client,
    Failed,
    Tally,
    Unanswered,
    Unsent,
    free_port,
    get_json,
    language_pair,
    percentile,
    run_benchmark,
)

from multihead import cpu
from multihead.app.console import UserError
from multihead.app.corpus import iter_lines

SERVERS = ("multihead", "CTranslate2")
AGREEMENT = 0.80  # fewest identical answers among the checked sentences
IDLE_CPU = 0.05  # the idle server's CPU seconds per second of another's phase, above which the report warns


# --- the LibreTranslate-style CTranslate2 server (the child, --serve-ct2) --------------------------------------------


@dataclass
class Codec:
    """How the CTranslate2 server turns a text into the tokens its model reads, and its tokens back into text."""

    tokenize: Callable[[str], list[str]]
    detokenize: Callable[[list[str]], str]
    limit: Callable[[int], int]  # max_decoding_length for a source of that many tokens
    prefix: list[str]  # what the run forces first (a language code): target_prefix, left out of the answer


def run_codec(run: str, hf_tokenizer: str | None) -> Codec:
    """The run's tokenizers (or MarianTokenizer of ``hf_tokenizer``) and length limit."""
    from multihead.app.batched import length_limit
    from multihead.app.runs import open_checkpoint

    checkpoint, _ = open_checkpoint(Path(run), None, lambda found: None)
    source, target = checkpoint.source, checkpoint.target
    longest, max_len = int(checkpoint.trainer["data"].get("longest_target", 0)), checkpoint.config.max_len
    most, at_limit = checkpoint.search.get("max_length"), int(checkpoint.generation.eos_at_limit)
    forced = target.pieces(list(checkpoint.generation.forced))

    def limit(length: int) -> int:
        own = min(most, max_len - 1) if most is not None else length_limit(length, longest, max_len)
        return max(1, own - at_limit)  # multihead's EOS at the limit is a token CTranslate2 does not write

    if hf_tokenizer is not None:
        return _marian_codec(hf_tokenizer, limit, forced)
    ids = {piece: index for index, piece in enumerate(target.pieces(range(len(target))))}
    return Codec(
        tokenize=lambda text: source.pieces(source.encode(text)[0]),
        detokenize=lambda tokens: target.decode([ids.get(piece, target.specials.unk) for piece in tokens]),
        limit=limit,
        prefix=forced,
    )


def _marian_codec(directory: str, limit: Callable[[int], int], forced: list[str]) -> Codec:
    import warnings

    from transformers import MarianTokenizer

    with warnings.catch_warnings():  # MarianTokenizer recommends Moses' punctuation normalizer
        warnings.simplefilter("ignore", UserWarning)
        tokenizer = MarianTokenizer.from_pretrained(directory)
    return Codec(
        tokenize=lambda text: tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids),
        detokenize=lambda tokens: tokenizer.decode(tokenizer.convert_tokens_to_ids(tokens), skip_special_tokens=True),
        limit=limit,
        prefix=forced,
    )


def ct2_app(codec: Codec, translator: Any, pair: tuple[str, str]) -> Any:
    """The Starlette app: ``POST /translate`` (one text, translated on its own), ``GET /health``, ``GET /languages``."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def translate(text: str) -> str:
        tokens = codec.tokenize(text)
        results = translator.translate_batch([tokens], beam_size=1, max_decoding_length=codec.limit(len(tokens)),
                                             target_prefix=[codec.prefix] if codec.prefix else None)  # fmt: skip
        return codec.detokenize(results[0].hypotheses[0][len(codec.prefix) :])

    async def translate_endpoint(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "Invalid JSON format"}, status_code=400)
        text = body.get("q") if isinstance(body, dict) else None
        if not isinstance(text, str) or not text.strip():
            return JSONResponse({"error": "Invalid request: missing q parameter"}, status_code=400)
        if (body.get("source"), body.get("target")) != pair:
            return JSONResponse({"error": f"{body.get('source')} is not supported"}, status_code=400)
        return JSONResponse({"translatedText": await run_in_threadpool(translate, text)})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def languages(request: Request) -> JSONResponse:
        return JSONResponse([{"code": pair[0], "name": pair[0], "targets": [pair[1]]}])

    routes = [Route("/translate", translate_endpoint, methods=["POST"]), Route("/health", health),
              Route("/languages", languages)]  # fmt: skip
    return Starlette(routes=routes)


def serve_ct2(args: argparse.Namespace) -> int:
    import ctranslate2
    import uvicorn

    inter, intra = args.ct2_split
    codec = run_codec(args.run, args.hf_tokenizer)
    translator = ctranslate2.Translator(args.ct2, device="cpu", inter_threads=inter, intra_threads=intra)
    app = ct2_app(codec, translator, tuple(args.langs))
    uvicorn.run(app, host=HOST, port=args.serve_ct2, workers=1, log_level="warning")
    return 0


# --- the servers, from the parent ------------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    process: subprocess.Popen
    port: int
    log: Path

    def cpu_seconds(self) -> float:
        """User and system CPU seconds of the server's process so far (all its threads)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(name: str, command: list[str], directory: Path) -> Server:
    """``command`` (which listens on the port after its ``--port`` or ``--serve-ct2``), up once it answers /health."""
    port = int(command[command.index("--port" if name == SERVERS[0] else "--serve-ct2") + 1])
    log = directory / f"{name}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    server = Server(name, process, port, log)
    print(f"{name}: {shlex.join(command[1:])} ...", file=sys.stderr)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise Failed(f"{name} exited with status {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            get_json(port, "/health", timeout=5)
            return server
        except (OSError, ValueError, Failed):
            time.sleep(0.5)
    stop(server)
    raise Failed(f"{name} did not answer GET /health within {START_TIMEOUT:.0f} s")


def stop(server: Server) -> None:
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(10)


@contextmanager
def servers(args: argparse.Namespace, ct2: str, directory: Path) -> Iterator[tuple[list[Server], tuple[str, str]]]:
    """Both servers, up, and the pair they translate (multihead's first); stopped at the end."""
    port = free_port()
    command = [*MULTIHEAD, "serve", args.run, "--host", HOST, "--port", str(port), "--beam", "1",
               *([] if args.guard else ["--no-guard"])]  # fmt: skip
    command += ["--threads", str(args.threads)] if args.threads else []  # 0: serve's own default
    command += ["--langs", *args.langs] if args.langs else []
    running = [start(SERVERS[0], command, directory)]
    try:
        pair = language_pair(port)
        inter, intra = args.ct2_split
        child = [sys.executable, str(Path(__file__).resolve()), args.run, args.src, "--ct2", ct2, "--serve-ct2",
                 str(free_port()), "--ct2-split", f"{inter}x{intra}", "--langs", *pair]  # fmt: skip
        child += ["--hf-tokenizer", args.hf_tokenizer] if args.hf_tokenizer else []
        running.append(start(SERVERS[1], child, directory))
        yield running, pair
    finally:
        for server in running:
            stop(server)


# --- the load -----------------------------------------------------------------------------------------------------


def post_text(client: Client, body: bytes) -> tuple[str | None, str]:
    """The ``translatedText`` of one request, or None and what went wrong."""
    try:
        status, data = client.post(body, JSON)
    except (Unsent, Unanswered) as error:
        return None, str(error)
    try:
        text = json.loads(data)["translatedText"] if status == 200 else None
    except (ValueError, KeyError, TypeError):
        text = None
    if not isinstance(text, str) or not text.strip():
        return None, f"status {status}: {data[:200]!r}"
    return text, ""


def client_loop(port: int, bodies: list[bytes], deadline: float, seed: str, tally: Tally) -> None:
    rng, client = random.Random(seed), Client(port)
    while time.monotonic() < deadline:
        body = bodies[rng.randrange(len(bodies))]
        tally.requests += 1
        begin = time.monotonic()
        text, problem = post_text(client, body)
        if text is None:
            tally.errors += 1
            tally.note(problem)
            time.sleep(0.05)  # no busy loop against a server that fails
            continue
        tally.ok += 1
        tally.latencies.append(time.monotonic() - begin)
    client.connection.close()


def load(port: int, bodies: list[bytes], clients: int, seconds: float, name: str) -> tuple[Tally, float]:
    """``clients`` closed-loop clients for ``seconds``: their tallies together, and the seconds until the last
    answer."""
    tallies = [Tally() for _ in range(clients)]
    begin = time.monotonic()
    threads = [threading.Thread(target=client_loop, args=(port, bodies, begin + seconds, f"{name} {index}", tally),
                                daemon=True) for index, tally in enumerate(tallies)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - begin
    total = Tally()
    for tally in tallies:
        total.add(tally)
    return total, elapsed


@dataclass
class Measured:
    round: int
    server: str
    clients: int
    seconds: float
    requests: int
    sentences: int
    errors: int
    rate: float  # sentences/s
    p50_ms: float
    p99_ms: float
    cpu_ms: float  # the server's CPU per sentence
    idle_cpu: float  # the other server's CPU seconds per second meanwhile
    problems: list[str] = field(default_factory=list)


def phase(args: argparse.Namespace, running: list[Server], which: int, clients: int, round_: int,
          bodies: list[bytes]) -> Measured:  # fmt: skip
    server, other = running[which], running[1 - which]
    print(f"round {round_ + 1}: {server.name}, {clients} clients, {args.seconds:g} s ...", file=sys.stderr)
    busy = busy_neighbours(args.neighbours)
    try:
        if args.warmup > 0:
            load(server.port, bodies, clients, args.warmup, "warm-up")
        cpu, idle, client_cpu = server.cpu_seconds(), other.cpu_seconds(), time.process_time()
        tally, seconds = load(server.port, bodies, clients, args.seconds, "client")
    finally:
        for process in busy:
            process.kill()
            process.wait()
    used = server.cpu_seconds() - cpu
    idle = (other.cpu_seconds() - idle) / seconds
    client_cpu = time.process_time() - client_cpu
    print(f"  {tally.ok / seconds:.2f} sentences/s, the clients' CPU {client_cpu:.1f} s", file=sys.stderr)
    return Measured(round_ + 1, server.name, clients, seconds, tally.requests, tally.ok, tally.errors,
                    tally.ok / seconds, percentile(tally.latencies, 0.5), percentile(tally.latencies, 0.99),
                    1000 * used / max(tally.ok, 1), idle, tally.problems)  # fmt: skip


def agreement(running: list[Server], bodies: list[bytes], sentences: list[str]) -> dict[str, Any]:
    """Each checked sentence through each server, one request at a time: how many answers are identical."""
    answers = []
    for server in running:
        client = Client(server.port)
        texts = []
        for body in bodies:
            text, problem = post_text(client, body)
            if text is None:
                raise Failed(f"{server.name}: {problem}")
            texts.append(text)
        client.connection.close()
        answers.append(texts)
    differ = [(source, *both) for source, *both in zip(sentences, *answers, strict=True) if both[0] != both[1]]
    return {"checked": len(bodies), "identical": len(bodies) - len(differ),
            "differing": [dict(zip(("source", *SERVERS), row, strict=True)) for row in differ[:5]]}  # fmt: skip


# --- the report ---------------------------------------------------------------------------------------------------


def summary(measured: list[Measured]) -> list[dict[str, Any]]:
    """One row a server and client count, over all rounds: sentences over seconds; multihead's rate over CT2's."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for entry in measured:
        empty = {"server": entry.server, "clients": entry.clients, "rates": [], "p50": [], "p99": [], "cpu": []}
        row = rows.setdefault((entry.server, entry.clients), empty)
        for key, value in (("rates", entry.rate), ("p50", entry.p50_ms), ("p99", entry.p99_ms), ("cpu", entry.cpu_ms)):
            row[key].append(value)
    for row in rows.values():
        for key, name in (("rates", "rate"), ("p50", "p50_ms"), ("p99", "p99_ms"), ("cpu", "cpu_ms")):
            values = sorted(row.pop(key))
            row[name] = values[len(values) // 2]  # the median round's
    for (server, clients), row in rows.items():
        other = rows.get((SERVERS[1], clients))
        row["ratio"] = row["rate"] / other["rate"] if server == SERVERS[0] and other and other["rate"] else None
    return list(rows.values())


def report(args: argparse.Namespace, pair: tuple[str, str], checked: dict[str, Any], measured: list[Measured],
           command: str) -> dict[str, Any]:  # fmt: skip
    described, rows = cpu.describe(), summary(measured)
    inter, intra = args.ct2_split
    print(f"\nCPU: {described}\ncommand: {command}")
    print(f"{pair[0]} -> {pair[1]}, greedy; multihead serve --threads {args.threads}"
          f"{'' if args.guard else ' --no-guard'}; CTranslate2 inter_threads {inter} x intra_threads {intra}; "
          f"{args.seconds:g} s a phase, {args.rounds} round(s) (the median round's figures)")  # fmt: skip
    print(f"agreement: {checked['identical']} of {checked['checked']} checked sentences translated identically\n")
    print("| server | clients | sentences/s | p50 ms | p99 ms | CPU ms/sentence | multihead / CT2 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        ratio = f"{row['ratio']:.2f}" if row.get("ratio") is not None else ""
        print(f"| {row['server']} | {row['clients']} | {row['rate']:.1f} | {row['p50_ms']:.0f} | {row['p99_ms']:.0f} "
              f"| {row['cpu_ms']:.0f} | {ratio} |")  # fmt: skip
    errors = sum(entry.errors for entry in measured)
    problems = [problem for entry in measured for problem in entry.problems][:10]
    for problem in problems:
        print(f"  problem: {problem}")
    for entry in measured:
        if entry.idle_cpu > IDLE_CPU:
            print(f"  note: the idle server used {entry.idle_cpu:.2f} CPU s/s during {entry.server}'s phase of "
                  f"{entry.clients} clients in round {entry.round}")  # fmt: skip
    return {"command": command, "cpu": described, "pair": list(pair), "threads": args.threads,
            "ct2_split": [inter, intra], "guard": args.guard, "seconds": args.seconds, "rounds": args.rounds,
            "agreement": checked,
            "errors": errors, "summary": rows, "phases": [asdict(entry) for entry in measured]}  # fmt: skip


# --- the parent ---------------------------------------------------------------------------------------------------


def ensure_ct2(args: argparse.Namespace, directory: Path) -> str:
    """``--ct2``'s directory, exported from RUN when missing (into ``directory`` without ``--ct2``)."""
    out = Path(args.ct2) if args.ct2 else directory / "ct2"
    if not out.exists():
        command = [*MULTIHEAD, "export", args.run, str(out), "--format", "ctranslate2"]
        print(f"exporting: {shlex.join(command[1:])} ...", file=sys.stderr)
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if done.returncode != 0:
            raise Failed(f"multihead export exited with status {done.returncode}:\n{done.stderr[-2000:]}")
    return str(out)


def benchmark(args: argparse.Namespace, directory: Path) -> int:
    sentences = [line for line in itertools.islice(iter_lines(args.src, "SRC"), args.limit) if line.strip()]
    if not sentences:
        raise UserError(f"SRC: no sentence in the first {args.limit} lines of {args.src}")
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    ct2 = ensure_ct2(args, directory)
    with servers(args, ct2, directory) as (running, pair):
        bodies = [json.dumps({"q": text, "source": pair[0], "target": pair[1]}).encode() for text in sentences]
        check = min(args.check, len(sentences))
        print(f"agreement: the first {check} sentences through both servers, one at a time ...", file=sys.stderr)
        checked = agreement(running, bodies[:check], sentences[:check])
        measured = [
            phase(args, running, which, clients, round_, bodies)
            for round_ in range(args.rounds)
            for which in range(len(running))
            for clients in args.clients
        ]
    result = report(args, pair, checked, measured, command)
    result["sentences"] = len(sentences)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    agreed = checked["identical"] >= AGREEMENT * checked["checked"]
    if not agreed:
        print(f"\nfewer than {AGREEMENT:.0%} of the checked sentences agree", file=sys.stderr)
    return 0 if agreed and result["errors"] == 0 else 1


def split(text: str) -> tuple[int, int]:
    inter, _, intra = text.partition("x")
    if not (inter.isdigit() and intra.isdigit() and int(inter) > 0 and int(intra) > 0):
        raise argparse.ArgumentTypeError(f"expected INTERxINTRA (2x1), received {text!r}")
    return int(inter), int(intra)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run directory written by multihead train (or import)")
    parser.add_argument("src", help="source sentences (plain or .gz)")
    parser.add_argument("--ct2", help="the CTranslate2 model directory (written by multihead export when missing)")
    parser.add_argument("--hf-tokenizer", metavar="DIR", help="tokenize for CTranslate2 with MarianTokenizer of DIR")
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64], help="client counts (default: 16 64)")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured seconds a phase (default: 30)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each (default: 2)")
    parser.add_argument("--limit", type=int, default=1000, help="read the first N lines of SRC (default: 1000)")
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="CPU threads of each server in all (default: 2; 0: multihead serve's own default, the free cores "
        "followed, and CTranslate2's split the cores x 1)",
    )
    parser.add_argument("--neighbours", type=int, default=0, help="busy processes beside each phase (default: 0)")
    parser.add_argument("--ct2-split", type=split, help="CTranslate2's inter_threads x intra_threads (default: Tx1)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every server and count (default: 1)")
    parser.add_argument("--check", type=int, default=50, help="sentences whose answers are compared (default: 50)")
    parser.add_argument("--langs", nargs=2, metavar=("SRC", "TGT"), help="serve's, for a run that records none")
    parser.add_argument("--guard", action="store_true", help="keep multihead serve's guard (default: --no-guard)")
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON")
    parser.add_argument("--serve-ct2", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.ct2_split = args.ct2_split or (args.threads or len(os.sched_getaffinity(0)), 1)
    if min(args.clients) < 1 or args.seconds <= 0 or args.warmup < 0 or args.limit < 1:
        parser.error("--clients and --limit must be 1 or more, --seconds above 0, --warmup 0 or more")
    if args.threads < 0 or args.neighbours < 0:
        parser.error("--threads and --neighbours must be 0 or more")
    if args.rounds < 1 or args.check < 1:
        parser.error("--rounds and --check must be 1 or more")
    return args


def main() -> int:
    args = arguments()
    if args.serve_ct2 is not None:
        return serve_ct2(args)
    return run_benchmark("serve_engines", benchmark, args)


if __name__ == "__main__":
    sys.exit(main())
