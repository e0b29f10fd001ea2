"""Greedy translation of a file in batches against one sentence at a time, with the same run and code (issue 14's
speed check; results quoted in docs/translation.md).

    .venv/bin/python benchmarks/translate_speed.py RUN SRC [--single 100]

Batched: all of SRC, twice, the faster taken. One at a time: the first ``--single`` sentences, each its own call.
"""

from __future__ import annotations

import argparse
import time

from multihead.app.corpus import read_lines
from multihead.app.translate import Translator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run directory written by multihead train")
    parser.add_argument("src", help="sentences to translate, one per line (plain or .gz)")
    parser.add_argument("--single", type=int, default=100, help="sentences translated one at a time")
    args = parser.parse_args()
    texts = read_lines(args.src, "SRC")
    translator = Translator(args.run)
    translator.translate(texts[:16])  # warm-up
    batched_s = []
    for _ in range(2):
        begin = time.perf_counter()
        batched = translator.translate(texts)
        batched_s.append(time.perf_counter() - begin)
    begin = time.perf_counter()
    singles = [translator.translate([text])[0] for text in texts[: args.single]]
    single_s = time.perf_counter() - begin
    batched_rate, single_rate = len(texts) / min(batched_s), len(singles) / single_s
    same = sum(a == b for a, b in zip(batched, singles, strict=False))
    print(f"batched: {len(texts)} sentences in {min(batched_s):.1f} s: {batched_rate:.1f} sentences/s")
    print(f"one at a time: {len(singles)} sentences in {single_s:.1f} s: {single_rate:.1f} sentences/s")
    print(f"speed-up {batched_rate / single_rate:.1f}x; identical translations {same}/{len(singles)}")


if __name__ == "__main__":
    main()
