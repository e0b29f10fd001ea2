"""A decoding step's float32 products on the CPU, each way a form can be laid out, timed side by side in one process
(the figures behind ``multihead.torch.layouts.PLAIN_STEP_VENDORS``, quoted in docs/performance.md).

    .venv/bin/python benchmarks/step_products.py [--d-model 256 512] [--rows 1 8 16 32 64 128] [--repeats 5]

For each model width E the products of a decoder layer's step (query-key-value E → 3E, E → E, E → 2E for
cross-attention's keys and values, E → 4E and 4E → E for the feed-forward block) are timed on ``rows`` rows: oneDNN's
kernel on the weight packed in its blocked format (``onednn``) and MKL's on the weight ``(I, O)`` row-major
(``plain``), interleaved call by call, the median of ``--repeats`` bursts each. A ratio below 1 means the row-major
form is faster. The CPU is named at the top.

Notation: I input features, O output features.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from multihead import cpu
from multihead.torch import layouts


def timed(call: Callable[[], object], calls: int) -> float:
    """Microseconds a call, over a burst of ``calls``."""
    begin = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - begin) / calls * 1e6


def compare(inputs: int, outputs: int, rows: int, repeats: int) -> tuple[float, float]:
    """Median microseconds of the packed and the row-major form of an ``I → O`` product on ``rows`` rows."""
    weight, bias, x = torch.randn(outputs, inputs), torch.randn(outputs), torch.randn(rows, inputs)
    packed = layouts.OneDNN(torch.ops.mkldnn._reorder_linear_weight(weight), bias)
    plain = layouts.Plain(weight.t().contiguous(), bias)
    calls = max(20, int(2e7 / (rows * inputs * outputs)))
    forms = {"onednn": packed, "plain": plain}
    times: dict[str, list[float]] = {name: [] for name in forms}
    for form in forms.values():  # warm-up
        timed(lambda form=form: form(x), calls)
    for _ in range(repeats):
        for name, form in forms.items():
            times[name].append(timed(lambda form=form: form(x), calls))
    return statistics.median(times["onednn"]), statistics.median(times["plain"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, nargs="+", default=[256, 512], help="model widths E")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128], help="rows a step")
    parser.add_argument("--repeats", type=int, default=5, help="bursts per form (median)")
    parser.add_argument("--threads", type=int, default=2, help="PyTorch's threads")
    args = parser.parse_args()
    if not layouts.onednn_linear():
        parser.error("this PyTorch build has no oneDNN linear kernel: nothing to compare")
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu.describe()}, {args.threads} threads")
    print(f"{'I → O':>14} {'rows':>5} {'onednn µs':>10} {'plain µs':>9} {'plain/onednn':>13}")
    for width in args.d_model:
        shapes = [(width, 3 * width), (width, width), (width, 2 * width), (width, 4 * width), (4 * width, width)]
        for inputs, outputs in shapes:
            for rows in args.rows:
                onednn, plain = compare(inputs, outputs, rows, args.repeats)
                print(f"{f'{inputs} → {outputs}':>14} {rows:5d} {onednn:10.1f} {plain:9.1f} {plain / onednn:13.2f}")


if __name__ == "__main__":
    main()
