"""The built-in tasks' generators: each returns ``(key, (source, target))`` for one random example.

The key decides the held-out split: every way of writing one date (or number, or string) lands on the same side.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import numpy as np

Example = tuple[str, tuple[str, str]]

MONTHS = [dt.date(2000, m, 1).strftime("%B") for m in range(1, 13)]
WEEKDAYS = [dt.date(2024, 1, d).strftime("%A") for d in range(1, 8)]  # 2024-01-01 was a Monday
FIRST_DAY, LAST_DAY = dt.date(1900, 1, 1).toordinal(), dt.date(2099, 12, 31).toordinal()


def _ordinal(day: int) -> str:
    suffix = "th" if 11 <= day % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


DATE_FORMATS: list[Callable[[dt.date], str]] = [
    lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    lambda d: f"{d.day} {MONTHS[d.month - 1][:3]} {d.year}",
    lambda d: f"{MONTHS[d.month - 1][:3]} {d.day} {d.year}",
    lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",
    lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}",
    lambda d: f"{d.day:02d}-{MONTHS[d.month - 1][:3]}-{d.year}",
    lambda d: f"{WEEKDAYS[d.weekday()]}, {d.day} {MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{WEEKDAYS[d.weekday()][:3]} {MONTHS[d.month - 1][:3]} {d.day} {d.year}",
    lambda d: f"the {_ordinal(d.day)} of {MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{MONTHS[d.month - 1].lower()} {_ordinal(d.day)}, {d.year}",
    lambda d: f"{MONTHS[d.month - 1].upper()} {d.day} {d.year}",
    lambda d: d.isoformat(),
]


def dates(rng: np.random.Generator) -> Example:
    """A date as people write it → ISO ``YYYY-MM-DD``."""
    day = dt.date.fromordinal(int(rng.integers(FIRST_DAY, LAST_DAY + 1)))
    style = DATE_FORMATS[int(rng.integers(len(DATE_FORMATS)))]
    return day.isoformat(), (style(day), day.isoformat())


ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int) -> str:
    """English words for ``0 <= n < 1_000_000``: 342506 → 'three hundred forty-two thousand five hundred six'."""

    def below_thousand(m: int) -> list[str]:
        words = []
        if m >= 100:
            words += [ONES[m // 100], "hundred"]
            m %= 100
        if m >= 20:
            words.append(TENS[m // 10] + (f"-{ONES[m % 10]}" if m % 10 else ""))
        elif m or not words:
            words.append(ONES[m])
        return words

    if n < 1000:
        return " ".join(below_thousand(n))
    rest = below_thousand(n % 1000) if n % 1000 else []
    return " ".join([*below_thousand(n // 1000), "thousand", *rest])


def _number(rng: np.random.Generator) -> int:
    digits = int(rng.integers(1, 7))  # as many short numbers as long ones
    return int(rng.integers(0 if digits == 1 else 10 ** (digits - 1), 10**digits))


def numbers(rng: np.random.Generator) -> Example:
    """English number words → digits."""
    n = _number(rng)
    return str(n), (number_words(n), str(n))


def numbers_to_words(rng: np.random.Generator) -> Example:
    """Digits → English number words."""
    n = _number(rng)
    return str(n), (str(n), number_words(n))


def _letters(rng: np.random.Generator) -> str:
    return "".join(chr(ord("a") + int(c)) for c in rng.integers(0, 10, size=int(rng.integers(4, 13))))


def copy(rng: np.random.Generator) -> Example:
    text = _letters(rng)
    return text, (text, text)


def reverse(rng: np.random.Generator) -> Example:
    text = _letters(rng)
    return text, (text, text[::-1])


def sort(rng: np.random.Generator) -> Example:
    text = _letters(rng)
    return text, (text, "".join(sorted(text)))


GENERATORS: dict[str, tuple[Callable[[np.random.Generator], Example], str]] = {
    "dates": (dates, "char"),
    "numbers": (numbers, "char"),
    "numbers-to-words": (numbers_to_words, "char"),
    "copy": (copy, "char"),
    "reverse": (reverse, "char"),
    "sort": (sort, "char"),
}
TASKS = tuple(GENERATORS)
"""The built-in tasks' names."""
