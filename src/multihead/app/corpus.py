"""Parallel corpora from files, as WMT, Multi30k, Moses and Tatoeba/Anki distribute them.

- Two line-aligned files, source and target (``train.de`` and ``train.en``), plain or ``.gz``: line ``i`` of one
  translates line ``i`` of the other.
- One TSV file (plain or ``.gz``): the first two tab-separated columns are source and target; further columns
  (the attribution column of Tatoeba/Anki exports) are ignored.

Everything that would make a bad corpus is refused before anything is written, in one line naming the file and the
line: a missing file, invalid UTF-8, a truncated ``.gz``, files of different line counts, a line empty on one side
only, a TSV line with an empty column. Lines empty on both sides are skipped; surrounding whitespace is stripped; in
two-file corpora a TAB inside a line is read as a space. A corpus's fingerprint (bytes and SHA-256 of each file)
lets a resumed run check that it is given the corpus it trained on.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import os
import sys
import zlib
from collections.abc import Generator, Iterable, Iterator, Sequence
from pathlib import Path

from multihead.app.console import UserError, plural

Pair = tuple[str, str]
CORPUS_FILES = "a file (TSV, or one file per language)"
__all__ = [
    "Pair",
    "file_sha256",
    "fingerprint",
    "iter_lines",
    "iter_parallel",
    "read_lines",
    "read_parallel",
    "read_stdin_lines",
]


def _check_file(option: str, path: Path, expected: str) -> None:
    if not path.exists():
        raise UserError(f"{option}: {str(path)!r} does not exist")
    if path.is_dir():
        raise UserError(f"{option}: {str(path)!r} is a directory; give {expected}")


BLOCK = 1 << 22
"""Bytes read at a time: lines are split and decoded a block at a time, far faster than one by one."""


def _raw_lines(path: Path) -> Iterator[bytes]:
    """The lines of a file (plain or ``.gz``), as bytes without their line feed, read a block at a time."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as file:
        rest = b""
        while block := file.read(BLOCK):
            block = rest + block
            cut = block.rfind(b"\n") + 1
            block, rest = block[:cut], block[cut:]
            if block:
                yield from block[:-1].split(b"\n")
        if rest:
            yield rest


def _decoded(raw_lines: Iterable[bytes], name: str, option: str) -> Iterator[str]:
    """Lines of bytes as text, without line ends; a :class:`UserError` naming ``option``, ``name`` and the line for
    invalid UTF-8."""
    number = 0
    try:
        for number, raw in enumerate(raw_lines, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):  # editors on Windows often start UTF-8 with a BOM
                raw = raw[3:]
            yield raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as error:
        raise UserError(
            f"{option}: {name} line {number} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None


def _decode(raw_lines: Iterable[bytes], name: str, option: str) -> list[str]:
    return list(_decoded(raw_lines, name, option))


def iter_lines(path: str | os.PathLike[str], option: str, expected: str = "a text file") -> Iterator[str]:
    """The lines of a UTF-8 text file (plain or ``.gz``) one at a time, as :func:`read_lines` reads them; its errors
    come when the line that causes them is reached."""
    path = Path(path)
    _check_file(option, path, expected)
    try:
        yield from _decoded(_raw_lines(path), repr(str(path)), option)
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise UserError(f"{option}: {str(path)!r} is a truncated or damaged gzip file ({error})") from None
    except OSError as error:
        raise UserError(f"{option}: cannot read {str(path)!r}: {error.strerror or error}") from None


def read_lines(path: str | os.PathLike[str], option: str, expected: str = "a text file") -> list[str]:
    """The lines of a UTF-8 text file (plain or ``.gz``), without line ends; a :class:`UserError` naming ``option``,
    the file and the line for anything unreadable (``expected`` says what a directory should have been)."""
    return list(iter_lines(path, option, expected))


def read_stdin_lines(option: str) -> list[str]:
    """The lines of standard input, split and decoded as :func:`read_lines` does a file's (only at line feeds: a form
    feed or a Unicode line separator inside a line does not split it)."""
    stream = getattr(sys.stdin, "buffer", None)
    data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8")
    return _decode(io.BytesIO(data), "standard input", option)


def _pairs_from_tsv(path: Path, option: str) -> Generator[Pair, None, None]:
    for number, line in enumerate(iter_lines(path, option, CORPUS_FILES), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise UserError(
                f"{option}: {str(path)!r} line {number}: expected 'source<TAB>target', received {line[:60]!r}"
            )
        for column, field in zip(("source", "target"), fields, strict=False):
            if not field.strip():
                raise UserError(f"{option}: {str(path)!r} line {number}: the {column} column is empty")
        yield fields[0].strip(), fields[1].strip()


def _pairs_from_files(source: Path, target: Path, option: str) -> Generator[Pair, None, None]:
    sources, targets = iter_lines(source, option, CORPUS_FILES), iter_lines(target, option, CORPUS_FILES)
    number = 0
    for number, (src, tgt) in enumerate(itertools.zip_longest(sources, targets), start=1):
        if src is None or tgt is None:  # one file has ended: count the rest of the other to name both counts
            longer = number + sum(1 for _ in (targets if src is None else sources))
            counts = (number - 1, longer) if src is None else (longer, number - 1)
            raise UserError(
                f"{option}: {str(source)!r} has {plural(counts[0], 'line')} but {str(target)!r} has {counts[1]}; "
                "the two files must be line-aligned translations"
            )
        src, tgt = _spaced(src), _spaced(tgt)
        if bool(src) != bool(tgt):
            empty, other = (source, target) if not src else (target, source)
            raise UserError(f"{option}: line {number} is empty in {str(empty)!r} but not in {str(other)!r}")
        if src:
            yield src, tgt


def _spaced(line: str) -> str:
    """A line of a one-language file with its TABs read as spaces (a TAB is no symbol a model should learn)."""
    return line.replace("\t", " ").strip()


def iter_parallel(paths: Sequence[str | os.PathLike[str]], option: str = "--data") -> Generator[Pair, None, None]:
    """The sentence pairs of a TSV file (one path) or of two line-aligned files (two paths), read line by line. The
    files are checked at the call (that they exist and are files); an error in a line comes when it is reached
    (different line counts at the end of the shorter file)."""
    if len(paths) not in (1, 2):
        raise UserError(f"{option} takes one TSV file or two line-aligned files, received {len(paths)} paths")
    files = [Path(path) for path in paths]
    for file in files:
        _check_file(option, file, CORPUS_FILES)
    return _pairs_from_tsv(files[0], option) if len(files) == 1 else _pairs_from_files(files[0], files[1], option)


def read_parallel(paths: Sequence[str | os.PathLike[str]], option: str = "--data") -> list[Pair]:
    """The sentence pairs of a TSV file (one path) or of two line-aligned files (two paths)."""
    pairs = list(iter_parallel(paths, option))
    if not pairs:
        raise UserError(f"{option}: {' and '.join(repr(str(p)) for p in paths)} hold no sentence pairs")
    return pairs


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read a block at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(paths: Sequence[str | os.PathLike[str]]) -> list[dict[str, object]]:
    """Each file's name, size and SHA-256: what a resumed run checks its corpus against."""
    return [{"name": path.name, "bytes": path.stat().st_size, "sha256": file_sha256(path)} for path in map(Path, paths)]
