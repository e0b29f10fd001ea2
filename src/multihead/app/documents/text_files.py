"""Plain text files as documents (``--format text``; ``serve``'s ``.txt`` uploads): a line a unit, blank lines and
line endings kept. (``translate --input FILE.txt`` without ``--format`` translates a text a line as ever, into
``--output`` as it goes: this format writes the file once whole instead.)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from multihead.app.console import UserError
from multihead.app.documents.base import Format
from multihead.app.segment import readable


@dataclass
class TextDocument:
    """A text file's lines (each with its line ending); its units, those with something to read."""

    lines: list[str]
    units: list[str] = field(default_factory=list)
    markup: bool = False

    def __post_init__(self) -> None:
        self.units = [line.rstrip("\r\n") for line in self.lines if readable(line)]

    def write(self, translations: Sequence[str], path: Path) -> None:
        done = iter(translations)
        out = [next(done) + line[len(line.rstrip("\r\n")) :] if readable(line) else line for line in self.lines]
        Path(path).write_text("".join(out), encoding="utf-8", newline="")


def read_text(path: Path) -> TextDocument:
    """The text file ``path``, refused in one line where it cannot be read as UTF-8."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as lines:
            return TextDocument(lines.readlines())
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{str(path)!r} cannot be read as a text file (UTF-8): {error}") from None


FORMATS = (Format("text", (), read_text),)
