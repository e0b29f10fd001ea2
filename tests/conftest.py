"""Shared test helpers. Notation: B batch, H heads, Hkv key/value heads, Lq/Lk lengths, Dk/Dv head dims."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up chatter out of test output

import numpy as np
import pytest
import torch

KERAS_TEST_FILES = ("test_keras_", "test_io")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that `make test` runs again under KERAS_BACKEND=torch."""
    for item in items:
        if Path(str(item.fspath)).name.startswith(KERAS_TEST_FILES):
            item.add_marker(pytest.mark.keras)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def randn(*shape: int, dtype: torch.dtype = torch.float64, requires_grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype).requires_grad_(requires_grad)


def to_numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().to(torch.float64).numpy() if x.dtype.is_floating_point else x.detach().numpy()


def state_dict_numpy(module: torch.nn.Module) -> dict[str, np.ndarray]:
    return {name: to_numpy(value) for name, value in module.state_dict().items()}
