"""Markdown files as documents (``.md``, ``.markdown``), parsed by markdown-it-py (CommonMark, with tables and
strikethrough).

A unit is the inline text of a block with a letter in it: a paragraph (in a list item or a block quote too), a
heading, a table cell. It is given as HTML: emphasis ``<em>``, strong ``<strong>``, strikethrough ``<s>``, a link an
``<a>`` with its address, a line break ``<br>``; inline code, images and autolinks ``<code>``/``<img>`` elements kept
as they were, inline HTML as it is. The translation is written back in Markdown in the block's place: its first line
holds the whole translation (a paragraph's other lines are dropped, a line break starting a line of its own), every
other line of the file byte for byte: code blocks and fences, HTML blocks, link reference definitions, a front matter
(``---`` ... ``---`` at the top), blank lines. A link is written inline (``[text](address "title")``), also where it
was a reference (``[text][name]``), its definition kept.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

from multihead.app.console import UserError
from multihead.app.documents.base import Format
from multihead.app.documents.office import GROUP, lettered

FRONT_MATTER = re.compile(r"\A(---|\+\+\+)\n.*?^(\1|\.\.\.)[ \t]*$", re.DOTALL | re.MULTILINE)
SPECIAL = re.compile(r"([\\`*_\[\]<|~])")
"""Characters escaped in a translation's text, which Markdown would read as its syntax."""
STARTING = re.compile(r"^([#>+\-=]|\d+[.)])")
"""What would start a block where a line starts."""
EMPHASIS = {"em": "*", "strong": "**", "s": "~~"}


@dataclass
class Block:
    """Where a block's inline text stands: the first line and the columns of its text, the other lines of it, the
    prefix a line of it starts with (a block quote's ``>``, a list item's indentation), and its kept elements'
    Markdown (code, images, autolinks)."""

    line: int
    start: int
    end: int
    others: list[int]
    prefix: str
    kept: list[str] = field(default_factory=list)


def _unit(children: Sequence[Any], kept: list[str]) -> str:
    """An inline token's children as HTML; the Markdown of its kept elements appended to ``kept``."""
    parts: list[str] = []
    link: list[Any] = []
    for token in children:
        if link:
            link.append(token)
            if token.type == "link_close":
                text = "".join(found.content for found in link if found.type == "text")
                kept.append(f"<{link[0].attrs.get('href', text)}>")
                parts.append(f'<code class="g{len(kept) - 1}">{escape(text)}</code>')
                link = []
        elif token.type == "link_open" and token.markup in ("autolink", "linkify"):
            link = [token]
        elif token.type == "text":
            parts.append(escape(token.content))
        elif token.type in ("softbreak", "hardbreak"):
            parts.append(" " if token.type == "softbreak" else "<br>")
        elif token.type.endswith(("_open", "_close")) and token.tag in (*EMPHASIS, "a"):
            attributes = "".join(f' {name}="{escape(str(value))}"' for name, value in token.attrs.items())
            parts.append(f"<{'/' if token.nesting < 0 else ''}{token.tag}{attributes if token.nesting > 0 else ''}>")
        elif token.type == "code_inline":
            fence = token.markup
            padding = " " if token.content.startswith("`") or token.content.endswith("`") else ""
            kept.append(f"{fence}{padding}{token.content}{padding}{fence}")
            parts.append(f'<code class="g{len(kept) - 1}">{escape(token.content)}</code>')
        elif token.type == "image":
            title = f' "{token.attrs["title"]}"' if token.attrs.get("title") else ""
            kept.append(f"![{token.content}]({token.attrs.get('src', '')}{title})")
            parts.append(f'<img class="g{len(kept) - 1}" alt="{escape(token.content)}">')
        elif token.type == "html_inline":
            parts.append(token.content)
    return "".join(parts)


