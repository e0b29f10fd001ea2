"""The languages a run translates between: ISO 639-1 codes, given to ``train --langs SRC TGT`` or read from the
corpus's file names (``train.de.gz`` and ``train.en.gz``: ``de`` to ``en``), kept in the run's options, shown by
``translate``/``evaluate`` and answered by ``serve``'s ``/languages``.

A model of many languages marks them with tokens (:class:`LanguageTokens`); which two it translates between, and how
it is told, is a :class:`Direction`, which the language tokens make (:func:`choose_direction`, :func:`asked_direction`):
every decision about another pair than a run's own is taken here."""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib.util
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from multihead.app.console import UserError
from multihead.decoding import Generation, SearchOptions

CODE = re.compile(r"^[a-z]{2,3}([-_][A-Za-z]{2,4})?$")
"""An ISO 639 code, with an optional script or region (``zh-Hans``, ``pt-BR``); or a model's own code written with
``_`` (NLLB's ``zho_Hant``, OPUS-MT's ``cmn_Hans``)."""
COMMON = frozenset({
    "ar", "bg", "ca", "cs", "da", "de", "el", "en", "es", "et", "fa", "fi", "fr", "ga", "he", "hi", "hu", "id",
    "it", "ja", "ko", "lt", "lv", "nl", "no", "pl", "pt", "ro", "ru", "sk", "sl", "sv", "th", "tr", "uk", "vi",
    "zh",
})  # fmt: skip
"""Common languages' ISO 639-1 codes: a model's name that ends in two of them names its pair (``...-en-fr``)."""
M2M100_CODES = {
    "m2m100": (
        "af", "am", "ar", "ast", "az", "ba", "be", "bg", "bn", "br", "bs", "ca", "ceb", "cs", "cy", "da", "de",
        "el", "en", "es", "et", "fa", "ff", "fi", "fr", "fy", "ga", "gd", "gl", "gu", "ha", "he", "hi", "hr", "ht",
        "hu", "hy", "id", "ig", "ilo", "is", "it", "ja", "jv", "ka", "kk", "km", "kn", "ko", "lb", "lg", "ln", "lo",
        "lt", "lv", "mg", "mk", "ml", "mn", "mr", "ms", "my", "ne", "nl", "no", "ns", "oc", "or", "pa", "pl", "ps",
        "pt", "ro", "ru", "sd", "si", "sk", "sl", "so", "sq", "sr", "ss", "su", "sv", "sw", "ta", "th", "tl", "tn",
        "tr", "uk", "ur", "uz", "vi", "wo", "xh", "yi", "yo", "zh", "zu",
    ),
    "wmt21": (
        "en", "ha", "is", "ja", "cs", "ru", "zh", "de",
    ),
}  # fmt: skip
"""The languages of fairseq's M2M100 dictionaries (``M2M100Tokenizer``'s ``language_codes``), in their order: a
model's ``__xx__`` tokens follow its ``vocab.json``'s pieces in this order, then its made-up words."""


CODE_TOKEN = re.compile(r"^__([a-z]{2,3})__$")
"""A language's token in M2M100's vocabulary (``__de__``)."""
NLLB_TOKEN = re.compile(r"^([a-z]{3}_[A-Z][a-z]{3})$")
"""A language's token in NLLB-200's vocabulary: ISO 639-3 and the script (``deu_Latn``, ``zho_Hant``)."""
MARIAN_TOKEN = re.compile(r"^>>([a-z]{2,3}(?:_[A-Za-z]{2,4})?)<<$")
"""A target language's token in a multilingual OPUS-MT model's vocabulary (``>>fra<<``, ``>>cmn_Hans<<``), which
opens the source text."""


def code_token(code: str) -> str:
    """The token of language ``code`` in M2M100's vocabulary (what :data:`CODE_TOKEN` reads)."""
    return f"__{code}__"


def code_tokens(vocabulary: Mapping[str, int], pattern: re.Pattern[str] = CODE_TOKEN) -> dict[str, int]:
    """The languages whose tokens (as ``pattern`` reads them) a vocabulary holds, and their ids, in id order."""
    found = {match[1]: index for piece, index in vocabulary.items() if (match := pattern.match(piece))}
    return dict(sorted(found.items(), key=lambda item: item[1]))


CLOSE = 25
"""The largest ``langcodes`` distance at which a language stands for its macrolanguage (``nb`` for ``no``: 1;
Cantonese, ``yue``, for ``zh``: 64, too far)."""
SCRIPT_PARTS = {"Kore": ("Hang", "Hani"), "Jpan": ("Hani", "Hira", "Kana"), "Hanb": ("Hani", "Bopo")}
"""The scripts each of ISO 15924's combined scripts holds: Korean's usual ``Kore`` is Hangul with Han, so NLLB's
``kor_Hang`` writes ``ko``."""


