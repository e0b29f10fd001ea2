"""Glossaries: source terms and the target terms a translation must use for them (``--glossary FILE``).

A glossary file is a table with a header row naming the languages of its columns (``de<TAB>en``; a ``.csv`` file is
comma-separated, any other tab-separated), one entry a row, or a TBX file (``.tbx``: a termbase as terminology tools
export it, one concept an entry); a pair's languages are read, the others left (a run that records no languages reads
a table of exactly two columns, source then target). A source term is found in a sentence as a whole word (letters
and digits around it do not belong to it; in scripts written without spaces, such as Chinese and Japanese, anywhere),
whatever its case, the longest first where terms overlap; only the entries found become the sentence's constraints
(:class:`multihead.constraints.Constraints`), their target terms written as the glossary writes them.

A TBX file is read with ``defusedxml``, which refuses entity declarations and external references: a termbase may
come from anyone, and those are how an XML file expands into gigabytes or reads files it should not. Terminology tools
declare no entities, so nothing a real termbase holds is lost.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from multihead.app.console import UserError

if TYPE_CHECKING:
    from xml.etree.ElementTree import Element

NO_SPACES = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff]")
"""Letters of scripts written without spaces between words (Japanese kana, CJK ideographs, Thai, Lao, Myanmar,
Khmer): a term holding one is found anywhere, not only as a whole word."""

VARIANT = re.compile(r"([a-z]{2,3})[-_][a-z0-9]{2,8}(?:[-_][a-z0-9]{1,8})*")
"""A language code with a region or script (``en-US``, ``pt_BR``, ``zh-Hant``): its language, the first group."""

XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
AVOIDED = ("deprecated", "superseded", "notrecommended")
"""How the TBX statuses (``administrativeStatus``) of terms never to write begin."""


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

    def joined(self, terms: Sequence[Term]) -> Glossary:
        """This glossary's terms and ``terms``, whose target wins where both give a source term (in any case): a
        ``serve`` request's own glossary beside the server's."""
        if not terms:
            return self
        own = {term.source.casefold(): term for term in self.terms}
        own.update({term.source.casefold(): term for term in terms})
        return Glossary(list(own.values()))


def _pattern(term: str) -> str:
    """What finds ``term``: itself, as a whole word unless its script is written without spaces."""
    if NO_SPACES.search(term):
        return re.escape(term)
    return rf"(?<!\w){re.escape(term)}(?!\w)"


@dataclass(frozen=True)
class Entry:
    """One entry of a glossary file: a table's row or a termbase's concept (``where``, as messages name it), its
    ``sources`` (each language's terms to find, as the file names the language, in lower case) and ``targets`` (each
    language's term to write; a TBX concept's preferred one). ``cells``: a table row's cells, which must give both
    terms of a pair where they give one (``None``: a concept, which may lack a language)."""

    where: str
    sources: dict[str, list[str]]
    targets: dict[str, str]
    cells: list[str] | None = None


class GlossaryFile:
    """A glossary file read (:func:`read_glossary_file`, refused in one line where it cannot be): its ``languages``
    (lower case; a table's in its columns' order), its entries, and the glossary of each pair of them
    (:meth:`glossary`, :meth:`glossaries`). ``named``: how messages name it (``--glossary 'terms.tbx'``)."""

    def __init__(self, named: str, languages: Sequence[str], entries: Sequence[Entry], *, table: bool) -> None:
        self.named, self.languages, self.entries, self.table = named, list(languages), list(entries), table

    def codes(self, lang: str) -> list[str]:
        """The file's languages that ``lang`` reads: itself (in any case, ``_`` as ``-``) first, then, for a language
        without a region or script, its variants in the file's order (``en-US`` and ``en_GB`` for ``en``)."""
        lang = lang.lower().replace("_", "-")
        same = [code for code in self.languages if code.replace("_", "-") == lang]
        return same + [code for code in self.languages if code not in same and _language_of(code) == lang]

    def terms(self, langs: Sequence[str] | None) -> list[Term] | None:
        """The terms of the pair ``langs`` (source, target; ``None``: a table of two columns, in order), each source
        term of an entry mapped to its target term; ``None`` where the file has no term in one of the languages.
        Refused in one line: a table row with one of the pair's terms, a source term given two targets."""
        if langs is None:
            if not self.table or len(self.languages) != 2:
                received = f"{len(self.languages)}: {self.languages}" if self.table else "a TBX file"
                raise UserError(f"{self.named}: this run records no languages, so its glossary has two columns "
                                f"(source, target), received {received}")  # fmt: skip
            sources, targets = [self.languages[0]], [self.languages[1]]
        else:
            sources, targets = self.codes(langs[0]), self.codes(langs[1])
        if not sources or not targets:
            return None
        return _pair_terms(self._pairs(sources, targets), self.named)

    def _pairs(self, sources: Sequence[str], targets: Sequence[str]) -> Iterator[tuple[Entry, list[str], str]]:
        """Each entry that holds terms of the languages ``sources`` and ``targets``, its source terms and its target
        term (a table row with only one of them refused)."""
        for entry in self.entries:
            found = [term for code in sources for term in entry.sources.get(code, [])]
            target = next((entry.targets[code] for code in targets if code in entry.targets), None)
            if found and target is not None:
                yield entry, found, target
            elif entry.cells is not None and (found or target is not None):
                raise UserError(f"{self.named} {entry.where}: an entry needs both terms, received {entry.cells!r}")

    def glossary(self, langs: Sequence[str] | None) -> Glossary:
        """The glossary of the pair ``langs`` (:meth:`terms`), refused in one line where the file has no column or
        no entry for it."""
        terms = self.terms(langs)
        if terms is None:
            assert langs is not None  # a table of two columns has both
            missing = ", ".join(lang for lang in langs if not self.codes(lang))
            found = (f"its header {self.languages} names no column for {missing}" if self.table
                     else f"its terms are in {', '.join(self.languages)}, none in {missing}")  # fmt: skip
            raise UserError(f"{self.named}: {found} (the run translates {langs[0]} to {langs[1]})")
        if not terms:
            raise UserError(f"{self.named} holds no entry with terms in both {langs[0]} and {langs[1]}"
                            if langs else f"{self.named} holds no entries")  # fmt: skip
        return Glossary(terms)

    def glossaries(self, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Glossary]:
        """The glossary of each of ``pairs`` the file gives entries (a pair it has no terms of: none); refused in one
        line where it gives none any."""
        pairs = list(pairs)
        found = {pair: Glossary(terms) for pair in pairs if (terms := self.terms(pair))}
        if not found:
            served = ", ".join(f"{source}-{target}" for source, target in pairs[:8]) + ", ..." * (len(pairs) > 8)
            raise UserError(f"{self.named} gives no pair served any entry: its languages are {self.languages}, the "
                            f"pairs served {served}")  # fmt: skip
        return found


