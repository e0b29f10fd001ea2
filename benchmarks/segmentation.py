"""Sentence segmenters side by side: how often each finds exactly the sentences of a paragraph, and how fast.

    .venv/bin/python benchmarks/segmentation.py [--data ../shared/data/multi30k] [--repeat 3]

Paragraphs: every three consecutive lines of Multi30k's test_2016_flickr (de, en, fr, cs: 333 paragraphs a language)
joined with a space, whose sentences are those lines; and a small hand-made set of harder cases (abbreviations,
numbers, quotes, CJK, Thai), each with the sentences a reader sees. A paragraph counts as found when a segmenter gives
exactly its sentences. Segmenters: the regular expression ``translate`` used before (a sentence end is ``.!?…``
followed by a space, or ``。！？``), ``multihead.app.segment.split`` (sentencex, then Thai's spaces), and pySBD where
it is installed (``pip install pysbd``; it knows 22 languages, not Czech or Thai). Time: the median of ``--repeat``
passes over all paragraphs of a language, in microseconds a paragraph.
"""

from __future__ import annotations

import argparse
import gzip
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from multihead.app.segment import split

OLD_RULE = re.compile(r"(?<=[.!?…])\s+|(?<=[。！？])")
HARD = [
    ("en", ["Dr. Smith arrived at 3.30 p.m. on Monday.", "He was late!", "Was he?"]),
    ("en", ["The U.S. economy grew by 2.5 percent.", "Prices rose."]),
    ("en", ['He said "Stop." and left.', "Nobody followed."]),
    ("de", ["Das kostet z. B. 3,50 Euro.", "Dr. Müller kommt am 3. Mai.", "Gut."]),
    ("de", ["Er wohnt in der Goethestr. 5 in Berlin.", "Sie nicht."]),
    ("fr", ["M. Dupont est arrivé à 14 h.", "Il a dit « bonjour ! » puis il est parti."]),
    ("zh", ["我们今天去公园。", "天气很好！", "你来吗？"]),
    ("ja", ["今日は雨です。", "明日は晴れるでしょう。"]),
    ("th", ["วันนี้อากาศดีมาก", "เราจะไปเที่ยวกัน"]),
    ("es", ["¿Vienes mañana?", "¡Claro que sí!", "Nos vemos a las 8 p. m."]),
]
UNSPACED = {"zh", "ja"}


def segmenters() -> dict[str, Callable[[str, str], list[str]]]:
    found: dict[str, Callable[[str, str], list[str]]] = {
        "old rule": lambda text, _: [part.strip() for part in OLD_RULE.split(text) if part.strip()],
        "sentencex (ours)": lambda text, language: split(text, language).sentences,
    }
    try:
        import pysbd
    except ImportError:
        return found
    made: dict[str, object] = {}

    def pysbd_split(text: str, language: str) -> list[str]:
        if language not in made:
            made[language] = pysbd.Segmenter(language=language, clean=False)
        return [part.strip() for part in made[language].segment(text) if part.strip()]  # type: ignore[attr-defined]

    found["pySBD"] = pysbd_split
    return found


def paragraphs(data: Path, language: str) -> list[list[str]]:
    with gzip.open(data / f"test_2016_flickr.{language}.gz", "rt", encoding="utf-8") as lines:
        sentences = [line.strip() for line in lines]
    return [sentences[start : start + 3] for start in range(0, len(sentences) - 2, 3)]


def measure(segment: Callable[[str, str], list[str]], cases: list[tuple[str, list[str]]], repeat: int) -> str:
    """``found/cases, µs a paragraph`` (and how many it refused, a language it lacks)."""
    texts = [("" if language in UNSPACED else " ").join(sentences) for language, sentences in cases]
    found, refused, kept = 0, 0, []
    for text, (language, sentences) in zip(texts, cases, strict=True):
        try:
            found += segment(text, language) == sentences
            kept.append((text, language))
        except Exception:  # pySBD refuses a language it lacks
            refused += 1
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for text, language in kept:
            segment(text, language)
        times.append((time.perf_counter() - start) / max(len(kept), 1) * 1e6)
    return f"{found}/{len(cases)}{f' ({refused} refused)' if refused else ''}, {statistics.median(times):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/multi30k"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sets = {f"Multi30k {language}": [(language, p) for p in paragraphs(args.data, language)]
            for language in ("de", "en", "fr", "cs")}  # fmt: skip
    sets["hard cases"] = HARD
    print("| paragraphs | " + " | ".join(f"{name}: found, µs" for name in segmenters()) + " |")
    print("|---|" + "---|" * len(segmenters()))
    for name, cases in sets.items():
        cells = [measure(segment, cases, args.repeat) for segment in segmenters().values()]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
