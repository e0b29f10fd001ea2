"""The attention page: one translation's cross-attention as data for ``page.html`` (subwords merged into words as
on the plots), and the page itself, served by ``multihead serve`` or written with its data by ``translate --html``.

Notation: L decoder layers, H heads, Lt target words, Ls source words."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from multihead.app.plot import merge_words, words
from multihead.app.translate import Translation
from multihead.files import atomic_write_text, check_file_target

VIEWS = '<script id="views" type="application/json">[]</script>'
"""Where the page holds its views: empty when served (it asks the server), filled by :func:`write_page`."""


def page() -> str:
    """The page's HTML (self-contained: its styles and script inline)."""
    return (resources.files("multihead.app") / "page.html").read_text(encoding="utf-8")


def attention_view(translation: Translation) -> dict[str, Any]:
    """What the page draws: the sentence, its translation, their words, and ``layers[l][h][t][s]`` (L, H, Lt, Ls),
    rounded to 4 decimals."""
    source = words(translation.source_tokens, translation.source_word_starts)
    target = words(translation.target_tokens, translation.target_word_starts)
    rows, columns = [positions for _, positions in target], [positions for _, positions in source]
    layers = [merge_words(weights, rows, columns).round(4).tolist() for weights in translation.cross_attention]
    return {
        "source": translation.source,
        "target": translation.target,
        "source_words": [word for word, _ in source],
        "target_words": [word for word, _ in target],
        "layers": layers,
    }


def write_page(views: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """The page with ``views`` in it, as one standalone HTML file (atomically)."""
    path = check_file_target(path)
    data = json.dumps(list(views), ensure_ascii=False).replace("<", "\\u003c")  # no tag or comment in the script
    html = page().replace(VIEWS, VIEWS.replace("[]", data))
    atomic_write_text(path, html)
    return path
