"""What every document format gives (:class:`Document`, :class:`Format`) and how a document's units are translated
(:func:`translate_units`): see :mod:`multihead.app.documents`."""

from __future__ import annotations

import asyncio
import io
import zipfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lxml import etree

from multihead.app.console import UserError
from multihead.app.markup import translate_html

Translate = Callable[[list[str]], list[str]]
"""What translates texts, in order (a :class:`~multihead.app.translate.Translator`'s ``translate``)."""


class Document(Protocol):
    """A file read for translation: its :attr:`units` and how it is written with their translations."""

    units: list[str]
    """The texts to translate, in the document's order (HTML where :attr:`markup` says so)."""
    markup: bool
    """Whether the units are HTML fragments: text escaped, inline formatting as elements."""

    def write(self, translations: Sequence[str], path: Path) -> None:
        """The document, each unit replaced by its translation (as the units are: HTML where they are), into the
        file ``path`` (a temporary one that is moved into place once whole)."""
        ...


@dataclass(frozen=True)
class Format:
    """A document format: its ``name`` (``--format``), the extensions it is chosen by, and what reads a file of it
    (refused in one line, a :class:`~multihead.app.console.UserError`, where it cannot)."""

    name: str
    extensions: tuple[str, ...]
    read: Callable[[Path], Document]


AsyncTranslate = Callable[[list[str]], Awaitable[list[str]]]
"""What translates texts, in order, awaited (``serve``'s translation of a request's texts)."""


async def translate_units(document: Document, translate: AsyncTranslate) -> list[str]:
    """Each unit of ``document`` translated by ``translate``: plain units in one call; HTML units with their inline
    formatting placed (:func:`multihead.app.markup.translate_html`), every unit's texts of a round in one call."""
    if not document.markup:
        return await translate(list(document.units))
    waiting: list[tuple[list[str], asyncio.Future[list[str]]]] = []

    async def ask(texts: list[str]) -> list[str]:
        answer: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        waiting.append((texts, answer))
        return await answer

    tasks = [asyncio.ensure_future(translate_html(unit, ask)) for unit in document.units]
    try:
        while not all(task.done() for task in tasks):
            await _settled(tasks, waiting)
            if waiting:
                asked, waiting[:] = list(waiting), []
                done = iter(await translate([text for texts, _ in asked for text in texts]))
                for texts, answer in asked:
                    answer.set_result([next(done) for _ in texts])
    finally:
        for task in tasks:
            task.cancel()
    return [task.result() for task in tasks]


async def _settled(tasks: Sequence[asyncio.Future[str]], waiting: Sequence[object]) -> None:
    """Return once every task has ended or waits for its texts (as many waiting as there are tasks going)."""
    while sum(not task.done() for task in tasks) > len(waiting):
        await asyncio.sleep(0)
    for task in tasks:
        if task.done() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def read_utf8(path: Path, kind: str) -> str:
    """The text of the file ``path`` (UTF-8, a byte order mark dropped), refused in one line, naming ``kind`` (what
    the file was read as), where it cannot be read or is not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"--input {str(path)!r} cannot be read: {error.strerror or error}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UserError(
            f"--input {str(path)!r} is not UTF-8 text, as {kind} must be here ({error.reason} at byte {error.start})"
        ) from None


XML = etree.XMLParser(resolve_entities=False, no_network=True, remove_blank_text=False)
"""How a document's XML is parsed: no entity resolved, nothing fetched (a file may come from anyone)."""


def zip_package(path: Path, kind: str, media: str, manifest: str) -> tuple[bytes, zipfile.ZipFile, Any]:
    """The bytes of the zip package ``path`` (an OpenDocument file, an EPUB book), the zip, and its entry ``manifest``
    parsed (:data:`XML`), refused in one line where it cannot be read or is not ``kind``: a zip whose ``mimetype``
    entry says ``media``."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"{str(path)!r} cannot be read: {error.strerror or error}") from None
    try:
        package = zipfile.ZipFile(io.BytesIO(data))
        found = package.read("mimetype").decode("ascii", "replace").strip()
        root = etree.fromstring(package.read(manifest), XML)
    except (zipfile.BadZipFile, KeyError, etree.XMLSyntaxError, OSError) as error:
        raise UserError(f"{str(path)!r} is not {kind}: {error}") from None
    if found != media:
        raise UserError(f"{str(path)!r} is not {kind}: it is {found or 'another kind of zip file'}")
    return data, package, root
