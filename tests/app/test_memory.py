"""The PyTorch trainer keeps freed memory for reuse (multihead.app.memory); its speed is benchmarks/train_step.py's."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

import multihead.app.train_torch as train_torch
from app.support import torch_trainer
from multihead.app.memory import keep_freed_memory, release_freed_memory


def test_glibc_keeps_freed_memory_and_other_c_libraries_are_left_alone() -> None:
    assert keep_freed_memory() == (platform.libc_ver()[0] == "glibc")


@pytest.mark.parametrize("setting", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"])
def test_the_users_own_malloc_settings_stand(setting: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(setting, "1")
    assert keep_freed_memory() is False


def test_the_torch_trainer_keeps_freed_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(train_torch, "keep_freed_memory", lambda: calls.append(True))
    torch_trainer()
    assert calls == [True]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not Path("/proc/self/statm").exists(), reason="glibc's")
def test_freed_memory_is_handed_back_to_the_system() -> None:
    """Blocks freed between blocks still in use stay in the process (resident) until released."""

    def resident() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    blocks = [bytes(2000) for _ in range(100_000)]  # 200 MB of malloc's blocks (above Python's own small objects)
    kept = blocks[::100]
    del blocks
    before = resident()
    release_freed_memory()
    assert before - resident() > 100 * 2**20
    assert len(kept) == 1000
