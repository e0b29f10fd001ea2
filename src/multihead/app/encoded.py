"""A corpus's token ids kept compact, and cached in the run directory so that it is encoded once.

Each side of a corpus is one flat array of every sentence's ids (``uint16`` while the vocabulary has at most 65,536
symbols, else ``int32``) and the offsets where each sentence begins, ``(n + 1,)`` ``int64``: about 2 bytes a token,
where lists of Python ints take about 36. Batching reads lengths and slices, never lists.

The cache, ``RUN/encoded/``, holds the four arrays as ``.npy`` files (read with ``allow_pickle=False``, memory-mapped:
processes on one machine share one copy) and ``manifest.json``: what the ids were made from (the corpus files'
fingerprints, the tokenizers' SHA-256, the length limit), how many pairs were kept and left out, and each file's
SHA-256. A cache whose key differs from the run's, or whose files do not match their checksums, is not used: the
corpus is encoded again, with a warning, and the cache rewritten.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from multihead.app.console import plural, progress_bar, say, warn
from multihead.app.corpus import Pair, file_sha256
from multihead.app.tokenizers import Tokenizer, flat
from multihead.files import write_directory

FORMAT = 1
MANIFEST = "manifest.json"
CHUNK = 10_000
"""Pairs encoded per call of the tokenizers' batch encoding (which runs on every core)."""
__all__ = ["EncodedCorpus", "Sentences", "encode_pairs", "read_cache", "write_cache"]


@dataclass
class Sentences:
    """One side of a corpus: sentence ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``."""

    tokens: np.ndarray  # (T,) uint16 or int32
    offsets: np.ndarray  # (n + 1,) int64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return self.tokens[self.offsets[index] : self.offsets[index + 1]]

    @property
    def lengths(self) -> np.ndarray:
        """``(n,)`` int64: each sentence's token count."""
        return np.diff(self.offsets)


@dataclass
class EncodedCorpus:
    """A corpus's training pairs as ids: the pairs that fit the model, and how many did not."""

    sources: Sentences
    targets: Sentences
    dropped: int

    def __len__(self) -> int:
        return len(self.sources)

    @classmethod
    def of(cls, sources: list[list[int]], targets: list[list[int]], vocabulary: int = 1 << 16) -> EncodedCorpus:
        """Pairs of id lists, none left out, as compact arrays for a vocabulary of ``vocabulary`` symbols."""
        sides = []
        for ids in (sources, targets):
            builder = _SideBuilder(_token_dtype(vocabulary))
            builder.add(*flat(ids))
            sides.append(builder.build())
        return cls(sides[0], sides[1], dropped=0)

    @property
    def nbytes(self) -> int:
        return sum(side.tokens.nbytes + side.offsets.nbytes for side in (self.sources, self.targets))


def _token_dtype(vocabulary: int) -> np.dtype:
    return np.dtype(np.uint16 if vocabulary <= 1 << 16 else np.int32)