def _language_of(code: str) -> str | None:
    """The language of a code with a region or script (``en`` of ``en-us``), else ``None``."""
    found = VARIANT.fullmatch(code)
    return found[1] if found else None


def _pair_terms(pairs: Iterable[tuple[Entry, list[str], str]], named: str) -> list[Term]:
    """The terms of entries (each with its source terms and its target term): one a source term, refused in one
    line where a source term (in any case) is given two targets."""
    terms: dict[str, Term] = {}
    for entry, sources, target in pairs:
        for source in sources:
            known = terms.get(source.casefold())
            if known is not None and known.target != target:
                raise UserError(f"{named} {entry.where}: {source!r} is given two targets, {known.target!r} and "
                                f"{target!r}")  # fmt: skip
            terms[source.casefold()] = Term(source, target)
    return list(terms.values())


def read_glossary(path: str | Path, langs: Sequence[str] | None, *, flag: str = "--glossary") -> Glossary:
    """The glossary in ``path`` for the pair ``langs`` (source, target; ``None``: a table of two columns, in order),
    refused in one line naming the file (and the row or concept) where it cannot be read (:func:`read_glossary_file`),
    has no column or no entry for the pair, a row gives one term, or a source term is given two targets."""
    return read_glossary_file(path, flag=flag).glossary(langs)


def read_glossary_file(path: str | Path, *, flag: str = "--glossary") -> GlossaryFile:
    """The glossary file ``path``: a TBX file (``.tbx``) or a table (``.csv``: comma-separated; any other name:
    tab-separated), refused in one line naming it where it is missing, not UTF-8, malformed or without entries."""
    where = Path(path)
    named = f"{flag} {str(where)!r}"
    if where.suffix.lower() == ".tbx":
        try:
            data = where.read_bytes()
        except OSError as error:
            raise UserError(f"{named} cannot be read: {error}") from None
        return _read_tbx(data, named)
    try:
        text = where.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{named} cannot be read: {error}") from None
    return _read_table(text, named, delimiter="," if where.suffix.lower() == ".csv" else "\t")


