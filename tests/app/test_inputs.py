"""Bad inputs to the application's tasks, corpus readers and tokenizers (moved from tests/torch/test_bad_inputs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multihead.app.corpus import read_parallel
from multihead.app.data import load_task
from multihead.app.tokenizers import SymbolTokenizer as Tokenizer
from multihead.app.training import TrainOptions

BAD = (ValueError, TypeError)


def test_task_name_of_the_wrong_kind_is_named() -> None:
    with pytest.raises(BAD, match=r"task"):
        load_task(["dates"])


def test_tokenizer_kind_is_checked_with_the_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tokenizer.*'byte'"):
        TrainOptions(out=str(tmp_path / "run"), task="copy", steps=1, tokenizer="byte")


def test_tsv_byte_order_mark_is_not_part_of_the_first_source(tmp_path: Path) -> None:
    path = tmp_path / "bom.tsv"
    path.write_bytes("\ufeffa\tb\nc\td\n".encode())
    assert read_parallel([path])[0] == ("a", "b")


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"kind": "char", "symbols": [1, 2]}, r"symbols"),
        ({"kind": "word", "symbols": [None]}, r"symbols"),
    ],
    ids=["integer-symbols", "none-symbol"],
)
def test_tokenizer_from_damaged_dict_refused(values: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Tokenizer.from_dict(values)
