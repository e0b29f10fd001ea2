"""The encoded corpus: compact ids, the run's cache of them, the vocabulary sample, and the memory they take."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.support import SMALL, TRAIN, VALID, write_corpus, write_lines
from multihead.app.batching import CorpusBatches
from multihead.app.data import load_corpus, survey
from multihead.app.encoded import EncodedCorpus, encode_pairs, read_cache, write_cache
from multihead.app.runs import ENCODED
from multihead.app.tokenizers import Specials, SubwordTokenizer, WordIds, build_tokenizers
from multihead.app.training import Training, TrainOptions, train


def ids(rng: np.random.Generator, count: int, vocabulary: int) -> list[list[int]]:
    return [rng.integers(4, vocabulary, rng.integers(1, 30)).tolist() for _ in range(count)]


@pytest.mark.parametrize(("vocabulary", "dtype"), [(8000, np.uint16), (1 << 16, np.uint16), (70_000, np.int32)])
def test_sentences_are_slices_of_one_flat_array(vocabulary: int, dtype: type) -> None:
    rng = np.random.default_rng(0)
    sources, targets = ids(rng, 50, vocabulary), ids(rng, 50, vocabulary)
    corpus = EncodedCorpus.of(sources, targets, vocabulary)
    assert corpus.sources.tokens.dtype == dtype
    assert len(corpus) == 50
    assert [corpus.sources[i].tolist() for i in range(50)] == sources
    assert [corpus.targets[i].tolist() for i in range(50)] == targets
    assert corpus.targets.lengths.tolist() == [len(t) for t in targets]


def test_the_cache_gives_back_what_was_written_mapped_and_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(1)
    corpus = EncodedCorpus.of(ids(rng, 300, 8000), ids(rng, 300, 8000))
    key = {"train": [{"name": "a", "bytes": 1, "sha256": "0"}], "tokenizers": "x", "max_len": 256}
    directory = tmp_path / ENCODED
    assert read_cache(directory, key) is None  # none yet: nothing said
    write_cache(directory, corpus, key)
    cached = read_cache(directory, key)
    assert isinstance(cached.sources.tokens, np.memmap)  # shared by the processes of a machine, not copied
    for side in ("sources", "targets"):
        for array in ("tokens", "offsets"):
            np.testing.assert_array_equal(getattr(getattr(cached, side), array), getattr(getattr(corpus, side), array))
    # The same batches from the cache as from the corpus encoded in memory.
    for step in (0, 5, 40):
        for a, b in zip(CorpusBatches(cached, Specials(), 200, 3).batch(step).as_arrays(),
                        CorpusBatches(corpus, Specials(), 200, 3).batch(step).as_arrays(), strict=True):  # fmt: skip
            np.testing.assert_array_equal(a, b)
    assert capsys.readouterr().err == ""
    # Made from something else: not used, and said.
    assert read_cache(directory, {**key, "tokenizers": "y"}) is None
    assert "was encoded from another corpus or vocabulary: encoding the corpus again" in capsys.readouterr().err
    # Damaged: not used, and said.
    tokens = directory / "target.tokens.npy"
    tokens.write_bytes(tokens.read_bytes()[:-10])
    assert read_cache(directory, key) is None
    assert "is damaged (target.tokens.npy does not match its SHA-256): encoding the corpus again" in (
        capsys.readouterr().err
    )
    (directory / "manifest.json").write_text("{", encoding="utf-8")
    assert read_cache(directory, key) is None
    assert "is damaged" in capsys.readouterr().err


def options(tmp_path: Path, **overrides: Any) -> TrainOptions:
    data = write_corpus(tmp_path / "corpus")
    valid = write_corpus(tmp_path / "corpus", VALID, "valid")
    base = dict(vocab_size=120, batch_tokens=120, steps=3, warmup=4, average=0, eval_every=1000, **SMALL)
    return TrainOptions(out=str(tmp_path / "run"), data=data, valid=valid, **{**base, **overrides})


def encodings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the pairs the subword tokenizer encodes in batches from now on."""
    counted: list[int] = []
    originals = {(owner, name): getattr(owner, name) for owner, name in ((SubwordTokenizer, "encode_all"),
                                                                          (WordIds, "encode"))}  # fmt: skip

    def counting(original: Callable[[Any, list[str]], Any]) -> Callable[[Any, list[str]], Any]:
        def encode(self: Any, texts: list[str]) -> Any:
            counted.append(len(texts))
            return original(self, texts)

        return encode

    for (owner, name), original in originals.items():
        monkeypatch.setattr(owner, name, counting(original))
    return counted


