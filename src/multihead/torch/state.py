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
from multihead.torch.stored import Int8Rows


class TorchAdapter:
    """The :class:`multihead.io.StateAdapter` of PyTorch modules; ``keep_int8``: see :meth:`assign`."""

    def __init__(self, module: torch.nn.Module, *, keep_int8: bool = False) -> None:
        self.module = module
        self.keep_int8 = keep_int8

    def export(self) -> dict[str, np.ndarray]:
        return {name: _plain(t).detach().cpu().contiguous().numpy() for name, t in self.module.state_dict().items()}

    def shapes(self, stored: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in self.module.state_dict().items()}

    def assign(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Each weight from ``tensors`` (names checked by the caller), one at a time, a tied weight once; then the
        quantized forms made from them anew (:func:`multihead.torch.quantize`). From a weights file, a weight on the
        CPU in the file's dtype takes the file's own pages (:mod:`multihead.torch.pages`); any other is copied in. With
        ``keep_int8``, a float32 weight on the CPU that the file stores as int8 rows becomes them, as stored
        (:class:`~multihead.torch.stored.Int8Rows`, on the file's pages); else it loads their dequantized values."""
        kept = [name for name, weight in self.module.state_dict(keep_vars=True).items() if isinstance(weight, Int8Rows)]
        if kept:
            raise RuntimeError(f"weight {kept[0]!r} {Int8Rows.READ_ONLY}")
        done: set[int] = set()
        read, from_file = _reader(tensors)
        with torch.no_grad():
            for name, weight in self.module.state_dict(keep_vars=True).items():
                if id(weight) not in done:
                    done.add(id(weight))
                    value = read(name)
                    if isinstance(value, Int8Rows):
                        if self.keep_int8 and weight.device.type == "cpu" and weight.dtype == torch.float32:
                            # One object for every name it is tied under: swapped, not replaced (not a Parameter:
                            # nothing trains it).
                            torch.utils.swap_tensors(weight, value)
                            continue
                        value = value.dequantized()
                    if from_file and weight.device.type == "cpu" and value.dtype == weight.dtype:
                        place(weight, value)
                    else:
                        weight.copy_(value)
        remake(self.module)

    def weight_objects(self) -> Mapping[str, object]:
        return self.module.state_dict(keep_vars=True)


@runtime_checkable
class _WeightsFile(Protocol):
    """A weights file's tensors (:class:`multihead.io.StoredWeights`): its path, each name's stored name, and the
    stored name of its rows' scales where it is stored as int8 rows."""

    path: Path

    def stored_name(self, name: str) -> str: ...

    def scales_name(self, name: str) -> str | None: ...


def _reader(tensors: Mapping[str, np.ndarray]) -> tuple[Callable[[str], torch.Tensor], bool]:
    """``tensors``' tensors by name as torch tensors (a matrix stored as int8 rows as
    :class:`~multihead.torch.stored.Int8Rows`), and whether they are a weights file's, mapped (else views of the
    caller's arrays, to be copied)."""
    if isinstance(tensors, _WeightsFile):
        mapped = map_file(tensors.path)

        def read(name: str) -> torch.Tensor:
            stored, scales = mapped(tensors.stored_name(name)), tensors.scales_name(name)
            return stored if scales is None else Int8Rows(stored, mapped(scales))

        return read, True
    return (lambda name: torch.from_numpy(np.ascontiguousarray(tensors[name]))), False


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a plain tensor NumPy can take: int8 rows dequantized, bfloat16 (which NumPy lacks) widened to
    float32, which loads back exactly."""
    if isinstance(tensor, Int8Rows):
        return tensor.dequantized()
    return tensor.float() if tensor.dtype == torch.bfloat16 else tensor
