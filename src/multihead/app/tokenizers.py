"""Tokenizers: characters and words for the built-in tasks, learned subwords for real corpora.

A tokenizer's :class:`Specials` say which ids pad, start the decoder, end and stand for unknown pieces. Ids 0-3 are
those of every tokenizer trained here: ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``.

- ``char`` and ``word`` (whitespace) keep the vocabulary seen in training, saved as our own JSON.
- ``subword``: byte-pair encoding learned with Hugging Face ``tokenizers`` (NFKC, words marked by ``▁`` and
  punctuation split off, which is lossless: decoding gives back the text, spaces and all). It is saved in that
  library's own ``tokenizer.json`` format. For a corpus the default is one joint vocabulary for both languages.
- ``sentencepiece``: a model trained elsewhere, as Hugging Face's Marian (OPUS-MT) checkpoints hold it: a SentencePiece
  model (``source.spm``, ``target.spm``) and a vocabulary of its pieces (``vocab.json``), which gives the same ids as
  Transformers' ``MarianTokenizer``. Its specials are the vocabulary's own (Marian's: ``</s>`` 0, ``<unk>`` 1, ``<pad>``
  last).

A run keeps its tokenizers in every checkpoint: ``tokenizer.json`` names them (``{"source": ..., "target": ...}``),
and each subword vocabulary, SentencePiece model and vocabulary of its pieces is a file of its own beside it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, astuple
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from multihead.decoding import Specials

PAD, BOS, EOS, UNK = Specials().pad, Specials().bos, Specials().eos, Specials().unk
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
KINDS = ("char", "word", "subword")
"""The kinds of tokenizer ``train`` learns."""
ALL_KINDS = (*KINDS, "sentencepiece")
"""Those and the kinds a run may take from another (``train --init`` of an imported model)."""
MANIFEST = "tokenizer.json"

__all__ = [
    "BOS", "EOS", "KINDS", "PAD", "SPECIALS", "UNK", "SentencePieceTokenizer", "SubwordTokenizer",
    "SymbolTokenizer", "Tokenizer",
]  # fmt: skip


class Tokenizer(Protocol):
    """What training, translation and the plots need of a tokenizer."""

    kind: str
    specials: Specials

    def __len__(self) -> int: ...

    def encode(self, text: str) -> tuple[list[int], list[str]]:
        """Ids of ``text`` (no BOS; no EOS but where the model's source ends with one, as Marian's does) and the
        pieces that were not in the vocabulary (read as ``<unk>``)."""
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


class SentencePieceTokenizer:
    """A SentencePiece model and a vocabulary of its pieces, as a Hugging Face Marian (OPUS-MT) checkpoint holds them:
    the same ids as Transformers' ``MarianTokenizer`` gives, and its decoded text.

    A text is cut where a special's own text (``</s>``, ``<unk>``, ``<pad>``) stands in it; each other part loses a
    language code that opens it (``>>fr<<``, one piece of its own) and SentencePiece cuts the rest. Pieces the
    vocabulary lacks read as ``specials.unk``. The source side of a Marian model ends every text with ``specials.eos``
    (``append_eos``); its target side does not, as the batches add it. ``prefix``: ids every encoded text starts with
    (the source language's code of an M2M100 or NLLB model, as their tokenizers put it first; the target language's
    code of a multilingual OPUS-MT model, unless the text opens with a code of its own), what the run chose; another
    pair's code is an argument of :meth:`encode`, the tokenizer never changes.
    """

    kind = "sentencepiece"
    MARK = "▁"  # begins every word

    def __init__(
        self,
        model: bytes,
        vocabulary: dict[str, int],
        *,
        append_eos: bool,
        specials: Specials,
        prefix: Sequence[int] = (),
    ) -> None:
        self.processor = sentencepiece_processor(model)
        self.symbols = vocabulary_symbols(vocabulary)
        outside = [value for value in [*astuple(specials), *prefix] if not 0 <= value < len(self.symbols)]
        if outside:
            raise ValueError(
                f"the specials {specials} and prefix {list(prefix)} must be ids of the vocabulary (0 to "
                f"{len(self.symbols) - 1})"
            )
        self.model, self.append_eos, self.specials = bytes(model), append_eos, specials
        self.prefix = tuple(int(index) for index in prefix)
        self.vocabulary = vocabulary  # kept as given (both sides of one vocabulary file share one): never changed
        pieces = self.processor.id_to_piece(list(range(self.processor.get_piece_size())))
        self.piece_ids = [self.vocabulary.get(piece, specials.unk) for piece in pieces]  # SentencePiece's id -> ours
        self.skipped = set(astuple(specials))  # what decoding leaves out
        special_texts = sorted({self.symbols[index] for index in self.skipped}, key=len, reverse=True)
        self.special_texts = set(special_texts)
        self.special_split = re.compile("(" + "|".join(map(re.escape, special_texts)) + ")")

    @classmethod
    def from_files(
        cls,
        model: Path,
        vocabulary: Path,
        *,
        append_eos: bool,
        specials: Specials,
        prefix: Sequence[int] = (),
        read: dict[Path, Any] | None = None,
    ) -> SentencePieceTokenizer:
        """The tokenizer of a SentencePiece model file (``source.spm``) and a JSON vocabulary of its pieces
        (``vocab.json``); ``ValueError`` naming a file that is missing or damaged. ``read``: vocabularies read before,
        by file, taken from there (one vocabulary for both sides of a model is read and held once) and added to it."""
        read = {} if read is None else read
        try:
            model_bytes = model.read_bytes()
        except OSError as error:
            raise ValueError(f"{str(model)!r} is damaged: {error}") from None
        try:
            pieces = read[vocabulary] if vocabulary in read else json.loads(vocabulary.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as error:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"{str(vocabulary)!r} is damaged: {error}") from None
        read[vocabulary] = pieces
        try:
            return cls(model_bytes, pieces, append_eos=append_eos, specials=specials, prefix=prefix)
        except NotAModelError as error:
            raise ValueError(f"{str(model)!r} is damaged: {error}") from None
        except VocabularyError as error:
            raise ValueError(f"{str(vocabulary)!r} is damaged: {error}") from None
        except ValueError as error:  # the specials or the prefix are not all ids of the vocabulary
            raise ValueError(f"{str(vocabulary)!r} does not fit: {error}") from None

    def __len__(self) -> int:
        return len(self.symbols)

    def _parts(self, text: str) -> list[tuple[str, bool]]:
        """``text`` cut as ``MarianTokenizer`` cuts it: ``(piece, True)`` for a special's text and a language code,
        each a piece of its own, ``(part, False)`` for what SentencePiece cuts."""
        if not text.startswith(">>") and self.special_split.search(text) is None:
            return [(text, False)]
        parts = []
        for part in self.special_split.split(text):
            if part in self.special_texts:
                parts.append((part, True))
            elif part:
                if part.startswith(">>") and (end := part.find("<<")) != -1:
                    parts.append((part[: end + 2], True))
                    part = part[end + 2 :]
                parts.append((part, False))
        return parts

    def with_prefix(self, prefix: Sequence[int]) -> SentencePieceTokenizer:
        """A tokenizer of the same SentencePiece model and vocabulary whose texts open with ``prefix``: what a run
        that chose another pair of a many-language model's languages keeps."""
        return SentencePieceTokenizer(self.model, self.vocabulary, append_eos=self.append_eos, specials=self.specials,
                                      prefix=prefix)  # fmt: skip

    def _ended(self, ids: list[int], layout: list[tuple[str, bool]], prefix: Sequence[int]) -> list[int]:
        """The ids of a text cut as ``layout`` with ``prefix`` before them (unless the text opens with a language code
        of its own, ``>>fra<<``, which takes its place) and, where ``append_eos``, EOS after them."""
        own_code = bool(layout) and layout[0][1] and layout[0][0].startswith(">>")
        opening = () if own_code else prefix
        return [*opening, *ids, self.specials.eos] if self.append_eos else [*opening, *ids]

    def encode(self, text: str, *, prefix: Sequence[int] | None = None) -> tuple[list[int], list[str]]:
        """:meth:`Tokenizer.encode`; ``prefix``: the ids the text opens with instead of :attr:`prefix` (another
        language's token)."""
        layout = self._parts(text)
        pieces = [
            piece
            for part, whole in layout
            for piece in ([part] if whole else self.processor.encode(part, out_type=str))
        ]
        ids = [self.vocabulary.get(piece, self.specials.unk) for piece in pieces]
        opening = self.prefix if prefix is None else prefix
        return self._ended(ids, layout, opening), [piece for piece in pieces if piece not in self.vocabulary]

    def encode_all(self, texts: Sequence[str]) -> list[list[int]]:
        """SentencePiece cuts all the texts at once, into its own ids, which become ours; a part holding what it does
        not know is cut again into pieces, as the vocabulary may have one for it."""
        layouts = [self._parts(text) for text in texts]
        cut = iter(self.processor.encode([part for layout in layouts for part, whole in layout if not whole]))
        unknown, unk = self.processor.unk_id(), self.specials.unk
        encoded = []
        for layout in layouts:
            ids: list[int] = []
            for part, whole in layout:
                if whole:
                    ids.append(self.vocabulary.get(part, unk))
                    continue
                numbers = next(cut)
                if unknown in numbers:
                    pieces = self.processor.encode(part, out_type=str)
                    ids += [self.vocabulary.get(piece, unk) for piece in pieces]
                else:
                    ids += map(self.piece_ids.__getitem__, numbers)
            encoded.append(self._ended(ids, layout, self.prefix))
        return encoded

    def corpus_encoder(self) -> Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]:
        return text_by_text(self)

    def decode(self, ids: Iterable[int]) -> str:
        """As ``MarianTokenizer.decode(ids, skip_special_tokens=True)`` with this side's SentencePiece model, which
        joins the pieces (a language code stays as it reads); the text loses its outer spaces. (For a shared vocabulary
        Transformers 5 takes the source's model, which reads the same unless the two models' rules differ.)"""
        kept = []
        for index in ids:
            if index == self.specials.eos:
                break
            if index not in self.skipped and 0 <= index < len(self.symbols):
                kept.append(self.symbols[index])
        return self.processor.decode_pieces(kept).replace(self.MARK, " ").strip()

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.symbols[index] for index in ids]

    def word_starts(self, ids: Sequence[int]) -> list[bool]:
        """A token starts a word when it carries the word mark, is a special or is a language code."""
        return [
            piece.startswith(self.MARK) or index in self.skipped or (piece.startswith(">>") and piece.endswith("<<"))
            for index, piece in zip(ids, self.pieces(ids), strict=True)
        ]


