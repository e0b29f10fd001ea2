"""Document jobs (``POST /documents``), on the event loop: a long document translated in the background, a chunk of
its units at a time, its state kept in a directory (``serve --jobs DIR``) so that a server started again resumes it.

A job's directory, ``DIR/ID/``, holds its upload (``upload.EXT``), its metadata (``job.json``, written atomically at
each change of status, last at its creation: a directory without it is an upload cut short, removed), the
translations of the chunks done so far (``chunks.jsonl``: a line a chunk, ``{"start": unit, "translations": [...]}``,
appended and synced; a line cut short by a kill is dropped on resuming) and, once every chunk is done, the translated
file (``result.EXT``, written atomically in the document's format). One job runs at a time, in the order they were
created; each chunk goes through the same path as ``/translate``'s texts (the engine batches it with the requests of
the moment, which step between its chunks). ``DIR/.lock`` keeps a second server off the directory
(:class:`~multihead.app.runs.RunLock`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from multihead.app.console import UserError
from multihead.app.documents import AsyncTranslate, Document, Format, formats, translate_units
from multihead.app.runs import LOCK, RunError, RunLock
from multihead.files import atomic_write, atomic_write_text

T = TypeVar("T")
CHUNK_UNITS = 4
"""The most units a chunk holds: modest, so that progress rises often and a job never holds the engine long."""
CHUNK_CHARS = 1000
"""The most characters a chunk of more than one unit holds."""
LIVE = ("queued", "running")
"""The statuses of a job whose work is left: resumed when the server starts again."""
META, CHUNKS = "job.json", "chunks.jsonl"

TranslateFor = Callable[[str, str], AsyncTranslate]
"""What translates a job's texts, given its source and target codes (the server's path, its glossary and keep)."""


@dataclass
class DocumentJob:
    """A document to translate: its ``id``, the uploaded file's name, its format's name, its languages, how many
    units it has, its status (``error`` when failed) and how many units are done."""

    id: str
    file: str
    format: str
    source: str
    target: str
    units: int
    status: str = "queued"
    error: str | None = None
    created: float = field(default_factory=time.time)
    done: int = 0
    began: tuple[float, int] | None = None  # when this server began on it, and the units done then
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def saved(self) -> dict[str, Any]:
        """Its metadata, as ``job.json`` holds it."""
        names = ("id", "file", "format", "source", "target", "units", "status", "error", "created")
        return {name: getattr(self, name) for name in names}

    def shown(self) -> dict[str, Any]:
        """``GET /documents/<id>``'s answer."""
        answer = {"id": self.id, "status": self.status, "progress": round(self.done / max(self.units, 1), 4),
                  "seconds_left": self.seconds_left(), "file": self.file}  # fmt: skip
        return answer | ({"error": self.error} if self.error is not None else {})

    def seconds_left(self) -> float | None:
        """The time the units left will take at the pace of those this server has done (``None``: none yet)."""
        if self.status != "running" or self.began is None or self.done <= self.began[1]:
            return None
        pace = (time.monotonic() - self.began[0]) / (self.done - self.began[1])
        return round(pace * (self.units - self.done), 1)

    @property
    def suffix(self) -> str:
        return Path(self.file).suffix.lower()


@dataclass
class _Part:
    """A chunk of a document's units, translated as a document of its own (:func:`translate_units`)."""

    units: list[str]
    markup: bool

    def write(self, translations: Sequence[str], path: Path) -> None:
        raise NotImplementedError("a chunk is never written")


