"""Our Keras layer against keras.layers.MultiHeadAttention in one process, steps interleaved.

The in-process figures of docs/performance.md; ``multihead bench`` measures each layer in a fresh process instead.

    .venv/bin/python benchmarks/keras_layer_step.py [--case L4096-train] [--steps 6]

Both on TensorFlow, each step the one ``multihead bench`` times (``multihead.app.bench``: inside ``tf.function``;
forward, or forward and backward with parameter gradients). Both are built and warmed up, then their steps
alternate; the script prints each one's median and every step's time.
"""

from __future__ import annotations

import argparse
import statistics
import time

from multihead import cpu
from multihead.app.bench import CASES, _keras_step

IMPLEMENTATIONS = ("multihead-keras", "keras-mha")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="L4096-train", choices=sorted(CASES))
    parser.add_argument("--steps", type=int, default=6, help="timed steps of each layer, interleaved")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}", flush=True)

    case = CASES[args.case]
    steps = {impl: _keras_step(impl, case) for impl in IMPLEMENTATIONS}
    for step in steps.values():
        for _ in range(2):
            step()
    times: dict[str, list[float]] = {impl: [] for impl in steps}
    for _ in range(args.steps):
        for impl, step in steps.items():
            began = time.perf_counter()
            step()
            times[impl].append(time.perf_counter() - began)
    for impl, taken in times.items():
        each = ", ".join(f"{t * 1e3:.0f}" for t in taken)
        print(f"{impl:16s} median {statistics.median(taken) * 1e3:7.1f} ms  ({each})")
    ours, peer = (statistics.median(times[impl]) for impl in steps)
    print(f"ratio {' / '.join(IMPLEMENTATIONS)}: {ours / peer:.3f} ({args.case}, {args.steps} steps each)")


if __name__ == "__main__":
    main()
