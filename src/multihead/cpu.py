"""What the CPU can do, as the kernels that run on it care: its instruction-set flags, read once.

The flags are Linux's (``/proc/cpuinfo``); elsewhere none are known, and every choice made from them falls back to
what runs everywhere.
"""

from __future__ import annotations

import functools
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")

VNNI = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
"""Flags of CPUs whose int8 dot products add up in int32 without saturating (Vector Neural Network Instructions)."""


@functools.cache
def flags() -> frozenset[str]:
    """The CPU's instruction-set flags (``avx512f``, ``avx512_bf16``, ``amx_bf16``, ...); empty where unknown."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def has_vnni() -> bool:
    """Whether int8 products can take the full 8-bit range of their inputs without saturating (:data:`VNNI`)."""
    return bool(flags() & VNNI)
