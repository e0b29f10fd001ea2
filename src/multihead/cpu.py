"""What the CPU can do, as the kernels that run on it care: its instruction-set flags, read once.

The flags are Linux's (``/proc/cpuinfo``); elsewhere none are known, and every choice made from them falls back to
what runs everywhere.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")

VNNI = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
"""Flags of CPUs whose int8 dot products add up in int32 without saturating (Vector Neural Network Instructions)."""


@functools.cache
def _first_cpu() -> dict[str, str]:
    """The fields of the first processor in ``/proc/cpuinfo``; empty where there is none."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


def flags() -> frozenset[str]:
    """The CPU's instruction-set flags (``avx512f``, ``avx512_bf16``, ``amx_bf16``, ...); empty where unknown."""
    return frozenset(_first_cpu().get("flags", "").split())


def vendor() -> str:
    """The CPU's vendor (``GenuineIntel``, ``AuthenticAMD``, ...); empty where unknown."""
    return _first_cpu().get("vendor_id", "")


def family() -> int | None:
    """The CPU's family number (AMD's Zen 4 is 25, Zen 5 26); ``None`` where unknown."""
    value = _first_cpu().get("cpu family", "")
    return int(value) if value.isdigit() else None


def model() -> str:
    """The CPU's model number within its family, as ``/proc/cpuinfo`` gives it; empty where unknown."""
    return _first_cpu().get("model", "")


def has_vnni() -> bool:
    """Whether int8 products can take the full 8-bit range of their inputs without saturating (:data:`VNNI`)."""
    return bool(flags() & VNNI)


NAMED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
"""The flags :func:`describe` names: the vector widths and matrix units the kernels choose between."""


def describe() -> str:
    """One line naming the CPU for a benchmark's report: model name, vendor, family and model, the
    :data:`NAMED_FLAGS` it has, and the cores this process may use."""
    info = _first_cpu()
    named = " ".join(flag for flag in NAMED_FLAGS if flag in flags()) or "none of " + " ".join(NAMED_FLAGS)
    return (
        f"{info.get('model name', 'unknown CPU')} ({vendor() or 'unknown vendor'} family {family()} model "
        f"{model() or '?'}; {named}; {usable_cores()} cores)"
    )


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
