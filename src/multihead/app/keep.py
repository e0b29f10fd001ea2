"""Do-not-translate spans: placeholders, and what ``--keep REGEX`` marks, come back in a translation exactly once, byte
for byte.

What is kept (:class:`Keep`): the placeholders of the usual formats, unless turned off (:data:`PLACEHOLDERS`:
``{name}``, ``{{name}}``, ``%s``/``%1$s``/``%(name)s``, ``${name}``, XLIFF's ``<x id=".."/>``, URLs, e-mail
addresses), and every match of the user's regular expressions; where two overlap, the one that starts first (then
the longest) is kept.

How: before the model reads a text, each span is replaced by a stand-in (:meth:`Keep.masked`): a capital letter and a
digit (``X1``, ``X2``... ``Q1``...; :data:`STAND_INS`), the first not already in the text, which nearly every
vocabulary spells, whatever the span holds (a vocabulary without braces cannot write ``{name}``; every one writes
``X1``). Each stand-in its sentence holds becomes one of the sentence's constraints (its target tokens, which the
translation must hold; :meth:`multihead.app.cutting.Cutter.constraints`), where the target vocabulary spells it and
the search is not sampling. After decoding, each stand-in is replaced by its span (:func:`restored`); a translation
that holds one of its stand-ins other than once is searched again by the guard (:func:`miscounted`), and what still
does is repaired: a stand-in written twice keeps its first place, one missing is put before the sentence's final
punctuation. A span kept is never dropped, nor written twice (past the :data:`STAND_INS`' count, a text's spans
stay as text).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PLACEHOLDERS = {
    "URL": r"\b(?:(?:https?|ftp)://|www\.)[^\s<>\"']*[^\s<>\"'.,;:!?)\]}]",
    "e-mail address": r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,}(?![\w-])",
    "{{name}}": r"\{\{[^{}\n]*\}\}",
    "${name}": r"\$\{[^{}\s]*\}",
    "{name}": r"\{[^{}\s]*\}",
    "printf": r"%(?:\d+\$|\([^()\s]+\))?[-+#0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t)?[diouxXeEfFgGcsp]"
    r"(?![A-Za-z])",
    "XLIFF <x/>": r"<(?:x|bx|ex|ph)\b[^<>]*/>",
}
"""The placeholders kept by default, by kind: each a regular expression."""
STAND_INS = tuple(letter + digit for letter in "XQZJKVWYFGHBPMDLNRSTCAEIOU" for digit in "1234567890")
"""What spans are replaced by while the model translates, in the order they are given: all as long, so that none
holds another; at most this many spans of one text are kept."""
FINAL = re.compile(r"[\s.!?。！？…:;\"'»“”)]*$")
"""What ends a sentence after its last word: where a missing span is put back (before it)."""
Kept = Mapping[str, str]
"""A text's stand-ins and the spans they stand for."""


def keep_pattern(regex: str) -> re.Pattern[str]:
    """``regex`` compiled, refused (``ValueError``, quoting it) where it is not a regular expression or matches an
    empty text."""
    try:
        pattern = re.compile(regex)
    except re.error as error:
        raise ValueError(f"{regex!r} is not a regular expression ({error})") from None
    if pattern.fullmatch(""):
        raise ValueError(f"{regex!r} matches an empty text: a span to keep holds something")
    return pattern


@dataclass(frozen=True)
class Keep:
    """The spans to keep: the default :data:`PLACEHOLDERS` (unless ``placeholders`` is off) and every match of
    ``patterns`` (:func:`keep_pattern`)."""

    patterns: tuple[re.Pattern[str], ...] = ()
    placeholders: bool = True

    def __bool__(self) -> bool:
        return self.placeholders or bool(self.patterns)

    def joined(self, patterns: Sequence[re.Pattern[str]]) -> Keep:
        """These spans and ``patterns``' matches."""
        return Keep((*self.patterns, *patterns), self.placeholders) if patterns else self

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where ``text`` holds spans to keep, in order, none overlapping: where two would, the one that starts first,
        then the longest."""
        found = [match.span() for pattern in self._all() for match in pattern.finditer(text)
                 if match.end() > match.start()]  # fmt: skip
        taken: list[tuple[int, int]] = []
        for start, end in sorted(found, key=lambda span: (span[0], -span[1])):
            if not taken or start >= taken[-1][1]:
                taken.append((start, end))
        return taken

    def _all(self) -> tuple[re.Pattern[str], ...]:
        return (_DEFAULT, *self.patterns) if self.placeholders else self.patterns

    def masked(self, text: str) -> tuple[str, dict[str, str]]:
        """``text`` with each span replaced by a stand-in (:data:`STAND_INS`, the first not in ``text``), and the
        stand-ins with their spans; spans past the last stand-in stay as they are."""
        spans = self.spans(text)
        if not spans:
            return text, {}
        free = (stand_in for stand_in in STAND_INS if stand_in not in text)
        kept: dict[str, str] = {}
        parts, at = [], 0
        for (start, end), stand_in in zip(spans, free, strict=False):
            parts += [text[at:start], stand_in]
            kept[stand_in] = text[start:end]
            at = end
        return "".join(parts) + text[at:], kept


_DEFAULT = re.compile("|".join(f"(?:{regex})" for regex in PLACEHOLDERS.values()))


def held(source: str, kept: Kept) -> list[str]:
    """The stand-ins of ``kept`` that the source piece ``source`` holds, in order."""
    return sorted((stand_in for stand_in in kept if stand_in in source), key=source.index)


def _finder(stand_ins: Sequence[str]) -> re.Pattern[str]:
    """What finds ``stand_ins`` in a translation, each with the space before it, if any."""
    return re.compile(f"( ?)({'|'.join(map(re.escape, stand_ins))})")


def miscounted(source: str, translation: str, kept: Kept) -> str | None:
    """Why ``translation`` of the source piece ``source`` does not hold each of its spans' stand-ins exactly once (the
    first such span, and how many times), or ``None``."""
    for stand_in in held(source, kept):
        count = translation.count(stand_in)
        if count != 1:
            return f"it held the kept {kept[stand_in]!r} {count} times"
    return None


def restored(source: str, translation: str, kept: Kept) -> str:
    """``translation`` of the source piece ``source`` with each of its stand-ins replaced by its span, exactly once: a
    stand-in written more than once keeps its first place, one missing is put before the final punctuation (stand-ins
    of the text's other pieces, written here, are left out)."""
    if not kept:
        return translation
    own = held(source, kept)
    seen: set[str] = set()

    def put(match: re.Match[str]) -> str:
        space, stand_in = match[1], match[2]
        if stand_in not in own or stand_in in seen:
            return ""
        seen.add(stand_in)
        return space + kept[stand_in]

    text = _finder(list(kept)).sub(put, translation)
    if text.startswith(" ") and not translation.startswith(" "):  # a first stand-in left out, its space with it
        text = text[1:]
    missing = [kept[stand_in] for stand_in in own if stand_in not in seen]
    if missing:
        end = FINAL.search(text)
        at = end.start() if end else len(text)
        text = text[:at] + (" " if text[:at] else "") + " ".join(missing) + text[at:]
    return text
