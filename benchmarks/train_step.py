"""One training step of our Transformer against the same model built on ``torch.nn.Transformer``, interleaved in one
process on the same batches (results quoted in docs/translation.md).

Both models: d_model 256, 3+3 layers, 4 heads, d_ff 1024, post-norm, dropout 0.1, one tied 8000-symbol vocabulary,
sinusoidal positions, Adam, label smoothing 0.1, the same padded batches of about 4096 tokens with key padding
masks. A step is forward, loss, backward and the optimizer's update. Like ``multihead train``, the process keeps the
memory it frees for reuse (:mod:`multihead.app.memory`); ``--malloc-default`` leaves glibc's allocator as it comes.

    .venv/bin/python benchmarks/train_step.py [--steps 20] [--compile] [--bf16] [--malloc-default]

Notation: B batch, L length, E d_model, V vocabulary.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from multihead.app.memory import keep_freed_memory
from multihead.positional import sinusoidal_positions
from multihead.torch import Transformer

V, E, HEADS, LAYERS, FF, PAD = 8000, 256, 4, 3, 1024, 0


class TorchNNTransformer(nn.Module):
    """The same model on torch.nn.Transformer (post-norm, batch first, the same tied embeddings and positions)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, E)
        nn.init.normal_(self.embed.weight, std=E**-0.5)
        self.register_buffer("table", torch.from_numpy(sinusoidal_positions(256, E)).float(), persistent=False)
        self.core = nn.Transformer(E, HEADS, LAYERS, LAYERS, FF, dropout=0.1, batch_first=True)
        self.bias = nn.Parameter(torch.zeros(V))
        self.dropout = nn.Dropout(0.1)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embed(tokens) * math.sqrt(E) + self.table[: tokens.shape[1]])  # (B, L, E)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        hidden = self.core(
            self.embed_tokens(src), self.embed_tokens(tgt), tgt_mask=causal, tgt_is_causal=True,
            src_key_padding_mask=src == PAD, tgt_key_padding_mask=tgt == PAD, memory_key_padding_mask=src == PAD,
        )  # fmt: skip
        return F.linear(hidden, self.embed.weight, self.bias)  # (B, L, V)


def batches(count: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Padded batches shaped like Multi30k's: lengths 8-40 bucketed, about 4096 padded tokens each."""
    rng = np.random.default_rng(seed)
    made = []
    for _ in range(count):
        length = int(rng.integers(10, 40))
        rows = 4096 // length
        lengths = rng.integers(max(2, length - 4), length + 1, size=rows)
        src = np.zeros((rows, length), dtype=np.int64)
        tgt = np.zeros((rows, length), dtype=np.int64)
        for row, n in enumerate(lengths):
            src[row, :n] = rng.integers(4, V, size=n)
            tgt[row, :n] = rng.integers(4, V, size=n)
        made.append((torch.from_numpy(src), torch.from_numpy(tgt[:, :-1]), torch.from_numpy(tgt[:, 1:])))
    return made


def step_function(model: nn.Module, bf16: bool) -> callable:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step(src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor) -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(src, tgt_in)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=PAD,
                                   label_smoothing=0.1)  # fmt: skip
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per model (after 3 warm-up steps)")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models (dynamic shapes)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast for both models")
    parser.add_argument("--malloc-default", action="store_true", help="leave glibc's malloc settings as they are")
    args = parser.parse_args()
    if not args.malloc_default:
        keep_freed_memory()
    torch.manual_seed(0)
    ours = Transformer(V, V, d_model=E, num_heads=HEADS, num_encoder_layers=LAYERS, num_decoder_layers=LAYERS,
                       d_ff=FF, dropout=0.1, pad_id=PAD, tie_embeddings=True)  # fmt: skip
    theirs = TorchNNTransformer()
    models = {"multihead": ours, "torch.nn.Transformer": theirs}
    if args.compile:
        models = {name: torch.compile(model, dynamic=True) for name, model in models.items()}
    steps = {name: step_function(model, args.bf16) for name, model in models.items()}
    data = batches(args.steps + 3)
    times: dict[str, list[float]] = {name: [] for name in steps}
    warm_up = dict.fromkeys(steps, 0.0)  # with --compile: compiling, for the first shapes
    for index, batch in enumerate(data):
        for name, step in steps.items():  # interleaved: both models on the same batch, one after the other
            begin = time.perf_counter()
            step(*batch)
            if index >= 3:
                times[name].append(time.perf_counter() - begin)
            else:
                warm_up[name] += time.perf_counter() - begin
    tokens = statistics.mean(int((b[2] != PAD).sum()) for b in data[3:])
    for name, measured in times.items():
        median = statistics.median(measured)
        print(
            f"{name:22s} median {median * 1e3:8.1f} ms/step  {tokens / median:7.0f} target tokens/s  "
            f"(3 warm-up steps: {warm_up[name]:.1f} s; slowest timed step {max(measured) * 1e3:.0f} ms)"
        )
    ratio = statistics.median(times["multihead"]) / statistics.median(times["torch.nn.Transformer"])
    print(f"ratio multihead / torch.nn.Transformer: {ratio:.3f} (medians of {args.steps} interleaved steps)")


if __name__ == "__main__":
    main()
