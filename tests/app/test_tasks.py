"""Built-in tasks and the character and word tokenizers."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from multihead.app.console import UserError
from multihead.app.data import load_task
from multihead.app.generated import TASKS, number_words
from multihead.app.tokenizers import BOS, EOS, PAD, UNK
from multihead.app.tokenizers import SymbolTokenizer as Tokenizer


@pytest.mark.parametrize("name", TASKS)
def test_tasks_are_deterministic_with_disjoint_splits(name: str) -> None:
    first, second = load_task(name), load_task(name)
    assert first.heldout == second.heldout
    assert len(first.heldout) == 1000
    assert first.batch(0, 7, 50) == second.batch(0, 7, 50)
    assert first.batch(0, 7, 50) != first.batch(1, 7, 50)
    training_sources = {source for step in range(40) for source, _ in first.batch(0, step, 50)}
    assert not training_sources & {source for source, _ in first.heldout}


def test_dates_targets_are_iso_of_the_source() -> None:
    for source, target in load_task("dates").batch(0, 0, 200):
        day = dt.date.fromisoformat(target)
        assert str(day.year) in source
        assert str(day.day) in source


def test_number_words() -> None:
    assert number_words(0) == "zero"
    assert number_words(13) == "thirteen"
    assert number_words(40) == "forty"
    assert number_words(342506) == "three hundred forty-two thousand five hundred six"
    assert number_words(100000) == "one hundred thousand"
    for source, target in load_task("numbers").batch(0, 0, 100):
        assert number_words(int(target)) == source


def test_toy_tasks() -> None:
    for source, target in load_task("reverse").batch(0, 0, 20):
        assert target == source[::-1]
    for source, target in load_task("sort").batch(0, 0, 20):
        assert target == "".join(sorted(source))
    for source, target in load_task("copy").batch(0, 0, 20):
        assert target == source


def test_unknown_task() -> None:
    with pytest.raises(UserError, match=r"unknown task 'weather'; built-in tasks are dates, numbers"):
        load_task("weather")


@pytest.mark.parametrize("kind", ["char", "word"])
def test_tokenizer_round_trip(kind: str) -> None:
    texts = ["the 4th of July 1976", "21 November 2026", "zebra"]
    tokenizer = Tokenizer.build(kind, texts)
    for text in texts:
        ids, unknown = tokenizer.encode(text)
        assert unknown == []
        assert tokenizer.decode([BOS, *ids, EOS, PAD, PAD]) == text
    clone = Tokenizer.from_dict(tokenizer.to_dict())
    assert clone.symbols == tokenizer.symbols
    assert clone.kind == kind


def test_tokenizer_unknown_symbols_and_stop_at_eos() -> None:
    tokenizer = Tokenizer.build("char", ["abc"])
    ids, unknown = tokenizer.encode("abz")
    assert ids[-1] == UNK
    assert unknown == ["z"]
    assert tokenizer.decode([*ids[:2], EOS, *ids[:2]]) == "ab"
    assert tokenizer.decode(ids) == "ab<unk>"
    with pytest.raises(ValueError, match="kind must be 'char' or 'word', received 'bytes'"):
        Tokenizer("bytes", [])
    with pytest.raises(ValueError, match="'kind' and 'symbols'"):
        Tokenizer.from_dict({"kind": "char"})


def test_vocabulary_does_not_depend_on_order() -> None:
    assert Tokenizer.build("char", ["ba", "c"]).symbols == Tokenizer.build("char", ["c", "ab"]).symbols
    assert np.all(np.diff([Tokenizer.build("char", ["zyx"]).ids[c] for c in "xyz"]) > 0)


def test_task_name_of_the_wrong_kind_is_named() -> None:
    with pytest.raises((ValueError, TypeError), match=r"task"):
        load_task(["dates"])
