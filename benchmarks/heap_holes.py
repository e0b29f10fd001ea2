"""Where a translation's heap has holes: every block ``malloc`` hands out, traced, and the heap at its highest.

glibc's heap is resident up to the highest address it has handed out (the command line has it keep freed memory, see
``multihead.app.memory``), so a process's peak is that address, not the memory in use. This runs
``benchmarks/deployed_sizes.py``'s multihead child (the same run, sentences, batches and search) with a small C
library preloaded (compiled here with ``cc``) that records every ``malloc``, ``posix_memalign``, ``calloc``,
``realloc`` and ``free`` of the main heap: blocks of 4 KiB and more throughout, and every block, however small, while
the first batch decodes (tracing them all from the start slows the process many times over). Replaying the record
gives the moment the heap reached its highest address, the blocks of 4 KiB and more in use then, and each free range
of at least 1 MiB between them (a hole): its size, the small blocks sitting in it, and its largest piece that holds
none (of those made in the first batch: a hole left from before it may hold small blocks the record does not show)::

    .venv/bin/python benchmarks/heap_holes.py WORK DATA [--beam 4] [--compute float32] [--sentences 200] [--tokens 32]
        [--int8-run]

WORK is ``deployed_sizes.py``'s (its ``run``), DATA Multi30k's directory. Linux with glibc only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from multihead import cpu

TRACER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void *(*next_malloc)(size_t), *(*next_calloc)(size_t, size_t), *(*next_realloc)(void *, size_t);
static void (*next_free)(void *);
static int (*next_memalign)(void **, size_t, size_t);
static int out = -1;
static size_t least = 4096;
static __thread int inside;
static char early[8192];
static size_t early_used;
void heap_trace_least(size_t bytes) { least = bytes; }
void heap_trace_mark(const char *text) {
  if (out >= 0) { char line[128]; int n = snprintf(line, sizeof line, "M %s\n", text); write(out, line, n); }
}
static void start(void) {
  if (next_malloc) return;
  next_calloc = dlsym(RTLD_NEXT, "calloc");
  next_realloc = dlsym(RTLD_NEXT, "realloc");
  next_free = dlsym(RTLD_NEXT, "free");
  next_memalign = dlsym(RTLD_NEXT, "posix_memalign");
  next_malloc = dlsym(RTLD_NEXT, "malloc");
  const char *path = getenv("HEAP_TRACE");
  if (path) out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
}
static void record(char what, void *at, size_t bytes) {
  if (out < 0 || inside || bytes < least) return;
  inside = 1;
  char line[64];
  int n = snprintf(line, sizeof line, "%c %lx %zu\n", what, (unsigned long)(uintptr_t)at, bytes);
  write(out, line, n);
  inside = 0;
}
void *malloc(size_t bytes) { start(); void *at = next_malloc(bytes); record('A', at, bytes); return at; }
void *calloc(size_t count, size_t size) {
  if (!next_calloc) {  /* dlsym itself may ask for zeroed memory before calloc is known */
    void *at = early + early_used; early_used += (count * size + 15) & ~(size_t)15; memset(at, 0, count * size);
    return at;
  }
  void *at = next_calloc(count, size); record('A', at, count * size); return at;
}
void free(void *at) {
  if (!at || ((char *)at >= early && (char *)at < early + sizeof early)) return;
  start(); record('F', at, malloc_usable_size(at)); next_free(at);
}
void *realloc(void *at, size_t bytes) {
  start(); size_t before = at ? malloc_usable_size(at) : 0; void *moved = next_realloc(at, bytes);
  if (at) record('F', at, before);
  record('A', moved, bytes); return moved;
}
int posix_memalign(void **at, size_t alignment, size_t bytes) {
  start(); int failed = next_memalign(at, alignment, bytes); if (!failed) record('A', *at, bytes); return failed;
}
"""

MAIN_HEAP_BELOW = 0x7000_0000_0000
"""Addresses of the main heap (``brk``) lie below this on x86-64 Linux; other arenas and mapped blocks above."""
HOLE = 1 << 20
SMALL = 4096
MIB = 2**20


def build(directory: Path) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("heap_holes.py needs a C compiler (cc or gcc) to build its tracer")
    source, library = directory / "heap_trace.c", directory / "heap_trace.so"
    source.write_text(TRACER)
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(source), "-ldl"], check=True)
    return library


def traced(args: argparse.Namespace) -> None:
    """The child: deployed_sizes.py's multihead translation, each batch marked, every block traced in the first."""
    import ctypes

    sys.path.insert(0, str(Path(__file__).parent))  # deployed_sizes.py, beside this file
    import deployed_sizes

    tracer = ctypes.CDLL(os.environ["HEAP_TRACE_LIBRARY"])
    batches = iter(range(1_000_000))
    from multihead.app import translate

    original = translate.translate_ids

    def marked(generate: Any, rows: Any, **options: Any) -> Any:
        def each(*batch: Any, **given: Any) -> Any:
            number = next(batches)
            tracer.heap_trace_mark(f"batch {number}".encode())
            tracer.heap_trace_least(ctypes.c_size_t(0 if number == 1 else SMALL))  # 0: the warm-up
            return generate(*batch, **given)

        return original(each, rows, **options)

    translate.translate_ids = marked  # what deployed_sizes' child calls
    result = deployed_sizes.translate_multihead(args)
    tracer.heap_trace_least(ctypes.c_size_t(SMALL))
    print(f"peak {deployed_sizes.peak_mb():.0f} MB, {result['seconds']:.1f} s")


