"""Padded self-attention, forward and backward: ``multihead.torch.MultiHeadAttention`` with ``key_mask`` and
``query_mask`` against ``torch.nn.MultiheadAttention`` with ``key_padding_mask``, interleaved in one process on the
same batches (results quoted in docs/performance.md).

Each batch holds sequences of random lengths between a quarter of L and L, padded to L. Ours zeroes the padded
query rows (its contract); PyTorch's computes them. On the CPU ours packs the real tokens; elsewhere it runs one
kernel over the padded batch (``multihead.torch.attention.PACKED_DEVICES``).

    .venv/bin/python benchmarks/padded_attention.py                                 # the CPU, small sizes
    python benchmarks/padded_attention.py --device cuda --dtype bf16 --sizes 32x512 256x64 --width 1024 --heads 16

Notation: B batch, L length, E width, H heads.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from multihead import cpu
from multihead.torch import MultiHeadAttention, padding_mask

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def timed(step: callable, device: torch.device) -> float:
    begin = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    parser.add_argument("--sizes", nargs="+", default=["8x128", "64x32"], help="BxL batches (default: 8x128 64x32)")
    parser.add_argument("--width", type=int, default=256, help="E (default: 256)")
    parser.add_argument("--heads", type=int, default=4, help="H (default: 4)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per model and size (default: 20)")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}", flush=True)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    torch.manual_seed(0)
    ours = MultiHeadAttention(args.width, args.heads).to(device, dtype)
    theirs = nn.MultiheadAttention(args.width, args.heads, batch_first=True).to(device, dtype)
    for size in args.sizes:
        batch, length = (int(n) for n in size.split("x"))
        lengths = torch.randint(max(1, length // 4), length + 1, (batch,))
        real = padding_mask(lengths, length).to(device)
        x = torch.randn(batch, length, args.width, device=device, dtype=dtype, requires_grad=True)
        pad = ~real

        def multihead(x: torch.Tensor = x, real: torch.Tensor = real) -> None:
            ours(x, key_mask=real, query_mask=real).sum().backward()

        def pytorch(x: torch.Tensor = x, pad: torch.Tensor = pad) -> None:  # need_weights=False: PyTorch's SDPA
            theirs(x, x, x, key_padding_mask=pad, need_weights=False)[0].sum().backward()

        calls = {"multihead": multihead, "nn.MultiheadAttention": pytorch}
        times: dict[str, list[float]] = {name: [] for name in calls}
        for repeat in range(args.repeats + 3):
            for name, call in calls.items():  # interleaved
                seconds = timed(call, device)
                if repeat >= 3:
                    times[name].append(seconds)
        medians = {name: statistics.median(measured) for name, measured in times.items()}
        print(f"B={batch} L={length} E={args.width} H={args.heads} {args.dtype} on {args.device}: "
              + ", ".join(f"{name} {median * 1e3:.2f} ms" for name, median in medians.items())
              + f"; ratio {medians['multihead'] / medians['nn.MultiheadAttention']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
