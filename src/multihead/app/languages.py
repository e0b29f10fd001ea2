"""The languages a run translates between: ISO 639-1 codes, given to ``train --langs SRC TGT`` or read from the
corpus's file names (``train.de.gz`` and ``train.en.gz``: ``de`` to ``en``), kept in the run's options, shown by
``translate``/``evaluate`` and answered by ``serve``'s ``/languages``."""

from __future__ import annotations

import argparse
import importlib.util
import re
from collections.abc import Sequence
from pathlib import Path

CODE = re.compile(r"^[a-z]{2,3}(-[A-Za-z]{2,4})?$")
"""An ISO 639 code, with an optional script or region (``zh-Hans``, ``pt-BR``)."""
NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "ca": "Catalan", "cs": "Czech", "da": "Danish", "de": "German",
    "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian", "fa": "Persian", "fi": "Finnish",
    "fr": "French", "ga": "Irish", "he": "Hebrew", "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "nl": "Dutch",
    "no": "Norwegian", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak",
    "sl": "Slovenian", "sv": "Swedish", "th": "Thai", "tr": "Turkish", "uk": "Ukrainian", "vi": "Vietnamese",
    "zh": "Chinese",
}  # fmt: skip
"""English names of common languages (LibreTranslate's ``/languages`` gives names); others are named by code."""
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
"""A language's token in a many-to-many model's vocabulary (M2M100's ``__de__``)."""


def code_token(code: str) -> str:
    """The token of language ``code`` in a many-to-many model's vocabulary (what :data:`CODE_TOKEN` reads)."""
    return f"__{code}__"


def code_tokens(vocabulary: dict[str, int]) -> dict[str, int]:
    """The languages whose tokens a vocabulary holds, and their ids, in the order of the ids."""
    found = {match[1]: index for piece, index in vocabulary.items() if (match := CODE_TOKEN.match(piece))}
    return dict(sorted(found.items(), key=lambda item: item[1]))


def language_code(text: str) -> str:
    """``text`` as a language code (argparse type): refused unless it looks like one."""
    if not CODE.match(text):
        raise argparse.ArgumentTypeError(f"must be an ISO 639-1 language code such as de, en or zh, received {text!r}")
    return text


def language_name(code: str) -> str:
    return NAMES.get(code.split("-")[0], code)


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


def pair_text(langs: Sequence[str] | None, *, task: str | None = None) -> str:
    """``de → en`` (German to English); for a run of a built-in ``task``, which translates no language, the task;
    else that the run does not say (``train --langs`` names them, for a corpus)."""
    if task is not None and not langs:
        return f"built-in task {task} (no languages)"
    if not langs:
        return "languages not recorded (train --langs SRC TGT)"
    return f"{langs[0]} → {langs[1]} ({language_name(langs[0])} to {language_name(langs[1])})"


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