class _Markdown(HTMLParser):
    """A translated unit written in Markdown: its text escaped, its elements as Markdown again."""

    def __init__(self, block: Block) -> None:
        super().__init__(convert_charrefs=True)
        self.block = block
        self.written: list[str] = []
        self.links: list[tuple[str, str]] = []
        self.skipped = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        group = GROUP.fullmatch(found.get("class") or "")
        if self.skipped:
            self.skipped += tag not in ("img", "br")
        elif group and tag in ("code", "img") and int(group[1]) < len(self.block.kept):
            self.written.append(self.block.kept[int(group[1])])
            self.skipped = int(tag == "code")
        elif tag == "br":
            self.written.append("\\\n" + self.block.prefix)
        elif tag in EMPHASIS:
            self.written.append(EMPHASIS[tag])
        elif tag == "a":
            title = found.get("title")
            self.links.append((found.get("href") or "", f' "{title}"' if title else ""))
            self.written.append("[")
        else:
            self.written.append(self.get_starttag_text() or "")

    def handle_endtag(self, tag: str) -> None:
        if self.skipped:
            self.skipped -= 1
        elif tag in EMPHASIS:
            self.written.append(EMPHASIS[tag])
        elif tag == "a" and self.links:
            address, title = self.links.pop()
            self.written.append(f"]({address.replace(' ', '%20')}{title})")
        elif tag not in ("br", "img", "code"):
            self.written.append(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        if not self.skipped:
            self.written.append(SPECIAL.sub(r"\\\1", data))


def _written(translation: str, block: Block) -> str:
    parser = _Markdown(block)
    parser.feed(translation)
    parser.close()
    return STARTING.sub(r"\\\1", "".join(parser.written).strip())


def _block(lines: list[str], token: Any, start: int) -> Block | None:
    """Where an inline token's text stands in ``lines`` (searched from the column ``start`` of its first line);
    ``None`` where a line of it is not found as it is."""
    first, last = token.map
    content = token.content.split("\n")
    if last - first < len(content):
        return None
    at = lines[first].find(content[0], start)
    if at < 0 or not all(line.strip() in lines[first + index] for index, line in enumerate(content[1:], 1)):
        return None
    prefix = lines[first][:at]
    if len(content) > 1:
        prefix = lines[first + 1][: len(lines[first + 1]) - len(lines[first + 1].lstrip(" \t>"))]
    else:
        prefix = re.sub(r"[^>\s]", " ", prefix)
    others = list(range(first + 1, first + len(content)))
    return Block(first, at, at + len(content[0]), others, prefix)


@dataclass
class MarkdownDocument:
    """A Markdown file read: its lines (each with its end), the blocks whose text is translated, their units."""

    lines: list[str]
    blocks: list[Block]
    units: list[str]
    markup: bool = True

    def write(self, translations: Sequence[str], path: Path) -> None:
        lines = list(self.lines)
        for block, translation in sorted(
            zip(self.blocks, translations, strict=True), key=lambda pair: (pair[0].line, -pair[0].start)
        ):
            line = lines[block.line]
            lines[block.line] = line[: block.start] + _written(translation, block) + line[block.end :]
            for other in block.others:
                lines[other] = ""
        Path(path).write_text("".join(lines), encoding="utf-8", newline="")


def read_markdown(path: Path) -> MarkdownDocument:
    """The Markdown file ``path``: its paragraphs', headings' and table cells' inline text, in the file's order."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as error:
        raise UserError(f"{str(path)!r} cannot be read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise UserError(f"{str(path)!r} is not Markdown: not UTF-8 ({error.reason} at byte {error.start})") from None
    lines = text.splitlines(keepends=True)
    bare = [line.rstrip("\r\n") for line in lines]
    front = FRONT_MATTER.match(text.replace("\r\n", "\n"))
    skipped = front[0].count("\n") + 1 if front else 0
    parsed = "\n" * skipped + "\n".join(bare[skipped:])
    parser = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    blocks: list[Block] = []
    units: list[str] = []
    columns: dict[int, int] = {}
    for token in parser.parse(parsed):
        if token.type != "inline" or token.map is None or not lettered(token.content):
            continue
        block = _block(bare, token, columns.get(token.map[0], 0))
        if block is None:
            continue
        columns[block.line] = block.end
        units.append(_unit(token.children or [], block.kept))
        blocks.append(block)
    return MarkdownDocument(lines, blocks, units)


FORMATS = (Format("markdown", (".md", ".markdown"), read_markdown),)
"""Markdown files: each paragraph, heading and table cell translated, its inline formatting kept, every other line as
it was."""
