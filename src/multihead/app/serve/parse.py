"""What an HTTP request asks, read on the event loop: its parameters (LibreTranslate's ``request.values``: the query
string's under the body's, JSON or a form), checked in LibreTranslate's order and with its messages, into one typed
request (:class:`TranslateRequest`, :class:`AttentionRequest`); and a request's texts as the lines the worker
translates (:class:`Lines`)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from starlette.exceptions import HTTPException
from starlette.requests import Request

from multihead.app.detect import Detected
from multihead.app.glossary import Glossary, Term
from multihead.app.keep import keep_pattern
from multihead.app.segment import not_text
from multihead.app.serve.limits import ApiError, Limits
from multihead.app.translate import Translated

BODY_LIMIT = 1 << 20
"""The largest request body accepted (bytes): LibreTranslate's clients send text, not files."""


@dataclass(frozen=True)
class TranslateRequest:
    """``/translate``'s: its texts (``many``: ``q`` was a list), ``source`` (``"auto"``: each text's detected) and
    ``target`` as sent, whether the texts are HTML, how many alternatives, whether they are split into sentences
    (``None``: as the server does), its own glossary's terms and the regular expressions whose matches it keeps as
    they are (beyond LibreTranslate's fields)."""

    texts: list[str]
    many: bool
    source: str
    target: str
    html: bool
    alternatives: int
    split: bool | None
    glossary: tuple[Term, ...] = ()
    keep: tuple[re.Pattern[str], ...] = ()


@dataclass(frozen=True)
class AttentionRequest:
    """``/attention``'s: the first line of ``q`` that holds text, and the pair asked (``None``: the default's)."""

    sentence: str
    source: str | None
    target: str | None


async def arguments(request: Request) -> dict[str, Any]:
    """The request's parameters, as LibreTranslate's ``request.values``: its query string's, under its body's."""
    return {**_fields(request.scope.get("query_string", b""), "query string"), **await _body_arguments(request)}


def translate_request(arguments: dict[str, Any], limits: Limits) -> TranslateRequest:
    """``/translate``'s parameters checked, in LibreTranslate's order."""
    q = arguments.get("q")
    _require_q(q)
    source, target = text_argument(arguments, "source"), text_argument(arguments, "target")
    if source is None or target is None:
        raise ApiError(400, f"Invalid request: missing {'source' if source is None else 'target'} parameter")
    alternatives = _alternatives(arguments, limits)
    texts = checked_texts(q, limits)
    text_format = text_argument(arguments, "format") or "text"
    if text_format not in ("text", "html"):
        raise ApiError(400, f"{text_format} format is not supported")
    split = _flag_argument(arguments, "split")
    glossary, keep = _glossary_argument(arguments), _keep_argument(arguments)
    return TranslateRequest(texts, isinstance(q, list), source, target, text_format == "html", alternatives, split,
                            glossary, keep)  # fmt: skip


def attention_request(arguments: dict[str, Any], limits: Limits) -> AttentionRequest:
    """``/attention``'s parameters checked."""
    (text,) = checked_texts(text_argument(arguments, "q"), limits)
    sentence = next((line for line in text.splitlines() if line.strip()), None)
    if sentence is None:
        raise ApiError(400, "Invalid request: q holds no text")
    return AttentionRequest(sentence, text_argument(arguments, "source"), text_argument(arguments, "target"))


def checked_texts(q: Any, limits: Limits) -> list[str]:
    """``q`` as a list of texts, checked against the limits."""
    _require_q(q)
    texts = q if isinstance(q, list) else [q]
    if not all(isinstance(text, str) for text in texts):
        raise ApiError(400, "Invalid request: q parameter must be a string or a list of strings")
    if isinstance(q, list) and limits.batch_limit != -1 and len(q) > limits.batch_limit:
        raise ApiError(400, f"Invalid request: request ({len(q)}) exceeds text limit ({limits.batch_limit})")
    for number, text in enumerate(texts, start=1):
        if limits.char_limit != -1 and len(text) > limits.char_limit:
            raise ApiError(400, f"Invalid request: request ({len(text)}) exceeds text limit ({limits.char_limit})")
        if (problem := not_text(text)) is not None:
            where = f"text {number} of q" if isinstance(q, list) else "q"
            raise ApiError(400, f"Invalid request: {where} holds {problem}")
    return texts


def text_argument(arguments: dict[str, Any], name: str) -> str | None:
    value = arguments.get(name)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"Invalid request: {name} parameter must be a string")
    if value and (problem := not_text(value)) is not None:
        raise ApiError(400, f"Invalid request: {name} holds {problem}")
    return value or None


