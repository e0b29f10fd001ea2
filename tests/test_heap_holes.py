"""benchmarks/heap_holes.py's replay of a heap trace: the heap at its highest address and the holes in it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "heap_holes.py"


@pytest.fixture(scope="module")
def heap_holes():
    spec = importlib.util.spec_from_file_location("heap_holes", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["heap_holes"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["heap_holes"]


def test_a_replayed_trace_gives_the_heap_at_its_highest_and_the_small_blocks_pinning_its_holes(
    heap_holes, tmp_path: Path
) -> None:
    mib, base = 2**20, 0x5500_0000_0000
    trace = tmp_path / "trace.txt"
    trace.write_text(
        "\n".join(
            [
                f"A {base:x} {8 * mib}",  # stays
                f"A {base + 8 * mib:x} {4 * mib}",  # freed: a hole of 4 MiB...
                "M batch 1",
                f"F {base + 8 * mib:x} {4 * mib}",
                f"A {base + 9 * mib:x} 64",  # ...with a small block 1 MiB into it
                f"A {0x7F00_0000_0000:x} {64 * mib}",  # another arena: not the main heap
                f"A {base + 12 * mib:x} {4 * mib}",  # the highest address: 16 MiB
                f"F {base + 12 * mib:x} {4 * mib}",
                f"A {base + 12 * mib:x} {2 * mib}",  # lower than the highest: nothing changes
            ]
        )
        + "\n"
    )
    heap = heap_holes.replay(trace)
    assert (heap["bottom"], heap["top"], heap["batch"]) == (base, base + 16 * mib, "batch 1")
    assert sorted(heap["blocks"]) == [base, base + 9 * mib, base + 12 * mib]
    [hole] = heap_holes.holes(heap)
    assert hole == {"at_mib": 8.0, "mib": 4.0, "small_blocks": 1, "largest_piece_mib": (3 * mib - 64) / mib}
