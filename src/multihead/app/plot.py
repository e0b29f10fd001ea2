"""Pictures of a run: every decoder layer's cross-attention (one heatmap per head), and its history.

Subwords are merged back into words on the attention maps: a source word's column is the sum of its subwords'
columns (the attention it receives), a target word's row the mean of its subwords' rows (each row sums to 1). Every
row and column is labelled with what the model read: a bare word mark as ``▁``, a space as ``␣``.

The history shows the training loss (label-smoothed when the run smooths: the legend says by how much where the
history records ``label_smoothing``), the validation loss (never smoothed) and the validation metric, in one legend.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from multihead.app.translate import Translation
from multihead.files import atomic_write, check_file_target

__all__ = ["plot_cross_attention", "plot_history", "words"]

SHOWN = {" ": "␣", "<eos>": "⟨eos⟩", "</s>": "⟨eos⟩"}  # </s>: a Marian (OPUS-MT) vocabulary's EOS
METRICS = {"bleu": "validation BLEU", "accuracy": "held-out exact match"}
"""The history's ``metric`` as the plot names it."""
CJK_FONT_FILES = r"CJK|wqy|DroidSansFallback"
"""File names of the fonts with Chinese characters that Debian packages (fonts-noto-cjk, fonts-wqy-*)."""


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@functools.cache
def cjk_font() -> str | None:
    """An installed font with Chinese and Japanese characters (Debian's ``fonts-noto-cjk``), or ``None``."""
    from matplotlib import font_manager

    found = [path for path in font_manager.findSystemFonts() if re.search(CJK_FONT_FILES, Path(path).name)]
    if not found:
        return None
    path = min(found, key=lambda path: ("Sans" not in path, "Bold" in path, path))  # a regular sans-serif first
    font_manager.fontManager.addfont(path)
    return font_manager.FontProperties(fname=path).get_name()


@functools.cache
def _drawable(character: str) -> bool:
    """Whether the plots' fonts have a glyph for ``character``."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    cjk = cjk_font()
    families = ["DejaVu Sans", *([cjk] if cjk else [])]
    return any(FT2Font(font_manager.findfont(family)).get_char_index(ord(character)) for family in families)


def shown(text: str) -> str:
    """``text`` as the plots can draw it: a character no font has becomes its code point (``U+72D7``)."""
    return "".join(c if c.isspace() or _drawable(c) else f"U+{ord(c):04X}" for c in text)


def _read(piece: str) -> str:
    """A token as its word shows it: the subword mark removed, ``<eos>`` and white space made visible (``␣``, others
    as code points)."""
    if piece in SHOWN:
        return SHOWN[piece]
    return "".join(SHOWN.get(c, f"U+{ord(c):04X}") if c.isspace() or not c.isprintable() else c
                   for c in piece.replace("▁", ""))  # fmt: skip


def words(pieces: Sequence[str], starts: Sequence[bool]) -> list[tuple[str, list[int]]]:
    """Group token positions into words: ``[(word, [positions])]``, subword marks removed, every word visible text.
    A word that is only the word mark ``▁`` shows it (the model read it, often attending much to it): BPE leaves the
    mark alone before a character it learned no merge with, such as the first of a Chinese sentence (no spaces)."""
    groups: list[tuple[str, list[int]]] = []
    for position, (piece, start) in enumerate(zip(pieces, starts, strict=True)):
        text = _read(piece)
        if start or not groups:
            groups.append((text, [position]))
        else:
            word, positions = groups[-1]
            groups[-1] = (word + text, [*positions, position])
    return [(word or "".join(pieces[p] for p in positions), positions) for word, positions in groups]


def merge_words(weights: np.ndarray, rows: list[list[int]], columns: list[list[int]]) -> np.ndarray:
    """``(H, Lt, Ls)`` token attention → ``(H, rows, columns)`` word attention: columns summed, rows averaged."""
    by_column = np.stack([weights[..., c].sum(-1) for c in columns], axis=-1)  # (H, Lt, words)
    return np.stack([by_column[:, r].mean(1) for r in rows], axis=1)  # (H, words, words)


def plot_cross_attention(translation: Translation, path: str | Path) -> Path:
    """Save a grid of heatmaps (rows: layers, columns: heads) with source words across, target words down. Chinese
    and Japanese are drawn with :func:`cjk_font` where one is installed, else as code points (no font warnings)."""
    path = check_file_target(path)
    plt = _pyplot()
    source = words(translation.source_tokens, translation.source_word_starts)
    target = words(translation.target_tokens, translation.target_word_starts)
    layers = [merge_words(w, [p for _, p in target], [p for _, p in source]) for w in translation.cross_attention]
    columns, rows = [shown(word) for word, _ in source], [shown(word) for word, _ in target]
    heads = layers[0].shape[0]
    width, height = len(source), len(target)
    cell = 0.28 if max(len(word) for word in columns) <= 2 else 0.45
    with plt.rc_context({"font.family": ["DejaVu Sans", *([cjk_font()] if cjk_font() else [])]}):
        figure, axes = plt.subplots(
            len(layers), heads, squeeze=False, layout="constrained",  # constrained: room for the title above
            figsize=(max(3.0, heads * (width * cell + 1.0)), max(2.5, len(layers) * (height * cell + 1.2))),
        )  # fmt: skip
        for layer, weights in enumerate(layers):
            for head in range(heads):
                axis = axes[layer][head]
                axis.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal")
                axis.set_xticks(range(width), columns, fontsize=7, rotation=90 if cell > 0.3 else 0)
                axis.set_yticks(range(height), rows, fontsize=7)
                axis.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=8)
        title = shown(f"{translation.source!r} → {translation.target!r}")
        figure.suptitle(f"{title}: cross-attention", fontsize=10)
        _save(figure, path)
    return path


def _training_loss(smoothing: float | None) -> str:
    """The training loss's name: its label smoothing (``None``: a history that does not record it)."""
    if smoothing is None:
        return "training loss (with the run's --label-smoothing)"
    return f"training loss (label smoothing {smoothing:g})" if smoothing else "training loss (no label smoothing)"