def _require_q(q: Any) -> None:
    if q is None or q == "" or q == []:
        raise ApiError(400, "Invalid request: missing q parameter")


def _flag_argument(arguments: dict[str, Any], name: str) -> bool | None:
    """A yes/no parameter: JSON's ``true``/``false``, or a form's ``true``/``false``/``1``/``0``; ``None`` when
    absent."""
    value = arguments.get(name)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise ApiError(400, f"Invalid request: {name} parameter must be true or false, received {value!r}")


def _listed(arguments: dict[str, Any], name: str, wanted: str) -> list[Any]:
    """The list a request gives as ``name`` (in a form, that list as JSON; none: empty), refused where it is not
    one as ``wanted`` (what the message says it must be)."""
    value = arguments.get(name)
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if not isinstance(value, list):
        raise ApiError(400, f"Invalid request: {name} must be {wanted}")
    return value


def _glossary_argument(arguments: dict[str, Any]) -> tuple[Term, ...]:
    """A request's own glossary: a list of ``[source, target]`` pairs of terms (in a form, that list as JSON)."""
    value = _listed(arguments, "glossary", "a list of [source, target] pairs of terms")
    terms = []
    for index, entry in enumerate(value):
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(t, str) and t.strip() for t in entry)):
            raise ApiError(400, f"Invalid request: glossary entry {index} must be [source, target], two terms, "
                                f"received {json.dumps(entry, ensure_ascii=False)[:80]}")  # fmt: skip
        for side, term in zip(("source", "target"), entry, strict=True):
            if (problem := not_text(term)) is not None:
                raise ApiError(400, f"Invalid request: glossary entry {index}'s {side} holds {problem}")
        terms.append(Term(entry[0].strip(), entry[1].strip()))
    return tuple(terms)


def _keep_argument(arguments: dict[str, Any]) -> tuple[re.Pattern[str], ...]:
    """The regular expressions whose matches a request keeps as they are: a list of strings (in a form, that list as
    JSON), each refused where it is not one or matches an empty text."""
    value = _listed(arguments, "keep", "a list of regular expressions")
    patterns = []
    for index, entry in enumerate(value):
        if not isinstance(entry, str):
            raise ApiError(400, f"Invalid request: keep entry {index} must be a regular expression, received "
                                f"{json.dumps(entry, ensure_ascii=False)[:80]}")  # fmt: skip
        if (problem := not_text(entry)) is not None:
            raise ApiError(400, f"Invalid request: keep entry {index} holds {problem}")
        try:
            patterns.append(keep_pattern(entry))
        except ValueError as error:
            raise ApiError(400, f"Invalid request: keep entry {index}: {error}") from None
    return tuple(patterns)


def _alternatives(arguments: dict[str, Any], limits: Limits) -> int:
    """The ``alternatives`` asked: a JSON integer, or a form's string of one (``true``, ``1.5``: not a number)."""
    count = arguments.get("alternatives", 0)
    if isinstance(count, str):
        with contextlib.suppress(ValueError):
            count = int(count)
    if isinstance(count, bool) or not isinstance(count, int):
        raise ApiError(400, "Invalid request: alternatives parameter is not a number")
    if count < 0:
        raise ApiError(400, "Invalid request: alternatives parameter must be >= 0")
    if limits.alternatives_limit != -1 and count > limits.alternatives_limit:
        raise ApiError(400, f"Invalid request: alternatives parameter must be <= {limits.alternatives_limit}")
    return count