def _read_table(text: str, named: str, *, delimiter: str) -> GlossaryFile:
    """A table's glossary: a header row naming the languages, then an entry a row (blank rows left)."""
    rows = [row for row in csv.reader(text.splitlines(), delimiter=delimiter) if any(cell.strip() for cell in row)]
    if len(rows) < 2:
        raise UserError(f"{named} holds no entries: a header row naming the languages, then a row a term")
    header = [cell.strip().lower() for cell in rows[0]]
    entries = []
    for number, row in enumerate(rows[1:], start=2):
        cells = {code: row[column].strip() for column, code in enumerate(header) if column < len(row)}
        written = {code: cell for code, cell in cells.items() if cell}
        entries.append(Entry(f"row {number}", {code: [cell] for code, cell in written.items()}, written, row))
    return GlossaryFile(named, header, entries, table=True)


def _read_tbx(data: bytes, named: str) -> GlossaryFile:
    """A TBX file's glossary: a concept (TBX-Basic's and TBX-Core's ``termEntry`` in a ``martif``, TBX v3's
    ``conceptEntry`` in a ``tbx``) an entry, each of its ``langSet``s (v3: ``langSec``) a language's terms."""
    from xml.etree.ElementTree import ParseError

    from defusedxml import DefusedXmlException
    from defusedxml.ElementTree import fromstring

    try:
        root = fromstring(data)
    except ParseError as error:
        raise UserError(f"{named} is not well-formed XML: {error}") from None
    except DefusedXmlException as error:  # an entity declared, an external reference
        raise UserError(f"{named} declares an XML entity, refused (an entity may expand without bound or read another "
                        f"file): {error}") from None  # fmt: skip
    if _local(root.tag) not in ("martif", "tbx"):
        raise UserError(f"{named} is not a TBX file: its root is <{_local(root.tag)}>, expected <martif> or <tbx>")
    concepts = [node for node in root.iter() if _local(node.tag) in ("termEntry", "conceptEntry")]
    if not concepts:
        raise UserError(f"{named} holds no entries: no termEntry or conceptEntry")
    entries = [_concept(node, number, named) for number, node in enumerate(concepts, start=1)]
    languages = list(dict.fromkeys(code for entry in entries for code in entry.sources))
    return GlossaryFile(named, languages, entries, table=False)


def _concept(node: Element, number: int, named: str) -> Entry:
    """One TBX concept's entry: each language's terms, and the one to write (the first marked preferred, else the
    first not marked deprecated, superseded or not recommended; none where every term is)."""
    kind, key = _local(node.tag), node.get("id")
    where = f"{kind} {number}" + (f" (id {key!r})" if key else "")
    sources: dict[str, list[str]] = {}
    targets: dict[str, str] = {}
    for languages in (child for child in node if _local(child.tag) in ("langSet", "langSec")):
        code = languages.get(XML_LANG) or languages.get("lang")
        if not code:
            raise UserError(f"{named} {where}: a {_local(languages.tag)} without xml:lang")
        code = code.strip().lower()
        terms = [term for term in map(_term, languages) if term is not None]
        sources.setdefault(code, []).extend(term for term, _ in terms)
        ranked = sorted((rank, index) for index, (_, rank) in enumerate(terms) if rank < 2)
        if ranked and code not in targets:
            targets[code] = terms[ranked[0][1]][0]
    return Entry(where, sources, targets)


def _term(node: Element) -> tuple[str, int] | None:
    """The term a ``tig``, ``ntig`` or ``termSec`` holds (or a bare ``term``), whitespace collapsed, and its rank as
    a target: 0 preferred, 1 admitted, 2 never written; ``None`` for anything else."""
    kind = _local(node.tag)
    if kind not in ("tig", "ntig", "termSec", "term"):
        return None
    term = node if kind == "term" else next((each for each in node.iter() if _local(each.tag) == "term"), None)
    text = " ".join("".join(term.itertext()).split()) if term is not None else ""
    if not text:
        return None
    status = next(filter(None, map(_status, node.iter())), "")
    rank = 0 if status.startswith("preferred") else 2 if status.startswith(AVOIDED) else 1
    return text, rank


def _status(node: Element) -> str:
    """The administrative status an element gives (``termNote type="administrativeStatus"``, TBX v3's
    ``administrativeStatus``), in lower case; empty for any other element."""
    kind = _local(node.tag)
    if kind == "administrativeStatus" or (kind == "termNote" and node.get("type") == "administrativeStatus"):
        return "".join(node.itertext()).strip().lower()
    return ""


def _local(tag: str) -> str:
    """An element's name without its namespace (TBX v3's elements have one)."""
    return tag.rsplit("}", 1)[-1]
