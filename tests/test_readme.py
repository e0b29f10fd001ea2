"""The README's examples run, and its picture of the causal pattern is the real one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from multihead.torch import causal_mask

README = Path(__file__).resolve().parents[1] / "README.md"
README_ZH = README.with_name("README.zh-CN.md")


def python_blocks(readme: Path = README) -> list[str]:
    return re.findall(r"```python\n(.*?)```", readme.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_python_examples() -> None:
    assert python_blocks()


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_example_runs(index: int) -> None:
    exec(compile(python_blocks()[index], f"README.md block {index}", "exec"), {})


def test_chinese_readme_examples_are_the_english_ones() -> None:
    """The translation's examples are copied from README.md, which runs them."""
    assert set(python_blocks(README_ZH)) <= set(python_blocks())
    assert "make demo" in README_ZH.read_text(encoding="utf-8")
    assert "README.zh-CN.md" in README.read_text(encoding="utf-8")


def test_readme_causal_table_matches_causal_mask() -> None:
    text = README.read_text(encoding="utf-8")
    lq, lk = map(int, re.search(r"<!-- causal-table: causal_mask\((\d+), (\d+)\) -->", text).groups())
    rows = re.findall(r"^\| query \d+ \|(.*)\|$", text, flags=re.M)
    table = [[cell.strip() == "✓" for cell in row.split("|")] for row in rows]
    assert torch.equal(torch.tensor(table), causal_mask(lq, lk))


def test_readme_shows_both_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text
    assert "make test" in text
