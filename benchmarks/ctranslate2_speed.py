"""multihead against CTranslate2 on the same run's weights: greedy and beam search, float32 and int8, time and
sacreBLEU for each (results quoted in docs/translation.md). It trains nothing: it exports RUN with ``multihead
export`` into a temporary directory and translates SRC with both, interleaved, each configuration twice (the faster
taken), in one process.

    .venv/bin/python benchmarks/ctranslate2_speed.py RUN SRC REF [--threads 2] [--beam 4] [--length-penalty 0.6]

Both engines take the same batches with the same length limit, as ``multihead translate`` makes them (sorted by
length, at most ``BATCH_TOKENS / beam`` source tokens each; a translation of an ``n``-token source stops after
``max(longest training target + 1, 2 n + 10)`` tokens): CTranslate2's ``translate_batch`` is called once per batch
with that ``max_decoding_length``, ``intra_threads`` = ``--threads``. multihead int8 is ``--quantize int8``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import ctranslate2
import numpy as np
import sacrebleu
import torch

from multihead import cpu
from multihead.app.corpus import read_lines
from multihead.app.export import export, vocabulary
from multihead.app.translate import BATCH_TOKENS, Generate, Translator, translate_ids
from multihead.decoding import SearchOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run directory written by multihead train")
    parser.add_argument("src", help="source sentences (plain or .gz)")
    parser.add_argument("ref", help="references, line-aligned with SRC")
    parser.add_argument("--threads", type=int, default=2, help="threads for both engines (default: 2)")
    parser.add_argument("--beam", type=int, default=4, help="beam size of the beam rows (default: 4)")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="both engines' (default: 0.6)")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}", flush=True)
    torch.set_num_threads(args.threads)
    sources, references = read_lines(args.src, "SRC"), read_lines(args.ref, "REF")
    ours = {
        compute: Translator(args.run, quantize=quantize) for compute, quantize in (("float32", None), ("int8", "int8"))
    }
    translator = ours["float32"]
    ids = translator.source.encode_all(sources)
    names = vocabulary(translator.source)
    target_ids = {piece: index for index, piece in enumerate(vocabulary(translator.target))}

    def theirs(engine: ctranslate2.Translator, beam: int) -> Generate:
        def generate(src: np.ndarray, limits: np.ndarray, indices: np.ndarray) -> np.ndarray:
            # CTranslate2 takes one limit a batch: the longest, each row cut at its own afterwards (translate_ids).
            # Greedy rows come out as with their own limit; a beam search may differ where a limit binds.
            batch = [[names[index] for index in row if index != translator.specials.pad] for row in src]
            max_len = int(limits.max())
            results = engine.translate_batch(
                batch, beam_size=beam, length_penalty=args.length_penalty, max_decoding_length=max_len
            )
            out = np.full((len(src), max_len + 1), translator.specials.eos, dtype=np.int64)  # (B, T): ends in EOS
            for row, result in enumerate(results):
                tokens = [target_ids[piece] for piece in result.hypotheses[0]]
                out[row, : len(tokens)] = tokens
            return out

        return generate

    with tempfile.TemporaryDirectory() as directory:
        model = export(args.run, Path(directory) / "ct2", checkpoint=None, quantization=None)
        engines = {
            compute: ctranslate2.Translator(str(model), device="cpu", compute_type=compute, intra_threads=args.threads)
            for compute in ("float32", "int8")
        }
        runs = {}
        for beam in (1, args.beam):
            search = SearchOptions(beam_size=beam, length_penalty=args.length_penalty)
            for compute in ("float32", "int8"):
                runs[f"multihead {compute}, beam {beam}"] = ours[compute].generate(search), beam
                runs[f"CTranslate2 {compute}, beam {beam}"] = theirs(engines[compute], beam), beam
        seconds, outputs = {name: float("inf") for name in runs}, {}
        for _ in range(2):  # interleaved: every configuration once, then again
            for name, (generate, beam) in runs.items():
                begin = time.perf_counter()
                found = translate_ids(
                    generate, ids, limit=translator.limit, generation=translator.generation,
                    batch_tokens=BATCH_TOKENS // beam,
                )  # fmt: skip
                seconds[name] = min(seconds[name], time.perf_counter() - begin)
                outputs[name] = [translator.target.decode(tokens) for tokens in found]
    for name in runs:
        bleu = sacrebleu.metrics.BLEU()
        score = bleu.corpus_score(outputs[name], [references])
        print(f"{name:32s} {seconds[name]:7.2f} s  BLEU {score.score:5.2f}")
    for beam in (1, args.beam):
        for compute in ("float32", "int8"):
            ratio = seconds[f"multihead {compute}, beam {beam}"] / seconds[f"CTranslate2 {compute}, beam {beam}"]
            print(f"beam {beam}, {compute}: multihead / CTranslate2 = {ratio:.2f}")
    print(f"multihead beam {args.beam} / its greedy = "
          f"{seconds[f'multihead float32, beam {args.beam}'] / seconds['multihead float32, beam 1']:.2f}")  # fmt: skip
    greedy = zip(outputs["multihead float32, beam 1"], outputs["CTranslate2 float32, beam 1"], strict=True)
    same = sum(a == b for a, b in greedy)
    print(f"greedy float32: {same} of {len(sources)} translations identical; sacreBLEU {bleu.get_signature()}")


if __name__ == "__main__":
    main()
