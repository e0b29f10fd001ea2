"""The `multihead` command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from multihead import __version__
from multihead.app.cli import DEMO_EXAMPLES, main


def test_demo_trains_translates_and_plots(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dates"
    assert main(["demo", "--out", str(out), "--steps", "2", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("accuracy: ") and "(exact match on 1000 held-out examples)" in line for line in lines)
    translations = [line for line in lines if " -> " in line]
    assert [line.split(" -> ")[0].strip() for line in translations] == [repr(text) for text in DEMO_EXAMPLES]
    assert (out / "attention.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["demo", "--out", str(out), "--steps", "2", "--no-progress"]) == 0  # a second run resumes


def test_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "multihead.app.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == f"multihead {__version__}"


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_unknown_command_exits_2() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2


def test_bench_options_reach_the_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[list[str]] = []
    monkeypatch.setattr("multihead.app.bench.main", lambda argv: received.append(argv) or 0)
    assert main(["bench", "--out", "somewhere", "--cases", "paper-forward", "--repeats", "1"]) == 0
    assert received == [["--out", "somewhere", "--cases", "paper-forward", "--repeats", "1"]]


def test_bench_help_lists_the_benchmark_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    assert "--generation" in capsys.readouterr().out
