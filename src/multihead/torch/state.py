"""PyTorch modules in the one weight format (see :mod:`multihead.io`): their state dict is the format's layout, so the
adapter only converts between tensors and NumPy arrays."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from multihead.torch.layouts import remake


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
        """Copy each weight in from ``tensors`` (names checked by the caller), one at a time, a tied weight once; then
        the quantized forms made from them anew (:func:`multihead.torch.quantize`)."""
        done: set[int] = set()
        with torch.no_grad():
            for name, weight in self.module.state_dict(keep_vars=True).items():
                if id(weight) not in done:
                    done.add(id(weight))
                    weight.copy_(torch.from_numpy(np.ascontiguousarray(tensors[name])))
        remake(self.module)

    def weight_objects(self) -> Mapping[str, object]:
        return self.module.state_dict(keep_vars=True)