def test_a_run_encodes_its_corpus_once_and_resumes_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    train(options(tmp_path))
    run = tmp_path / "run"
    manifest = json.loads((run / ENCODED / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["pairs"] == len(TRAIN)
    assert manifest["key"]["train"][0]["name"] == "train.de"
    counted = encodings(monkeypatch)
    resumed = Training(options(tmp_path, steps=6, resume=True))
    resumed.build()
    assert sum(counted) <= 2 * len(VALID)  # only validation sentences, never the training corpus
    assert isinstance(resumed.setup.prepared.encoded.sources.tokens, np.memmap)
    # A truncated cache is rebuilt, with a warning, and written again whole.
    resumed.lock.release()
    before = np.array(resumed.setup.prepared.encoded.sources.offsets)
    offsets = run / ENCODED / "source.offsets.npy"
    offsets.write_bytes(offsets.read_bytes()[:-8])
    capsys.readouterr()
    again = Training(options(tmp_path, steps=6, resume=True))
    again.build()
    again.lock.release()
    assert "is damaged" in capsys.readouterr().err
    assert sum(counted) >= len(TRAIN)  # encoded again
    rebuilt = json.loads((run / ENCODED / "manifest.json").read_text(encoding="utf-8"))
    assert rebuilt == manifest
    np.testing.assert_array_equal(again.setup.prepared.encoded.sources.offsets, before)


def test_the_vocabulary_sample_is_fixed_in_corpus_order_and_at_most_its_size(tmp_path: Path) -> None:
    pairs = [(f"quelle {i}", f"ziel {i}") for i in range(500)]
    corpus = load_corpus(write_corpus(tmp_path, pairs), write_corpus(tmp_path, pairs[:5], "valid"))
    whole = survey(corpus, 1000)
    assert whole.sample == pairs  # a smaller corpus: all of it, in order
    assert whole.size == 500
    assert whole.valid_in_training
    sample = survey(corpus, 50, seed=3)
    assert len(sample.sample) == 50
    assert set(sample.sample) < set(pairs)
    assert sample.sample == sorted(sample.sample, key=pairs.index)
    assert survey(corpus, 50, seed=3).sample == sample.sample  # the same seed, the same sample
    assert survey(corpus, 50, seed=4).sample != sample.sample


def test_a_large_corpus_is_learned_from_its_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    learned: list[int] = []
    original = SubwordTokenizer.train.__func__

    def spy(cls: type, texts: Any, vocab_size: int) -> SubwordTokenizer:
        texts = list(texts)
        learned.append(len(texts))
        return original(cls, texts, vocab_size)

    monkeypatch.setattr(SubwordTokenizer, "train", classmethod(spy))
    train(options(tmp_path, vocab_sample=40, steps=1))
    assert learned == [80]  # one joint vocabulary: 40 sources and 40 targets
    assert f"from 40 sentence pairs, a sample of the {len(TRAIN)}" in capsys.readouterr().out


def test_memory_grows_by_a_few_bytes_per_token(tmp_path: Path) -> None:
    """100,000 generated pairs, encoded chunk by chunk: what stays is about 2 bytes a token (ids) and 8 a sentence
    (offsets); the peak adds one chunk's lists."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(3000)]
    lines = [" ".join(rng.choice(words, rng.integers(3, 25))) for _ in range(100_000)]
    data = [str(write_lines(tmp_path / "big.src", lines)), str(write_lines(tmp_path / "big.tgt", lines[::-1]))]
    tokenizer, _ = build_tokenizers("word", lines[:5000], lines[:5000], vocab_size=0, joint=True)
    corpus = load_corpus(data, [data[0], data[0]])
    tracemalloc.start()
    try:
        encoded = encode_pairs(corpus.pairs(), tokenizer, tokenizer, 256)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    tokens = len(encoded.sources.tokens) + len(encoded.targets.tokens)
    assert len(encoded) == 100_000
    assert encoded.nbytes / tokens < 3
    assert peak / tokens < 16, f"{peak / tokens:.1f} bytes per token"
