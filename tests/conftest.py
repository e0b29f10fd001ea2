"""Shared test helpers. Notation: B batch, H heads, Hkv key/value heads, Lq/Lk lengths, Dk/Dv head dims."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up chatter out of test output
# On NVIDIA GPUs, JAX and TensorFlow multiply float32 matrices in TF32 by default (errors ~1e-3): the tests compare
# with float64 references, so they ask for full float32 (nothing changes on CPUs).
os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
if os.environ.get("KERAS_BACKEND") == "jax":
    os.environ.setdefault("JAX_ENABLE_X64", "1")  # JAX has no float64 without it; the tests compare float64 results
    # Compiling dominates the JAX pass (a program for every new shape): LLVM's optimisations cost more than they save.
    os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")

import numpy as np
import pytest
import torch
from hypothesis import settings
from torch.overrides import TorchFunctionMode

from multihead.cache import KVCacheBase

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


# Tests parametrized over the two attention paths, with the ids they have always had: the fused kernel cannot return
# the weights, so the explicit path is also the one that does.
PATHS = pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])


def path_for(return_weights: bool) -> str:
    """The ``implementation`` a :data:`PATHS` test passes."""
    return "explicit" if return_weights else "fused"


class TorchCalls(TorchFunctionMode):
    """Record every torch function and tensor method called inside ``with TorchCalls() as calls:``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Callable] = []
        self.reductions: list[Callable] = []  # the calls among them that reduce a whole tensor (no ``dim``)

    def __torch_function__(self, func: Callable, types: object, args: tuple = (), kwargs: dict | None = None) -> object:
        kwargs = kwargs or {}
        self.calls.append(func)
        if len(args) < 2 and "dim" not in kwargs:
            self.reductions.append(func)
        return func(*args, **kwargs)

    def count(self, *funcs: Callable) -> int:
        return sum(call in funcs for call in self.calls)

    def count_whole(self, *funcs: Callable) -> int:
        """Calls of ``funcs`` over a whole tensor (given no ``dim``): ``max(x)``, not ``max(x, dim=1)``."""
        return sum(call in funcs for call in self.reductions)


class NumpyKVCache(KVCacheBase):
    """The shared KV cache bookkeeping over NumPy arrays: a third front end, written only for the tests.

    Unused buffer positions hold NaN, so reading past the cached length would show."""

    def _concat(self, cached: np.ndarray, new: np.ndarray) -> np.ndarray:
        return np.concatenate([cached, new], axis=2)

    def _empty(self, like: np.ndarray, length: int) -> np.ndarray:
        return np.full((like.shape[0], like.shape[1], length, like.shape[3]), np.nan)

    def _write(self, buffer: np.ndarray, new: np.ndarray, start: int) -> np.ndarray:
        buffer[:, :, start : start + new.shape[2]] = new
        return buffer

    def _take(self, x: np.ndarray, rows: object) -> np.ndarray:
        return x[np.asarray(rows)]


def filtered_distribution(probs: np.ndarray, top_k: int, top_p: float, temperature: float) -> np.ndarray:
    """The distribution sampling draws from, written plainly: the ``top_k`` most probable tokens (0: all), each
    probability raised to ``1 / temperature`` and renormalised, then the fewest most probable whose probability
    reaches ``top_p``, renormalised."""
    order = sorted(range(len(probs)), key=lambda token: -probs[token])
    kept = order if top_k == 0 else order[:top_k]
    weights = {token: probs[token] ** (1 / temperature) for token in kept}
    total = sum(weights.values())
    chosen, mass = [], 0.0
    for token in kept:
        if mass >= top_p:
            break
        chosen.append(token)
        mass += weights[token] / total
    out = np.zeros(len(probs))
    for token in chosen:
        out[token] = weights[token]
    return out / out.sum()


def mapped_from(tensor: torch.Tensor, path: Path) -> bool:
    """Whether ``tensor``'s bytes lie in this process's mapping of the file ``path`` (``/proc/self/maps``)."""
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.nbytes
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        low, high = (int(value, 16) for value in fields[0].split("-"))
        if len(fields) == 6 and fields[5] == str(path.resolve()) and low <= start and end <= high:
            return True
    return False
