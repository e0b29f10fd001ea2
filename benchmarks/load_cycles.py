"""Resident memory over many loads and releases of one run in one process, as ``serve --max-loaded`` or ``--memory``
evicts and loads runs again (quoted in docs/serving.md).

    .venv/bin/python benchmarks/load_cycles.py RUN SOURCES [--quantize int8] [--cycles 30] [--sentences 32]

Each cycle loads RUN (``multihead.app.translate.Translator``, the guard off), translates the first ``--sentences``
lines of SOURCES (a text file, gzipped or not), lets the translator go and hands the freed memory back to the system
(``hand_back_memory``, what ``serve --memory`` does after a release); then the process's resident memory is read.
Each load is timed (``Translator(...)``, the run's tokenizers included) and its peak resident memory read (``VmHWM``,
reset before it): the summary gives the median of the loads after the first, what a server pays to load a run again.
With ``--quantize int8`` and the checkpoint's kept ``int8-*.safetensors`` removed first, the first cycle is the load
that packs the forms and writes that file, the others map it.
A leak grows it by about the same amount every cycle; caches that fill once grow it over the first cycles only. The
summary gives the growth over the first half of the cycles and over the second, per cycle.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from multihead import cpu
from multihead.app.corpus import iter_lines
from multihead.app.memory import hand_back_memory, peak_resident_bytes
from multihead.app.translate import Translator

MIB = 2**20


def cycles(args: argparse.Namespace, texts: list[str]) -> tuple[list[float], list[float]]:
    """The resident memory (MiB) after each cycle, and each cycle's load time (seconds)."""
    resident, loads = [], []
    for cycle in range(args.cycles):
        peak_resident_bytes(reset=True)
        begin = time.perf_counter()
        translator = Translator(args.run, quantize=args.quantize, guard=False)
        loads.append(time.perf_counter() - begin)
        peak = (peak_resident_bytes() or 0) / MIB
        translator.translate(texts)
        del translator
        resident.append((hand_back_memory() or 0) / MIB)
        print(f"cycle {cycle + 1}: loaded in {loads[-1]:.3f} s (peak {peak:.1f} MiB), {resident[-1]:.1f} MiB resident",
              flush=True)  # fmt: skip
    return resident, loads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="the run directory")
    parser.add_argument("sources", help="a text file of sentences to translate each cycle")
    parser.add_argument("--quantize", choices=("int8", "bf16"), help="as translate's --quantize")
    parser.add_argument("--cycles", type=int, default=30, help="loads and releases (at least 4)")
    parser.add_argument("--sentences", type=int, default=32, help="sentences translated each cycle")
    args = parser.parse_args()
    if args.cycles < 4:
        parser.error(f"--cycles must be at least 4, received {args.cycles}")
    texts = list(itertools.islice(iter_lines(args.sources, "SOURCES"), args.sentences))
    resident, loads = cycles(args, texts)
    half = args.cycles // 2
    first = (resident[half - 1] - resident[0]) / (half - 1)
    second = (resident[-1] - resident[half - 1]) / (args.cycles - half)
    print(f"\nCPU: {cpu.describe()}\nrun {args.run}, {args.quantize or 'float32'}, {args.cycles} cycles of "
          f"{len(texts)} sentences: {resident[0]:.1f} MiB after the first, {resident[-1]:.1f} after the last; "
          f"growth {first:+.2f} MiB a cycle over cycles 1-{half}, {second:+.2f} over {half}-{args.cycles}; "
          f"loads after the first: median {statistics.median(loads[1:]):.3f} s (first {loads[0]:.3f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
