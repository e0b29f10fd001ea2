"""``multihead serve`` of many runs within a memory budget (``--memory``), against the same runs all held, and two
replicas of it side by side.

    .venv/bin/python benchmarks/serve_memory.py WORK DATA [--runs 24] [--memory 2G] [--quantize int8]
        [--requests 480] [--clients 4] [--int8-runs]

WORK holds an OPUS-MT-sized Marian checkpoint of random weights (``WORK/checkpoint``, made by
``benchmarks/deployed_sizes.py``'s ``prepare`` when missing) and the runs served (``WORK/runs``, made when missing):
the checkpoint imported ``--runs`` times (``multihead import --langs``), each for a pair of its own (English from and
into a dozen languages), each run's weights then made its own by Gaussian noise (half each tensor's standard
deviation, seeded by the run's number), so that an answer from the wrong run shows: the report counts how many
distinct answers the runs give the first sentence. DATA holds Multi30k's ``test_2016_flickr.de.gz``, the sentences
sent (the runs' tokenizers are German and English ones whatever their pair says).

``--int8-runs``: each run served as an int8 run instead (``WORK/runs-int8``, written from its run by ``multihead export
--format multihead --quantization int8`` when missing; its weights stored as int8 rows, which it computes with).

With ``--quantize int8`` (or ``--int8-runs``) each run is loaded once first where its checkpoint does not yet keep its
packed int8 forms (as the first load on a machine does), so that every phase maps them as a service does after its
first start.

Four phases, each with fresh servers (``--quantize``, ``--no-guard``: random weights never end a sentence, so every
translation runs to its length limit) on free loopback ports; ``--clients`` threads send ``--requests`` requests in
all, one sentence each, request ``i`` to pair ``i mod --runs`` (each sentence sent to every pair in turn), so that
consecutive requests ask for different runs:

* ``all``: every run held (no budget); its answers are what the other phases' must equal;
* ``budget``: ``--memory`` as given: runs released and loaded again as the pairs asked for cycle;
* ``replicas``: two servers with that budget at once, the requests alternating between them (each sees half the
  pairs);
* ``replicas-all``: two servers holding every run (no budget) at once, each taking every pair in turn (request ``i``
  to server ``i div --runs mod 2``): what two replicas of one service hold together against the ``all`` phase's one
  (``replicas_over_one``: the sum of their proportional memory over its).

Reported for each server: its peak resident memory (``VmHWM``) and, at the end, its resident and proportional
(``Pss``: shared pages divided among the processes that map them) memory, from ``/proc``; the phase's sentences/s,
p50 and p95 latency, and the loads and releases ``/metrics`` counts. Exit status 1 if an answer differs or a budgeted
server's peak exceeds its budget. Linux only (``/proc``). Writes WORK/serve_memory.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from serve_load import HOST, MULTIHEAD, free_port, percentile

from multihead import cpu

LANGUAGES = ("de", "fr", "cs", "es", "it", "nl", "pt", "sv", "da", "fi", "pl", "ro")
"""The languages of the runs' pairs: each from and into English."""
START_TIMEOUT = 900.0
NOISE = 0.5
"""Each run's weights: the checkpoint's plus Gaussian noise of this many times each tensor's standard deviation."""


def pairs(count: int) -> list[tuple[str, str]]:
    """``count`` pairs: each language into English, then English into each."""
    every = [(code, "en") for code in LANGUAGES] + [("en", code) for code in LANGUAGES]
    if count > len(every):
        raise SystemExit(f"--runs is at most {len(every)}")
    return every[:count]


