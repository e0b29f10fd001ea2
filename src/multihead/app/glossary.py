"""Glossaries: source terms and the target terms a translation must use for them (``--glossary FILE``).

A glossary file is a table with a header row naming the languages of its columns (``de<TAB>en``; a ``.csv`` file is
comma-separated, any other tab-separated), one entry a row; the columns of a run's pair are read, the others left
(a run that records no languages reads a file of exactly two columns, source then target). A source term is found in
a sentence as a whole word (letters and digits around it do not belong to it; in scripts written without spaces,
such as Chinese and Japanese, anywhere), whatever its case, the longest first where terms overlap; only the entries
found become the sentence's constraints (:class:`multihead.constraints.Constraints`), their target terms written as
the glossary writes them.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from multihead.app.console import UserError

NO_SPACES = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff]")
"""Letters of scripts written without spaces between words (Japanese kana, CJK ideographs, Thai, Lao, Myanmar,
Khmer): a term holding one is found anywhere, not only as a whole word."""


@dataclass(frozen=True)
class Term:
    """One glossary entry: its ``source`` term and the ``target`` term translations must use for it."""

    source: str
    target: str


class Glossary:
    """Terms (:class:`Term`) to find in sources (:meth:`found`)."""

    def __init__(self, terms: Sequence[Term]) -> None:
        self.terms = list(terms)
        self._by_length = sorted(self.terms, key=lambda term: -len(term.source))
        alternatives = [f"(?P<t{index}>{_pattern(term.source)})" for index, term in enumerate(self._by_length)]
        self._pattern = re.compile("|".join(alternatives), re.IGNORECASE) if alternatives else None

    def __len__(self) -> int:
        return len(self.terms)

    def found(self, text: str) -> list[Term]:
        """The terms ``text`` holds, in the order they come (each once), the longest where two overlap."""
        if self._pattern is None:
            return []
        found = (self._by_length[int(str(match.lastgroup)[1:])] for match in self._pattern.finditer(text))
        return list(dict.fromkeys(found))


def _pattern(term: str) -> str:
    """What finds ``term``: itself, as a whole word unless its script is written without spaces."""
    if NO_SPACES.search(term):
        return re.escape(term)
    return rf"(?<!\w){re.escape(term)}(?!\w)"


def read_glossary(path: str | Path, langs: Sequence[str] | None, *, flag: str = "--glossary") -> Glossary:
    """The glossary in ``path`` for the pair ``langs`` (source, target; ``None``: a file of two columns, in order),
    refused in one line naming the file (and the row) where it cannot be read: missing, empty, without the pair's
    columns, a row without both terms, or a source term given two targets."""
    where = Path(path)
    try:
        text = where.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{flag} {str(where)!r} cannot be read: {error}") from None
    rows = [row for row in csv.reader(text.splitlines(), delimiter="," if where.suffix.lower() == ".csv" else "\t")
            if any(cell.strip() for cell in row)]  # fmt: skip
    if len(rows) < 2:
        raise UserError(f"{flag} {str(where)!r} holds no entries: a header row naming the languages, then a row a term")
    header = [cell.strip().lower() for cell in rows[0]]
    columns = _columns(header, langs, f"{flag} {str(where)!r}")
    terms: dict[str, Term] = {}
    for number, row in enumerate(rows[1:], start=2):
        source, target = (row[column].strip() if column < len(row) else "" for column in columns)
        if not source or not target:
            raise UserError(f"{flag} {str(where)!r} row {number}: an entry needs both terms, received {row!r}")
        known = terms.get(source.casefold())
        if known is not None and known.target != target:
            raise UserError(f"{flag} {str(where)!r} row {number}: {source!r} is given two targets, "
                            f"{known.target!r} and {target!r}")  # fmt: skip
        terms[source.casefold()] = Term(source, target)
    return Glossary(list(terms.values()))


def _columns(header: list[str], langs: Sequence[str] | None, named: str) -> tuple[int, int]:
    """The source and target columns of ``header`` for ``langs``."""
    if langs is None:
        if len(header) != 2:
            raise UserError(f"{named}: this run records no languages, so its glossary has two columns (source, "
                            f"target), received {len(header)}: {header}")  # fmt: skip
        return 0, 1
    wanted = [lang.lower() for lang in langs]
    missing = [lang for lang in wanted if lang not in header]
    if missing:
        raise UserError(f"{named}: its header {header} names no column for {', '.join(missing)} (the run translates "
                        f"{wanted[0]} to {wanted[1]})")  # fmt: skip
    return header.index(wanted[0]), header.index(wanted[1])
