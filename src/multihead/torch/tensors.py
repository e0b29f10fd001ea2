"""What the shared rules need of PyTorch tensors: the operations of :class:`multihead.checks.TensorOps` (which
includes :class:`multihead.masks.MaskOps`), as ``OPS``.

Notation: Lq query length, Lk key length.
"""

from __future__ import annotations

import numpy as np
import torch

from multihead.masks import causal_diagonal

__all__ = ["OPS", "causal_tril"]


def causal_tril(lq: int, lk: int, device: torch.device | None) -> torch.Tensor:
    """The bottom-right causal mask ``(lq, lk)`` on ``device``."""
    return torch.ones(lq, lk, dtype=torch.bool, device=device).tril(diagonal=causal_diagonal(lq, lk))


class _TorchOps:
    noun = "a torch.Tensor"

    def is_tensor(self, x: object) -> bool:
        return isinstance(x, torch.Tensor)

    def kind(self, x: torch.Tensor) -> str:
        if x.dtype == torch.bool:
            return "bool"
        if x.dtype.is_floating_point:
            return "float"
        return "other" if x.dtype.is_complex else "int"

    def dtype(self, x: torch.Tensor) -> str:
        return str(x.dtype)

    def fits(self, x: torch.Tensor, parameter: torch.Tensor) -> bool:
        # Under autocast the dtypes may differ: autocast casts inputs and weights itself.
        return x.dtype == parameter.dtype or torch.is_autocast_enabled(x.device.type)

    def device(self, x: torch.Tensor) -> torch.device:
        return x.device

    def reshape(self, x: torch.Tensor, shape: tuple[int | None, ...]) -> torch.Tensor:
        return x.reshape(tuple(-1 if size is None else size for size in shape))  # None: as many as there are

    def value_range(self, x: torch.Tensor) -> tuple[int, int] | None:
        if not x.numel():
            return None
        low, high = torch.aminmax(x)
        return int(low), int(high)

    def values(self, x: torch.Tensor) -> np.ndarray:
        return x.detach().cpu().numpy()

    def is_bool(self, mask: torch.Tensor) -> bool:
        return mask.dtype == torch.bool

    def logical_and(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a & b

    def logical_or(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a | b

    def logical_not(self, a: torch.Tensor) -> torch.Tensor:
        return ~a

    def is_neg_inf(self, x: torch.Tensor) -> torch.Tensor:
        return torch.isneginf(x)

    def not_equal(self, x: torch.Tensor, value: int) -> torch.Tensor:
        return x != value

    def any_last(self, x: torch.Tensor) -> torch.Tensor:
        return x.any(dim=-1, keepdim=True)

    def where(self, condition: torch.Tensor, x: torch.Tensor, y: float) -> torch.Tensor:
        return torch.where(condition, x, y)

    def expand(self, x: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
        for axis in axes:
            x = x.unsqueeze(axis)
        return x

    def causal(self, lq: int, lk: int, like: torch.Tensor) -> torch.Tensor:
        return causal_tril(lq, lk, like.device)

    def first_position(self, like: torch.Tensor) -> torch.Tensor:
        return torch.arange(like.shape[1], device=like.device)[None] == 0  # (1, L)


OPS = _TorchOps()
