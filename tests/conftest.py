"""Shared test helpers. Notation: B batch, H heads, Hkv key/value heads, Lq/Lk lengths, Dk/Dv head dims."""

from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def randn(*shape: int, dtype: torch.dtype = torch.float64, requires_grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype).requires_grad_(requires_grad)


def to_numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().to(torch.float64).numpy() if x.dtype.is_floating_point else x.detach().numpy()


def state_dict_numpy(module: torch.nn.Module) -> dict[str, np.ndarray]:
    return {name: to_numpy(value) for name, value in module.state_dict().items()}