@functools.lru_cache(maxsize=4096)
def _language(code: str) -> Any:
    """``code`` (ISO 639-1 or -3, with a script or region, ``-`` or ``_``) as a ``langcodes.Language`` whose
    language is the macrolanguage where there is one (``cmn_Hans``: ``zh-Hans``); ``None`` for what is no tag."""
    import langcodes

    try:
        return langcodes.Language.get(langcodes.Language.get(code.replace("_", "-")).prefer_macrolanguage().to_tag())
    except ValueError:  # langcodes.tag_parser.LanguageTagError
        return None


def _usual_script(language: Any) -> str | None:
    """The script a language's code alone means (``ko``: Kore; ``sr``: Cyrl), by ``langcodes``' likely subtags."""
    return None if language.language is None else type(language).get(language.language).maximize().script


def _asked_script(language: Any) -> str | None:
    """The script a requested tag names, or that its region gives where that is not its language's usual one
    (``zh-TW``: Hant; ``sr-ME``: Latn); ``None`` where it leaves the script open (``zh``, ``ko-KR``)."""
    if language.script is not None or language.territory is None:
        return language.script
    script = language.maximize().script
    return None if script == _usual_script(language) else script


def _same_script(one: str | None, other: str | None) -> bool:
    """Whether scripts ``one`` and ``other`` write the same texts: they are one, or one is a part of the other, a
    combined script (:data:`SCRIPT_PARTS`: Hang of Kore)."""
    return one == other or one in SCRIPT_PARTS.get(other or "", ()) or other in SCRIPT_PARTS.get(one or "", ())


def _of_language(code: Any, wanted: Any) -> bool:
    """Whether a model's language ``code`` is the language ``wanted`` (both ``langcodes.Language``; macrolanguages as
    ``langcodes``' table of ISO 639-3's has them): the same, one of the macrolanguage ``wanted`` names (``ps``:
    Southern Pashto, ``pbt``; ``no``: ``nb``), or the macrolanguage of the one it names where ``langcodes`` holds them
    within :data:`CLOSE` (``nb``: ``no``). Never another language, however close (``br`` is not ``fr``)."""
    from langcodes.data_dicts import MACROLANGUAGES

    if code.language == wanted.language or MACROLANGUAGES.get(code.language) == wanted.language:
        return True
    one, macrolanguage = (type(language).get(language.language) for language in (wanted, code))
    return MACROLANGUAGES.get(wanted.language) == code.language and one.distance(macrolanguage) <= CLOSE


def _same_language(requested: str, codes: Sequence[str]) -> list[str]:
    """The codes among ``codes`` of the language ``requested`` names, in any script (:func:`_of_language`)."""
    wanted = _language(requested)
    if wanted is None or wanted.language is None:
        return []
    return [code for code in codes if (language := _language(code)) is not None and _of_language(language, wanted)]


def closest_code(requested: str, codes: Sequence[str]) -> str | None:
    """The code among ``codes`` of the language ``requested``: itself, else one of its language
    (:func:`_of_language`: ``ps`` is NLLB's ``pbt_Arab``) in the script it names or its region gives (``sr-Latn``
    is never ``srp_Cyrl``; ``zh-TW`` is Traditional Chinese), or, where it leaves the script open, in any script
    (``ko``: NLLB's ``kor_Hang``); of these, the closest by ``langcodes``' distance (``zh`` is Simplified Chinese),
    the first of equally close ones. ``None`` where none is."""
    if requested in codes:
        return requested
    wanted = _language(requested)
    script = None if wanted is None else _asked_script(wanted)
    found = [code for code in _same_language(requested, codes)
             if script is None or _same_script(script, _language(code).maximize().script)]  # fmt: skip
    return min(found, key=lambda code: wanted.distance(_language(code)), default=None)


def public_code(code: str, codes: Sequence[str]) -> str:
    """The code a LibreTranslate client sends for ``code``, one of a model's ``codes``: the shortest ISO one that
    :func:`closest_code` takes back to it and that means its script (NLLB's ``kor_Hang``: ``ko``; ``pbt_Arab``:
    ``ps``; ``zho_Hant``: ``zh-Hant``; ``crh_Latn``: ``crh-Latn``, ``crh`` meaning Cyrillic), else ``code``."""
    from langcodes.data_dicts import MACROLANGUAGES

    language = _language(code)
    if language is None or language.language is None:
        return code
    script = language.maximize().script
    usual = language.update_dict({"script": None}) if _same_script(script, _usual_script(language)) else language
    names = sorted(filter(None, (language.language, MACROLANGUAGES.get(language.language))), key=len)
    for tag in dict.fromkeys([*names, str(usual.to_tag()), str(language.to_tag())]):
        if closest_code(tag, codes) == code and _same_script(_language(tag).maximize().script, script):
            return tag
    return code


