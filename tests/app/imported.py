"""What the import tests share: a checkpoint saved by Transformers, its model and tokenizer loaded by Transformers,
and the run ``multihead import`` made of it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
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

    def logits_error(self, texts: list[str], start: tuple[int, ...], *, seed: int, length: int, keras: bool) -> float:
        """The largest difference between our logits (PyTorch's, or with ``keras`` Keras') and Transformers' for the
        sources ``texts`` and random decoder inputs that begin with ``start`` (the decoder start, a language code)."""
        src, mask = self.encode(texts)
        high = int(self.model.config.vocab_size)
        tgt = torch.randint(4, min(high, 80), (len(texts), length), generator=torch.Generator().manual_seed(seed))
        tgt[:, : len(start)] = torch.tensor(start)
        with torch.no_grad():
            expected = self.model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits.numpy()
            if not keras:
                return float(np.abs(self.ours()(src, tgt, src_key_mask=mask.bool()).numpy() - expected).max())
        from keras_helpers import numpy, tensor
        from multihead.keras import Transformer as KerasTransformer

        model = KerasTransformer.from_config(read_config(self.checkpoint / "config.json"))
        load_weights(model, self.checkpoint / "model.safetensors")
        got = numpy(model(tensor(src.numpy().astype("int32")), tensor(tgt.numpy().astype("int32")),
                          src_key_mask=tensor(mask.numpy().astype(bool))))  # fmt: skip
        return float(np.abs(got - expected).max())


def train_briefly(model: Any, tokenizer: Any, pad: int, steps: int = 60) -> None:
    """A few steps of training on the made-up pairs (``support.PAIRS``), so that the model's translations end, at
    various lengths (a random model's repeat a token)."""
    from app.support import PAIRS

    batch = tokenizer([de for de, _ in PAIRS], text_target=[en for _, en in PAIRS], return_tensors="pt", padding=True)
    batch["labels"][batch["labels"] == pad] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def generated(tokens: torch.Tensor, eos: int) -> list[list[int]]:
    """Each row's tokens up to its first EOS (included)."""
    return [row[: row.index(eos) + 1] if eos in row else row for row in tokens.tolist()]


def imported(
    root: Path,
    name: str,
    make: Callable[[Path], Path],
    kind: type[Imported],
    model_class: Any,
    tokenizer: Callable[[Path], Any],
) -> Any:
    """A checkpoint ``make`` saves into ``root / name`` (Transformers' UserWarnings quiet), imported as the run
    ``root / "run"`` (of the pair de → en), with its model and tokenizer (``tokenizer(directory)``) as Transformers
    loads them: a ``kind``."""
    import warnings

    from multihead.app.pretrained import import_pretrained

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)
        directory = make(root / name)
    import_pretrained(str(directory), root / "run", langs=["de", "en"])
    model = model_class.from_pretrained(directory).eval()
    return kind(directory, model, tokenizer(directory), root / "run")


def marian_runs(root: Path) -> dict[str, Path]:
    """A tiny Marian checkpoint of one vocabulary named as OPUS-MT's de-en (``test_import.make_checkpoint``) under
    ``root``, imported twice: as its own German → English run and as English → Swedish (``--langs en sv``)."""
    import warnings

    from app.test_import import make_checkpoint
    from multihead.app.pretrained import import_pretrained

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)
        made = make_checkpoint(root / "checkpoints" / "opus-mt-de-en", shared=True)
    import_pretrained(str(made), root / "runs" / "de-en")
    import_pretrained(str(made), root / "runs" / "en-sv", langs=["en", "sv"])
    return {name: root / "runs" / name for name in ("de-en", "en-sv")}
