"""Which run translates what: the languages the runs serve, and the route of each pair (pure: no thread, no I/O).

A pair a run serves is one leg on that run (where two runs serve it, the one named first). A pair no run serves, but
two do through one language (:data:`PIVOT` where they can), is a :class:`Route` of two legs, each leg's translation
the next one's source, as Argos Translate's ``CompositeTranslation`` chains its two translations: texts,
alternatives and attention all go by the same route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from multihead.app.detect import Detected, LanguageIdentifier
from multihead.app.languages import LanguageTokens, closest_code, language_name
from multihead.app.translate import Described

PIVOT = "en"
"""The language a pair no run serves goes through first, where both legs are served (as Argos Translate does)."""

Pair = tuple[str, str]
"""A source and a target language, as clients name them."""
T = TypeVar("T")


class Unserved(Exception):
    """A language, or a pair, that no route serves: LibreTranslate's words for it."""


@dataclass(frozen=True)
class Leg:
    """One run's translation of one pair: ``run``, its index among the runs served."""

    run: int
    pair: Pair


@dataclass(frozen=True)
class Route:
    """How texts go from one language into another: one leg, or through a pivot language two."""

    legs: tuple[Leg, ...]

    @property
    def pivot(self) -> str | None:
        """The language between the legs, where there are two."""
        return self.legs[0].pair[1] if len(self.legs) > 1 else None

    async def through(
        self,
        texts: list[str],
        each: Callable[[Leg, list[str]], Awaitable[list[str]]],
        last: Callable[[Leg, list[str]], Awaitable[T]],
    ) -> T:
        """What ``last`` makes of ``texts`` on the route's last leg, the legs before it translating them in turn
        (``each``)."""
        for leg in self.legs[:-1]:
            texts = await each(leg, texts)
        return await last(self.legs[-1], texts)


class Routes:
    """The languages ``runs`` serve (each described, with its pair; the first run's pair, the default): a model that
    marks its languages with tokens serves every pair it has; a pair two runs serve goes to the one named first; a
    pair none serves goes through a language both legs share (:func:`pivots`)."""

    def __init__(self, runs: Sequence[tuple[Described, Sequence[str]]]) -> None:
        self.source, self.target = runs[0][1][0], runs[0][1][1]
        self.names = [run.name for run, _ in runs]
        """Each run's name: its directory's."""
        self.tokens = [run.language_tokens for run, _ in runs]
        """Each run's model's language tokens, where it marks its languages with them."""
        self.direct: dict[Pair, int] = {}
        """Each pair a run serves (the codes clients send) -> the first run named that serves it."""
        for index, (run, (source, target, *_)) in enumerate(runs):
            for code, targets in served_pairs(run.language_tokens, source, target).items():
                for other in targets:
                    if other != code:  # a multilingual OPUS-MT model's own source among its targets
                        self.direct.setdefault((code, other), index)
        codes = list(dict.fromkeys(code for pair in self.direct for code in pair))
        self.pivots = pivots(self.direct, codes)
        reachable = {*self.direct, *self.pivots}
        self.pairs = {
            source: [target for target in codes if (source, target) in reachable]
            for source in codes
            if any(pair[0] == source for pair in reachable)
        }
        """Each source language's targets, the first run's source first."""
        self.identifier = LanguageIdentifier(list(dict.fromkeys([self.source, *codes])))

    def targets(self) -> list[str]:
        return list(dict.fromkeys(code for targets in self.pairs.values() for code in targets))

    def code(self, requested: str) -> str:
        """The served code of the language ``requested`` (:func:`closest_code`: ``zh-TW`` is ``zh-Hant``)."""
        found = closest_code(requested, list(dict.fromkeys([*self.pairs, *self.targets()])))
        if found is None:
            raise Unserved(f"{requested} is not supported")
        return found

    def route(self, source: str, target: str) -> Route:
        """The route from ``source`` into ``target`` (served codes); refused as LibreTranslate refuses a pair it
        lacks."""
        if target not in self.pairs.get(source, []):
            raise Unserved(f"{language_name(target)} ({target}) is not available as a target language from "
                           f"{language_name(source)} ({source})")  # fmt: skip
        middle = self.pivots.get((source, target))
        pairs = [(source, target)] if middle is None else [(source, middle), (middle, target)]
        return Route(tuple(Leg(self.direct[pair], pair) for pair in pairs))

    def sources(self, texts: list[str], source: str, target: str) -> tuple[str, list[Detected] | None, list[str]]:
        """A request's ``target`` as served, each text's language as ``/detect`` finds it (``source: "auto"``, else
        ``None``), and each text's source language as served."""
        chosen, target = None if source == "auto" else self.code(source), self.code(target)
        if chosen is not None:
            return target, None, [chosen] * len(texts)
        detected = [self.identifier.detect(text)[0] for text in texts]
        return target, detected, [self.source_of(found, target) for found in detected]

    def source_of(self, found: Detected, target: str) -> str:
        """The source language of a text ``found`` in (``source: "auto"``): the language it is identified in, refused
        as ``source`` naming it is where nothing translates it into ``target`` (as LibreTranslate does: another
        language's model would only garble it); for a text identified in none, or in ``target`` (kept as it is), the
        run's source where it translates into ``target``, else the first that does."""
        if found.identified and found.language != target:
            self.route(found.language, target)  # refused where no run, nor a pivot, goes into target
            return found.language
        if target in self.pairs.get(self.source, []):
            return self.source
        return next((code for code, targets in self.pairs.items() if target in targets), self.source)

    def languages(self) -> list[dict[str, Any]]:
        """LibreTranslate's ``/languages``: every language served, with the targets it translates into; beyond
        LibreTranslate's keys, ``model_codes``, each run's model's own code of it, where its model marks languages with
        tokens (NLLB's ``kor_Hang`` for ``ko``), and, with several runs, ``runs``, which runs serve each target (two for
        a pivot)."""
        found = []
        for code in dict.fromkeys([*self.pairs, *self.targets()]):
            targets = self.pairs.get(code, [])
            entry: dict[str, Any] = {"code": code, "name": language_name(code), "targets": targets}
            models = zip(self.names, self.tokens, strict=True)
            owns = {name: own for name, tokens in models if tokens is not None and (own := tokens.own_code(code))}
            if owns:
                entry["model_codes"] = owns
            if len(self.names) > 1:
                entry["runs"] = {other: [self.names[leg.run] for leg in self.route(code, other).legs]
                                 for other in targets}  # fmt: skip
            found.append(entry)
        return found


def pivots(direct: Collection[Pair], codes: Sequence[str]) -> dict[Pair, str]:
    """The pairs of ``codes`` that no run serves (``direct``) but two do through one language: that language,
    :data:`PIVOT` where it can, else the first that can."""
    found = {}
    for source in codes:
        for target in codes:
            if source == target or (source, target) in direct:
                continue
            middles = [code for code in (PIVOT, *codes) if (source, code) in direct and (code, target) in direct]
            if middles:
                found[(source, target)] = middles[0]
    return found


def served_pairs(tokens: LanguageTokens | None, source: str, target: str) -> dict[str, list[str]]:
    """The pairs a run serves, as the codes clients send: its own, ``source`` into ``target``; with a model that marks
    its languages with ``tokens``, every pair it has (:meth:`LanguageTokens.pairs
    <multihead.app.languages.LanguageTokens.pairs>`)."""
    return {source: [target]} if tokens is None else tokens.pairs(source, target)
