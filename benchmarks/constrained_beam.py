"""Constrained beam search against plain beam search on a run: coverage of the phrases, BLEU and time.

    .venv/bin/python benchmarks/constrained_beam.py RUN SRC REF [--limit 500] [--beam 4] [--rounds 2]

The first ``--limit`` lines of SRC and REF (blank ones left out). Plain beam search translates them first; then each
sentence is given up to two terms as a glossary would: words of its reference (letters only, four or more) that the
plain translation does not hold, else one that it does, each as the target tokenizer writes it. Then, ``--rounds``
times, plain and constrained beam search (the library's ``multihead.engine.generate`` with ``constraints=``) translate
the same batches in turn, timed. Reported: the time of each (best round) and their ratio, the share of terms the
translations hold (as token phrases), and sacreBLEU of both against REF with its signature.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

import numpy as np
import sacrebleu

from multihead.app.batched import in_batches, translation
from multihead.app.corpus import iter_lines
from multihead.app.translate import Translator
from multihead.decoding import SearchOptions
from multihead.engine import generate

WORD = re.compile(r"[^\W\d_]{4,}")


def holds(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[i : i + len(phrase)] == phrase for i in range(len(tokens) - len(phrase) + 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("src")
    parser.add_argument("ref")
    parser.add_argument("--limit", type=int, default=500)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    lines = zip(range(args.limit), iter_lines(args.src, "SRC"), iter_lines(args.ref, "REF"), strict=False)
    pairs = [(source, reference) for _, source, reference in lines if source.strip()]
    translator = Translator(args.run, split_sentences=False, guard=False)
    spec = translator.spec(SearchOptions(beam_size=args.beam))
    ids = [translator.cutter.encode(source, translator.direction)[0][: translator.max_len] for source, _ in pairs]

    def translate(phrases: list[list[list[int]]] | None) -> tuple[list[list[int]], float]:
        def run(src: np.ndarray, limits: np.ndarray, indices: np.ndarray) -> list[list[int]]:
            with translator.loaded.decoding():
                out = generate(translator.session(src, limits), len(src), spec, max_len=limits,
                               constraints=None if phrases is None else [phrases[i] for i in indices])  # fmt: skip
            return [translation(row, limit, spec) for row, limit in zip(out, limits, strict=True)]

        begin = time.perf_counter()
        found = in_batches(run, ids, limit=translator.limit, pad=spec.specials.pad,
                           batch_tokens=translator.batch_size(SearchOptions(beam_size=args.beam)))  # fmt: skip
        return found, time.perf_counter() - begin

    plain, _ = translate(None)
    phrases = []
    for (_, reference), out in zip(pairs, plain, strict=True):
        written = set(WORD.findall(translator.target.decode(out).lower()))
        words = list(dict.fromkeys(WORD.findall(reference)))
        missing = [word for word in words if word.lower() not in written][:2] or words[:1]
        phrases.append([translator.target.encode(word)[0] for word in missing])
    times: dict[str, list[float]] = {"plain": [], "constrained": []}
    for _ in range(args.rounds):
        plain, seconds = translate(None)
        times["plain"].append(seconds)
        constrained, seconds = translate(phrases)
        times["constrained"].append(seconds)
    terms = sum(map(len, phrases))
    held = {name: sum(holds(out, phrase) for out, own in zip(outs, phrases, strict=True) for phrase in own)
            for name, outs in (("plain", plain), ("constrained", constrained))}  # fmt: skip
    references, metric = [reference for _, reference in pairs], sacrebleu.BLEU()
    for name, outs in (("plain", plain), ("constrained", constrained)):
        bleu = metric.corpus_score([translator.target.decode(out) for out in outs], [references])
        print(f"{name:12} {min(times[name]):7.2f} s (rounds {', '.join(f'{t:.2f}' for t in times[name])}), "
              f"terms held {held[name]}/{terms} ({100 * held[name] / terms:.1f}%), BLEU {bleu.score:.2f}")  # fmt: skip
    print(f"constrained / plain time: {min(times['constrained']) / min(times['plain']):.2f}; {len(pairs)} sentences, "
          f"beam {args.beam}; {metric.get_signature()}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