def plot_history(history: dict[str, Any], path: str | Path) -> Path:
    """Training loss (and validation loss) and the validation metric over steps, all named in one legend."""
    path = Path(path)
    plt = _pyplot()
    metric = history.get("metric", "bleu")
    figure, loss_axis = plt.subplots(figsize=(7, 4))
    steps, losses = zip(*history["losses"], strict=True) if history["losses"] else ((), ())
    loss_axis.plot(steps, losses, color="tab:blue", linewidth=0.6, alpha=0.6,
                   label=_training_loss(history.get("label_smoothing")))  # fmt: skip
    evals = [e for e in history["evals"] if "checkpoint" not in e]
    if any("valid_loss" in e for e in evals):
        loss_axis.plot([e["step"] for e in evals], [e["valid_loss"] for e in evals], "o-", color="tab:purple",
                       markersize=3, label="validation loss (no label smoothing)")  # fmt: skip
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("loss per target token")
    handles, labels = loss_axis.get_legend_handles_labels()
    legend_axis = loss_axis
    if evals:
        legend_axis = loss_axis.twinx()  # the metric's axis, drawn over the losses': the one legend goes on it
        name = METRICS[metric]
        (line,) = legend_axis.plot([e["step"] for e in evals], [e[metric] for e in evals], "s-", color="tab:red",
                                   markersize=3, label=name)  # fmt: skip
        legend_axis.set_ylabel(name, color="tab:red")
        handles, labels = [*handles, line], [*labels, name]
    legend_axis.legend(handles, labels, loc="upper left", fontsize=8)
    figure.tight_layout()
    _save(figure, path)
    return path


def _save(figure: Any, path: Path) -> None:
    plt = _pyplot()
    suffix = path.suffix or ".png"
    try:
        atomic_write(path, lambda tmp: figure.savefig(tmp, dpi=110, format=suffix.lstrip(".")))
    finally:
        plt.close(figure)  # pyplot keeps every open figure alive
