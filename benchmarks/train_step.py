"""One training step of our Transformer against the same model built on ``torch.nn.Transformer``, interleaved in one
process on the same batches (results quoted in docs/translation.md).

Both models: by default d_model 256, 3+3 layers, 4 heads, d_ff 1024, one tied 8000-symbol vocabulary (the CPU
corpus recipe); with ``--base`` the paper's base model (d_model 512, 6+6 layers, 8 heads, d_ff 2048, a tied
32000-symbol vocabulary, the GPU recipe's sizes). Post-norm, dropout 0.1, sinusoidal positions, Adam, label
smoothing 0.1, the same padded batches of about ``--batch-tokens`` tokens with key padding masks. A step is
forward, loss, backward and the optimizer's update; ours runs what ``multihead train`` runs (``TokenLoss``: the
model's unchecked ``_forward``, the batches being the benchmark's own, and the loss projected a slice of rows at a
time; with ``--compile``, the whole logits), theirs ``F.cross_entropy`` on the whole logits. On CUDA each step ends
with a synchronisation, and
batches are on the device before the clock starts. Like ``multihead train``, the process keeps the memory it frees
for reuse (:mod:`multihead.app.memory`); ``--malloc-default`` leaves glibc's allocator as it comes.

    .venv/bin/python benchmarks/train_step.py [--steps 20] [--compile] [--bf16] [--malloc-default]
    python benchmarks/train_step.py --device cuda --base --bf16 --batch-tokens 8192   # and 32768

Notation: B batch, L length, E d_model, V vocabulary.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from multihead import cpu
from multihead.app.memory import keep_freed_memory
from multihead.app.train_torch import TokenLoss
from multihead.positional import sinusoidal_positions
from multihead.torch import Transformer

PAD = 0


@dataclass(frozen=True)
class Sizes:
    vocab: int = 8000
    d_model: int = 256
    heads: int = 4
    layers: int = 3
    d_ff: int = 1024


BASE = Sizes(32000, 512, 8, 6, 2048)


class TorchNNTransformer(nn.Module):
    """The same model on torch.nn.Transformer (post-norm, batch first, the same tied embeddings and positions)."""

    def __init__(self, sizes: Sizes) -> None:
        super().__init__()
        self.scale = math.sqrt(sizes.d_model)
        self.embed = nn.Embedding(sizes.vocab, sizes.d_model)
        nn.init.normal_(self.embed.weight, std=sizes.d_model**-0.5)
        table = torch.from_numpy(sinusoidal_positions(256, sizes.d_model)).float()
        self.register_buffer("table", table, persistent=False)
        self.core = nn.Transformer(sizes.d_model, sizes.heads, sizes.layers, sizes.layers, sizes.d_ff, dropout=0.1,
                                   batch_first=True)  # fmt: skip
        self.bias = nn.Parameter(torch.zeros(sizes.vocab))
        self.dropout = nn.Dropout(0.1)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embed(tokens) * self.scale + self.table[: tokens.shape[1]])  # (B, L, E)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
        hidden = self.core(
            self.embed_tokens(src), self.embed_tokens(tgt), tgt_mask=causal, tgt_is_causal=True,
            src_key_padding_mask=src == PAD, tgt_key_padding_mask=tgt == PAD, memory_key_padding_mask=src == PAD,
        )  # fmt: skip
        return F.linear(hidden, self.embed.weight, self.bias)  # (B, L, V)


def batches(
    count: int, tokens: int, vocab: int, device: str, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Padded batches shaped like Multi30k's: lengths 8-40 bucketed, about ``tokens`` padded tokens each."""
    rng = np.random.default_rng(seed)
    made = []
    for _ in range(count):
        length = int(rng.integers(10, 40))
        rows = tokens // length
        lengths = rng.integers(max(2, length - 4), length + 1, size=rows)
        src = np.zeros((rows, length), dtype=np.int64)
        tgt = np.zeros((rows, length), dtype=np.int64)
        for row, n in enumerate(lengths):
            src[row, :n] = rng.integers(4, vocab, size=n)
            tgt[row, :n] = rng.integers(4, vocab, size=n)
        arrays = (src, tgt[:, :-1], tgt[:, 1:])
        made.append(tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays))
    return made


def cross_entropy(forward: callable) -> callable:
    """``torch.nn.Transformer``'s loss: label-smoothed cross-entropy on the whole logits, summed."""

    def loss(src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor, smoothing: float) -> torch.Tensor:
        logits = forward(src, tgt_in)
        return F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=PAD, reduction="sum",
                               label_smoothing=smoothing)  # fmt: skip

    return loss


def step_function(model: nn.Module, loss_sum: callable, bf16: bool, device: torch.device) -> callable:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step(src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_sum(src, tgt_in, tgt_out, 0.1) / (tgt_out != PAD).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per model (after 3 warm-up steps)")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models (dynamic shapes)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast for both models")
    parser.add_argument("--malloc-default", action="store_true", help="leave glibc's malloc settings as they are")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--base", action="store_true", help="the paper's base model and a 32k vocabulary")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per batch (default: 4096)")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}", flush=True)
    if not args.malloc_default:
        keep_freed_memory()
    device = torch.device(args.device)
    sizes = BASE if args.base else Sizes()
    torch.manual_seed(0)
    ours = Transformer(sizes.vocab, sizes.vocab, d_model=sizes.d_model, num_heads=sizes.heads,
                       num_encoder_layers=sizes.layers, num_decoder_layers=sizes.layers, d_ff=sizes.d_ff, dropout=0.1,
                       pad_id=PAD, tie_embeddings=True).to(device)  # fmt: skip
    theirs = TorchNNTransformer(sizes).to(device)
    losses = {"multihead": TokenLoss(ours, sliced=not args.compile), "torch.nn.Transformer": cross_entropy(theirs)}
    if args.compile:
        losses = {name: torch.compile(loss, dynamic=True) for name, loss in losses.items()}
    models = {"multihead": ours, "torch.nn.Transformer": theirs}
    steps = {name: step_function(models[name], loss, args.bf16, device) for name, loss in losses.items()}
    data = batches(args.steps + 3, args.batch_tokens, sizes.vocab, args.device)
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
    print(f"ratio multihead / torch.nn.Transformer: {ratio:.3f} (medians of {args.steps} interleaved steps on "
          f"{args.device})")  # fmt: skip


if __name__ == "__main__":
    main()
