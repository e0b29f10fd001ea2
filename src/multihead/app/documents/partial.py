"""A document's translation as far as it has gone, kept beside its output so that an interrupted one goes on
(``translate --input FILE --output OUT --resume``).

The file ``.OUT.partial`` (hidden, in ``OUT``'s directory) holds, after a first line naming what it is the translation
of (the input's SHA-256 and the translator), a JSON line ``[source, translation]`` for each text translated, written
and flushed to disk a part at a time as they are done. A resumed translation answers the texts it holds from it and
translates only the others; once the document is written whole, the file goes. A last line cut short by a crash is
left out (its text is translated again).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from multihead.app.console import UserError
from multihead.app.documents.base import Translate

PART = 100
"""Texts translated, then made durable, at a time."""


class Partial:
    """The partial translation of the document ``source`` into ``output`` by the translator ``made_by`` (what names
    it: its run, checkpoint and search), taken up where it was when ``resume`` (refused in one line where it is of
    another input or translator), else begun afresh."""

    def __init__(self, source: Path, output: Path, made_by: dict[str, Any], *, resume: bool) -> None:
        self.path = output.with_name(f".{output.name}.partial")
        self.key = {"input": hashlib.sha256(source.read_bytes()).hexdigest(), **made_by}
        self.done: dict[str, str] = {}
        if resume and self.path.exists():
            self._load()
        else:
            self.path.write_text(json.dumps(self.key, sort_keys=True) + "\n", encoding="utf-8")

    def _load(self) -> None:
        lines = self.path.read_text(encoding="utf-8").split("\n")
        try:
            key = json.loads(lines[0])
        except ValueError:
            key = None
        if key != json.loads(json.dumps(self.key)):
            raise UserError(f"--resume: {str(self.path)!r} is the partial translation of another input or by another "
                            "run or search; translate without --resume to begin again")  # fmt: skip
        for line in lines[1:]:
            try:
                source, translation = json.loads(line)
            except ValueError:  # the last line, cut short
                continue
            self.done[source] = translation

    def translated(self, texts: Sequence[str], translate: Translate, bar: Any) -> list[str]:
        """``texts`` translated: those done before answered as they were, the others by ``translate``, a part at a
        time, each part made durable here before the next (``bar`` counts them)."""
        missing = [text for text in dict.fromkeys(texts) if text not in self.done]
        bar.update(len(set(texts)) - len(missing))
        for start in range(0, len(missing), PART):
            part = missing[start : start + PART]
            found = translate(part)
            with self.path.open("a", encoding="utf-8") as out:
                out.write(
                    "".join(json.dumps([s, t], ensure_ascii=False) + "\n" for s, t in zip(part, found, strict=True))
                )
                out.flush()
                os.fsync(out.fileno())
            self.done.update(zip(part, found, strict=True))
            bar.update(len(part))
        return [self.done[text] for text in texts]

    def remove(self) -> None:
        """The translation is whole: its partial file goes."""
        self.path.unlink(missing_ok=True)
