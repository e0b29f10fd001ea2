"""The `multihead` command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from multihead import __version__
from multihead.cli import main


def test_demo_prints_the_paper_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "output (64, 5, 512), weights (64, 8, 5, 5)" in out
    weight_rows = [line.split() for line in out.splitlines() if line.startswith("   ")]
    assert len(weight_rows) == 5
    for i, row in enumerate(weight_rows):  # causal: query i puts no weight on keys after i
        assert all(float(p) == 0.0 for p in row[i + 1 :])
        assert abs(sum(float(p) for p in row) - 1.0) < 0.03


def test_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "multihead.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == f"multihead {__version__}"


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_unknown_command_exits_2() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2
