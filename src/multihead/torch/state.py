"""PyTorch modules in the one weight format (see :mod:`multihead.io`): their state dict is the format's layout, so the
adapter only converts between tensors and NumPy arrays."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from multihead.torch.layouts import remake
from multihead.torch.pages import map_file, place


class TorchAdapter:
    """The :class:`multihead.io.StateAdapter` of PyTorch modules."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def export(self) -> dict[str, np.ndarray]:
        # bfloat16 has no NumPy dtype: widen it to float32, which loads back exactly.
        return {
            name: (t.float() if t.dtype == torch.bfloat16 else t).detach().cpu().contiguous().numpy()
            for name, t in self.module.state_dict().items()
        }

    def shapes(self, stored: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in self.module.state_dict().items()}

    def assign(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Each weight from ``tensors`` (names checked by the caller), one at a time, a tied weight once; then the
        quantized forms made from them anew (:func:`multihead.torch.quantize`). From a weights file, a weight on the
        CPU in the file's dtype takes the file's own pages (:mod:`multihead.torch.pages`); any other is copied in."""
        done: set[int] = set()
        read, from_file = _reader(tensors)
        with torch.no_grad():
            for name, weight in self.module.state_dict(keep_vars=True).items():
                if id(weight) not in done:
                    done.add(id(weight))
                    value = read(name)
                    if from_file and weight.device.type == "cpu" and value.dtype == weight.dtype:
                        place(weight, value)
                    else:
                        weight.copy_(value)
        remake(self.module)

    def weight_objects(self) -> Mapping[str, object]:
        return self.module.state_dict(keep_vars=True)


@runtime_checkable
class _WeightsFile(Protocol):
    """A weights file's tensors (:class:`multihead.io.StoredWeights`): its path, and each name's stored name."""

    path: Path

    def stored_name(self, name: str) -> str: ...


def _reader(tensors: Mapping[str, np.ndarray]) -> tuple[Callable[[str], torch.Tensor], bool]:
    """``tensors``' tensors by name as torch tensors, and whether they are a weights file's, mapped (else views of
    the caller's arrays, to be copied)."""
    if isinstance(tensors, _WeightsFile):
        mapped = map_file(tensors.path)
        return (lambda name: mapped(tensors.stored_name(name))), True
    return (lambda name: torch.from_numpy(np.ascontiguousarray(tensors[name]))), False
