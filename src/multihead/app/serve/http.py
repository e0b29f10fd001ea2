"""The HTTP side, on the event loop: LibreTranslate's endpoints, field for field and error for error (its clients
work unchanged): ``POST /translate``, ``POST /translate_file`` and ``GET /download_file/<name>``, ``GET /languages``,
``POST /detect``, ``GET /health``, ``GET /frontend/settings``;
ours: ``GET /`` (the page, self-contained) and ``POST /attention`` (one sentence's cross-attention, as the page draws
it).

A handler reads its request into a typed one (:mod:`multihead.app.serve.parse`), finds its route
(:mod:`multihead.app.serve.routing`) and gives the worker typed jobs (:mod:`multihead.app.serve.jobs`), awaiting their
answers; the event loop never computes a translation. Every error is mapped here, at the edge: each a user can cause
is ``{"error": "..."}`` with a 4xx status, as LibreTranslate words it; a 500 would be a bug of ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, overload

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Route as Endpoint

from multihead.app.console import UserError
from multihead.app.documents import AsyncTranslate, Document, Format, document_format, formats, translate_units
from multihead.app.glossary import Glossary
from multihead.app.languages import language_name
from multihead.app.markup import translate_html, visible_text
from multihead.app.serve.document_jobs import DocumentJob, DocumentJobs, file_extensions, safe_name
from multihead.app.serve.jobs import Attend, Hypotheses, Translate, Work
from multihead.app.serve.limits import Access, ApiError, Limits
from multihead.app.serve.metrics import PAIR, Metrics
from multihead.app.serve.parse import (
    FileRequest,
    Lines,
    TranslateRequest,
    answer,
    applied,
    arguments,
    attention_request,
    checked_texts,
    file_request,
    translate_request,
)
from multihead.app.serve.routing import Leg, Route, Unserved
from multihead.app.serve.service import Service
from multihead.app.translate import Translated, Translation
from multihead.app.view import attention_view, page
from multihead.files import atomic_write


class Handlers:
    """The HTTP endpoints of ``service`` under ``limits``: each a Starlette handler."""

    def __init__(self, service: Service, limits: Limits, jobs: DocumentJobs | None = None) -> None:
        self.service, self.routes, self.limits = service, service.routes, limits
        self.access = Access(limits)
        self.page = page()
        self.files: Path | None = None  # where translated files wait for their download (made at the first)
        self.jobs = jobs or DocumentJobs()

    async def _arguments(self, request: Request) -> dict[str, Any]:
        """The request's parameters, its access checked."""
        found = await arguments(request)
        self.access.check(found.get("api_key"), request.client.host if request.client else "")
        return found

    async def translate(self, request: Request) -> JSONResponse:
        asked = translate_request(await self._arguments(request), self.limits)
        texts = asked.texts
        shown = [visible_text(text) for text in texts] if asked.html else texts  # what detection reads
        target, detected, sources = self.routes.sources(shown, asked.source, asked.target)
        setattr(request.state, PAIR, (asked.source, target))
        routes = {code: self.routes.route(code, target) for code in dict.fromkeys(sources)}
        pivoted = [route for route in routes.values() if route.pivot is not None]
        if asked.glossary and pivoted:
            pair = pivoted[0].legs[0].pair[0], pivoted[-1].legs[-1].pair[1]
            raise ApiError(400, f"Invalid request: a glossary needs a pair a run serves directly, and {pair[0]} -> "
                                f"{pair[1]} goes through {pivoted[0].pivot}")  # fmt: skip
        glossaries = {code: self._glossary(route, asked) for code, route in routes.items()}
        # A text already in the target language (source "auto") is kept as it is; the others go by their sources.
        kept = [found.language == target for found in detected] if detected else [False] * len(texts)
        groups: dict[str, list[int]] = {}
        for index, (code, keep) in enumerate(zip(sources, kept, strict=True)):
            if not keep:
                groups.setdefault(code, []).append(index)
        doubtful: list[list[str]] = [[] for _ in texts]  # each text's sentences whose translation the guard doubts
        others: list[list[str]] = [[] for _ in texts]  # alternatives: none for HTML, as LibreTranslate
        translated = list(texts)
        if asked.html or asked.alternatives:  # a text at a time
            for code, indices in groups.items():
                for index in indices:
                    if asked.html:
                        through = self._through(routes[code], request, asked, doubtful, [index], glossaries[code])
                        translated[index] = await translate_html(texts[index], through)
                    else:
                        found = await self._best(routes[code], texts[index], asked, request, glossaries[code])
                        translated[index] = found[0]
                        others[index] = [other for other in dict.fromkeys(found[1:]) if other != found[0]]
        else:
            done = await asyncio.gather(*(
                self._through(routes[code], request, asked, doubtful, indices, glossaries[code])(
                    [texts[i] for i in indices]
                )
                for code, indices in groups.items()
            ))  # fmt: skip
            for indices, outputs in zip(groups.values(), done, strict=True):
                for index, output in zip(indices, outputs, strict=True):
                    translated[index] = output
        used = [None if keep else glossaries[code] for code, keep in zip(sources, kept, strict=True)]
        found_terms = applied(used, shown)
        fields = answer(translated, detected=detected, alternatives=asked.alternatives and others, doubtful=doubtful,
                        glossary=found_terms)  # fmt: skip
        return JSONResponse(fields if asked.many else {name: value[0] for name, value in fields.items()})

    def _glossary(self, route: Route, asked: TranslateRequest) -> Glossary | None:
        """What the texts ``asked`` sends along ``route`` use: the server's glossary of its pair joined by the
        request's own (:meth:`Service.glossary <multihead.app.serve.service.Service.glossary>`); none through a pivot
        language (the handler refuses a request's own glossary there)."""
        return None if route.pivot is not None else self.service.glossary(route.legs[0].pair, asked.glossary)

    def _through(
        self,
        route: Route,
        request: Request | None,
        asked: TranslateRequest,
        doubtful: list[list[str]],
        into: Sequence[int],
        glossary: Glossary | None,
    ) -> Callable[[list[str]], Awaitable[list[str]]]:
        """What translates a request's texts along ``route``, line by line, split into sentences as ``asked`` says and
        using ``glossary`` (:meth:`_glossary`), adding the source sentences the guard doubts in its ``i``-th text to
        ``doubtful[into[i]]`` (an HTML text's pieces, all of them to ``doubtful[into[0]]``)."""

        async def translate(texts: list[str]) -> list[str]:
            lines = Lines.of(texts)

            async def leg(on: Leg, flat: list[str]) -> list[str]:
                done = await self._ask(Translate(on, flat, asked.split, glossary, asked.keep), request)
                for index, found in enumerate(lines.doubts(done)):
                    doubtful[into[min(index, len(into) - 1)]] += found
                return done.texts

            return lines.joined(await route.through(lines.flat, leg, leg))

        return translate

    async def _best(
        self, route: Route, text: str, asked: TranslateRequest, request: Request, glossary: Glossary | None
    ) -> list[str]:
        """The best translations of ``text`` along ``route`` (one more than ``asked``'s alternatives, using
        ``glossary``: :meth:`_glossary`), line by line (the ``i``-th best of each line, joined; a blank line: itself):
        each line's beam search is a job of its own on the worker, so that the requests being streamed take their
        steps between them."""

        async def leg(on: Leg, texts: list[str]) -> list[str]:
            return (await self._ask(Translate(on, texts, keep=asked.keep), request)).texts

        count = asked.alternatives + 1

        async def best(on: Leg, texts: list[str]) -> list[list[str]]:
            return await self._ask(Hypotheses(on, texts, count, glossary, asked.keep), request)

        found = []
        for line in Lines.of([text]).lines[0]:
            found += [[line]] if not line.strip() else await route.through([line], leg, best)
        return ["\n".join(line[min(i, len(line) - 1)] for line in found) for i in range(count)]

    @overload
    async def _ask(self, job: Translate, request: Request | None) -> Translated: ...
    @overload
    async def _ask(self, job: Hypotheses, request: Request) -> list[list[str]]: ...
    @overload
    async def _ask(self, job: Attend, request: Request) -> Translation: ...

    async def _ask(self, job: Work, request: Request | None) -> object:
        """``job``'s answer from the worker; an :class:`ApiError` when ``request``'s client leaves first (499) or the
        time limit passes first (503), and then the worker drops the job (``request`` ``None``: a document job's, no
        client and no limit: it goes on until done or deleted)."""
        self.service.worker.submit(job)
        future: Future[Any] = job.answer
        answer, timeout = asyncio.wrap_future(future), self.limits.timeout if request else -1
        left = asyncio.ensure_future(_client_left(request) if request else asyncio.Event().wait())
        try:
            done, _ = await asyncio.wait(
                [answer, left], timeout=None if timeout < 0 else timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:  # also when this request's task is cancelled (the server stopping)
            left.cancel()
            future.cancel()  # nobody waits for it now: the worker drops it (done already: no effect)
        if answer in done:
            return answer.result()
        if done:
            raise ApiError(499, "Client closed request")  # nobody reads it
        raise ApiError(503, f"Translation took longer than this server allows ({timeout:g} seconds): try shorter texts")

    async def attention(self, request: Request) -> JSONResponse:
        asked = attention_request(await self._arguments(request), self.limits)
        routes = self.routes
        source, target = routes.code(asked.source or routes.source), routes.code(asked.target or routes.target)
        route = routes.route(source, target)
        if route.pivot is not None:
            raise ApiError(400, f"{language_name(source)} ({source}) to {language_name(target)} ({target}) goes "
                           f"through {language_name(route.pivot)}: no one model's attention")  # fmt: skip
        return JSONResponse(attention_view(await self._ask(Attend(route.legs[0], asked.sentence), request)))

    async def detect(self, request: Request) -> JSONResponse:
        q = (await self._arguments(request)).get("q")
        texts = checked_texts(q, self.limits)
        found = [[each.as_json() for each in self.routes.identifier.detect(text)] for text in texts]
        return JSONResponse(found if isinstance(q, list) else found[0])  # a list of texts: each text's candidates

    async def languages(self, request: Request) -> JSONResponse:
        return JSONResponse(self.routes.languages())

    async def health(self, request: Request) -> JSONResponse:
        """``{"status": "ok"}`` (LibreTranslate's answer) while the worker makes progress, with the runs held where it
        serves several and under ``--memory`` what they cost (:meth:`Engines.held
        <multihead.app.serve.engines.Engines.held>`); 503 with how long it has been on one step or job once that is
        over :data:`~multihead.app.serve.worker.STALLED_AFTER` seconds."""
        stalled = self.service.worker.stalled()
        if stalled is None:
            return JSONResponse({"status": "ok", **self.service.engines.held()})
        message = f"the translation worker has been on one step for {stalled:.0f} seconds"
        return JSONResponse({"status": "stalled", "error": message}, status_code=503)

    async def settings(self, request: Request) -> JSONResponse:
        keys, routes = self.limits.api_keys is not None, self.routes
        return JSONResponse(
            {
                "charLimit": self.limits.char_limit, "frontendTimeout": 500, "apiKeys": keys, "keyRequired": keys,
                "suggestions": False, "filesTranslation": True, "supportedFilesFormat": file_extensions(),
                "language": {
                    "source": {"code": routes.source, "name": language_name(routes.source)},
                    "target": {"code": routes.target, "name": language_name(routes.target)},
                },
            }
        )  # fmt: skip

    async def translate_file(self, request: Request) -> JSONResponse:
        """LibreTranslate's ``/translate_file``: a document uploaded (``file``, its format from its name's extension),
        translated whole through the same engine as ``/translate`` (:mod:`multihead.app.documents`), and where to
        download the translation (``translatedFileUrl``, a file of the same name and format)."""
        asked, document, _, route = await self._upload(request)
        translations = await translate_units(document, self.document_path(route, request))
        name = f"{secrets.token_hex(8)}-{safe_name(asked.name)}"
        folder = self._folder()
        await asyncio.to_thread(atomic_write, folder / name, lambda path: document.write(translations, Path(path)))
        return JSONResponse({"translatedFileUrl": f"{str(request.base_url).rstrip('/')}/download_file/{name}"})

    async def _upload(self, request: Request) -> tuple[FileRequest, Document, Format, Route]:
        """The document a ``/translate_file`` or ``/documents`` request uploads, read in its format, and its route
        (refused as LibreTranslate refuses a file: its size, its text past ``--char-limit``, the API key)."""
        asked = await file_request(request)
        self.access.check(asked.fields.get("api_key"), request.client.host if request.client else "")
        document, found = await self._document(asked)
        shown = "\n".join(visible_text(unit) if document.markup else unit for unit in document.units)
        if not shown.strip():
            raise ApiError(400, f"Invalid request: {asked.name!r} holds no text to translate")
        checked_texts(shown, self.limits)
        target, _, sources = self.routes.sources([shown], asked.source, asked.target)
        return asked, document, found, self.routes.route(sources[0], target)

    def document_path(self, route: Route, request: Request | None) -> AsyncTranslate:
        """What translates a document's texts along ``route``, as ``/translate`` translates a request's, with the
        server's glossary and kept spans (``request``: ``None`` for a job, which no client waits for)."""
        wanted = TranslateRequest([], False, "", "", False, 0, None)
        return self._through(route, request, wanted, [[]], [0], self._glossary(route, wanted))

    async def create_document(self, request: Request) -> JSONResponse:
        """``POST /documents``: a document uploaded as for ``/translate_file``, queued as a job (202)."""
        asked, document, found, route = await self._upload(request)
        source, target = route.legs[0].pair[0], route.legs[-1].pair[1]
        job = await self.jobs.create(asked.name, asked.data, found, source, target, len(document.units))
        return JSONResponse({"id": job.id, "status": job.status}, status_code=202)

    def _job(self, request: Request) -> DocumentJob:
        job = self.jobs.jobs.get(request.path_params["id"])
        if job is None:
            raise ApiError(404, "Invalid request: no such document job (jobs last until deleted)")
        return job

    async def document(self, request: Request) -> JSONResponse:
        """``GET /documents/<id>``: the job's status and progress."""
        return JSONResponse(self._job(request).shown())

    async def document_result(self, request: Request) -> Response:
        """``GET /documents/<id>/result``: the translated file once the job is done (409 before)."""
        job = self._job(request)
        if job.status != "done":
            raise ApiError(409, f"Invalid request: the document is not translated ({job.status})")
        return FileResponse(self.jobs.result(job), filename=job.file)

    async def cancel_document(self, request: Request) -> JSONResponse:
        """``DELETE /documents/<id>``: the job cancelled, its files removed."""
        job = await self.jobs.cancel(self._job(request).id)
        assert job is not None
        return JSONResponse({"id": job.id, "status": job.status})

    async def _document(self, asked: FileRequest) -> tuple[Document, Format]:
        """The document ``asked`` uploads, read in the format its name says, and that format (refused: one it has none
        of, or a file its format cannot read, a 400 naming it)."""
        found = document_format(asked.name) or (formats()["text"] if asked.name.lower().endswith(".txt") else None)
        if found is None:
            raise ApiError(400, f"Invalid request: file format not supported ({asked.name!r}; one of "
                                f"{', '.join(file_extensions())})")  # fmt: skip
        folder = self._folder()
        upload = folder / f".{secrets.token_hex(8)}{Path(asked.name).suffix.lower()}"
        upload.write_bytes(asked.data)
        try:
            return await asyncio.to_thread(found.read, upload), found
        except UserError as error:
            said = str(error).replace(repr(str(upload)), repr(asked.name)).removeprefix("--input ")
            raise ApiError(400, f"Invalid request: {said}") from None
        finally:
            upload.unlink(missing_ok=True)

    def _folder(self) -> Path:
        """Where translated files wait for their download: a directory of this server's, removed when it stops."""
        if self.files is None:
            self.files = Path(tempfile.mkdtemp(prefix="multihead-files-"))
        return self.files

    async def download_file(self, request: Request) -> Response:
        """LibreTranslate's ``/download_file/<name>``: a translated file, under the name it was uploaded with."""
        name = request.path_params["name"]
        path = None if self.files is None or name.startswith(".") else self.files / name
        if path is None or not path.is_file():
            raise ApiError(404, "Invalid request: file not found (translated files last until the server stops)")
        return FileResponse(path, filename=name.split("-", 1)[-1])

    async def favicon(self, request: Request) -> Response:
        """No icon (204): a browser's request for one is answered without an error in the log."""
        return Response(status_code=204)

    async def index(self, request: Request) -> HTMLResponse:
        return HTMLResponse(self.page)


async def refused(request: Request, error: Exception) -> JSONResponse:
    """Every error, as LibreTranslate answers it: ``{"error": ...}`` with its status."""
    if isinstance(error, ApiError):
        return JSONResponse({"error": error.message}, status_code=error.status)
    if isinstance(error, HTTPException):
        return JSONResponse({"error": str(error.detail)}, status_code=error.status_code)
    if isinstance(error, (Unserved, UserError)):  # a pair no route serves; the translator's own refusal
        return JSONResponse({"error": str(error)}, status_code=400)
    return JSONResponse({"error": f"Internal error: {type(error).__name__}"}, status_code=500)


async def _client_left(request: Request) -> None:
    """Returns when ``request``'s client disconnects (its body already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(service: Service, limits: Limits, jobs: DocumentJobs | None = None) -> Starlette:
    """The Starlette application of ``service`` under ``limits``, its document jobs kept by ``jobs`` (``None``: in a
    temporary directory, removed when it stops)."""
    handlers, metrics = Handlers(service, limits, jobs), Metrics(service)
    endpoints = [
        Endpoint("/", handlers.index, methods=["GET"]),
        Endpoint("/translate", handlers.translate, methods=["POST"]),
        Endpoint("/attention", handlers.attention, methods=["POST"]),
        Endpoint("/detect", handlers.detect, methods=["POST"]),
        Endpoint("/translate_file", handlers.translate_file, methods=["POST"]),
        Endpoint("/download_file/{name}", handlers.download_file, methods=["GET"]),
        Endpoint("/documents", handlers.create_document, methods=["POST"]),
        Endpoint("/documents/{id}", handlers.document, methods=["GET"]),
        Endpoint("/documents/{id}", handlers.cancel_document, methods=["DELETE"]),
        Endpoint("/documents/{id}/result", handlers.document_result, methods=["GET"]),
        Endpoint("/favicon.ico", handlers.favicon, methods=["GET"]),
        Endpoint("/languages", handlers.languages, methods=["GET", "POST"]),
        Endpoint("/health", handlers.health, methods=["GET"]),
        Endpoint("/metrics", metrics.endpoint, methods=["GET"]),
        Endpoint("/frontend/settings", handlers.settings, methods=["GET"]),
    ]
    errors = {error: refused for error in (ApiError, HTTPException, Unserved, UserError, Exception)}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        handlers.jobs.start(lambda source, target: handlers.document_path(handlers.routes.route(source, target), None))
        yield
        await handlers.jobs.stop()  # the jobs' state kept: a server on the same --jobs resumes them
        await asyncio.to_thread(service.worker.close)  # after the last request: what was queued is answered
        if handlers.files is not None:
            shutil.rmtree(handlers.files, ignore_errors=True)

    return Starlette(
        routes=endpoints, exception_handlers=errors, lifespan=lifespan, middleware=[Middleware(metrics.measured)]
    )
