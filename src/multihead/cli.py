"""The ``multihead`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from multihead import __version__


def _demo(_: argparse.Namespace) -> int:
    import torch

    from multihead.torch import MultiHeadAttention

    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=512, num_heads=8).eval()
    x = torch.randn(64, 5, 512)
    out, weights = mha(x, causal=True, return_weights=True)
    print(f"multihead {__version__}: self-attention at the paper's sizes (B=64, L=5, d_model=512, h=8)")
    print(f"  output {tuple(out.shape)}, weights {tuple(weights.shape)}")
    print("  causal weights of head 0 for the first sequence (rows: queries, columns: keys):")
    for row in weights[0, 0]:
        print("   " + " ".join(f"{p:.2f}" for p in row.tolist()))
    print("The translation task (train, translate, attention plot) arrives in a later release.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="multihead", description="The Transformer's attention from scratch, for PyTorch and Keras 3."
    )
    parser.add_argument("--version", action="version", version=f"multihead {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser("demo", help="run multi-head attention on the paper's sizes and show its weights")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
