"""Keras' compiled generation on a trained run: beam search against greedy on the active Keras backend (the ratio
is quoted in docs/translation.md). It trains nothing: it loads RUN's checkpoint into the Keras Transformer and
translates SRC in the batches ``multihead translate`` makes, greedy and beam, interleaved, the faster of two passes
(the first pass traces the step programs).

    KERAS_BACKEND=jax .venv/bin/python benchmarks/keras_beam.py RUN SRC [--beam 4] [--length-penalty 0.6] [--limit N]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from multihead import cpu
from multihead.app.corpus import read_lines
from multihead.app.runs import open_checkpoint
from multihead.app.translate import BATCH_TOKENS, length_limit, translate_ids
from multihead.decoding import SearchOptions
from multihead.io import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run directory written by multihead train")
    parser.add_argument("src", help="source sentences (plain or .gz)")
    parser.add_argument("--beam", type=int, default=4, help="beam size of the beam rows (default: 4)")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="(default: 0.6)")
    parser.add_argument("--limit", type=int, default=1000, help="the first N sentences of SRC (default: 1000)")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}", flush=True)
    import keras

    checkpoint, model = open_checkpoint(Path(args.run), None, lambda found: load_model(found.path, "keras"))
    ids = checkpoint.source.encode_all(read_lines(args.src, "SRC")[: args.limit])
    longest_target = int(checkpoint.trainer["data"].get("longest_target", 0))
    generation = checkpoint.generation

    def limit(source_length: int) -> int:
        return length_limit(source_length, longest_target, checkpoint.config.max_len)

    def generate(beam: int):
        def run(src: np.ndarray, limits: np.ndarray, indices: np.ndarray) -> np.ndarray:
            search = SearchOptions(beam_size=beam, length_penalty=args.length_penalty)
            out = model.generate(src, max_len=limits, generation=replace(generation, search=search))
            return np.asarray(keras.ops.convert_to_numpy(out))

        return run

    seconds = {beam: float("inf") for beam in (1, args.beam)}
    for _ in range(2):  # interleaved; the first pass also traces each batch shape's programs
        for beam in seconds:
            begin = time.perf_counter()
            translate_ids(generate(beam), ids, limit=limit, generation=generation, batch_tokens=BATCH_TOKENS // beam)
            seconds[beam] = min(seconds[beam], time.perf_counter() - begin)
    backend = keras.backend.backend()
    for beam, taken in seconds.items():
        print(f"Keras ({backend}, compiled) beam {beam}: {taken:.2f} s for {len(ids)} sentences")
    print(f"beam {args.beam} / greedy = {seconds[args.beam] / seconds[1]:.2f}")


if __name__ == "__main__":
    main()
