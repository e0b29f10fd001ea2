"""A document's throughput: translated whole (``multihead.app.documents``, every unit's sentences in shared batches)
against a loop that translates its text one span at a time, as a per-span file translator does.

    .venv/bin/python benchmarks/documents.py RUN SRC [--paragraphs 200] [--rounds 2]

The document is an HTML page of ``--paragraphs`` paragraphs of three sentences each (SRC's lines in order, blank ones
left out), every third word of a paragraph's first sentence in bold. The loop translates each text between two tags
(what a page's spans are) with its own call of the translator, as LibreTranslate's file translation does; the document
path translates the page as ``translate --input page.html --output out.html`` does. Reported: each one's time (best
round, interleaved), sentences a second, and their ratio.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
import tempfile
import time
from pathlib import Path

from multihead.app.corpus import iter_lines
from multihead.app.documents import document_format, translate_document
from multihead.app.translate import Translator

TEXT = re.compile(r">([^<>]*[^\W\d_][^<>]*)<")


def page(lines: list[str], paragraphs: int) -> str:
    """An HTML page of ``paragraphs`` paragraphs of three of ``lines`` each, bold words in each first sentence."""
    out = []
    for start in range(0, 3 * paragraphs, 3):
        first, *rest = lines[start : start + 3]
        words = [f"<b>{html.escape(w)}</b>" if i % 3 == 1 else html.escape(w) for i, w in enumerate(first.split())]
        out.append(f"<p>{' '.join(words)} {html.escape(' '.join(rest))}</p>")
    return "<!doctype html>\n<html><body>\n" + "\n".join(out) + "\n</body></html>\n"


def per_span(translator: Translator, text: str) -> str:
    """``text`` (HTML) with each text between two tags translated alone, one call each."""
    return TEXT.sub(lambda found: f">{html.escape(translator.translate([html.unescape(found[1])])[0])}<", text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("src")
    parser.add_argument("--paragraphs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    lines = [line for line in iter_lines(args.src, "SRC") if line.strip()][: 3 * args.paragraphs]
    if len(lines) < 3 * args.paragraphs:
        parser.error(f"SRC holds {len(lines)} sentences, fewer than 3 a paragraph")
    translator = Translator(args.run)
    folder = Path(tempfile.mkdtemp())
    source = folder / "page.html"
    source.write_text(page(lines, args.paragraphs), encoding="utf-8")
    found = document_format(source)
    assert found is not None
    times: dict[str, list[float]] = {"document": [], "per span": []}
    for _ in range(args.rounds):
        begin = time.perf_counter()
        translate_document(source, folder / "out.html", found, translator.translate)
        times["document"].append(time.perf_counter() - begin)
        begin = time.perf_counter()
        per_span(translator, source.read_text(encoding="utf-8"))
        times["per span"].append(time.perf_counter() - begin)
    sentences = len(lines)
    for name, seconds in times.items():
        print(f"{name:9} {min(seconds):7.2f} s ({sentences / min(seconds):6.1f} sentences/s; rounds "
              f"{', '.join(f'{s:.2f}' for s in seconds)})")  # fmt: skip
    spans = len(TEXT.findall(source.read_text(encoding="utf-8")))
    print(f"document / per span: {min(times['per span']) / min(times['document']):.1f}x faster; {args.paragraphs} "
          f"paragraphs, {sentences} sentences, {spans} spans")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