class _SideBuilder:
    """A side's arrays, built chunk by chunk."""

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.tokens: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []

    def add(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Texts of ``lengths`` ids each, their ``ids`` one after another."""
        self.tokens.append(ids.astype(self.dtype))
        self.lengths.append(lengths)

    def build(self) -> Sentences:
        lengths = np.concatenate([np.zeros(1, np.int64), *self.lengths])
        tokens = np.concatenate(self.tokens) if self.tokens else np.zeros(0, self.dtype)
        return Sentences(tokens, np.cumsum(lengths))


def _chunks(pairs: Iterable[Pair], size: int) -> Iterator[list[Pair]]:
    iterator = iter(pairs)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def encode_pairs(
    pairs: Iterable[Pair],
    source: Tokenizer,
    target: Tokenizer,
    max_len: int,
    *,
    total: int | None = None,
    progress: bool = False,
) -> EncodedCorpus:
    """The ids of ``pairs`` (read as they come, ``CHUNK`` at a time) whose source fits ``max_len`` tokens and whose
    target fits with its BOS or EOS; a progress bar of pairs (``total`` of them) when ``progress``."""
    builders = _SideBuilder(_token_dtype(len(source))), _SideBuilder(_token_dtype(len(target)))
    encoders = (
        (source.corpus_encoder(),) * 2 if source is target else (source.corpus_encoder(), target.corpus_encoder())
    )
    dropped, begin = 0, time.perf_counter()
    bar = progress_bar(total, enabled=progress, unit="pair")
    for chunk in _chunks(pairs, CHUNK):
        sides = encoders[0]([s for s, _ in chunk]), encoders[1]([t for _, t in chunk])
        kept = (sides[0][1] <= max_len) & (sides[1][1] + 1 <= max_len)  # (pairs,)
        dropped += len(chunk) - int(kept.sum())
        for builder, (ids, lengths) in zip(builders, sides, strict=True):
            builder.add(ids[np.repeat(kept, lengths)], lengths[kept])
        bar.update(len(chunk))
    bar.close()
    corpus = EncodedCorpus(builders[0].build(), builders[1].build(), dropped)
    seconds, count = time.perf_counter() - begin, len(corpus) + dropped
    rate = f"{count / max(seconds, 1e-9):,.0f} pairs/s, {corpus.nbytes / 2**20:,.0f} MiB of ids"
    say(f"encoded {plural(count, 'sentence pair')} in {seconds:.1f} s ({rate})")
    return corpus


# --- the cache ------------------------------------------------------------------------------------------------

_ARRAYS = {
    "source.tokens.npy": ("sources", "tokens"),
    "source.offsets.npy": ("sources", "offsets"),
    "target.tokens.npy": ("targets", "tokens"),
    "target.offsets.npy": ("targets", "offsets"),
}


def write_cache(directory: Path, corpus: EncodedCorpus, key: dict[str, Any]) -> EncodedCorpus:
    """``corpus`` into ``directory`` (replaced whole, atomically), made from what ``key`` says; the same corpus read
    back from there, memory-mapped."""

    def write(staging: Path) -> None:
        files = {}
        for name, (side, array) in _ARRAYS.items():
            np.save(staging / name, getattr(getattr(corpus, side), array), allow_pickle=False)
            files[name] = file_sha256(staging / name)
        manifest = {"format": FORMAT, "key": key, "pairs": len(corpus), "dropped": corpus.dropped, "files": files}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")

    write_directory(directory, write, prefix=".encoded.")
    return _mapped(directory, corpus.dropped)


def _mapped(directory: Path, dropped: int) -> EncodedCorpus:
    arrays = {key: np.load(directory / name, mmap_mode="r", allow_pickle=False) for name, key in _ARRAYS.items()}
    return EncodedCorpus(
        Sentences(arrays["sources", "tokens"], arrays["sources", "offsets"]),
        Sentences(arrays["targets", "tokens"], arrays["targets", "offsets"]),
        dropped,
    )


def read_cache(directory: Path, key: dict[str, Any]) -> EncodedCorpus | None:
    """The corpus cached in ``directory`` if it was made from what ``key`` says and is intact, memory-mapped; else
    ``None``, with a warning saying why when there was a cache."""
    if not directory.exists():
        return None
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')!r}, not {FORMAT}")
        if manifest.get("key") != key:
            warn(f"{str(directory)!r} was encoded from another corpus or vocabulary: encoding the corpus again")
            return None
        for name in _ARRAYS:
            if file_sha256(directory / name) != manifest["files"][name]:
                raise ValueError(f"{name} does not match its SHA-256")
        corpus = _mapped(directory, int(manifest["dropped"]))
        if len(corpus) != manifest["pairs"] or len(corpus.targets) != manifest["pairs"]:
            raise ValueError(f"it holds {len(corpus)} pairs where its manifest says {manifest['pairs']}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        warn(f"{str(directory)!r} is damaged ({error}): encoding the corpus again")
        return None
    return corpus
