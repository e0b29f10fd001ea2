"""PyTorch beam search against greedy on one device (the ratio on a GPU is quoted in docs/translation.md). It trains
nothing: it loads RUN's checkpoint as ``multihead translate`` does and translates SRC in the batches it makes (the
device's source tokens per batch, divided by the beam; ``--batch-tokens`` sets another), greedy and beam,
interleaved, the fastest of three passes; the first pass of each also warms the device up. BLEU against REF.

    .venv/bin/python benchmarks/beam_speed.py RUN SRC REF [--device cuda] [--beam 4] [--batch-tokens N]
"""

from __future__ import annotations

import argparse
import time

import sacrebleu
import torch

from multihead import cpu
from multihead.app.corpus import read_lines
from multihead.app.translate import Translator, translate_ids
from multihead.decoding import SearchOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run directory written by multihead train")
    parser.add_argument("src", help="source sentences (plain or .gz)")
    parser.add_argument("ref", help="references, line-aligned with SRC")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--beam", type=int, default=4, help="beam size of the beam rows (default: 4)")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="(default: 0.6)")
    parser.add_argument("--batch-tokens", type=int, help="source tokens per greedy batch (default: the device's)")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}", flush=True)
    translator = Translator(args.run, device=args.device)
    sources, references = read_lines(args.src, "SRC"), read_lines(args.ref, "REF")
    ids = translator.source.encode_all(sources)
    batch_tokens = args.batch_tokens or translator.batch_tokens
    seconds = {beam: float("inf") for beam in (1, args.beam)}
    bleu = {}
    for _ in range(3):  # interleaved: greedy, beam, greedy, ...
        for beam in seconds:
            generate = translator.generate(SearchOptions(beam_size=beam, length_penalty=args.length_penalty))
            if translator.device.type == "cuda":
                torch.cuda.synchronize(translator.device)
            begin = time.perf_counter()
            found = translate_ids(
                generate,
                ids,
                limit=translator.limit,
                generation=translator.generation,
                batch_tokens=batch_tokens // beam,
            )
            seconds[beam] = min(seconds[beam], time.perf_counter() - begin)  # generate returns host arrays: synced
            outputs = [translator.target.decode(tokens) for tokens in found]
            bleu[beam] = sacrebleu.metrics.BLEU().corpus_score(outputs, [references]).score
    for beam, spent in seconds.items():
        print(f"beam {beam}: {spent:.3f} s ({len(ids) / spent:.0f} sentences/s), BLEU {bleu[beam]:.2f}")
    print(f"on {translator.device}, {batch_tokens} source tokens per greedy batch: "
          f"beam {args.beam} / greedy = {seconds[args.beam] / seconds[1]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
