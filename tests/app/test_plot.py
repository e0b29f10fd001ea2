"""The attention plot's words: subwords merged back, columns summed (attention received), rows averaged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from app.support import SAMPLES, Cli, CorpusRun
from multihead.app.plot import merge_words, words
from multihead.app.translate import Translator


def test_subwords_become_words_and_marks_go() -> None:
    pieces = ["▁Ein", "▁Mann", "▁sp", "ring", "t", ".", "<eos>"]
    starts = [True, True, True, False, False, True, True]
    assert words(pieces, starts) == [("Ein", [0]), ("Mann", [1]), ("springt", [2, 3, 4]), (".", [5]), ("⟨eos⟩", [6])]


def test_characters_stay_one_word_each_with_spaces_shown() -> None:
    assert words(list("a b"), [True, True, True]) == [("a", [0]), ("␣", [1]), ("b", [2])]


def test_word_attention_sums_columns_and_averages_rows() -> None:
    rng = np.random.default_rng(0)
    weights = rng.random((2, 3, 4))
    weights /= weights.sum(-1, keepdims=True)  # (H, Lt, Ls), rows sum to 1
    merged = merge_words(weights, rows=[[0, 1], [2]], columns=[[0], [1, 2, 3]])
    assert merged.shape == (2, 2, 2)
    np.testing.assert_allclose(merged[:, 0, 1], weights[:, :2, 1:].sum(-1).mean(-1))
    np.testing.assert_allclose(merged[:, 1, 0], weights[:, 2, 0])
    np.testing.assert_allclose(merged.sum(-1), 1.0)  # each word row is still a distribution


def test_a_subword_translation_plots_words(corpus_run: CorpusRun, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import multihead.app.plot as plot

    shown: list[list[list[int]]] = []  # the columns of each layer's map
    original = plot.merge_words

    def recorded(weights: np.ndarray, rows: list[list[int]], columns: list[list[int]]) -> np.ndarray:
        shown.append(columns)
        return original(weights, rows, columns)

    monkeypatch.setattr(plot, "merge_words", recorded)
    translation = Translator(corpus_run.path).attention(SAMPLES[0])
    plot.plot_cross_attention(translation, tmp_path / "words.png")
    source_words = words(translation.source_tokens, translation.source_word_starts)
    assert [w for w, _ in source_words] == [*SAMPLES[0].replace(".", " .").split()]
    assert len(shown[0]) == len(source_words)  # the plot's columns are the words
    assert (tmp_path / "words.png").read_bytes()[:4] == b"\x89PNG"


def test_translate_shows_a_progress_bar_on_a_terminal(
    corpus_run: CorpusRun, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    result = cli("translate", corpus_run.path, *SAMPLES)
    assert result.status == 0
    assert f"{len(SAMPLES)}/{len(SAMPLES)}" in result.err
    assert "sentence" in result.err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert "sentence" not in cli("translate", corpus_run.path, *SAMPLES).err
