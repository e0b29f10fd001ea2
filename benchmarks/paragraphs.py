"""Paragraphs against their sentences: BLEU of paragraphs of three test sentences translated whole, sentence by
sentence (``translate`` and ``serve``'s default), and the same sentences one at a time.

    .venv/bin/python benchmarks/paragraphs.py RUN [--data ../shared/data/multi30k] [--count 200] [--beam 1]

The first ``3 × --count`` lines of Multi30k's test_2016_flickr (German → English) make ``--count`` paragraphs of three
consecutive sentences joined with a space; their references are the three English references joined the same way.
Rows (sacreBLEU on the paragraphs, and how many paragraphs lost more than 40 % of their reference's words):

* sentences one by one: each sentence translated alone (``--no-split``), the three joined: what a paragraph should get;
* whole: each paragraph given to the model as one sentence (``--no-split``), as ``translate`` did before;
* split: ``translate``'s default, each paragraph cut into sentences, translated, joined;
* ``/translate``: the paragraphs posted to ``multihead serve RUN`` on a free loopback port, 50 a request.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import re
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import sacrebleu

from multihead.app.translate import TRANSLATION, Translator

LOST = 0.6
"""A paragraph whose translation has fewer than this share of its reference's words lost more than 40 % of them."""


def lines(path: Path, count: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as file:
        return [line.strip() for _, line in zip(range(count), file, strict=False)]


def served(run: str, paragraphs: list[str], search: str) -> list[str]:
    """``paragraphs`` through ``multihead serve RUN``'s ``/translate``, 50 a request."""
    process = subprocess.Popen(
        [sys.executable, "-m", "multihead", "serve", run, "--port", "0", "--beam", search],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        found = re.search(r"127\.0\.0\.1:(\d+)", process.stderr.readline())
        if found is None:
            raise SystemExit(f"serve did not start: {process.communicate(timeout=30)[1]}")
        connection = http.client.HTTPConnection("127.0.0.1", int(found[1]), timeout=600)
        out: list[str] = []
        for start in range(0, len(paragraphs), 50):
            body = json.dumps({"q": paragraphs[start : start + 50], "source": "de", "target": "en"})
            connection.request("POST", "/translate", body=body, headers={"Content-Type": "application/json"})
            answer = json.loads(connection.getresponse().read())
            out += answer["translatedText"]
        return out
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/multi30k"))
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--beam", type=int, default=1)
    args = parser.parse_args()
    sources = lines(args.data / "test_2016_flickr.de.gz", 3 * args.count)
    references = lines(args.data / "test_2016_flickr.en.gz", 3 * args.count)
    groups = range(0, len(sources), 3)
    paragraphs = [" ".join(sources[i : i + 3]) for i in groups]
    joined_references = [" ".join(references[i : i + 3]) for i in groups]
    search = replace(TRANSLATION, beam_size=args.beam)
    split, whole = Translator(args.run), Translator(args.run, split_sentences=False)
    alone = whole.translate(sources, search=search)
    rows = {
        "sentences one by one": [" ".join(alone[i : i + 3]) for i in groups],
        "whole (--no-split)": whole.translate(paragraphs, search=search),
        "split (translate)": split.translate(paragraphs, search=search),
        "split (/translate)": served(args.run, paragraphs, str(args.beam)),
    }
    signature = ""
    print(f"| {len(paragraphs)} paragraphs of 3 sentences | BLEU | paragraphs that lost > 40 % of the words |")
    print("|---|---|---|")
    for name, hypotheses in rows.items():
        bleu = sacrebleu.metrics.BLEU()
        score = bleu.corpus_score(hypotheses, [joined_references])
        signature = str(bleu.get_signature())
        lost = sum(len(h.split()) < LOST * len(r.split()) for h, r in zip(hypotheses, joined_references, strict=True))
        print(f"| {name} | {score.score:.2f} | {lost} |")
    print(f"\nsacreBLEU {signature}")


if __name__ == "__main__":
    main()