@functools.cache
def word_ends(tokenizer: Tokenizer, size: int) -> np.ndarray:
    """The ids of a target vocabulary of ``size`` that may follow a word written whole without joining it, bools
    ``(size,)``: those that begin a word, and those that begin with neither a letter nor a digit (punctuation, ``'s``,
    specials); none past the tokenizer's own. Kept for each tokenizer (hashed by identity) and size."""
    ids = list(range(min(size, len(tokenizer))))
    ends = np.zeros(size, dtype=bool)
    starts, pieces = tokenizer.word_starts(ids), tokenizer.pieces(ids)
    ends[: len(ids)] = [start or not piece[:1].isalnum() for start, piece in zip(starts, pieces, strict=True)]
    return ends


def forcing(target: Tokenizer, forced: Sequence[int]) -> Tokenizer:
    """``target`` encoding every text after the ``forced`` tokens (a multilingual model's target-language code,
    which generation forces first): what training's targets are made with, as Transformers' labels hold the code."""
    if not forced:
        return target
    if not isinstance(target, SentencePieceTokenizer):
        raise TypeError(f"forced tokens go with a SentencePiece vocabulary, not a {type(target).__name__}")
    found = copy.copy(target)  # the model and vocabulary shared: this is made at every evaluation
    found.prefix = tuple(forced)
    return found


