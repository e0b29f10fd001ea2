"""Token-by-token generation with the KV cache against recomputing the whole prefix at every step.

Greedy generation of exactly 128 tokens (EOS is never chosen) for B=8 source sentences of 32 tokens, with a
Transformer of d_model=256, 4 heads, 3 encoder and 3 decoder layers, d_ff=1024. Each measurement runs in a fresh
process after a short warm-up; cached and uncached runs are interleaved; medians are reported, and the ratio.
Writes benchmarks/generation.json.

    .venv/bin/python benchmarks/generation.py [--repeats 3] [--frameworks torch keras]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
framework, use_cache, tokens = sys.argv[1], sys.argv[2] == "cache", int(sys.argv[3])
sizes = dict(d_model=256, num_heads=4, num_encoder_layers=3, num_decoder_layers=3, d_ff=1024, dropout=0.0)
src = np.random.default_rng(0).integers(3, 100, size=(8, 32))
if framework == "torch":
    import torch
    from multihead.torch import Transformer
    torch.manual_seed(0)
    model = Transformer(100, 100, **sizes).eval()
    with torch.no_grad():
        model.output_proj.bias[2] = -1e9  # EOS never wins: always the full length
    src = torch.from_numpy(src)
else:
    import keras
    from multihead.keras import Transformer
    keras.utils.set_random_seed(0)
    model = Transformer(100, 100, **sizes)
    model.build()
    bias = keras.ops.convert_to_numpy(model.output_proj.bias).copy()
    bias[2] = -1e9
    model.output_proj.bias.assign(bias)
    src = keras.ops.convert_to_tensor(src.astype("int32"))
model.generate(src, max_len=8, bos_id=1, eos_id=2, use_cache=use_cache)  # warm-up
start = time.perf_counter()
out = model.generate(src, max_len=tokens, bos_id=1, eos_id=2, use_cache=use_cache)
elapsed = time.perf_counter() - start
assert out.shape[1] == tokens, out.shape
print(json.dumps({"seconds": elapsed}))
"""


def measure(framework: str, mode: str, tokens: int) -> float:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, framework, mode, str(tokens)], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--frameworks", nargs="+", default=["torch", "keras"], choices=["torch", "keras"])
    args = parser.parse_args()
    results = {}
    for framework in args.frameworks:
        times = {"cache": [], "recompute": []}
        for _ in range(args.repeats):
            for mode in times:  # interleaved
                times[mode].append(measure(framework, mode, args.tokens))
        medians = {mode: statistics.median(values) for mode, values in times.items()}
        results[framework] = {
            "median_seconds": medians,
            "all_seconds": times,
            "speedup": medians["recompute"] / medians["cache"],
        }
        print(
            f"{framework}: {args.tokens} tokens, cache {medians['cache']:.2f} s, "
            f"recompute {medians['recompute']:.2f} s, speed-up {results[framework]['speedup']:.1f}x",
            flush=True,
        )
    output = Path(__file__).with_name("generation.json")
    output.write_text(json.dumps({"tokens": args.tokens, "repeats": args.repeats, **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
