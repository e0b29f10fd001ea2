"""Start-up on large corpora: time and peak memory of ``multihead train`` to its first step, and of ``--resume``
(the figures are quoted in docs/translation.md, "Large corpora").

    .venv/bin/python benchmarks/large_corpus.py [--repeats 10 100] [--data ../shared/data/multi30k] [--keep DIR]

It makes its own corpora: Multi30k's training pairs (from ``--data``) repeated ``--repeats`` times, gzipped (without
Multi30k, generated sentences of the same length), with the first 20 validation pairs as ``--valid`` so that the
final validation costs little. Each size trains 1 step of the corpus recipe in a fresh process, evaluated at once
(the time to that evaluation's line is the time to the first step; the peak resident memory of the whole process,
from the operating system), then resumes for 1 more step, timed the same way.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent
MULTI30K = HERE.parent / "shared" / "data" / "multi30k"


def lines(data: Path, name: str, side: str) -> list[str]:
    path = data / f"{name}.{side}.gz"
    if path.exists():
        return gzip.decompress(path.read_bytes()).decode("utf-8").splitlines()
    rng = random.Random(0 if side == "de" else 1)
    words = [f"wort{i}" if side == "de" else f"word{i}" for i in range(6000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))) for _ in range(29000)]


def run(command: list[str]) -> tuple[float, float, float]:
    """Seconds to the end of the first step (its evaluation line, on the 20 validation pairs), seconds to the end,
    and peak resident GiB of one ``multihead train`` process."""
    begin = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    first = float("nan")
    for line in process.stdout:
        if line.startswith("step ") and first != first:
            first = time.perf_counter() - begin
    _, status, usage = os.wait4(process.pid, 0)
    if status:
        raise SystemExit(f"{' '.join(command)} failed ({status})")
    return first, time.perf_counter() - begin, usage.ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, nargs="+", default=[10, 100], help="corpus sizes, in Multi30ks")
    parser.add_argument("--data", type=Path, default=MULTI30K, help="Multi30k's directory (default: ../shared)")
    parser.add_argument("--keep", type=Path, help="write corpora and runs here instead of a temporary directory")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="large-corpus."))
    work.mkdir(parents=True, exist_ok=True)
    multihead = [sys.executable, "-m", "multihead", "train", "--no-progress", "--eval-every", "1"]
    sources, targets = lines(args.data, "train", "de"), lines(args.data, "train", "en")
    valid = [lines(args.data, "val", side)[:20] for side in ("de", "en")]
    for side, text in zip(("de", "en"), valid, strict=True):
        (work / f"valid.{side}").write_text("\n".join(text) + "\n", encoding="utf-8")
    print(f"{'pairs':>10} {'tokens':>12} {'first step':>11} {'peak':>9} {'next step':>10} {'peak':>9}")
    for repeats in args.repeats:
        data = []
        for side, text in (("de", sources), ("en", targets)):
            path = work / f"train{repeats}.{side}.gz"
            if not path.exists():
                with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as file:
                    for _ in range(repeats):
                        file.write("\n".join(text) + "\n")
            data.append(str(path))
        out = work / f"run{repeats}"
        flags = ["--data", *data, "--valid", str(work / "valid.de"), str(work / "valid.en"), "--out", str(out)]
        first = run([*multihead, *flags, "--steps", "1"])
        again = run([*multihead, *flags, "--steps", "2", "--resume"])
        pairs = json.loads((out / "encoded" / "manifest.json").read_text(encoding="utf-8"))["pairs"]
        tokens = sum(
            int(np.load(out / "encoded" / f"{side}.offsets.npy", mmap_mode="r")[-1]) for side in ("source", "target")
        )
        print(f"{pairs:>10,} {tokens:>12,} {first[0]:>9.1f} s {first[2]:>6.2f} GiB {again[0]:>8.1f} s "
              f"{again[2]:>6.2f} GiB")  # fmt: skip


if __name__ == "__main__":
    main()