def source_prefix(tokenizer: Tokenizer) -> tuple[int, ...]:
    """The ids ``tokenizer`` opens every text with: a SentencePiece tokenizer's :attr:`~SentencePieceTokenizer.prefix`
    (a language's token); none for the others."""
    return tokenizer.prefix if isinstance(tokenizer, SentencePieceTokenizer) else ()


def encode_opened(tokenizer: Tokenizer, text: str, prefix: Sequence[int]) -> tuple[list[int], list[str]]:
    """:meth:`Tokenizer.encode` of ``text``, opened with ``prefix`` instead of the tokenizer's own
    (:func:`source_prefix`): another language's token, which only a SentencePiece vocabulary holds."""
    if isinstance(tokenizer, SentencePieceTokenizer):
        return tokenizer.encode(text, prefix=prefix)
    return tokenizer.encode(text)


class NotAModelError(ValueError):
    """Bytes that are not a SentencePiece model."""


class VocabularyError(ValueError):
    """A vocabulary that is not one piece -> id object of ids 0 to its size - 1."""


def sentencepiece_processor(model: bytes) -> Any:
    """A ``sentencepiece.SentencePieceProcessor`` of a model file's bytes; :class:`NotAModelError` for what is not
    one."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(model)
    except RuntimeError as error:
        raise NotAModelError(f"not a SentencePiece model ({str(error).splitlines()[0]})") from None
    return processor


def vocabulary_symbols(vocabulary: Any) -> list[str]:
    """The pieces of a vocabulary (piece -> id) in the order of their ids, which must be 0 to its size - 1, each
    given once (as Marian's are); :class:`VocabularyError` otherwise."""
    if not isinstance(vocabulary, dict) or not vocabulary:
        raise VocabularyError("a vocabulary must be a non-empty JSON object of pieces and their ids")
    if set(map(type, vocabulary)) != {str} or "" in vocabulary or set(map(type, vocabulary.values())) != {int}:
        wrong = [
            (piece, index)
            for piece, index in vocabulary.items()
            if not isinstance(piece, str) or not piece or type(index) is not int
        ]
        raise VocabularyError(
            f"a vocabulary must give each piece (a non-empty string) an integer id, received {wrong[:5]}"
        )
    ids = sorted(vocabulary.values())
    if ids != list(range(len(ids))):
        repeated = sorted(index for index, count in Counter(ids).items() if count > 1)
        found = f"{repeated[:5]} more than once" if repeated else f"ids from {ids[0]} to {ids[-1]}"
        raise VocabularyError(f"a vocabulary's ids must be 0 to {len(ids) - 1}, each given once, received {found}")
    return sorted(vocabulary, key=vocabulary.__getitem__)


def sentencepiece_files(side: str, tokenizer: SentencePieceTokenizer, other: Tokenizer) -> tuple[str, str]:
    """The files of one side's SentencePiece model and vocabulary in a checkpoint: one file for what both sides
    share."""
    if not isinstance(other, SentencePieceTokenizer):
        return f"{side}.spm", f"vocab.{side}.json"
    model = "sentencepiece.spm" if other.model == tokenizer.model else f"{side}.spm"
    vocabulary = "vocab.json" if other.symbols == tokenizer.symbols else f"vocab.{side}.json"
    return model, vocabulary


def sentencepiece_entry(
    entry: dict[str, Any], directory: Path, side: str, read: dict[Path, Any] | None = None
) -> SentencePieceTokenizer:
    """The tokenizer the manifest in ``directory`` describes for ``side``; ``ValueError`` naming the damaged file.
    ``read``: vocabularies read before (see :meth:`SentencePieceTokenizer.from_files`)."""
    names = [entry.get("model"), entry.get("vocabulary")]
    specials, prefix = entry.get("specials"), entry.get("prefix", [])
    if (
        set(entry) - {"prefix"} != {"kind", "model", "vocabulary", "append_eos", "specials"}
        or not isinstance(prefix, list)
        or not all(type(value) is int for value in prefix)
        or not all(isinstance(name, str) and name and Path(name).name == name for name in names)
        or not isinstance(entry["append_eos"], bool)
        or not isinstance(specials, dict)
        or set(specials) != {"pad", "bos", "eos", "unk"}
        or not all(type(value) is int for value in specials.values())
    ):
        raise ValueError(
            f"{str(directory / MANIFEST)!r} is damaged: its {side} must name a SentencePiece model and vocabulary "
            "beside it, say whether to append EOS, give the ids of pad, bos, eos and unk, and may give a prefix of ids"
        )
    return SentencePieceTokenizer.from_files(
        directory / entry["model"], directory / entry["vocabulary"], append_eos=entry["append_eos"],
        specials=Specials(**specials), prefix=prefix, read=read,
    )  # fmt: skip


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


def digest(source: Tokenizer, target: Tokenizer, *, prefixes: bool = True) -> str:
    """A SHA-256 of both tokenizers' vocabularies and rules: the same only for the same tokenizers. Without
    ``prefixes``, the ids they open texts with left out: the same for every pair of a many-language model's
    languages."""
    described = [_described(tokenizer, prefix=prefixes) for tokenizer in (source, target)]
    return hashlib.sha256(json.dumps(described).encode("utf-8")).hexdigest()


def _described(tokenizer: Tokenizer, *, prefix: bool = True) -> str:
    """A tokenizer's whole vocabulary and rules as text (``prefix``: with the ids it opens texts with)."""
    if isinstance(tokenizer, SubwordTokenizer):
        return tokenizer.to_json()
    if isinstance(tokenizer, SymbolTokenizer):
        return json.dumps(tokenizer.to_dict())
    if isinstance(tokenizer, SentencePieceTokenizer):
        model = hashlib.sha256(tokenizer.model).hexdigest()
        rules = {"append_eos": tokenizer.append_eos, "specials": asdict(tokenizer.specials)}
        rules |= {"prefix": tokenizer.prefix} if tokenizer.prefix and prefix else {}  # as one without always was
        return json.dumps({"kind": tokenizer.kind, "model": model, "symbols": tokenizer.symbols, **rules})
    raise TypeError(f"no description of a {type(tokenizer).__name__}")


def save_tokenizers(source: Tokenizer, target: Tokenizer, directory: Path) -> list[str]:
    """Write the manifest and any subword vocabulary, SentencePiece model and vocabulary of its pieces into
    ``directory``; return the file names written."""
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
        elif isinstance(tokenizer, SentencePieceTokenizer):
            model, vocabulary = sentencepiece_files(side, tokenizer, target if side == "source" else source)
            manifest[side] = {
                "kind": tokenizer.kind, "model": model, "vocabulary": vocabulary, "append_eos": tokenizer.append_eos,
                "specials": asdict(tokenizer.specials), **({"prefix": tokenizer.prefix} if tokenizer.prefix else {}),
            }  # fmt: skip
            pieces = json.dumps(tokenizer.vocabulary, ensure_ascii=False).encode("utf-8")
            for name, content in ((model, tokenizer.model), (vocabulary, pieces)):
                if name not in written:
                    (directory / name).write_bytes(content)
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
    vocabularies: dict[Path, Any] = {}
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
        elif isinstance(entry, dict) and entry.get("kind") == "sentencepiece":
            sides[side] = sentencepiece_entry(entry, directory, side, vocabularies)
        else:
            try:
                sides[side] = SymbolTokenizer.from_dict(entry)
            except ValueError as error:
                raise ValueError(f"{str(path)!r} is damaged: {error}") from None
    source, target = sides["source"], sides["target"]
    if manifest.get("joint") is True and source is not target:
        # One object for a joint vocabulary, as it was trained: `source is target` is what ties the embeddings and
        # what the next save writes as "joint".
        if _described(source) != _described(target):
            raise ValueError(f"{str(path)!r} is damaged: it says joint, but its source and target vocabularies differ")
        target = source
    return source, target
