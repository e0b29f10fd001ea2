"""A glossary on a run: how many of its terms the translations use, BLEU and time, with and without constraints.

    .venv/bin/python benchmarks/constrained_beam.py RUN SRC REF --train TRAIN_SRC TRAIN_REF [--entries 300]
        [--limit 1000] [--beam 4] [--rounds 2] [--glossary-out FILE]

The glossary is built as a terminologist would for this test set, from its references: a word list of the training
corpus (TRAIN_SRC/TRAIN_REF, line-aligned) links each source word to the target words that share its lines most
(Dice's coefficient); an entry is a source word of the test sources and one of its linked target words that the
references use for it at least half the time it occurs, where plain beam search wrote another (a rarer translation
than the model's); the ``--entries`` entries missed most often are kept, one a source word. The glossary is written
to ``--glossary-out`` (a TSV file with the run's languages as its header) and read back by the app's own glossary
reader, which finds its entries in the sources (whole words, any case) as ``translate --glossary`` does.

Then, ``--rounds`` times, plain and constrained beam search (``multihead.engine.generate`` with ``constraints=``)
translate the sentences that hold at least one entry, in turn, timed, and then those that hold one or two. Reported:
the time of each (best round) and their ratio, how many constraints the sentences get, the share of the terms found
whose target the translations use (a whole word, any case), and sacreBLEU of the whole test set with its signature
(sentences without an entry are translated alike both ways).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import sacrebleu

from multihead import cpu
from multihead.app.batched import in_batches, translation
from multihead.app.corpus import iter_lines
from multihead.app.translate import Translator
from multihead.decoding import SearchOptions
from multihead.engine import generate

WORD = re.compile(r"[^\W\d_]{3,}")


def words(text: str) -> set[str]:
    return set(WORD.findall(text.lower()))


def uses(text: str, term: str) -> bool:
    """Whether ``text`` holds ``term`` as a whole word, in any case."""
    return re.search(rf"(?<!\w){re.escape(term)}(?!\w)", text, re.IGNORECASE) is not None


def links(sources: Sequence[str], targets: Sequence[str], best: int = 5, floor: float = 0.1) -> dict[str, list[str]]:
    """Each source word's target words by Dice's coefficient over the lines of a parallel corpus: those of its
    ``best`` (at least ``floor``) whose own ``best`` source words hold it (a word that comes with many, such as
    "wearing" with every colour, links to none)."""
    pair, single_s, single_t = Counter[tuple[str, str]](), Counter[str](), Counter[str]()
    for source, target in zip(sources, targets, strict=True):
        s, t = words(source), words(target)
        single_s.update(s)
        single_t.update(t)
        pair.update((a, b) for a in s for b in t)
    forward: dict[str, list[tuple[float, str]]] = {}
    backward: dict[str, list[tuple[float, str]]] = {}
    for (a, b), both in pair.items():
        dice = 2 * both / (single_s[a] + single_t[b])
        if dice >= floor:
            forward.setdefault(a, []).append((dice, b))
            backward.setdefault(b, []).append((dice, a))
    back = {b: {a for _, a in sorted(found, reverse=True)[:best]} for b, found in backward.items()}
    return {a: [b for _, b in sorted(found, reverse=True)[:best] if a in back[b]] for a, found in forward.items()}


def glossary(
    sources: Sequence[str], references: Sequence[str], plain: Sequence[str], linked: dict[str, list[str]], entries: int
) -> list[tuple[str, str]]:
    """The ``entries`` (source word, target word) pairs the references use and plain translations miss most."""
    seen, used, missed = Counter[str](), Counter[tuple[str, str]](), Counter[tuple[str, str]]()
    for source, reference, out in zip(sources, references, plain, strict=True):
        held, written = words(reference), words(out)
        for word in words(source):
            seen[word] += 1
            for target in linked.get(word, []):
                if target in held:
                    used[word, target] += 1
                    missed[word, target] += target not in written
    best: dict[str, tuple[int, int, str]] = {}
    for (word, target), count in missed.items():
        if count and len(word) >= 4 and 2 * used[word, target] >= seen[word]:
            best[word] = max(best.get(word, (0, 0, "")), (count, used[word, target], target))
    ranked = sorted(best.items(), key=lambda item: (-item[1][0], -item[1][1], item[0]))
    return [(word, target) for word, (_, _, target) in ranked[:entries]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("src")
    parser.add_argument("ref")
    parser.add_argument("--train", nargs=2, required=True, metavar=("TRAIN_SRC", "TRAIN_REF"))
    parser.add_argument("--entries", type=int, default=300)
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--glossary-out", type=Path)
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}", flush=True)
    lines = zip(range(args.limit), iter_lines(args.src, "SRC"), iter_lines(args.ref, "REF"), strict=False)
    pairs = [(source, reference) for _, source, reference in lines if source.strip()]
    sources, references = [source for source, _ in pairs], [reference for _, reference in pairs]
    translator = Translator(args.run, split_sentences=False, guard=False)
    spec = translator.spec(SearchOptions(beam_size=args.beam))
    ids = [translator.cutter.encode(source, translator.direction)[0][: translator.max_len] for source in sources]

    def translate(chosen: list[int], phrases: list[list[list[int]]] | None) -> tuple[list[list[int]], float]:
        def run(src: np.ndarray, limits: np.ndarray, indices: np.ndarray) -> list[list[int]]:
            with translator.loaded.decoding():
                out = generate(translator.session(src, limits), len(src), spec, max_len=limits,
                               constraints=None if phrases is None else [phrases[i] for i in indices])  # fmt: skip
            return [translation(row, limit, spec) for row, limit in zip(out, limits, strict=True)]

        begin = time.perf_counter()
        found = in_batches(run, [ids[i] for i in chosen], limit=translator.limit, pad=spec.specials.pad,
                           batch_tokens=translator.batch_size(SearchOptions(beam_size=args.beam)))  # fmt: skip
        return found, time.perf_counter() - begin

    everyone = list(range(len(pairs)))
    plain = [translator.target.decode(out) for out in translate(everyone, None)[0]]
    train = list(zip(iter_lines(args.train[0], "TRAIN_SRC"), iter_lines(args.train[1], "TRAIN_REF"), strict=True))
    linked = links([source for source, _ in train], [target for _, target in train])
    entries = glossary(sources, references, plain, linked, args.entries)
    path = args.glossary_out or Path(tempfile.mkdtemp()) / "glossary.tsv"
    langs = translator.direction.langs or ("source", "target")
    path.write_text("".join(f"{a}\t{b}\n" for a, b in [langs, *entries]), encoding="utf-8")
    glossed = Translator(args.run, split_sentences=False, guard=False, glossary=path)
    found = [glossed.cutter.glossary.found(source) for source in sources]  # type: ignore[union-attr]
    every = glossed.cutter.constraints(sources) or [[] for _ in sources]
    chosen = [i for i in everyone if every[i]]
    few = [i for i in chosen if len(every[i]) <= 2]
    times: dict[str, list[float]] = {}
    outs: dict[str, list[list[int]]] = {}
    for _ in range(args.rounds):  # interleaved: each group plain, then constrained
        for group, indices in (("", chosen), (" (1-2 terms)", few)):
            for name, own in (("plain", None), ("constrained", [every[i] for i in indices])):
                outs[name + group], seconds = translate(indices, own)
                times.setdefault(name + group, []).append(seconds)
    report(args, translator, sources, references, plain, found, chosen, outs, times, len(entries))
    print(f"sentences of 1-2 terms ({len(few)}): plain {min(times['plain (1-2 terms)']):.2f} s, constrained "
          f"{min(times['constrained (1-2 terms)']):.2f} s, ratio "
          f"{min(times['constrained (1-2 terms)']) / min(times['plain (1-2 terms)']):.2f}")  # fmt: skip
    return 0


def report(
    args: argparse.Namespace,
    translator: Translator,
    sources: list[str],
    references: list[str],
    plain: list[str],
    found: list[list],
    chosen: list[int],
    outs: dict[str, list[list[int]]],
    times: dict[str, list[float]],
    entries: int,
) -> None:
    """Print the figures (see the module's docstring)."""
    terms = sum(len(found[i]) for i in chosen)
    counts = Counter(len(found[i]) for i in chosen)
    print(f"glossary of {entries} entries: {len(chosen)} of {len(sources)} sentences hold {terms} terms "
          f"({', '.join(f'{n} a sentence: {counts[n]}' for n in sorted(counts))})")  # fmt: skip
    metric = sacrebleu.BLEU()
    for name in ("plain", "constrained"):
        texts = list(plain)
        for i, out in zip(chosen, outs[name], strict=True):
            texts[i] = translator.target.decode(out)
        held = sum(uses(texts[i], term.target) for i in chosen for term in found[i])
        missed = [(term.target, texts[i]) for i in chosen for term in found[i] if not uses(texts[i], term.target)]
        bleu = metric.corpus_score(texts, [references])
        print(f"{name:12} {min(times[name]):7.2f} s (rounds {', '.join(f'{t:.2f}' for t in times[name])}), "
              f"terms used {held}/{terms} ({100 * held / terms:.1f}%), BLEU {bleu.score:.2f}")  # fmt: skip
        for term, text in missed[:3] if name == "constrained" else []:
            print(f"  not used as a word: {term!r} in {text!r}")
    print(f"constrained / plain time: {min(times['constrained']) / min(times['plain']):.2f}; beam {args.beam}; "
          f"{metric.get_signature()}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
