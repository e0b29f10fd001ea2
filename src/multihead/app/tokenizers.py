"""Character- and word-level tokenizers, saved with the model as JSON.

Ids 0-3 are the specials: ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``; the rest is the vocabulary seen in training.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
KINDS = ("char", "word")


class Tokenizer:
    """Maps text to ids and back; ``kind`` is ``"char"`` (every character a token) or ``"word"`` (whitespace)."""

    def __init__(self, kind: str, symbols: Iterable[str]) -> None:
        if kind not in KINDS:
            raise ValueError(f"tokenizer kind must be one of {KINDS}, received {kind!r}")
        self.kind = kind
        self.symbols = list(SPECIALS) + [s for s in dict.fromkeys(symbols) if s not in SPECIALS]
        self.ids = {symbol: index for index, symbol in enumerate(self.symbols)}

    @classmethod
    def build(cls, kind: str, texts: Iterable[str]) -> Tokenizer:
        """The vocabulary of ``texts``, in sorted order (so it does not depend on the order of the data)."""
        symbols = set()
        for text in texts:
            symbols.update(cls.split_text(kind, text))
        return cls(kind, sorted(symbols))

    @staticmethod
    def split_text(kind: str, text: str) -> list[str]:
        return list(text) if kind == "char" else text.split()

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, text: str) -> tuple[list[int], list[str]]:
        """Ids of ``text`` (no BOS/EOS) and the symbols that were not in the vocabulary (mapped to ``<unk>``)."""
        pieces = self.split_text(self.kind, text)
        unknown = [piece for piece in pieces if piece not in self.ids]
        return [self.ids.get(piece, UNK) for piece in pieces], unknown

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first ``<eos>``, without specials other than ``<unk>``."""
        pieces = []
        for index in ids:
            if index == EOS:
                break
            if index in (PAD, BOS):
                continue
            pieces.append(self.symbols[index] if 0 <= index < len(self.symbols) else SPECIALS[UNK])
        return ("" if self.kind == "char" else " ").join(pieces)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "symbols": self.symbols[len(SPECIALS) :]}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Tokenizer:
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
