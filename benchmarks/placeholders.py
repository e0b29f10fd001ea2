"""Placeholders in translations: how many come back exactly once, byte for byte, with and without keeping them.

    .venv/bin/python benchmarks/placeholders.py RUN SRC [--limit 1000] [--beam 1] [--seed 0] [--json FILE]

Each of the first ``--limit`` lines of SRC (plain or gzipped) gets one or two placeholders, inserted between two of
its words (seeded): the kinds kept by default (``{name}``, ``{{name}}``, ``%s``, ``%1$s``, ``%(name)s``, ``${name}``,
``<x id=".."/>``, a URL, an e-mail address) in turn, each numbered by its line, so that every kind comes as often.
Then the run translates them three ways, timed:

- ``off``: placeholders as text (``Translator(keep=None)``), as the command line's ``--no-keep-placeholders``;
- ``direct``: each placeholder a constraint of its own target tokens, as a glossary entry that translates it into
  itself (``Glossary([Term(span, span)])``), placeholders otherwise read as text;
- ``kept``: the default (:mod:`multihead.app.keep`): each placeholder masked to a stand-in, constrained, put back.

Reported per way: the placeholders that come back exactly once (and per kind), the lines whose placeholders all do,
and the time.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from multihead.app.corpus import iter_lines
from multihead.app.glossary import Glossary, Term
from multihead.app.translate import TRANSLATION, Translator
from multihead.decoding import SearchOptions

KINDS = {
    "{name}": "{{name{i}}}",
    "{{name}}": "{{{{user{i}}}}}",
    "%s": "%s",
    "%1$s": "%{n}$s",
    "%(name)s": "%(count{i})d",
    "${name}": "${{price{i}}}",
    '<x id=".."/>': '<x id="{i}"/>',
    "URL": "https://example.com/item?id={i}",
    "e-mail": "user{i}@example.org",
}
"""Each default kind and how line ``i``'s is written (``n``: a small number)."""


def injected(lines: list[str], seed: int) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each line with one or two placeholders inserted between its words, the kinds in turn: the line, and its
    placeholders (kind, as written)."""
    rng, kinds, turn, found = random.Random(seed), list(KINDS), 0, []
    for i, line in enumerate(lines):
        words, spans = line.split(), []
        for _ in range(1 + i % 2):
            kind = kinds[turn % len(kinds)]
            turn += 1
            span = KINDS[kind].format(i=i, n=1 + i % 9)
            if span in (written for _, written in spans):
                continue
            words.insert(rng.randint(1, max(1, len(words) - 1)), span)
            spans.append((kind, span))
        found.append((" ".join(words), spans))
    return found


def count(ways: dict[str, Translator], texts: list[tuple[str, list[tuple[str, str]]]], search: SearchOptions) -> dict:
    """Each way's translations of ``texts`` checked: placeholders back exactly once (all, per kind), lines, seconds."""
    sources = [text for text, _ in texts]
    results = {}
    for name, translator in ways.items():
        begin = time.perf_counter()
        outputs = translator.translate(sources, search=search)
        seconds = time.perf_counter() - begin
        kept, per_kind, lines = 0, Counter[str](), 0
        for (_, spans), output in zip(texts, outputs, strict=True):
            once = [output.count(span) == 1 for _, span in spans]
            kept += sum(once)
            per_kind.update(kind for (kind, _), ok in zip(spans, once, strict=True) if ok)
            lines += all(once)
        total = sum(len(spans) for _, spans in texts)
        results[name] = {"placeholders": total, "kept": kept, "lines": len(texts), "lines_kept": lines,
                         "seconds": round(seconds, 2), "per_kind": dict(per_kind)}  # fmt: skip
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("src")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    lines = [line.strip() for line, _ in zip(iter_lines(args.src, "SRC"), range(args.limit), strict=False)]
    texts = injected([line for line in lines if line], args.seed)
    kept = Translator(args.run)
    off = Translator.of(kept.loaded, kept.direction, replace(kept.cutter, keep=None))
    spans = sorted({span for _, found in texts for _, span in found})
    direct = off.glossing(Glossary([Term(span, span) for span in spans]))
    search = replace(TRANSLATION, **{**kept.checkpoint.search, "beam_size": args.beam, "n_best": 1})
    results = count({"off": off, "direct": direct, "kept": kept}, texts, search)
    total = results["kept"]["placeholders"]
    print(f"{len(texts)} lines, {total} placeholders ({', '.join(KINDS)}), beam {args.beam}")
    print("| | placeholders back exactly once | lines with all of theirs | time |")
    print("|---|---|---|---|")
    for name, found in results.items():
        print(f"| {name} | {found['kept']} / {total} ({100 * found['kept'] / total:.1f} %) | "
              f"{found['lines_kept']} / {found['lines']} | {found['seconds']:.1f} s |")  # fmt: skip
    for name, found in results.items():
        print(f"{name} per kind: " + ", ".join(f"{kind} {found['per_kind'].get(kind, 0)}" for kind in KINDS))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
