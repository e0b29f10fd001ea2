"""What the import tests share: a checkpoint saved by Transformers, its model and tokenizer loaded by Transformers,
and the run ``multihead import`` made of it."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from multihead.decoding import Generation, SearchOptions
from multihead.io import load_weights, read_config
from multihead.torch import Transformer


@dataclass
class Imported:
    directory: Path
    model: Any  # a Transformers model
    tokenizer: Any  # its Transformers tokenizer
    run: Path

    @property
    def checkpoint(self) -> Path:
        return self.run / "checkpoints" / "step-0000000"

    def ours(self) -> Transformer:
        model = Transformer.from_config(read_config(self.checkpoint / "config.json")).eval()
        load_weights(model, self.checkpoint / "model.safetensors")
        return model

    def generation(self, **search: Any) -> Generation:
        """The run's generation spec, searching as ``search`` says."""
        stored = Generation.from_dict(json.loads((self.checkpoint / "generation.json").read_text()))
        return replace(stored, search=SearchOptions(**search))

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.tokenizer(texts, return_tensors="pt", padding=True)
        return batch["input_ids"], batch["attention_mask"]
