"""multihead against CTranslate2 on the same run's weights: greedy and beam search, float32 and int8, time and
sacreBLEU for each (results quoted in docs/translation.md). It trains nothing: it exports RUN with ``multihead
export`` into a temporary directory and translates SRC with both, interleaved, each configuration twice (the faster
taken), in one process.

    .venv/bin/python benchmarks/ctranslate2_speed.py RUN SRC REF [--threads 2] [--beam 4] [--length-penalty 0.6]

multihead runs as ``multihead translate`` does (batches of at most 4,096 tokens, sorted by length); CTranslate2
takes the same sentences in batches of 4,096 tokens (``batch_type="tokens"``), ``intra_threads`` = ``--threads``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import ctranslate2
import sacrebleu
import torch

from multihead.app.corpus import read_lines
from multihead.app.export import export, vocabulary
from multihead.app.translate import Translator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run directory written by multihead train")
    parser.add_argument("src", help="source sentences (plain or .gz)")
    parser.add_argument("ref", help="references, line-aligned with SRC")
    parser.add_argument("--threads", type=int, default=2, help="threads for both engines (default: 2)")
    parser.add_argument("--beam", type=int, default=4, help="beam size of the beam rows (default: 4)")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="both engines' (default: 0.6)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sources, references = read_lines(args.src, "SRC"), read_lines(args.ref, "REF")
    ours = Translator(args.run)
    tokenizer = ours.source
    with tempfile.TemporaryDirectory() as directory:
        model = export(args.run, Path(directory) / "ct2", checkpoint=None, quantization=None)
        engines = {
            compute: ctranslate2.Translator(str(model), device="cpu", compute_type=compute, intra_threads=args.threads)
            for compute in ("float32", "int8")
        }
        pieces = [tokenizer.pieces(tokenizer.encode(text)[0]) for text in sources]

        ids = {piece: index for index, piece in enumerate(vocabulary(ours.target))}

        def theirs(compute: str, beam: int) -> list[str]:
            results = engines[compute].translate_batch(
                pieces, beam_size=beam, length_penalty=args.length_penalty, max_batch_size=4096, batch_type="tokens"
            )
            return [ours.target.decode([ids[piece] for piece in result.hypotheses[0]]) for result in results]

        runs = {}
        for beam in (1, args.beam):
            runs[f"multihead float32, beam {beam}"] = lambda beam=beam: ours.translate(
                sources, beam=beam, length_penalty=args.length_penalty
            )
            for compute in engines:
                runs[f"CTranslate2 {compute}, beam {beam}"] = lambda compute=compute, beam=beam: theirs(compute, beam)
        seconds, outputs = {name: float("inf") for name in runs}, {}
        for _ in range(2):  # interleaved: every configuration once, then again
            for name, run in runs.items():
                begin = time.perf_counter()
                outputs[name] = run()
                seconds[name] = min(seconds[name], time.perf_counter() - begin)
    for name in runs:
        bleu = sacrebleu.metrics.BLEU()
        score = bleu.corpus_score(outputs[name], [references])
        print(f"{name:32s} {seconds[name]:7.2f} s  BLEU {score.score:5.2f}")
    for beam in (1, args.beam):
        base = seconds[f"CTranslate2 float32, beam {beam}"]
        print(f"beam {beam}: multihead / CTranslate2 float32 = {seconds[f'multihead float32, beam {beam}'] / base:.2f}")
    print(f"multihead beam {args.beam} / its greedy = "
          f"{seconds[f'multihead float32, beam {args.beam}'] / seconds['multihead float32, beam 1']:.2f}")  # fmt: skip
    greedy = zip(outputs["multihead float32, beam 1"], outputs["CTranslate2 float32, beam 1"], strict=True)
    same = sum(a == b for a, b in greedy)
    print(f"greedy float32: {same} of {len(sources)} translations identical; sacreBLEU {bleu.get_signature()}")


if __name__ == "__main__":
    main()