def _fields(encoded: bytes, what: str) -> dict[str, str]:
    """The fields of URL-encoded ``encoded`` (a form, or a query string), the first of a name repeated."""
    try:
        fields = parse_qs(encoded.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        raise ApiError(400, f"Invalid request: the {what} is not UTF-8") from None
    return {key: values[0] for key, values in fields.items()}


async def _body_arguments(request: Request) -> dict[str, Any]:
    """The request body's parameters: its JSON object, or its form fields; refused when too large or malformed."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > BODY_LIMIT:
        raise ApiError(413, f"Request body too large: {length} bytes, at most {BODY_LIMIT}")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > BODY_LIMIT:
            raise ApiError(413, f"Request body too large: more than {BODY_LIMIT} bytes")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json":
        try:
            arguments = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "Invalid JSON format") from None
        if not isinstance(arguments, dict):
            raise ApiError(400, "Invalid JSON format")
        return arguments
    if kind == "multipart/form-data":

        async def replay() -> dict[str, Any]:  # the body already read, for Starlette to parse the form from
            return {"type": "http.request", "body": body, "more_body": False}

        form = await Request(request.scope, replay).form()
        return {key: value for key, value in form.items() if isinstance(value, str)}
    return _fields(body, "form")


FILE_LIMIT = 20 << 20
"""The most bytes a ``/translate_file`` request's body may hold (its file and fields)."""


@dataclass(frozen=True)
class FileRequest:
    """``/translate_file``'s: the uploaded file's ``name`` and ``data``, its ``source`` and ``target`` languages as
    sent, and the request's other fields (``api_key``)."""

    name: str
    data: bytes
    source: str
    target: str
    fields: dict[str, str]


async def file_request(request: Request) -> FileRequest:
    """``/translate_file``'s multipart form (``file``, ``source``, ``target``, ``api_key``) checked, as LibreTranslate
    refuses it: a file missing or empty, a body over :data:`FILE_LIMIT` bytes, a language missing."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > FILE_LIMIT:
        raise ApiError(413, f"Request body too large: {length} bytes, at most {FILE_LIMIT}")
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "multipart/form-data":
        raise ApiError(400, "Invalid request: missing file parameter")
    try:
        form = await request.form(max_files=1)
    except (ValueError, HTTPException) as error:  # a malformed body, or more than one file
        raise ApiError(400, f"Invalid request: {getattr(error, 'detail', error)}") from None
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise ApiError(400, "Invalid request: missing file parameter")
    data = await upload.read(FILE_LIMIT + 1)
    if len(data) > FILE_LIMIT:
        raise ApiError(413, f"Request body too large: more than {FILE_LIMIT} bytes")
    if not upload.filename or not data:
        raise ApiError(400, "Invalid request: empty file")
    fields = {key: value for key, value in form.items() if isinstance(value, str)}
    source, target = fields.get("source"), fields.get("target")
    if not source or not target:
        raise ApiError(400, f"Invalid request: missing {'source' if not source else 'target'} parameter")
    return FileRequest(upload.filename, data, source, target, fields)


@dataclass(frozen=True)
class Lines:
    """Texts as their lines, all in one list (``flat``): a text is translated line by line, as ``translate``
    translates a file's lines, and a blank text stays as it came."""

    texts: Sequence[str]
    lines: list[list[str]]

    @classmethod
    def of(cls, texts: Sequence[str]) -> Lines:
        return cls(texts, [text.replace("\r\n", "\n").replace("\r", "\n").split("\n") for text in texts])

    @property
    def flat(self) -> list[str]:
        return [line for text_lines in self.lines for line in text_lines]

    def joined(self, translated: Sequence[str]) -> list[str]:
        """Each text's translation from its lines' ``translated`` (all of them, in order)."""
        each = iter(translated)
        joined = ["\n".join(next(each) for _ in text_lines) for text_lines in self.lines]
        return [text if not text.strip() else out for text, out in zip(self.texts, joined, strict=True)]

    def doubts(self, translated: Translated) -> list[list[str]]:
        """Each text's sentences whose translation the guard doubts, from its lines' ``translated``."""
        each = iter(translated.doubtful)
        return [[sentence for _ in text_lines for sentence, _ in next(each)] for text_lines in self.lines]


def applied(glossaries: Sequence[Glossary | None], texts: list[str]) -> list[list[list[str]]] | None:
    """``/translate``'s entries of its glossary each text holds (``glossaries[i]``: the server's and the request's,
    :meth:`~multihead.app.serve.http.Handlers._glossary`), ``[source, target]`` each (``None``: no text has one)."""
    if all(glossary is None for glossary in glossaries):
        return None
    return [[[term.source, term.target] for term in glossary.found(text)] if glossary else []
            for glossary, text in zip(glossaries, texts, strict=True)]  # fmt: skip


def answer(
    translated: list[str],
    *,
    detected: list[Detected] | None,
    alternatives: Any,
    doubtful: list[list[str]],
    glossary: list[list[list[str]]] | None = None,
) -> dict[str, list[Any]]:
    """``/translate``'s answer, each field a list of each text's: ``translatedText``, and where there are any
    ``detectedLanguage``, ``alternatives`` (each text's list), ``doubtful`` (each text's sentences the guard
    doubts, each once: an HTML text's pieces may translate one more than once) and ``glossary`` (the entries of the
    server's and the request's glossaries each text holds, ``[source, target]`` each)."""
    fields: dict[str, list[Any]] = {"translatedText": translated}
    if glossary is not None:
        fields["glossary"] = glossary
    if detected:
        fields["detectedLanguage"] = [found.as_json() for found in detected]
    if alternatives:
        fields["alternatives"] = alternatives
    if any(doubtful):
        fields["doubtful"] = [list(dict.fromkeys(sentences)) for sentences in doubtful]
    return fields