@dataclass(frozen=True)
class Direction:
    """Which two languages a run translates between, and how its model is told: ``prefix``, the ids every source
    opens with (M2M100's and NLLB's source language token, a multilingual OPUS-MT model's target's; a run's own, its
    source tokenizer's), and ``generation``, whose forced ids open every translation (M2M100's and NLLB's target
    language token). ``langs``: (source, target) as clients name them, ``None`` where the run records none. A run's
    other pairs are other directions (:meth:`LanguageTokens.direction`)."""

    langs: tuple[str, str] | None
    prefix: tuple[int, ...]
    generation: Generation

    def spec(self, search: SearchOptions) -> Generation:
        """Its generation, searching as ``search`` says."""
        return replace(self.generation, search=search)

    @property
    def forced(self) -> tuple[int, ...]:
        """The ids every translation opens with, which generation forces: the model's, not the text's."""
        return tuple(self.generation.forced)

    @property
    def source_lang(self) -> str | None:
        return self.langs[0] if self.langs else None

    @property
    def target_lang(self) -> str | None:
        return self.langs[1] if self.langs else None


@dataclass(frozen=True)
class LanguageTokens:
    """The language tokens of a model that translates between many languages, and where each goes.

    M2M100 and NLLB-200: a text starts with its language's token (``sources``: ``__de__``, ``deu_Latn``), and the
    translation with the target's (``targets``, forced first; ``forced_target``). A multilingual OPUS-MT model: the
    source starts with the target's token (``>>cmn_Hans<<``), and ``sources`` is empty (its sources need no token).
    Codes are the model's own; :meth:`choose` finds the model's code for an ISO one (``zh``: ``zho_Hans``)."""

    sources: dict[str, int]
    targets: dict[str, int]
    forced_target: bool

    @classmethod
    def of(cls, source: Mapping[str, int], target: Mapping[str, int]) -> LanguageTokens | None:
        """The language tokens of a model with these source and target vocabularies (piece -> id), if any."""
        for pattern in (CODE_TOKEN, NLLB_TOKEN):
            codes = code_tokens(target, pattern)
            if len(codes) > 1:
                return cls(code_tokens(source, pattern), codes, True)
        codes = code_tokens(source, MARIAN_TOKEN)
        return cls({}, codes, False) if codes else None

    def choose(self, requested: str, *, target: bool) -> str:
        """The model's code of the language ``requested``: its own code, or an ISO one (:func:`closest_code`: ``ko``
        is NLLB's ``kor_Hang``, ``zh`` Simplified Chinese, ``zh-Hant`` Traditional); ``ValueError`` naming the
        nearest codes it has (``sr-Latn``: ``srp_Cyrl``, which writes another script)."""
        codes = list(self.targets if target else self.sources)
        found = closest_code(requested, codes)
        if found is not None:
            return found
        nearest = _same_language(requested, codes)[:5] or difflib.get_close_matches(requested, codes, n=3, cutoff=0.5)
        some = ", ".join(codes[:8])
        shown = f"the nearest it has: {', '.join(nearest)}" if nearest else f"it has {len(codes)}, such as {some}"
        raise ValueError(f"the model has no language {requested!r}; {shown}")

    @functools.cached_property
    def _public(self) -> tuple[dict[str, str], dict[str, str]]:
        """The sources' and the targets' codes -> the ISO codes clients send for them (:func:`public_code`)."""

        def public(side: Mapping[str, int]) -> dict[str, str]:
            return {code: public_code(code, list(side)) for code in side}

        return public(self.sources), public(self.targets)

    def public(self, code: str, *, target: bool) -> str:
        """The ISO code clients send for ``code``, one of the model's targets (or sources): :func:`public_code`,
        NLLB's ``kor_Hang`` is ``ko``; a code the model has none of as it is (a multilingual OPUS-MT model's
        source)."""
        return self._public[target].get(code, code)

    def own_code(self, public: str) -> str | None:
        """The model's code (a target's, else a source's) whose ISO code (:meth:`public`) is ``public``, if any."""
        return next((code for side in self._public[::-1] for code, shown in side.items() if shown == public), None)

    def own_codes(self, langs: Sequence[str]) -> list[str]:
        """The model's codes of the pair ``langs`` (ISO codes, as :meth:`public` gives them: ``ko`` is NLLB's
        ``kor_Hang``), each as given where the model has none of it (a multilingual OPUS-MT model's source)."""
        sides = (self.sources, self.targets)
        return [closest_code(code, list(side)) or code for code, side in zip(langs, sides, strict=True)]

    def direction(self, run: Direction, source: str | None, target: str | None) -> Direction:
        """The direction from ``source`` into ``target`` (``None``: ``run``'s, the run's own direction; an ISO code
        or the model's own, :meth:`choose`): M2M100's and NLLB's sources open with the source's token and their
        translations with the target's (forced first); a multilingual OPUS-MT model's sources open with the
        target's. ``ValueError`` for a language the model lacks, or for another source than the run's where the
        sources carry no token."""
        recorded: Sequence[str | None] = run.langs or (None, None)
        prefix, generation = run.prefix, run.generation
        if source is not None and self.sources:
            source = self.choose(source, target=False)
            prefix = (self.sources[source],)
        elif source is not None and source != recorded[0] and recorded[0] not in (None, "mul"):
            raise ValueError(f"this model reads {recorded[0]} (its sources carry no language token)")
        if target is not None:
            target = self.choose(target, target=True)
            if self.forced_target:
                generation = replace(generation, forced=(self.targets[target],))
            else:
                prefix = (self.targets[target],)
        chosen = [code and self.public(code, target=side == 1) for side, code in enumerate((source, target))]
        return Direction((chosen[0] or recorded[0] or "mul", chosen[1] or recorded[1] or "mul"), prefix, generation)

    def pairs(self, source: str, target: str) -> dict[str, list[str]]:
        """Each source language this model translates and its targets, as the codes clients send (:meth:`public`:
        NLLB's ``kor_Hang`` is ``ko``), for a run whose own pair is ``source`` into ``target``: M2M100's and NLLB's,
        each of its languages into every other; a multilingual OPUS-MT model's, ``source`` into each of its
        targets."""
        targets = list(dict.fromkeys(self.public(code, target=True) for code in self.targets))
        targets += [] if target in targets else [target]
        if not self.sources:
            return {source: targets}
        sources = list(dict.fromkeys([source, *(self.public(code, target=False) for code in self.sources)]))
        return {code: [other for other in targets if other != code] for code in sources}

    def choosing(self) -> str:
        """How ``translate`` chooses among this model's languages, in words."""
        if self.sources:
            return f"{len(self.targets)} languages, any into any other: translate --source-lang/--target-lang CODE"
        return f"{len(self.targets)} target languages: translate --target-lang CODE"


