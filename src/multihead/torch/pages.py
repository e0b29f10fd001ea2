"""Weights on a weights file's own pages: loading maps the safetensors file (copy-on-write) instead of reading it, and
the pages of a weight that an inference form has copied (packed for oneDNN, quantized) go back to the page cache.

A mapped weight takes memory only for the pages that something reads (an embedding's looked-up rows, say), loads in
the time the file's header takes to read, and shares its pages with every process that maps the same file (replicas
of one service). Writing to it (training, an optimizer's step) copies the pages written, as any tensor's would be
written; the file never changes. Like every memory-mapped file, it must not be overwritten in place while mapped
(``multihead.io`` replaces files whole, so its own saves never do).

:func:`release` is the hand-back: once a form holds its own copy of a weight, the weight's pages that are still the
file's (never written) leave the process (``madvise(MADV_DONTNEED)``); reading the weight again reads them back from the
page cache. Pages that were written are kept, so nothing is ever lost. Linux only (``/proc/self/pagemap`` tells the
file's pages from written ones); elsewhere :func:`release` does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import safetensors
import torch

__all__ = ["map_file", "place", "release"]

MAPPED = "_multihead_file_pages"
"""The attribute a mapped tensor carries: ``(data_ptr, nbytes)`` of the file pages it was mapped on."""
MADV_DONTNEED = 4
PRESENT, SWAPPED, FILE_PAGE = 1 << 63, 1 << 62, 1 << 61  # /proc/self/pagemap's bits (the kernel's admin-guide/mm)


def map_file(path: Path) -> Callable[[str], torch.Tensor]:
    """A reader of the safetensors file ``path``'s tensors by stored name, each on the file's own pages (mapped
    copy-on-write by safetensors) and marked as such for :func:`release`."""
    handle = safetensors.safe_open(str(path), framework="pt")
    ranges = _mappings_of(path)

    def tensor(name: str) -> torch.Tensor:
        found = handle.get_tensor(name)
        start, end = found.data_ptr(), found.data_ptr() + found.nbytes
        if any(low <= start and end <= high for low, high in ranges):
            setattr(found, MAPPED, (start, found.nbytes))
        return found

    return tensor


def place(weight: torch.Tensor, value: torch.Tensor) -> None:
    """``weight`` (a parameter or buffer, which stays the same object) takes ``value``'s data: its pages, and its
    mark if :func:`map_file` mapped it."""
    weight.data = value
    mark = getattr(value, MAPPED, None)
    if mark is not None:
        setattr(weight, MAPPED, mark)


def _mappings_of(path: Path) -> list[tuple[int, int]]:
    """The address ranges at which this process maps the file ``path`` (none where ``/proc`` is not there)."""
    target = str(path.resolve())
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    ranges = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == target:
            low, high = fields[0].split("-")
            ranges.append((int(low, 16), int(high, 16)))
    return ranges


def release(tensor: torch.Tensor, part: torch.Tensor | None = None) -> None:
    """Hand back the pages of a weight mapped by :func:`map_file` (of ``part`` only, where given: a contiguous piece of
    it, such as a block of its rows) that hold only its bytes and are still the file's; nothing for any other tensor,
    nor where one of its pages was written."""
    mapped = getattr(tensor, MAPPED, None)
    libc = _libc()
    if mapped is None or libc is None or mapped != (tensor.data_ptr(), tensor.nbytes):
        return
    start, nbytes = mapped if part is None else (part.data_ptr(), part.nbytes)
    if part is not None and not (part.is_contiguous() and mapped[0] <= start <= start + nbytes <= sum(mapped)):
        return
    size = mmap.PAGESIZE
    first, end = -(-start // size), (start + nbytes) // size  # whole pages inside those bytes
    if end <= first or not _file_pages_only(first, end - first):
        return
    libc.madvise(ctypes.c_void_p(first * size), ctypes.c_size_t((end - first) * size), MADV_DONTNEED)


def _file_pages_only(first: int, count: int) -> bool:
    """Whether pages ``first`` … ``first + count - 1`` of this process are each either absent or a file's page: none
    written since it was mapped (copy-on-write made it anonymous, in memory or swapped out)."""
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return False
    try:
        entries = np.frombuffer(os.pread(fd, 8 * count, 8 * first), dtype=np.uint64)
    finally:
        os.close(fd)
    if len(entries) != count:
        return False
    present, swapped, file = ((entries & np.uint64(bit)) != 0 for bit in (PRESENT, SWAPPED, FILE_PAGE))
    return not (swapped | (present & ~file)).any()


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library's ``madvise`` where the system has ``/proc/self/pagemap`` (Linux), else ``None``."""
    if not os.path.exists("/proc/self/pagemap"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc
