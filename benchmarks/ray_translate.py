"""Batch translation on Ray Data against one process on the same machine (quoted in docs/translation.md).

    .venv/bin/python benchmarks/ray_translate.py RUN CORPUS [--sentences 24000] [--shards 16] [--actors 2]
        [--threads 1] [--rounds 2]

The first ``--sentences`` lines of CORPUS (a text file, gzipped or not; taken again from its start where it has
fewer) are cut into ``--shards`` shards of equal lines. Each round, alternating: ``multihead translate RUN --input
ALL --output FILE --threads ACTORS×THREADS`` (one process on the whole corpus), then ``multihead translate RUN
--input 'SHARDS/*' --output DIR --ray --actors ACTORS --threads THREADS`` (a new local Ray cluster each time). Both
are timed whole, from the command's start to its exit: loading the model, and for Ray starting the cluster and its
actors, count. The outputs are compared line for line: each shard's output is exactly ``translate --input SHARD``'s,
but batches cut at other places than the whole corpus's may round a sentence's floats into another word. It prints
each round's sentences/s, Ray's over one process's, the lines that differ, and Ray's overhead: its wall time less
the longest any actor spent translating (the cluster's start, the actors' loading, the last shard's tail).
"""

from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from multihead import cpu
from multihead.app.corpus import iter_lines

MULTIHEAD = [sys.executable, "-m", "multihead"]


def timed(command: list[str]) -> tuple[float, str]:
    """``command``'s wall time and its stderr (it must succeed)."""
    begin = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - begin
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    return seconds, done.stderr


def busiest(stderr: str) -> float:
    """The longest time an actor spent translating, from the job's summary."""
    return max(float(seconds) for seconds in re.findall(r"sentences in ([\d.]+) s,", stderr.split("\ntranslated ")[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="the run directory")
    parser.add_argument("corpus", help="a text file of sentences, one a line (plain or .gz)")
    parser.add_argument("--sentences", type=int, default=24000, help="lines of the corpus translated")
    parser.add_argument("--shards", type=int, default=16, help="shards they are cut into for Ray")
    parser.add_argument("--actors", type=int, default=2, help="Ray's actors")
    parser.add_argument("--threads", type=int, default=1, help="each actor's threads (one process gets actors×threads)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the two, alternating")
    args = parser.parse_args()
    lines = list(itertools.islice(itertools.cycle(list(iter_lines(args.corpus, "CORPUS"))), args.sentences))
    work = Path(tempfile.mkdtemp(prefix="ray-translate-"))
    (work / "shards").mkdir()
    per = -(-len(lines) // args.shards)
    for index in range(args.shards):
        shard = lines[index * per :][:per]
        (work / "shards" / f"part-{index:03d}.txt").write_text("".join(f"{line}\n" for line in shard), encoding="utf-8")
    (work / "all.txt").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    common = ["translate", args.run, "--no-guard"]
    print(f"CPU: {cpu.describe()}\n{len(lines)} sentences of {args.corpus} in {args.shards} shards; one process "
          f"with --threads {args.actors * args.threads} against Ray with {args.actors} actors × {args.threads} "
          "threads\n")  # fmt: skip
    ratios = []
    for round_ in range(1, args.rounds + 1):
        single, _ = timed([*MULTIHEAD, *common, "--input", str(work / "all.txt"), "--output", str(work / "one.txt"),
                           "--threads", str(args.actors * args.threads)])  # fmt: skip
        out = work / f"ray-{round_}"
        spread, stderr = timed([*MULTIHEAD, *common, "--input", str(work / "shards" / "*"), "--output", str(out),
                                "--ray", "--actors", str(args.actors), "--threads", str(args.threads)])  # fmt: skip
        joined = "".join((out / path.name).read_text(encoding="utf-8") for path in sorted((work / "shards").iterdir()))
        one = (work / "one.txt").read_text(encoding="utf-8").splitlines()
        differ = sum(a != b for a, b in zip(joined.splitlines(), one, strict=True))
        ratios.append(single / spread)
        print(f"round {round_}: one process {len(lines) / single:.1f} sentences/s ({single:.1f} s), Ray "
              f"{len(lines) / spread:.1f} ({spread:.1f} s): {ratios[-1]:.2f}× one process's throughput; Ray's overhead "
              f"{spread - busiest(stderr):.1f} s; {differ} of {len(one)} lines differ", flush=True)  # fmt: skip
    print(f"\nRay / one process, per round: {', '.join(f'{ratio:.2f}' for ratio in ratios)}")


if __name__ == "__main__":
    main()
