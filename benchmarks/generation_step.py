"""Cached greedy generation with PyTorch, time per decoding step, for one or more checkouts side by side (issue 13's
check; the figures are quoted in docs/performance.md).

    .venv/bin/python benchmarks/generation_step.py [--src OTHER/src ...] [--rounds 3] [--runs 7]

The model of the issue: B=8, source length 32, up to 128 tokens, d_model 256, 3+3 layers, 8 heads, d_ff 512,
vocabulary 8000, EOS made unreachable so that every run takes all 128 steps. Each round runs every checkout in a
fresh process, one after the other (this checkout's ``src`` first, then each ``--src``); each process warms up, then
times ``--runs`` generations and prints their median time per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE_SRC = Path(__file__).resolve().parent.parent / "src"


def child(runs: int, tokens: int) -> dict:
    import torch

    import multihead
    from multihead.torch import Transformer

    torch.manual_seed(0)
    model = Transformer(8000, 8000, d_model=256, num_heads=8, num_encoder_layers=3, num_decoder_layers=3, d_ff=512,
                        dropout=0.0).eval()  # fmt: skip
    eos_id = 2
    with torch.no_grad():
        model.output_proj.bias[eos_id] = -1e9  # never ends early: every run decodes `tokens` steps
    src = torch.randint(3, 8000, (8, 32))
    model.generate(src, max_len=tokens, bos_id=1, eos_id=eos_id)  # warm-up
    per_step = []
    for _ in range(runs):
        begin = time.perf_counter()
        out = model.generate(src, max_len=tokens, bos_id=1, eos_id=eos_id)
        per_step.append((time.perf_counter() - begin) / out.shape[1] * 1e3)
        if out.shape[1] != tokens:
            raise RuntimeError(f"generation stopped after {out.shape[1]} of {tokens} tokens")
    return {"src": str(Path(multihead.__file__).parent.parent), "ms_per_step": statistics.median(per_step),
            "threads": torch.get_num_threads()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", default=[], help="another checkout's src directory to compare")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of fresh processes, checkouts interleaved")
    parser.add_argument("--runs", type=int, default=7, help="timed generations per process")
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.runs, args.tokens)))
        return
    sources = [str(HERE_SRC), *(str(Path(s).resolve()) for s in args.src)]
    results: dict[str, list[float]] = {s: [] for s in sources}
    for round_ in range(args.rounds):
        for src in sources:
            env = {**os.environ, "PYTHONPATH": src}
            command = [sys.executable, __file__, "--child", "--runs", str(args.runs), "--tokens", str(args.tokens)]
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
            measured = json.loads(out.strip().splitlines()[-1])
            if measured["src"] != src:
                raise RuntimeError(f"expected multihead from {src}, imported it from {measured['src']}")
            results[src].append(measured["ms_per_step"])
            print(f"round {round_ + 1}: {src}: {measured['ms_per_step']:.2f} ms/step", flush=True)
    print("medians over rounds (ms per decoding step):")
    for src, values in results.items():
        print(f"  {statistics.median(values):6.2f}  {src}  ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
