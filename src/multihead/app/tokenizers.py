"""Tokenizers: characters and words for the built-in tasks, learned subwords for real corpora.

A tokenizer's :class:`Specials` say which ids pad, start the decoder, end and stand for unknown pieces. Ids 0-3 are
those of every tokenizer trained here: ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``.

- ``char`` and ``word`` (whitespace) keep the vocabulary seen in training, saved as our own JSON.
- ``subword``: byte-pair encoding learned with Hugging Face ``tokenizers`` (NFKC, words marked by ``▁`` and
  punctuation split off, which is lossless: decoding gives back the text, spaces and all). It is saved in that
  library's own ``tokenizer.json`` format. For a corpus the default is one joint vocabulary for both languages.

A run keeps its tokenizers in every checkpoint: ``tokenizer.json`` names them (``{"source": ..., "target": ...}``),
and each subword vocabulary is a file of its own beside it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
KINDS = ("char", "word", "subword")
MANIFEST = "tokenizer.json"

__all__ = [
    "BOS", "EOS", "KINDS", "PAD", "SPECIALS", "UNK", "Specials", "SubwordTokenizer", "SymbolTokenizer", "Tokenizer",
]  # fmt: skip


@dataclass(frozen=True)
class Specials:
    """The special ids of a vocabulary: ``pad`` fills batches, ``bos`` starts every target sequence (the decoder's
    first input; Marian's is its pad), ``eos`` ends a sentence, ``unk`` reads a piece the vocabulary lacks."""

    pad: int = PAD
    bos: int = BOS
    eos: int = EOS
    unk: int = UNK


class Tokenizer(Protocol):
    """What training, translation and the plots need of a tokenizer."""

    kind: str
    specials: Specials

    def __len__(self) -> int: ...

    def encode(self, text: str) -> tuple[list[int], list[str]]:
        """Ids of ``text`` (no BOS/EOS) and the pieces that were not in the vocabulary (read as ``<unk>``)."""
        ...

    def encode_all(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of many texts at once (unknown pieces read as ``<unk>`` silently)."""
        ...

    def corpus_encoder(self) -> Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]:
        """A function giving what :meth:`encode_all` gives, as the ids of all texts one after another (int64) and each
        text's length (int64): the form a corpus is kept in. It may remember what it has met, to go faster over a
        whole corpus: one per corpus, let go after it."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first ``<eos>``, without specials."""
        ...

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The token of each id, as it reads (for plots)."""
        ...

    def word_starts(self, ids: Sequence[int]) -> list[bool]:
        """Whether each token begins a new word (subwords after the first continue it)."""
        ...


class SymbolTokenizer:
    """Every character (``char``) or every whitespace-separated word (``word``) is a symbol of the vocabulary."""

    specials = Specials()

    def __init__(self, kind: str, symbols: Iterable[str]) -> None:
        if kind not in ("char", "word"):
            raise ValueError(f"a symbol tokenizer's kind must be 'char' or 'word', received {kind!r}")
        self.kind = kind
        self.symbols = list(SPECIALS) + [s for s in dict.fromkeys(symbols) if s not in SPECIALS]
        self.ids = {symbol: index for index, symbol in enumerate(self.symbols)}

    @classmethod
    def build(cls, kind: str, texts: Iterable[str]) -> SymbolTokenizer:
        """The vocabulary of ``texts``, in sorted order (so it does not depend on the order of the data)."""
        symbols = set()
        for text in texts:
            symbols.update(cls._split(kind, text))
        return cls(kind, sorted(symbols))

    @staticmethod
    def _split(kind: str, text: str) -> list[str]:
        return list(text) if kind == "char" else text.split()

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, text: str) -> tuple[list[int], list[str]]:
        pieces = self._split(self.kind, text)
        unknown = [piece for piece in pieces if piece not in self.ids]
        return [self.ids.get(piece, UNK) for piece in pieces], unknown

    def encode_all(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text)[0] for text in texts]

    def corpus_encoder(self) -> Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]:
        return text_by_text(self)

    def decode(self, ids: Iterable[int]) -> str:
        pieces = []
        for index in ids:
            if index == EOS:
                break
            if index in (PAD, BOS):
                continue
            pieces.append(self.symbols[index] if 0 <= index < len(self.symbols) else SPECIALS[UNK])
        return ("" if self.kind == "char" else " ").join(pieces)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.symbols[index] for index in ids]

    def word_starts(self, ids: Sequence[int]) -> list[bool]:
        return [True] * len(ids)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "symbols": self.symbols[len(SPECIALS) :]}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SymbolTokenizer:
        """The tokenizer :meth:`to_dict` described; anything that would give other ids is refused."""
        if (
            not isinstance(values, dict)
            or set(values) != {"kind", "symbols"}
            or not isinstance(values["symbols"], list)
        ):
            raise ValueError("a tokenizer must be a JSON object with 'kind' and 'symbols'")
        symbols = values["symbols"]
        wrong = [symbol for symbol in symbols if not isinstance(symbol, str) or not symbol or symbol in SPECIALS]
        if wrong:
            raise ValueError(
                f"a tokenizer's symbols must be non-empty strings other than {SPECIALS}, received {wrong[:5]}"
            )
        repeated = sorted(symbol for symbol, count in Counter(symbols).items() if count > 1)
        if repeated:
            raise ValueError(f"a tokenizer's symbols must each appear once, received {repeated[:5]} more than once")
        return cls(values["kind"], symbols)


WRITTEN_WITHOUT_SPACES = "[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
"""Characters of scripts written without spaces between words (Chinese characters, kana): each is its own
pre-token, so that a subword never spans two of them, and its own word on the attention maps."""


class SubwordTokenizer:
    """Byte-pair encoding learned with Hugging Face ``tokenizers``; decodes to plain text (no ``▁``). Words are what
    spaces and punctuation delimit, and each character of a script written without spaces."""

    kind = "subword"
    specials = Specials()
    MARK = "▁"  # begins every word

    def __init__(self, model: Any) -> None:
        self.model = model  # a tokenizers.Tokenizer
        for index, special in enumerate(SPECIALS):
            if model.token_to_id(special) != index:
                raise ValueError(f"a subword vocabulary must give {special!r} the id {index}")

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> SubwordTokenizer:
        from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
        from tokenizers import Tokenizer as HuggingFaceTokenizer

        model = HuggingFaceTokenizer(models.BPE(unk_token=SPECIALS[UNK]))
        model.normalizer = normalizers.NFKC()
        model.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Metaspace(),
                pre_tokenizers.Punctuation(behavior="isolated"),
                pre_tokenizers.Split(Regex(f"{cls.MARK}?{WRITTEN_WITHOUT_SPACES}"), behavior="isolated"),
            ]
        )
        model.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False)
        model.train_from_iterator(texts, trainer)
        return cls(model)

    def __len__(self) -> int:
        return self.model.get_vocab_size()

    def encode(self, text: str) -> tuple[list[int], list[str]]:
        encoding = self.model.encode(text, add_special_tokens=False)
        normalized = self.model.normalizer.normalize_str(text)
        unknown = [
            normalized[start:end]
            for index, (start, end) in zip(encoding.ids, encoding.offsets, strict=True)
            if index == UNK
        ]
        return encoding.ids, unknown

    def encode_all(self, texts: Sequence[str]) -> list[list[int]]:
        return model_ids(self.model, texts)

    def corpus_encoder(self) -> Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]:
        """Several times faster than :meth:`encode_all` on a corpus, with the same ids: each distinct word is encoded
        once (see :class:`WordIds`)."""
        return WordIds(self.model).encode if WordIds.applies(self.model) else text_by_text(self)

    def decode(self, ids: Iterable[int]) -> str:
        kept = []
        for index in ids:
            if index == EOS:
                break
            kept.append(index)
        return self.model.decode(kept, skip_special_tokens=True)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.model.id_to_token(index) for index in ids]

    def word_starts(self, ids: Sequence[int]) -> list[bool]:
        """A token starts a word when it carries the word mark, is punctuation split off a word, or is a character of
        a script written without spaces."""
        starts = []
        for piece in self.pieces(ids):
            bare = piece.removeprefix(self.MARK)
            starts.append(
                piece.startswith(self.MARK)
                or piece in SPECIALS
                or not piece[:1].isalnum()
                or bool(re.match(WRITTEN_WITHOUT_SPACES, bare))
            )
        return starts

    def to_json(self) -> str:
        return self.model.to_str()

    @classmethod
    def from_json(cls, text: str) -> SubwordTokenizer:
        from tokenizers import Tokenizer as HuggingFaceTokenizer

        try:
            model = HuggingFaceTokenizer.from_str(text)
        except Exception as error:  # the library raises a bare Exception for malformed files
            raise ValueError(f"not a Hugging Face tokenizers file ({str(error).splitlines()[0]})") from None
        return cls(model)


class WordIds:
    """The ids of the words a subword tokenizer has met, to encode a corpus fast and exactly as the tokenizer does.

    A subword tokenizer normalizes a text (NFKC), cuts it into words at its spaces (each word marked with ``▁``),
    splits the words further (punctuation, characters of scripts written without spaces) and encodes each piece on
    its own. So a text that NFKC leaves as it is, holding words separated by single spaces and none of the specials'
    text, encodes to its words' ids one after another, and each word need be encoded only once. Other texts (double
    or outer spaces, text NFKC changes, a special's text, the empty text) go to Hugging Face whole. At most ``LIMIT``
    words are kept: the collection starts again when it would hold more.
    """

    LIMIT = 1 << 19

    def __init__(self, model: Any) -> None:
        self.model = model
        self.specials = "".join(sorted({token.content[:1] for token in model.get_added_tokens_decoder().values()}))
        self._forget()

    def _forget(self) -> None:
        self.index: dict[str, int] = {}  # word -> its number
        self.starts = np.zeros(1, np.int64)  # word i's ids are ids[starts[i]:starts[i + 1]]
        self.ids = np.zeros(0, np.int64)

    @staticmethod
    def applies(model: Any) -> bool:
        """Whether ``model`` (a ``tokenizers.Tokenizer``) follows the rules above: NFKC, then ``▁``-marked words cut at
        spaces before any other split, BPE without dropout, no truncation or padding."""
        described = json.loads(model.to_str())
        splits = described.get("pre_tokenizer") or {}
        first = splits["pretokenizers"][0] if splits.get("type") == "Sequence" and splits["pretokenizers"] else splits
        return (
            described.get("normalizer") == {"type": "NFKC"}
            and first.get("type") == "Metaspace"
            and first.get("replacement") == SubwordTokenizer.MARK
            and first.get("prepend_scheme") == "always"
            and first.get("split") is True
            and described["model"].get("type") == "BPE"
            and described["model"].get("dropout") is None
            and described.get("truncation") is None
            and described.get("padding") is None
        )

    def _plain(self, text: str) -> bool:
        """Whether ``text`` encodes word by word."""
        return (
            bool(text)
            and text[0] != " "
            and text[-1] != " "
            and "  " not in text
            and not any(mark in text for mark in self.specials)
            and unicodedata.is_normalized("NFKC", text)
        )

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """A :meth:`Tokenizer.corpus_encoder`'s ids of ``texts``."""
        plain = np.fromiter(map(self._plain, texts), bool, count=len(texts))
        if plain.all():
            return self._words(texts)
        parts = {
            True: self._words([texts[int(i)] for i in np.flatnonzero(plain)]),
            False: flat(model_ids(self.model, [texts[int(i)] for i in np.flatnonzero(~plain)])),
        }
        lengths = np.zeros(len(texts), np.int64)
        for kind, (_, counts) in parts.items():
            lengths[plain == kind] = counts
        starts = np.cumsum(lengths) - lengths
        ids = np.zeros(int(lengths.sum()), np.int64)
        for kind, (part, counts) in parts.items():
            ids[spans(starts[plain == kind], counts)] = part
        return ids, lengths

    def _words(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of plain texts, word by word."""
        words = " ".join(texts).split(" ") if texts else []
        numbers = list(map(self.index.get, words))
        if None in numbers:
            new = list(dict.fromkeys(word for word, number in zip(words, numbers, strict=True) if number is None))
            if len(self.index) + len(new) > self.LIMIT:
                self._forget()
                new = list(dict.fromkeys(words))
            self._learn(new)
            numbers = list(map(self.index.get, words))
        number = np.array(numbers, np.int64)  # (W,) every word of every text
        counts = self.starts[number + 1] - self.starts[number]  # (W,) ids per word
        ids = self.ids[spans(self.starts[number], counts)]
        word_ends = np.cumsum(np.fromiter((text.count(" ") + 1 for text in texts), np.int64, count=len(texts)))
        id_ends = np.cumsum(counts)[word_ends - 1] if len(words) else np.zeros(0, np.int64)
        return ids, np.diff(id_ends, prepend=0)

    def _learn(self, words: list[str]) -> None:
        ids, counts = flat(model_ids(self.model, words))
        self.index.update(zip(words, range(len(self.index), len(self.index) + len(words)), strict=True))
        self.starts = np.concatenate([self.starts, self.starts[-1] + np.cumsum(counts)])
        self.ids = np.concatenate([self.ids, ids])


def model_ids(model: Any, texts: Sequence[str]) -> list[list[int]]:
    """The ids Hugging Face's ``model`` gives each of ``texts``, without specials."""
    return [encoding.ids for encoding in model.encode_batch(list(texts), add_special_tokens=False)]


def text_by_text(tokenizer: Tokenizer) -> Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]:
    """A :meth:`Tokenizer.corpus_encoder` that encodes each text with ``encode_all``."""
    return lambda texts: flat(tokenizer.encode_all(texts))


def flat(ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Id lists as their ids one after another and each list's length (int64 both)."""
    lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), np.int64, count=int(lengths.sum())), lengths


def spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``starts[i], starts[i] + 1, ..., starts[i] + lengths[i] - 1`` for every ``i``, one after another."""
    ends = np.cumsum(lengths)
    return np.repeat(starts - (ends - lengths), lengths) + np.arange(int(ends[-1]) if len(ends) else 0)


def build_tokenizers(
    kind: str, sources: Sequence[str], targets: Sequence[str], *, vocab_size: int, joint: bool
) -> tuple[Tokenizer, Tokenizer]:
    """Source and target tokenizers learned on training texts (one shared object when ``joint``)."""
    if kind == "subword":
        if joint:
            shared = SubwordTokenizer.train([*sources, *targets], vocab_size)
            return shared, shared
        return SubwordTokenizer.train(sources, vocab_size), SubwordTokenizer.train(targets, vocab_size)
    if joint:
        symbols = SymbolTokenizer.build(kind, [*sources, *targets])
        return symbols, symbols
    return SymbolTokenizer.build(kind, sources), SymbolTokenizer.build(kind, targets)


def subword_file(side: str, joint: bool) -> str:
    return "subwords.json" if joint else f"subwords.{side}.json"


def digest(source: Tokenizer, target: Tokenizer) -> str:
    """A SHA-256 of both tokenizers' vocabularies and rules: the same only for the same tokenizers."""
    described = [_described(tokenizer) for tokenizer in (source, target)]
    return hashlib.sha256(json.dumps(described).encode("utf-8")).hexdigest()


def _described(tokenizer: Tokenizer) -> str:
    """A tokenizer's whole vocabulary and rules as text."""
    if isinstance(tokenizer, SubwordTokenizer):
        return tokenizer.to_json()
    if isinstance(tokenizer, SymbolTokenizer):
        return json.dumps(tokenizer.to_dict())
    raise TypeError(f"no description of a {type(tokenizer).__name__}")


def save_tokenizers(source: Tokenizer, target: Tokenizer, directory: Path) -> list[str]:
    """Write the manifest and any subword vocabulary into ``directory``; return the file names written."""
    joint = source is target
    manifest: dict[str, Any] = {}
    written = [MANIFEST]
    for side, tokenizer in (("source", source), ("target", target)):
        if isinstance(tokenizer, SubwordTokenizer):
            name = subword_file(side, joint)
            manifest[side] = {"kind": "subword", "file": name}
            if name not in written:
                (directory / name).write_text(tokenizer.to_json(), encoding="utf-8")
                written.append(name)
        elif isinstance(tokenizer, SymbolTokenizer):
            manifest[side] = tokenizer.to_dict()
        else:
            raise TypeError(f"cannot save a {type(tokenizer).__name__}")
    manifest["joint"] = joint
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return written


def load_tokenizers(directory: Path) -> tuple[Tokenizer, Tokenizer]:
    """The tokenizers :func:`save_tokenizers` wrote; ``ValueError`` naming the damaged file otherwise."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{str(path)!r} is not a readable tokenizer manifest ({error})") from None
    if not isinstance(manifest, dict) or not {"source", "target"} <= set(manifest):
        raise ValueError(f"{str(path)!r} must be a JSON object with 'source' and 'target' tokenizers")
    loaded: dict[str, Tokenizer] = {}
    sides = {}
    for side in ("source", "target"):
        entry = manifest[side]
        if isinstance(entry, dict) and entry.get("kind") == "subword":
            name = entry.get("file")
            if not isinstance(name, str) or Path(name).name != name:
                raise ValueError(f"{str(path)!r} names no subword file for the {side}")
            if name not in loaded:
                try:
                    loaded[name] = SubwordTokenizer.from_json((directory / name).read_text(encoding="utf-8"))
                except (OSError, UnicodeDecodeError, ValueError) as error:
                    raise ValueError(f"{str(directory / name)!r} is damaged: {error}") from None
            sides[side] = loaded[name]
        else:
            try:
                sides[side] = SymbolTokenizer.from_dict(entry)
            except ValueError as error:
                raise ValueError(f"{str(path)!r} is damaged: {error}") from None
    source, target = sides["source"], sides["target"]
    if manifest.get("joint") is True and source is not target:
        # One object for a joint vocabulary, as it was trained: `source is target` is what ties the embeddings and
        # what the next save writes as "joint".
        if not isinstance(source, SymbolTokenizer) or source.to_dict() != getattr(target, "to_dict", dict)():
            raise ValueError(f"{str(path)!r} is damaged: it says joint, but its source and target vocabularies differ")
        target = source
    return source, target