def make_runs(work: Path, data: Path, count: int) -> list[Path]:
    """The runs in WORK/runs (each made when missing): the checkpoint imported for its pair, its tensors rescaled."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    if not (work / "checkpoint").exists():
        subprocess.run([sys.executable, Path(__file__).parent / "deployed_sizes.py", work, data, "--skip-translation",
                        "--finetune-steps", "0"], check=True)  # fmt: skip
    found = []
    for index, (source, target) in enumerate(pairs(count)):
        run = work / "runs" / f"{index:02d}-{source}-{target}"
        if not run.exists():
            partial = run.with_name(run.name + ".partial")
            subprocess.run([*MULTIHEAD, "import", work / "checkpoint", partial, "--langs", source, target],
                           check=True, capture_output=True)  # fmt: skip
            (weights,) = partial.glob("checkpoints/*/model.safetensors")
            with safe_open(weights, "np") as stored:
                metadata = stored.metadata()
                tensors = {name: stored.get_tensor(name) for name in stored.keys()}  # noqa: SIM118 (no iteration)
            generator = np.random.default_rng(index)
            for name, tensor in tensors.items():
                noise = generator.normal(0.0, NOISE * float(tensor.std()), tensor.shape)
                tensors[name] = (tensor + noise).astype(tensor.dtype)
            save_file(tensors, weights, metadata=metadata)
            partial.rename(run)
        found.append(run)
    return found


def int8_runs(work: Path, runs: list[Path]) -> list[Path]:
    """Each run as an int8 run in WORK/runs-int8 (exported when missing)."""
    found = []
    for run in runs:
        exported = work / "runs-int8" / run.name
        if not exported.exists():
            subprocess.run([*MULTIHEAD, "export", run, exported, "--format", "multihead", "--quantization", "int8"],
                           check=True, capture_output=True)  # fmt: skip
        found.append(exported)
    return found


def keep_int8_forms(runs: list[Path]) -> None:
    """Each run loaded once with ``--quantize int8`` where its checkpoint keeps no packed forms yet (the first load on
    this machine writes them): every phase then loads as a service does after its first start."""
    for run in runs:
        if not list(run.glob("checkpoints/*/int8-*.safetensors")):
            subprocess.run([*MULTIHEAD, "translate", run, "Hallo.", "--quantize", "int8", "--max-length", "4"],
                           check=True, capture_output=True)  # fmt: skip


def proc_kib(pid: int, path: str, field: str) -> int:
    """A field of ``/proc/PID/<path>`` in KiB."""
    for line in Path(f"/proc/{pid}/{path}").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise SystemExit(f"/proc/{pid}/{path} has no {field}")


class Server:
    """``multihead serve RUNS`` on a free loopback port, started and up."""

    def __init__(self, runs: list[Path], flags: list[str]) -> None:
        self.port = free_port()
        command = [*MULTIHEAD, "serve", *map(str, runs), "--port", str(self.port), "--no-guard", *flags]
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        begin = time.monotonic()
        while not self.up():
            if self.process.poll() is not None:
                raise SystemExit(f"serve exited with {self.process.returncode}: {self.process.stderr.read()[-2000:]}")
            if time.monotonic() - begin > START_TIMEOUT:
                raise SystemExit("serve did not start")
            time.sleep(0.5)
        self.started = time.monotonic() - begin
        self.log: list[str] = []
        threading.Thread(target=lambda: self.log.extend(self.process.stderr), daemon=True).start()

    def up(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.port}/health", timeout=5) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def translate(self, text: str, pair: tuple[str, str]) -> str:
        body = json.dumps({"q": text, "source": pair[0], "target": pair[1]}).encode()
        request = urllib.request.Request(f"http://{HOST}:{self.port}/translate", body,
                                         {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=600) as answer:
            return str(json.load(answer)["translatedText"])

    def metrics(self) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"http://{HOST}:{self.port}/metrics", timeout=30) as answer:
            text = answer.read().decode()
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals

    def memory(self) -> dict[str, Any]:
        pid, counts = self.process.pid, self.metrics()
        return {"started_s": round(self.started, 1), "peak_mb": proc_kib(pid, "status", "VmHWM") // 1024,
                "rss_mb": proc_kib(pid, "status", "VmRSS") // 1024,
                "pss_mb": proc_kib(pid, "smaps_rollup", "Pss") // 1024,
                "loads": int(counts.get("multihead_run_loads_total", 0)),
                "releases": int(counts.get("multihead_run_releases_total", 0))}  # fmt: skip

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


def load(
    servers: list[Server], texts: list[str], runs: int, requests: int, clients: int, *, spread: bool = False
) -> dict[str, Any]:
    """``requests`` requests from ``clients`` threads (request ``i``: sentence ``i div runs``, pair ``i mod runs``,
    server ``i mod len(servers)``, or ``i div runs mod len(servers)`` with ``spread``): their answers, sentences/s, p50
    and p95 latency."""
    every = pairs(runs)
    answers: list[str] = [""] * requests
    seconds: list[float] = [0.0] * requests
    next_one = iter(range(requests))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                index = next(next_one, None)
            if index is None:
                return
            begin = time.perf_counter()
            text = texts[index // runs % len(texts)]
            server = servers[(index // runs if spread else index) % len(servers)]
            answers[index] = server.translate(text, every[index % runs])
            seconds[index] = time.perf_counter() - begin

    begin = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - begin
    return {"answers": answers, "sentences_per_s": round(requests / elapsed, 2),
            "p50_ms": round(percentile(seconds, 0.5)), "p95_ms": round(percentile(seconds, 0.95))}  # fmt: skip


def phase(name: str, runs: list[Path], flags: list[str], copies: int, args: argparse.Namespace,
          texts: list[str], *, spread: bool = False) -> dict[str, Any]:  # fmt: skip
    servers = [Server(runs, flags) for _ in range(copies)]
    try:
        found = load(servers, texts, len(runs), args.requests, args.clients, spread=spread)
        found["servers"] = [server.memory() for server in servers]
    finally:
        for server in servers:
            server.stop()
    summary = {key: value for key, value in found.items() if key != "answers"}
    print(name, json.dumps(summary), flush=True)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("data", type=Path)
    parser.add_argument("--runs", type=int, default=24)
    parser.add_argument("--memory", default="2G")
    parser.add_argument("--quantize", default="int8")
    parser.add_argument("--requests", type=int, default=480)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--int8-runs", action="store_true", help="serve each run as an int8 run (exported)")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}", flush=True)
    runs = make_runs(args.work, args.data, args.runs)
    if args.int8_runs:
        runs = int8_runs(args.work, runs)
    if args.quantize == "int8" or args.int8_runs:
        keep_int8_forms(runs)
    with gzip.open(args.data / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as lines:
        texts = [line.strip() for line in lines if line.strip()][: args.requests]
    from multihead.app.options import byte_size

    quantize = ["--quantize", args.quantize] if args.quantize else []
    budget = ["--memory", args.memory, *quantize]
    disk = sum(path.stat().st_size for run in runs for path in run.glob("checkpoints/*/model.safetensors"))
    results = {"command": " ".join(sys.argv), "weights_on_disk_mb": round(disk / 2**20),
               "all": phase("all", runs, quantize, 1, args, texts),
               "budget": phase("budget", runs, budget, 1, args, texts),
               "replicas": phase("replicas", runs, budget, 2, args, texts),
               "replicas-all": phase("replicas-all", runs, quantize, 2, args, texts, spread=True)}  # fmt: skip
    expected = results["all"]["answers"]
    results["distinct_first_answers"] = len(set(expected[: len(runs)]))
    wrong = {name: sum(a != b for a, b in zip(results[name]["answers"], expected, strict=True))
             for name in ("budget", "replicas", "replicas-all")}  # fmt: skip
    over = [server["peak_mb"] for name in ("budget", "replicas") for server in results[name]["servers"]
            if server["peak_mb"] << 20 > byte_size(args.memory)]  # fmt: skip
    for found in results.values():
        if isinstance(found, dict):
            found.pop("answers", None)
    results["wrong"], results["over_budget_mb"] = wrong, over
    together = sum(server["pss_mb"] for server in results["replicas-all"]["servers"])
    results["replicas_over_one"] = round(together / results["all"]["servers"][0]["pss_mb"], 3)
    (args.work / "serve_memory.json").write_text(json.dumps(results, indent=1))
    print(
        json.dumps(
            {
                "wrong": wrong,
                "over_budget_mb": over,
                "distinct_first_answers": results["distinct_first_answers"],
                "replicas_over_one": results["replicas_over_one"],
            }
        )
    )
    return 1 if any(wrong.values()) or over else 0


if __name__ == "__main__":
    sys.exit(main())
