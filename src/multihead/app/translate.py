"""Translating with a trained run, and what its cross-attention looked at."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from multihead.app.runs import require_checkpoint
from multihead.app.tokenizers import BOS, EOS, SPECIALS
from multihead.app.train import load_setup


@dataclass
class Translation:
    source: str
    target: str
    source_tokens: list[str]
    target_tokens: list[str]
    cross_attention: list[np.ndarray]  # per decoder layer, (H, Lt, Ls)


class Translator:
    """A run's latest checkpoint, loaded in PyTorch, ready to translate."""

    def __init__(self, run: str | Path) -> None:
        import torch

        from multihead.io import load_weights
        from multihead.torch import Transformer

        checkpoint = require_checkpoint(Path(run))
        self.setup, _ = load_setup(checkpoint)
        self.model = Transformer.from_config(self.setup.config).eval()
        load_weights(self.model, checkpoint / "model.safetensors")
        self.torch = torch

    def translate(self, text: str, *, beam: int = 1, max_len: int | None = None) -> Translation:
        torch = self.torch
        ids, unknown = self.setup.source.encode(text)
        if unknown:
            shown = "".join(dict.fromkeys(unknown)) if self.setup.source.kind == "char" else " ".join(unknown)
            print(f"warning: {shown!r} not in the training vocabulary, read as {SPECIALS[3]}", file=sys.stderr)
        if not ids:
            raise ValueError("nothing to translate: the text is empty")
        limit = max_len or self.setup.config.max_len - 1
        src = torch.tensor([ids])
        out = self.model.generate(src, max_len=limit, bos_id=BOS, eos_id=EOS, beam_size=beam)[0].tolist()
        generated = out[: out.index(EOS) + 1] if EOS in out else out
        with torch.no_grad():
            memory = self.model.encode(src)
            _, weights = self.model.decode(torch.tensor([[BOS, *generated[:-1]]]), memory, return_weights=True)
        target = self.setup.target
        return Translation(
            source=text,
            target=target.decode(generated),
            source_tokens=[self.setup.source.symbols[i] for i in ids],
            target_tokens=[target.symbols[i] for i in generated],
            cross_attention=[w[0].numpy() for w in weights],
        )
