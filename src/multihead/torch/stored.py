"""Weights kept as a file stores them in int8: a float32 weight whose values are int8 rows times one scale a row.

An int8 run (``multihead export --format multihead --quantization int8``) stores each matrix (linear weights,
embeddings) as int8 rows with a float32 scale a row (:mod:`multihead.io`). Loaded with
``load_weights(model, path, keep_int8=True)``, a PyTorch model's float32 weights on the CPU take them as
:class:`Int8Rows`: the int8 values on the file's own pages (mapped, :mod:`multihead.torch.pages`), never a float32 copy
of the matrix. Such a weight reads as the float32 weight it stands for, ``stored * scales[:, None]``: any operation on
it computes with those values, made for the call (PyTorch's first call through such a tensor imports some hundreds
of its modules, tens of MB). Two read less, and make no such call: an embedding's lookup (:meth:`Int8Rows.rows`, which
the Transformer calls itself) dequantizes only the rows it reads, and the int8 forms (:func:`multihead.torch.quantize`)
are packed from the stored values themselves, which are exactly what quantizing the dequantized weight gives back.
It is for inference: writing it (an optimizer's step, ``copy_``, ``load_state_dict``) or moving it to another device
or dtype raises; load the file without ``keep_int8`` to train or move the model.

Notation: R rows, C columns.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch.utils._pytree import tree_map

__all__ = ["Int8Rows"]


class Int8Rows(torch.Tensor):
    """A float32 matrix ``(R, C)`` held as int8 values ``stored (R, C)`` and float32 ``scales (R,)``: it reads as
    ``stored * scales[:, None]``; read-only (see :mod:`multihead.torch.stored`)."""

    stored: torch.Tensor
    """The int8 values ``(R, C)``."""
    scales: torch.Tensor
    """Each row's scale ``(R,)``, float32."""
    READ_ONLY: ClassVar[str] = (
        "is stored in int8 and kept so (load_weights(..., keep_int8=True)): it cannot be written, nor moved to another "
        "device or dtype; load the weights without keep_int8 to train or move the model"
    )

    @staticmethod
    def __new__(cls, values: torch.Tensor, scales: torch.Tensor) -> Int8Rows:
        if values.dtype != torch.int8 or values.dim() != 2 or scales.shape != values.shape[:1]:
            raise ValueError(
                f"`values` must be an int8 matrix and `scales` one float a row, received {values.dtype} "
                f"{tuple(values.shape)} and {tuple(scales.shape)}"
            )
        made = torch.Tensor._make_wrapper_subclass(cls, values.shape, dtype=torch.float32, device=values.device)
        made.stored, made.scales = values, scales.float()
        return made

    def dequantized(self) -> torch.Tensor:
        """The float32 matrix it stands for ``(R, C)``, made now."""
        return self.stored.float() * self.scales[:, None]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows ``ids (...)`` name, dequantized ``(..., C)``: an embedding's lookup, reading only those rows."""
        return self.stored[ids].float() * self.scales[ids].unsqueeze(-1)

    def __repr__(self) -> str:  # type: ignore[override]
        return f"Int8Rows(shape={tuple(self.shape)})"

    def __deepcopy__(self, memo: dict[int, Any]) -> Int8Rows:
        return Int8Rows(self.stored, self.scales)  # read-only: a copy shares the stored values

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten.embedding.default:
            return args[0].rows(args[1])
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            return Int8Rows(args[0].stored, args[0].scales)  # a parameter made of it, a detached view: still it
        if func._schema.is_mutable or func is torch.ops.aten._to_copy.default:
            raise RuntimeError(f"a weight {cls.READ_ONLY} (received {func})")

        def plain(x: Any) -> Any:
            return x.dequantized() if isinstance(x, Int8Rows) else x

        return func(*tree_map(plain, args), **tree_map(plain, kwargs))