class DocumentJobs:
    """The document jobs kept in ``folder`` (``None``: a temporary directory, removed when the server stops)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.given: Path | None = folder
        self.folder: Path | None = None  # the directory in use, once locked
        self.jobs: dict[str, DocumentJob] = {}
        self.held: RunLock | None = None
        self.translate_for: TranslateFor | None = None
        self.turn: asyncio.Semaphore | None = None

    def lock(self) -> Path:
        """The directory, made where missing and locked for this process; refused in one line when another holds it
        or it cannot be made."""
        if self.folder is None:
            try:
                folder = self.given or Path(tempfile.mkdtemp(prefix="multihead-jobs-"))
                folder.mkdir(parents=True, exist_ok=True)
                held = RunLock(folder)
                held.acquire()
            except RunError:
                holder = (folder / LOCK).read_text(encoding="utf-8").strip() or "unknown"
                raise UserError(f"--jobs {str(folder)!r} is in use by another multihead serve (pid {holder}): give "
                                "each server a directory of its own") from None  # fmt: skip
            except OSError as error:
                raise UserError(f"--jobs {str(self.given)!r} cannot be used: {error.strerror or error}") from None
            self.folder, self.held = folder, held
        return self.folder

    def start(self, translate_for: TranslateFor) -> None:
        """On the event loop: the jobs of the directory read, those queued or running resumed in their order."""
        folder, self.translate_for, self.turn = self.lock(), translate_for, asyncio.Semaphore(1)
        found = []
        for place in sorted(path for path in folder.iterdir() if path.is_dir()):
            if not (place / META).exists():
                shutil.rmtree(place, ignore_errors=True)  # an upload cut short
                continue
            try:
                found.append(DocumentJob(**json.loads((place / META).read_text(encoding="utf-8"))))
            except (OSError, ValueError, TypeError):
                continue  # no job this server reads: left as it is
        for job in sorted(found, key=lambda job: job.created):
            self.jobs[job.id] = job
            job.done = job.units if job.status == "done" else len(self._translated(job, rewrite=False))
            if job.status in LIVE:
                job.status = "queued"
                job.task = asyncio.ensure_future(self._run(job))

    async def stop(self) -> None:
        """The jobs' tasks stopped where they are (their state kept: resumed by the next server on the directory),
        then the directory let go (:meth:`release`)."""
        tasks = [job.task for job in self.jobs.values() if job.task is not None and not job.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self.release()

    def release(self) -> None:
        """The lock let go, and a temporary directory removed."""
        if self.held is not None and self.folder is not None:
            self.held.release()
            if self.given is None:
                shutil.rmtree(self.folder, ignore_errors=True)
            self.held = self.folder = None

    async def create(self, name: str, data: bytes, found: Format, source: str, target: str, units: int) -> DocumentJob:
        """A job of the document ``data`` (uploaded as ``name``, read as ``found``) from ``source`` into ``target``,
        its ``units`` counted: written into the directory, then queued."""
        job = DocumentJob(secrets.token_hex(8), safe_name(name), found.name, source, target, units)
        place = self.lock() / job.id

        def write() -> None:
            place.mkdir()
            atomic_write(place / f"upload{job.suffix}", lambda path: Path(path).write_bytes(data))
            atomic_write_text(place / META, json.dumps(job.saved()))

        await _finished(write)
        self.jobs[job.id] = job
        job.task = asyncio.ensure_future(self._run(job))
        return job

    def result(self, job: DocumentJob) -> Path:
        """Where a job done has its translated file."""
        return self.lock() / job.id / f"result{job.suffix}"

    async def cancel(self, id: str) -> DocumentJob | None:
        """The job ``id`` (``None``: none) dropped: its work left undone, its files removed; one queued or running is
        ``cancelled`` (and so answered until the server stops), another forgotten."""
        job = self.jobs.get(id)
        if job is None:
            return None
        if job.status in LIVE:
            job.status = "cancelled"
        else:
            del self.jobs[id]
        if job.task is not None and not job.task.done():
            job.task.cancel()
            await asyncio.wait([job.task])
        await _finished(lambda: shutil.rmtree(self.lock() / id, ignore_errors=True))
        return job

    async def _run(self, job: DocumentJob) -> None:
        """Translate ``job``'s document, the chunks already done skipped, when its turn comes; its status saved."""
        assert self.turn is not None
        assert self.translate_for is not None
        try:
            async with self.turn:
                job.status = "running"
                await _finished(lambda: self._save(job))
                upload = self.lock() / job.id / f"upload{job.suffix}"
                document = await _finished(lambda: formats()[job.format].read(upload))
                translations = await _finished(lambda: self._translated(job, rewrite=True))
                job.done, job.began = len(translations), (time.monotonic(), len(translations))
                await self._chunks(job, document, translations, self.translate_for(job.source, job.target))
                written = functools.partial(_write, document, translations)
                await _finished(lambda: atomic_write(self.result(job), written))
                job.status = "done"
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the job's failure, its status says
            job.status, job.error = "failed", str(getattr(error, "message", None) or error or type(error).__name__)
        await _finished(lambda: self._save(job))

    async def _chunks(
        self, job: DocumentJob, document: Document, translations: list[str], translate: AsyncTranslate
    ) -> None:
        """The units of ``document`` past ``translations`` translated a chunk at a time, each chunk's translations
        saved and added to ``translations``."""
        units = document.units
        while len(translations) < len(units):
            start = len(translations)
            end = chunk_end(units, start)
            found = await translate_units(_Part(units[start:end], document.markup), translate)
            line = json.dumps({"start": start, "translations": found}, ensure_ascii=False) + "\n"
            await _finished(functools.partial(self._append, job, line))
            translations += found
            job.done = len(translations)

    def _save(self, job: DocumentJob) -> None:
        if job.status != "cancelled":
            atomic_write_text(self.lock() / job.id / META, json.dumps(job.saved()))

    def _append(self, job: DocumentJob, line: str) -> None:
        with open(self.lock() / job.id / CHUNKS, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())

    def _translated(self, job: DocumentJob, *, rewrite: bool) -> list[str]:
        """The translations of the units of ``job``'s chunks done, in order; with ``rewrite``, the file rewritten
        without what follows the first line cut short (a kill while it was appended)."""
        path = self.lock() / job.id / CHUNKS
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True) if path.exists() else []
        translations: list[str] = []
        for count, line in enumerate(lines):
            try:
                entry = json.loads(line) if line.endswith("\n") else None
            except ValueError:
                entry = None
            if not isinstance(entry, dict) or entry.get("start") != len(translations):
                if rewrite:
                    atomic_write_text(path, "".join(lines[:count]))
                break
            translations += entry["translations"]
        return translations