def replay(path: Path) -> dict[str, Any]:
    """The main heap, from the record at ``path``, when it reached its highest address: its lowest and highest
    address, the batch then, and the blocks in use (address -> (bytes, the batch that made it))."""
    live: dict[int, tuple[int, str]] = {}
    top, bottom, batch, highest = 0, None, "load", ("load", {})
    with path.open() as lines:
        for line in lines:
            what, *rest = line.split()
            if what == "M":
                batch = " ".join(rest)
                continue
            address, size = int(rest[0], 16), int(rest[1])
            if address >= MAIN_HEAP_BELOW:
                continue
            if what == "F":
                live.pop(address, None)
                continue
            live[address] = (size, batch)
            bottom = address if bottom is None else min(bottom, address)
            if address + size > top:
                top, highest = address + size, (batch, dict(live))
    return {"bottom": bottom or 0, "top": top, "batch": highest[0], "blocks": highest[1]}


def holes(heap: dict[str, Any]) -> list[dict[str, Any]]:
    """Each range of at least :data:`HOLE` bytes between blocks of :data:`SMALL` bytes or more in ``heap`` (from
    :func:`replay`): where it starts (MiB above the lowest block), its size, the smaller blocks in it, and its largest
    piece between them."""
    blocks: dict[int, tuple[int, str]] = heap["blocks"]
    large = sorted(address for address, (size, _) in blocks.items() if size >= SMALL)
    small = sorted(address for address, (size, _) in blocks.items() if size < SMALL)
    found, start = [], heap["bottom"]
    for address in [*large, heap["top"]]:
        if address - start >= HOLE:
            inside = [at for at in small if start <= at < address]
            pieces, free = [], start
            for at in inside:
                pieces.append(at - free)
                free = max(free, at + blocks[at][0])
            found.append({
                "at_mib": (start - heap["bottom"]) / MIB, "mib": (address - start) / MIB, "small_blocks": len(inside),
                "largest_piece_mib": max([*pieces, address - free]) / MIB,
            })  # fmt: skip
        if address in blocks:
            start = max(start, address + blocks[address][0])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="deployed_sizes.py's directory (its run)")
    parser.add_argument("data", type=Path, help="Multi30k's directory")
    parser.add_argument("--beam", type=int, default=4, help="beam size (default: 4)")
    parser.add_argument("--compute", choices=("float32", "int8", "bfloat16"), default="float32",
                        help="as deployed_sizes.py's (default: float32)")  # fmt: skip
    parser.add_argument("--sentences", type=int, default=200, help="sentences translated (default: 200)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens each translation takes (default: 32)")
    parser.add_argument("--threads", type=int, default=2, help="threads (default: 2)")
    parser.add_argument("--int8-run", action="store_true", help="as deployed_sizes.py's: --compute int8 translates "
                        "WORK/run-int8 (made by deployed_sizes.py --int8-run)")  # fmt: skip
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not (args.work / "run").is_dir():
        raise SystemExit(f"no run in {str(args.work)!r}: make it with benchmarks/deployed_sizes.py WORK DATA first")
    if args.child:
        traced(args)
        return
    print(f"CPU: {cpu.describe()}")
    with tempfile.TemporaryDirectory(prefix="heap-holes-") as scratch:
        library, trace = build(Path(scratch)), Path(scratch) / "trace.txt"
        environment = {**os.environ, "LD_PRELOAD": str(library), "HEAP_TRACE": str(trace),
                       "HEAP_TRACE_LIBRARY": str(library)}  # fmt: skip
        command = [sys.executable, __file__, str(args.work), str(args.data), "--child", "--beam", str(args.beam),
                   "--compute", args.compute, "--sentences", str(args.sentences), "--tokens", str(args.tokens),
                   "--threads", str(args.threads), *(["--int8-run"] if args.int8_run else [])]  # fmt: skip
        done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"the traced translation failed:\n{done.stderr[-3000:]}")
        print(done.stdout.strip().splitlines()[-1])
        heap = replay(trace)
    in_use = sum(size for size, _ in heap["blocks"].values() if size >= SMALL)
    print(f"heap at its highest ({heap['batch']}): {(heap['top'] - heap['bottom']) / MIB:.0f} MiB from its lowest "
          f"block, {in_use / MIB:.0f} MiB of it in blocks of 4 KiB or more")  # fmt: skip
    print("| hole at (MiB) | size (MiB) | small blocks in it | largest piece free of them (MiB) |")
    print("|---:|---:|---:|---:|")
    for hole in holes(heap):
        at, size, pinned, piece = hole["at_mib"], hole["mib"], hole["small_blocks"], hole["largest_piece_mib"]
        print(f"| {at:.1f} | {size:.2f} | {pinned} | {piece:.2f} |")
    made = Counter(batch for size, batch in heap["blocks"].values() if size >= MIB)
    print("blocks of 1 MiB or more in use then, by the batch that made them:", dict(made))


if __name__ == "__main__":
    main()
