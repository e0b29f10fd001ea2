"""Cached greedy generation, time per decoding step, for one or more checkouts side by side (the figures are quoted in
docs/performance.md): PyTorch's, or Keras' compiled generation on the active Keras backend (``--framework keras``).

    .venv/bin/python benchmarks/generation_step.py [--src OTHER/src ...] [--rounds 3] [--runs 7] [--framework keras]

The model: B=8, source length 32, up to 128 tokens, d_model 256, 3+3 layers, 8 heads, d_ff 512,
vocabulary 8000, EOS made unreachable so that every run takes all 128 steps. Each round runs every checkout in a
fresh process, one after the other (this checkout's ``src`` first, then each ``--src``); each process warms up, then
times ``--runs`` generations and prints their median time per step. With ``--src``, the ratios of this checkout's time
to each other's, round by round, and their median: on a machine whose speed drifts, compare those.
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


SIZES = dict(d_model=256, num_heads=8, num_encoder_layers=3, num_decoder_layers=3, d_ff=512, dropout=0.0)
EOS = 2


def torch_model() -> tuple[object, object]:
    """The model (EOS unreachable, so that every run decodes all its tokens) and a batch of sources."""
    import torch

    from multihead.torch import Transformer

    torch.manual_seed(0)
    model = Transformer(8000, 8000, **SIZES).eval()
    with torch.no_grad():
        model.output_proj.bias[EOS] = -1e9
    return model, torch.randint(3, 8000, (8, 32))


def keras_model() -> tuple[object, object]:
    """As :func:`torch_model`, in Keras; generation runs compiled (on TensorFlow and JAX)."""
    import keras
    import numpy as np

    from multihead.keras import Transformer

    keras.utils.set_random_seed(0)
    model = Transformer(8000, 8000, **SIZES)
    model.build()
    bias = np.zeros(8000, "float32")
    bias[EOS] = -1e9
    model.output_proj.bias.assign(bias)
    return model, np.random.default_rng(0).integers(3, 8000, (8, 32)).astype("int32")


def child(runs: int, tokens: int, framework: str) -> dict:
    import multihead

    model, src = (torch_model if framework == "torch" else keras_model)()
    model.generate(src, max_len=tokens, bos_id=1, eos_id=EOS)  # warm-up (and compilation)
    per_step = []
    for _ in range(runs):
        begin = time.perf_counter()
        out = model.generate(src, max_len=tokens, bos_id=1, eos_id=EOS)
        per_step.append((time.perf_counter() - begin) / out.shape[1] * 1e3)
        if out.shape[1] != tokens:
            raise RuntimeError(f"generation stopped after {out.shape[1]} of {tokens} tokens")
    return {"src": str(Path(multihead.__file__).parent.parent), "ms_per_step": statistics.median(per_step)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", default=[], help="another checkout's src directory to compare")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of fresh processes, checkouts interleaved")
    parser.add_argument("--runs", type=int, default=7, help="timed generations per process")
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per run")
    parser.add_argument("--framework", choices=("torch", "keras"), default="torch", help="which front end generates")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.runs, args.tokens, args.framework)))
        return
    from multihead import cpu  # here: a child imports multihead from the checkout it measures

    print(f"CPU: {cpu.describe()}", flush=True)
    sources = [str(HERE_SRC), *(str(Path(s).resolve()) for s in args.src)]
    results: dict[str, list[float]] = {s: [] for s in sources}
    for round_ in range(args.rounds):
        for src in sources:
            env = {**os.environ, "PYTHONPATH": src}
            command = [sys.executable, __file__, "--child", "--runs", str(args.runs), "--tokens", str(args.tokens),
                       "--framework", args.framework]  # fmt: skip
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
            measured = json.loads(out.strip().splitlines()[-1])
            if measured["src"] != src:
                raise RuntimeError(f"expected multihead from {src}, imported it from {measured['src']}")
            results[src].append(measured["ms_per_step"])
            print(f"round {round_ + 1}: {src}: {measured['ms_per_step']:.2f} ms/step", flush=True)
    print("medians over rounds (ms per decoding step):")
    for src, values in results.items():
        print(f"  {statistics.median(values):6.2f}  {src}  ({', '.join(f'{v:.2f}' for v in values)})")
    this = results[sources[0]]
    for src in sources[1:]:  # round by round: a machine whose speed drifts moves both figures of a round together
        ratios = [mine / theirs for mine, theirs in zip(this, results[src], strict=True)]
        print(
            f"this checkout / {src}, round by round: {', '.join(f'{r:.2f}' for r in ratios)}; "
            f"median {statistics.median(ratios):.2f}"
        )


if __name__ == "__main__":
    main()
