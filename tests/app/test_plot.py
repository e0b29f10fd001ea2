"""The attention plot's words: subwords merged back, columns summed (attention received), rows averaged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def test_a_bare_word_mark_and_white_space_are_shown_never_an_empty_label() -> None:
    pieces = ["▁", "今", "▁runs", "▁", ".", " ", "\u3000", "<eos>"]  # a subword mark alone, white space of a char run
    labels = [word for word, _ in words(pieces, [True] * len(pieces))]
    assert labels == ["▁", "今", "runs", "▁", ".", "␣", "U+3000", "⟨eos⟩"]
    assert all(label.strip() for label in labels)


def _legend_texts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, history: dict[str, Any]) -> list[list[str]]:
    """The texts of every legend of the history figure, one list per legend."""
    import matplotlib.pyplot as plt

    import multihead.app.plot as plot

    figures: list = []
    monkeypatch.setattr(plot, "_save", lambda figure, path: figures.append(figure))
    plot.plot_history(history, tmp_path / "history.png")
    try:
        legends = [axis.get_legend() for axis in figures[0].axes]
        return [[text.get_text() for text in legend.get_texts()] for legend in legends if legend is not None]
    finally:
        plt.close(figures[0])


@pytest.mark.parametrize(
    ("metric", "smoothing", "training"),
    [
        ("bleu", 0.1, "training loss (label smoothing 0.1)"),
        ("accuracy", 0.0, "training loss (no label smoothing)"),
        ("bleu", None, "training loss (with the run's --label-smoothing)"),  # a history without it
    ],
)
def test_the_history_legend_names_the_smoothing_and_every_series(
    metric: str, smoothing: float | None, training: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    history: dict[str, Any] = {
        "metric": metric,
        "losses": [[1, 5.0], [2, 4.0], [3, 3.5]],
        "evals": [{"step": 2, "valid_loss": 4.4, metric: 10.0}, {"step": 3, "valid_loss": 4.1, metric: 12.0},
                  {"step": 3, "valid_loss": 4.0, metric: 13.0, "checkpoint": "average"}],
    }  # fmt: skip
    if smoothing is not None:
        history["label_smoothing"] = smoothing
    score = {"bleu": "validation BLEU", "accuracy": "held-out exact match"}[metric]
    assert _legend_texts(monkeypatch, tmp_path, history) == [[training, "validation loss (no label smoothing)", score]]
