"""Texts translated as they come, for ``serve``: requests' texts cut into the pieces the model reads (as
:meth:`Translator.translate` cuts them) and decoded by one :class:`multihead.torch.streaming.Stream` that sentences
join and leave at every decoding step (continuous batching, greedy or sampling)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from multihead.app.tokenizers import BOS, EOS
from multihead.app.translate import TRANSLATION, Ids, Translator
from multihead.decoding import SearchOptions
from multihead.torch.streaming import Stream


class StreamingTranslator:
    """Texts translated as they come (:class:`~multihead.torch.streaming.Stream`), as :meth:`Translator.translate`
    translates them: each request's translations are its future's result once all of its pieces have ended. A
    request's piece ``i`` is sampled with key ``i``, as ``translate`` samples that request's texts."""

    def __init__(self, translator: Translator, *, rows: int = 256, search: SearchOptions = TRANSLATION) -> None:
        self.translator = translator
        self.stream: Stream[tuple[_Job, int]] = Stream(
            translator.generator, rows=rows, search=search, bos_id=BOS, eos_id=EOS
        )

    def __len__(self) -> int:
        return len(self.stream)

    def add(
        self, texts: Sequence[str], future: Future, finish: Callable[[list[str]], Any] = lambda translated: translated
    ) -> None:
        """Queue ``texts``; ``finish(translations)`` becomes ``future``'s result in :meth:`step` (at once, when they
        hold no piece to translate)."""
        pieces, flat = self.translator.pieces(texts)
        job = _Job(pieces, [[] for _ in flat], len(flat), future, finish)
        if not flat:
            future.set_result(finish(self.translator.joined(pieces, [])))
        for index, ids in enumerate(flat):
            self.stream.add(ids, (job, index), limit=self.translator.limit(len(ids)), key=index)

    def step(self) -> None:
        for (job, index), tokens in self.stream.step():
            job.outputs[index] = tokens
            job.left -= 1
            if job.left == 0:
                job.future.set_result(job.finish(self.translator.joined(job.pieces, job.outputs)))

    def fail(self, error: BaseException) -> None:
        """Drop every text being translated, ``error`` their futures' exception."""
        for future in {id(job): job.future for job, _ in self.stream.clear()}.values():
            future.set_exception(error)


@dataclass
class _Job:
    """One request's texts: their pieces, the translations of those that have ended (empty until then), how many
    have not."""

    pieces: list[list[Ids]]
    outputs: list[Ids]
    left: int
    future: Future
    finish: Callable[[list[str]], Any]
