"""Weight-only int4 products against the int8 and float32 forms ``translate`` uses, at an OPUS-MT-sized model's
shapes (quoted in docs/performance.md: whether ``--quantize int4`` could pay on this CPU).

    .venv/bin/python benchmarks/int4_products.py [--rows 1 8 32 128 512] [--groups 32 128] [--repeats 5]

For each weight shape (in → out) and row count: the float32 form (``multihead.torch.layouts.lay_out``: oneDNN's
packed float32, or row-major for small weights on Intel), the int8 form (``lay_out(dtype="int8")``: oneDNN's int8
kernel, inputs quantized as they come) and PyTorch's weight-only int4 kernel for CPUs
(``_weight_int4pack_mm_for_cpu``: 4-bit weights, one scale and zero a group of ``--groups`` inputs; inputs in
bfloat16, its vectorised path, and in float32; outputs in 16s, a weight of other sizes padded and its output cut),
timed interleaved, the median of ``--repeats`` rounds of enough calls to fill ~20 ms each. It prints microseconds a
call and int4's time over int8's, and each form's error on the products: the RMS of its output's difference from
float32's over the RMS of float32's output (random normal weights and inputs).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from multihead import cpu
from multihead.torch.layouts import lay_out

SHAPES = [(512, 512), (512, 2048), (2048, 512), (512, 58101)]
"""OPUS-MT's (Marian base) products: attention's projections, the feed-forward's two, the output projection."""
DTYPES = {torch.bfloat16: "bf16 inputs", torch.float32: "fp32 inputs"}
"""The int4 kernel's input types: bfloat16 takes its vectorised path, float32 another."""


def int4_form(weight: torch.Tensor, group: int, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x @ weight.T`` with ``weight (O, I)`` as 4-bit values, one scale and zero a group of ``group`` inputs
    (asymmetric: the group's range over 15 steps), the inputs, scales and zeros in ``dtype``, the output float32."""
    wanted = len(weight)
    weight = torch.cat([weight, weight.new_zeros(-wanted % 16, weight.shape[1])])  # the kernel takes O in 16s
    out_features, in_features = weight.shape
    grouped = weight.view(out_features, in_features // group, group)  # (O, I/g, g)
    low, high = grouped.amin(-1, keepdim=True), grouped.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp_min(1e-8)  # (O, I/g, 1)
    values = ((grouped - low) / scale).round().clamp(0, 15).to(torch.int32).view(out_features, in_features)
    zero = low + 8 * scale  # the kernel computes (value - 8) * scale + zero
    scales_zeros = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous().to(dtype)  # (I/g, O, 2)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(values, 2)

    def product(x: torch.Tensor) -> torch.Tensor:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(dtype), packed, group, scales_zeros)  # (N, O)
        return out[:, :wanted].float()

    return product


def per_call(form: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    """Seconds a call, over enough calls to fill about 20 ms."""
    form(x)
    calls, begin = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - begin) < 0.02:
        form(x)
        calls += 1
    return elapsed / calls


def relative_error(form: Callable[[torch.Tensor], torch.Tensor], exact: torch.Tensor, x: torch.Tensor) -> float:
    return float((form(x) - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128, 512])
    parser.add_argument("--groups", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"CPU: {cpu.describe()}; {torch.get_num_threads()} threads\n")
    names = ["float32", "int8", *(f"int4 g{group} {DTYPES[dtype]}" for group in args.groups for dtype in DTYPES)]
    print(f"| in → out | rows | {' | '.join(f'{name} µs' for name in names)} | "
          f"{' | '.join(f'{name} / int8' for name in names[2:])} |")  # fmt: skip
    print(f"|---|---:|{'---:|' * (len(names) * 2 - 2)}")
    errors: dict[tuple[int, int], list[float]] = {}
    with torch.inference_mode():
        for in_features, out_features in SHAPES:
            linear = nn.Linear(in_features, out_features, bias=False)
            forms = [lay_out(linear), lay_out(linear, dtype="int8")]
            forms += [int4_form(linear.weight.detach(), group, dtype) for group in args.groups for dtype in DTYPES]
            probe = torch.randn(64, in_features)
            exact = probe @ linear.weight.t()
            errors[(in_features, out_features)] = [relative_error(form, exact, probe) for form in forms]
            for rows in args.rows:
                x = torch.randn(rows, in_features)
                times: list[list[float]] = [[] for _ in forms]
                for _ in range(args.repeats):  # interleaved
                    for index, form in enumerate(forms):
                        times[index].append(per_call(form, x))
                medians = [statistics.median(each) * 1e6 for each in times]
                print(f"| {in_features} → {out_features} | {rows} | {' | '.join(f'{m:,.0f}' for m in medians)} | "
                      f"{' | '.join(f'{m / medians[1]:.2f}' for m in medians[2:])} |", flush=True)  # fmt: skip
    print("\nRelative RMS error of the products (against float32's):")
    for (in_features, out_features), each in errors.items():
        print(
            f"  {in_features} → {out_features}: " + ", ".join(f"{n} {e:.4f}" for n, e in zip(names, each, strict=True))
        )


if __name__ == "__main__":
    main()
