"""Shared test helpers. Notation: B batch, H heads, Hkv key/value heads, Lq/Lk lengths, Dk/Dv head dims."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up chatter out of test output

import numpy as np
import pytest
import torch
from hypothesis import settings

TESTS = Path(__file__).parent
KERAS_TESTS = (TESTS / "keras", TESTS / "test_io.py")  # what `make test` runs once per Keras backend

# Property tests: reproducible in CI (set CI=1): the same examples every run, no example database written (a
# read-only checkout stays clean), and a failure prints the blob that replays it (@reproduce_failure).
# Locally they explore new examples each run and remember failures in .hypothesis/ (git-ignored).
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True, database=None)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that `make test` runs again under KERAS_BACKEND=torch."""
    for item in items:
        path = Path(str(item.fspath))
        if any(path == place or place in path.parents for place in KERAS_TESTS):
            item.add_marker(pytest.mark.keras)


@pytest.fixture(scope="module")
def fused_kernel() -> Iterator[None]:
    """Send every torch attention call without weights to the fused kernel, however small: for the files that test
    that path (small inference calls otherwise take the explicit math, which is faster there)."""
    import multihead.torch.functional as functional

    saved = functional.SMALL_INFERENCE_SCORES
    functional.SMALL_INFERENCE_SCORES = 0
    yield
    functional.SMALL_INFERENCE_SCORES = saved


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def randn(*shape: int, dtype: torch.dtype = torch.float64, requires_grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype).requires_grad_(requires_grad)


def to_numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().to(torch.float64).numpy() if x.dtype.is_floating_point else x.detach().numpy()


def state_dict_numpy(module: torch.nn.Module) -> dict[str, np.ndarray]:
    return {name: to_numpy(value) for name, value in module.state_dict().items()}


def broadcast_shapes(full: tuple[int, ...] = (2, 3, 4, 5)) -> list[tuple[int, ...]]:
    """Every shape that broadcasts to ``full`` (B, H, Lq, Lk), of every rank from 1 to 4."""
    shapes = set()
    for rank in range(1, len(full) + 1):
        for keep in itertools.product([True, False], repeat=rank):
            shapes.add(tuple(d if kept else 1 for d, kept in zip(full[-rank:], keep, strict=True)))
    return sorted(shapes, key=lambda s: (len(s), s))
