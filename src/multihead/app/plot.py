"""Attention maps: every decoder layer's cross-attention, one heatmap per head."""

from __future__ import annotations

from pathlib import Path

from multihead.app.translate import Translation
from multihead.files import atomic_write, check_file_target


def _label(token: str) -> str:
    return {" ": "␣", "<eos>": "⟨eos⟩"}.get(token, token)


def plot_cross_attention(translation: Translation, path: str | Path) -> Path:
    """Save a grid of heatmaps (rows: layers, columns: heads) with source tokens across, target tokens down."""
    path = check_file_target(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = translation.cross_attention
    heads = layers[0].shape[0]
    width, height = len(translation.source_tokens), len(translation.target_tokens)
    cell = 0.28
    figure, axes = plt.subplots(
        len(layers), heads, squeeze=False,
        figsize=(max(3.0, heads * (width * cell + 1.0)), max(2.5, len(layers) * (height * cell + 1.2))),
    )  # fmt: skip
    for layer, weights in enumerate(layers):
        for head in range(heads):
            axis = axes[layer][head]
            axis.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal")
            axis.set_xticks(range(width), [_label(t) for t in translation.source_tokens], fontsize=7)
            axis.set_yticks(range(height), [_label(t) for t in translation.target_tokens], fontsize=7)
            axis.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=8)
    figure.suptitle(f"{translation.source!r} → {translation.target!r}: cross-attention", fontsize=10)
    figure.tight_layout()
    suffix = path.suffix or ".png"
    try:
        atomic_write(path, lambda tmp: figure.savefig(tmp, dpi=110, format=suffix.lstrip(".")))
    finally:
        plt.close(figure)  # pyplot keeps every open figure alive
    return path
