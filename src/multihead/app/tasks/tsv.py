"""A user's parallel corpus: one ``source<TAB>target`` pair per line (UTF-8, with or without a byte order mark)."""

from __future__ import annotations

import os
from pathlib import Path


def read_tsv(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """The pairs of a TSV file; a clear ``ValueError`` naming the line for anything malformed."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{str(path)!r}: no such file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # editors on Windows often start UTF-8 files with a BOM
    except UnicodeDecodeError as error:
        raise ValueError(f"{str(path)!r} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise ValueError(f"{str(path)!r} line {number}: expected 'source<TAB>target', received {line[:60]!r}")
        pairs.append((fields[0].strip(), fields[1].strip()))
    if not pairs:
        raise ValueError(f"{str(path)!r} holds no 'source<TAB>target' lines")
    return pairs
