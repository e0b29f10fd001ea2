"""The process's memory allocator, set up for training: freed memory kept for the next step, and what learning the
vocabulary and encoding a corpus freed handed back before training starts.

A training step allocates tensors of tens of MB (activations; the loss takes the logits a slice at a time).
glibc's ``malloc`` gives every block above its mmap threshold (which it raises by itself to 32 MiB at most) fresh
pages from the kernel and returns them when it is freed, so a step would pay a page fault for every 4 KiB of those
tensors (docs/translation.md measures what that costs: ``benchmarks/train_step.py --malloc-default``). TensorFlow and
JAX keep their own pools, so this concerns PyTorch only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 1 << 30
"""Blocks below 1 GiB come from the heap, where freed blocks are reused."""
TRIM_THRESHOLD = 2**31 - 1
"""Freed memory at the heap's top is kept up to 2 GiB (mallopt takes an int)."""
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.gnu_get_libc_version  # noqa: B018 (glibc's own: other C libraries' mallopt, if any, take other numbers)
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def release_freed_memory() -> None:
    """Hand the memory ``malloc`` holds free back to the system (glibc's ``malloc_trim``): Hugging Face's BPE trainer
    and the corpus's encoding leave hundreds of MB free in the process, which the training step cannot all reuse.
    Nothing elsewhere."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def keep_freed_memory() -> bool:
    """Have glibc's ``malloc`` keep freed memory for reuse (see the module's docstring). Whether it did: not on other C
    libraries, nor when the environment already sets glibc's malloc options, which then stand."""
    libc = None if any(name in os.environ for name in USER_SETTINGS) else _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def resident_bytes() -> int | None:
    """The process's resident memory in bytes (Linux's ``/proc/self/statm``); ``None`` where the system has no
    ``/proc``."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def peak_resident_bytes(*, reset: bool = False) -> int | None:
    """The most resident memory the process has held, in bytes (Linux's ``VmHWM``), since it started or since the
    last call with ``reset`` (which sets it to the resident memory now: ``/proc/self/clear_refs``); ``None`` where the
    system does not tell it, or cannot reset it when asked."""
    try:
        if reset:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")
        with open("/proc/self/status") as status:
            found = [line.split()[1] for line in status if line.startswith("VmHWM:")]
        return int(found[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None


def hand_back_memory() -> int | None:
    """Hand back to the system what the process holds free: a garbage collection (objects in reference cycles, such
    as a released model's), then the C allocator's free memory (:func:`release_freed_memory`). The resident memory
    then (:func:`resident_bytes`)."""
    gc.collect()
    release_freed_memory()
    return resident_bytes()