def _write(document: Document, translations: list[str], path: str) -> None:
    document.write(translations, Path(path))


def chunk_end(units: Sequence[str], start: int) -> int:
    """Where the chunk of ``units`` that begins at ``start`` ends: :data:`CHUNK_UNITS` units, fewer where they would
    hold over :data:`CHUNK_CHARS` characters (always one at least)."""
    end, size = start, 0
    while end < len(units) and end - start < CHUNK_UNITS and (end == start or size + len(units[end]) <= CHUNK_CHARS):
        size += len(units[end])
        end += 1
    return end


async def _finished(call: Callable[[], T]) -> T:
    """``call()`` on a thread; a task cancelled meanwhile waits for it to end (no file is written after a job is
    dropped)."""
    running = asyncio.ensure_future(asyncio.to_thread(call))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await asyncio.wait([running])
        raise


def safe_name(name: str) -> str:
    """An uploaded file's name as its translation's: its last part, letters, digits, ``.-_`` and spaces kept."""
    kept = re.sub(r"[^\w. -]", "_", name.replace("\\", "/").rsplit("/", 1)[-1]).strip(" .")
    return kept or "document"


def file_extensions() -> list[str]:
    """The extensions of the files ``/translate_file`` and ``/documents`` take (``supportedFilesFormat``)."""
    return [".txt", *(extension for found in formats().values() for extension in found.extensions)]
