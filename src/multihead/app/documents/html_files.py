"""HTML files as documents (``.html``, ``.htm``): the page one unit, translated as ``serve`` translates HTML
(:mod:`multihead.app.markup`: the text it shows, its tags, comments, scripts and ``translate="no"`` elements kept)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from multihead.app.console import UserError
from multihead.app.documents.base import Format


@dataclass
class HtmlDocument:
    """An HTML file: its text, one unit."""

    units: list[str]
    markup: bool = True

    def write(self, translations: Sequence[str], path: Path) -> None:
        Path(path).write_text(translations[0], encoding="utf-8")


def read_html(path: Path) -> HtmlDocument:
    """The HTML file ``path``, refused in one line where it cannot be read as UTF-8."""
    try:
        return HtmlDocument([path.read_text(encoding="utf-8-sig")])
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{str(path)!r} cannot be read as an HTML file (UTF-8): {error}") from None


FORMATS = (Format("html", (".html", ".htm", ".xhtml"), read_html),)