def choose_direction(
    tokens: LanguageTokens | None,
    run: Direction,
    source: str | None,
    target: str | None,
    *,
    named: str | None = None,
    task: str | None = None,
) -> Direction:
    """The direction from ``source`` into ``target`` of a run whose own is ``run`` and whose model has the language
    ``tokens`` (:meth:`LanguageTokens.direction`); refused in one line, naming what chose them as ``named`` says
    (default: ``--source-lang``/``--target-lang``), for a language the model lacks, or a model without language
    tokens (``task``: the built-in task a run of one translates)."""
    given = named or " ".join(f"{flag} {code}" for flag, code in (("--source-lang", source),
                              ("--target-lang", target)) if code is not None)  # fmt: skip
    if tokens is None:
        raise UserError(f"{given}: this run translates {pair_text(run.langs, task=task)} only; its model marks no "
                        "languages with tokens (M2M100, NLLB-200 and multilingual OPUS-MT models do)")  # fmt: skip
    try:
        return tokens.direction(run, source, target)
    except ValueError as error:
        raise UserError(f"{given}: {error}") from None


def asked_direction(
    tokens: LanguageTokens | None, run: Direction, pair: Sequence[str], *, named: str | None = None,
    task: str | None = None,
) -> Direction:  # fmt: skip
    """The direction of a run asked to translate ``pair`` (as clients name it: ``serve``'s), ``run`` its own: of a
    model with language ``tokens``, the pair it chooses (:func:`choose_direction`), its source only where its
    sources carry a token (a multilingual OPUS-MT model's read any of its languages); of a run that records its one
    pair, that pair in any spelling (``de-DE``: ``de``), another refused as :func:`choose_direction` refuses it; of
    a run that records none, its own."""
    if tokens is not None:
        return choose_direction(tokens, run, pair[0] if tokens.sources else None, pair[1], named=named, task=task)
    if run.langs and any(closest_code(code, [own]) != own for code, own in zip(pair, run.langs, strict=True)):
        return choose_direction(None, run, *pair, named=named, task=task)  # refused: the model has no tokens
    return run


