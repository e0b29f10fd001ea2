"""The PyTorch trainer keeps freed memory for reuse (multihead.app.memory); its speed is benchmarks/train_step.py's."""

from __future__ import annotations

import platform

import pytest

import multihead.app.train_torch as train_torch
from multihead.app.memory import keep_freed_memory
from multihead.config import TransformerConfig


def test_glibc_keeps_freed_memory_and_other_c_libraries_are_left_alone() -> None:
    assert keep_freed_memory() == (platform.libc_ver()[0] == "glibc")


@pytest.mark.parametrize("setting", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"])
def test_the_users_own_malloc_settings_stand(setting: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(setting, "1")
    assert keep_freed_memory() is False


def test_the_torch_trainer_keeps_freed_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(train_torch, "keep_freed_memory", lambda: calls.append(True))
    config = TransformerConfig(10, 10, 16, 2, 1, 1, 32, 0.0, "relu", False, 16, 0, False)
    train_torch.TorchTrainer(config, {"seed": 0, "lr": 1e-3, "clip": 0.0, "label_smoothing": 0.0}, None)
    assert calls == [True]
