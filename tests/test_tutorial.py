"""The tutorials run from top to bottom (their claims are asserts), write their figures, and the Chinese one has
the same code as the English one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
TUTORIALS = ["tutorial.py", "tutorial.zh-CN.py"]
FIGURES = ["scaled_dot_product.png", "masks.png", "dates_attention.png", "multi30k_attention.png"]
MULTI30K = DOCS.parents[1] / "shared" / "data" / "multi30k"  # beside the checkout, where CI has it
TENSORFLOW_NOISE = re.compile(r"absl::InitializeLog|oneDNN custom operations|^[IWEF]\d{4} \d\d:\d\d:\d\d")
"""TensorFlow's start-up notices and C++ log lines (``I0000 00:00:1795710774.415454 7464 port.cc:153] ...``)."""


def cells(name: str, kind: str) -> list[str]:
    return [cell.source for cell in jupytext.read(DOCS / name).cells if cell.cell_type == kind]


@pytest.mark.parametrize("name", TUTORIALS)
def test_tutorial_runs_and_writes_its_figures(name: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "MULTIHEAD_TUTORIAL_OUT": str(tmp_path),
        "MULTIHEAD_TUTORIAL_STEPS": "20",  # the full 1500 steps take two minutes; the code path is the same
        "MULTI30K": str(MULTI30K),
        "MPLBACKEND": "Agg",
    }
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the tutorial quiets TensorFlow itself
    result = subprocess.run(
        [sys.executable, str(DOCS / name)], env=env, cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "after 20 steps" in result.stdout
    corpus = "Multi30k from" if (MULTI30K / "train.de.gz").exists() else "a tiny made-up corpus instead"
    assert corpus in result.stdout
    assert "greedy: BLEU" in result.stdout
    assert "beam 4: BLEU" in result.stdout
    assert "(nrefs:1|case:mixed|eff:no|tok:13a|" in result.stdout
    # An undertrained model never ends a sentence: its searches are capped below the default length limit.
    capped = re.search(r"translations capped at (\d+) tokens \(by default at most (\d+)\)", result.stdout)
    assert capped, result.stdout[-3000:]
    assert int(capped[1]) < int(capped[2])
    noise = [line for line in (result.stdout + result.stderr).splitlines() if TENSORFLOW_NOISE.search(line)]
    assert not noise, noise
    for figure in FIGURES:
        assert (tmp_path / figure).read_bytes()[:4] == b"\x89PNG", figure


def test_translation_has_the_same_code_cells() -> None:
    english, chinese = cells("tutorial.py", "code"), cells("tutorial.zh-CN.py", "code")
    assert len(english) > 10
    assert chinese == english


def test_translation_is_translated() -> None:
    english, chinese = cells("tutorial.py", "markdown"), cells("tutorial.zh-CN.py", "markdown")
    assert len(chinese) == len(english)
    han = re.compile(r"[\u4e00-\u9fff]")
    assert all(han.search(text) for text in chinese)
    assert not any(han.search(text) for text in english)


@pytest.mark.parametrize("name", TUTORIALS)
def test_notebook_is_generated_from_the_script(name: str) -> None:
    notebook = jupytext.read(DOCS / name)
    headings = [cell.source.splitlines()[0] for cell in notebook.cells if cell.cell_type == "markdown"]
    assert sum(heading.startswith("## ") for heading in headings) >= 8
    assert jupytext.writes(notebook, fmt="ipynb").startswith("{")