def language_code(text: str) -> str:
    """``text`` as a language code (argparse type): refused unless it looks like one."""
    if not CODE.match(text):
        raise argparse.ArgumentTypeError(f"must be an ISO 639-1 language code such as de, en or zh, received {text!r}")
    return text


def known_language_code(text: str) -> str:
    """``text`` as the code of a language ``langcodes`` knows (argparse type): what names a run's languages
    (``--langs``), refused unless ISO 639 has it (``xx`` has no language)."""
    import langcodes

    code = language_code(text)
    if not langcodes.tag_is_valid(code.replace("_", "-")):
        raise argparse.ArgumentTypeError(f"must be an ISO 639 language code such as de, en or zh, received {text!r}, "
                                         "which names no language")  # fmt: skip
    return code


def language_name(code: str) -> str:
    """A language's English name (``zh-Hant``: Chinese (Traditional)); its code where ``langcodes`` knows none."""
    language = _language(code)
    name = None if language is None else str(language.display_name())
    return code if name is None or name.startswith("Unknown language") else name


def file_language(path: str) -> str | None:
    """The language code a corpus file's name gives (``train.de.gz``: ``de``), if any."""
    suffixes = [suffix[1:] for suffix in Path(path).suffixes if suffix != ".gz"]
    return suffixes[-1].lower() if suffixes and 2 <= len(suffixes[-1]) <= 3 and suffixes[-1].isalpha() else None


def from_file_names(paths: Sequence[str]) -> list[str] | None:
    """``[source, target]`` from two corpus files named ``NAME.CODE`` or ``NAME.CODE.gz`` that differ only in their
    codes, else ``None``."""
    if len(paths) != 2:
        return None
    source, target = (file_language(path) for path in paths)
    if source is None or target is None or source == target:
        return None
    names = [Path(path).name.lower() for path in paths]
    rest = [(name.removesuffix(".gz").rsplit(".", 1)[0], name.endswith(".gz")) for name in names]  # all but the code
    return [source, target] if rest[0] == rest[1] else None


def pair_text(langs: Sequence[str] | None, *, task: str | None = None, tokens: LanguageTokens | None = None) -> str:
    """``de → en`` (German to English); with a model's language ``tokens``, also its own codes of the pair where they
    differ (``de → ko (German to Korean; the model's deu_Latn → kor_Hang)``); for a run of a built-in ``task``,
    which translates no language, the task; else that the run does not say (``train --langs`` names them)."""
    if task is not None and not langs:
        return f"built-in task {task} (no languages)"
    if not langs:
        return "languages not recorded (train --langs SRC TGT)"
    own = [] if tokens is None else tokens.own_codes(langs)
    codes = f"; the model's {own[0]} → {own[1]}" if own and own != list(langs) else ""
    return f"{langs[0]} → {langs[1]} ({language_name(langs[0])} to {language_name(langs[1])}{codes})"


BLEU_TOKENIZERS = ("13a", "intl", "zh", "ja-mecab", "char", "none")
"""sacreBLEU's tokenizers that need nothing downloaded (``ja-mecab`` needs MeCab: ``pip install 'sacrebleu[ja]'``)."""


def _has_mecab() -> bool:
    return bool(importlib.util.find_spec("MeCab") and importlib.util.find_spec("ipadic"))


def bleu_tokenize_choice(text: str) -> str:
    """``--bleu-tokenize``'s value (argparse type): one of :data:`BLEU_TOKENIZERS` that can run here."""
    if text not in BLEU_TOKENIZERS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(BLEU_TOKENIZERS)}, received {text!r}")
    if text == "ja-mecab" and not _has_mecab():
        raise argparse.ArgumentTypeError("ja-mecab needs MeCab: pip install 'sacrebleu[ja]' (or choose char)")
    return text


def bleu_tokenizer(target: str | None) -> str:
    """sacreBLEU's tokenizer for translations into ``target``: ``zh`` for Chinese, ``ja-mecab`` for Japanese where
    MeCab is installed (else ``char``), ``13a`` (the standard, which splits at spaces and punctuation) otherwise."""
    language = (target or "").split("-")[0]
    if language == "zh":
        return "zh"
    if language == "ja":
        return "ja-mecab" if _has_mecab() else "char"
    return "13a"
