"""Argument checks shared by the reference and every front end.

They look only at plain Python values and shape tuples, so the NumPy oracle, the PyTorch front end and the
Keras front end reject the same inputs with the same messages, before any computation.

Notation: B batch, H query heads, Hkv key/value heads, Lq query length, Lk key length, Dk query/key head
dim, Dv value head dim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

Shape = tuple[int | None, ...]  # None: a dim unknown until run time (symbolic Keras/TensorFlow shapes)


def _agree(*dims: int | None) -> bool:
    """Known dims are all equal; an unknown dim agrees with anything."""
    return len({d for d in dims if d is not None}) <= 1


class DTypeError(TypeError, ValueError):
    """A tensor of the wrong dtype (an integer mask, mixed input dtypes).

    It is both a ``TypeError`` (the object is the wrong kind) and a ``ValueError`` (the argument is bad), so
    either ``except`` clause catches it.
    """


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, received {value!r} of type {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"`{name}` must be a positive int, received {value}")
    return value


def check_non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, received {value!r} of type {type(value).__name__}")
    if value < 0:
        raise ValueError(f"`{name}` must be a non-negative int, received {value}")
    return value


def check_optional_positive_int(name: str, value: object) -> int | None:
    return None if value is None else check_positive_int(name, value)


def check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be True or False, received {value!r} of type {type(value).__name__}")
    return value


def check_dropout(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"`{name}` must be a float in [0, 1), received {value!r} of type {type(value).__name__}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"`{name}` must be in [0, 1), received {value!r}")
    return float(value)


def check_scale(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"`scale` must be a float or None, received {value!r} of type {type(value).__name__}")
    if not math.isfinite(float(value)):
        raise ValueError(f"`scale` must be finite, received {value!r}")
    return float(value)


def check_heads(num_heads: object, num_kv_heads: object) -> tuple[int, int]:
    """Return ``(num_heads, num_kv_heads)``; ``num_kv_heads=None`` means one key/value head per query head."""
    num_heads = check_positive_int("num_heads", num_heads)
    num_kv_heads = num_heads if num_kv_heads is None else check_positive_int("num_kv_heads", num_kv_heads)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"`num_heads` must be divisible by `num_kv_heads` (query heads are shared out in equal groups), "
            f"received num_heads={num_heads}, num_kv_heads={num_kv_heads}"
        )
    return num_heads, num_kv_heads


def resolve_head_dim(d_model: int, num_heads: int, head_dim: int | None) -> int:
    """``head_dim`` when given, else ``d_model // num_heads``, which must then divide evenly."""
    if head_dim is not None:
        return head_dim
    if d_model % num_heads:
        raise ValueError(
            f"`d_model` must be divisible by `num_heads` when `head_dim` is not given, "
            f"received d_model={d_model}, num_heads={num_heads}"
        )
    return d_model // num_heads


def check_attention_shapes(q: Shape, k: Shape, v: Shape, *, packed: bool = False) -> None:
    """q ``(B, H, Lq, Dk)``, k ``(B, Hkv, Lk, Dk)``, v ``(B, Hkv, Lk, Dv)`` with ``H % Hkv == 0``; or, ``packed``,
    the same without the batch axis and with length first: q ``(N, H, Dk)``, k ``(M, Hkv, Dk)``, v ``(M, Hkv, Dv)``."""
    layouts = (
        ("(N, H, Dk)", "(M, Hkv, Dk)", "(M, Hkv, Dv)")
        if packed
        else ("(B, H, Lq, Dk)", "(B, Hkv, Lk, Dk)", "(B, Hkv, Lk, Dv)")
    )
    head, length, dim = (1, 0, 2) if packed else (1, 2, 3)
    for name, shape, layout in zip(("q", "k", "v"), (q, k, v), layouts, strict=True):
        if len(shape) != len(layouts[0].split(",")):
            raise ValueError(f"`{name}` must be {len(layouts[0].split(','))}-D {layout}, received {name}.shape={shape}")
    if not packed and not _agree(q[0], k[0], v[0]):
        raise ValueError(f"`q`, `k`, `v` must share the batch size B, received q.shape={q}, k.shape={k}, v.shape={v}")
    if not _agree(k[head], v[head]):
        raise ValueError(f"`k` and `v` must have the same number of heads Hkv, received k.shape={k}, v.shape={v}")
    if q[head] == 0 or k[head] == 0:
        raise ValueError(
            f"`q` and `k` must have at least one head, received q.shape={q} (H={q[head]}), k.shape={k} (Hkv={k[head]})"
        )
    heads, kv_heads = q[head], k[head]
    if heads is not None and kv_heads is not None and heads % kv_heads:
        raise ValueError(
            f"the query heads H must be a multiple of the key/value heads Hkv, "
            f"received q.shape={q} (H={q[head]}), k.shape={k} (Hkv={k[head]})"
        )
    if not _agree(k[length], v[length]):
        which = "number of keys M" if packed else "length Lk"
        raise ValueError(f"`k` and `v` must have the same {which}, received k.shape={k}, v.shape={v}")
    if not _agree(q[dim], k[dim]):
        raise ValueError(f"`q` and `k` must have the same head dim Dk, received q.shape={q}, k.shape={k}")
    if q[dim] == 0:
        raise ValueError(f"`q` and `k` need a head dim Dk of at least 1 (scale 1/sqrt(Dk)), received q.shape={q}")


def check_broadcastable(name: str, shape: Shape, target: Shape, layout: str) -> None:
    """``shape`` must broadcast *to* ``target`` without growing it."""
    ok = len(shape) <= len(target) and all(m in (1, t) for m, t in zip(reversed(shape), reversed(target), strict=False))
    if not ok:
        raise ValueError(f"`{name}` must be broadcastable to {layout}={target}, received {name}.shape={shape}")


def check_mask_dtype(name: str, kind: str, dtype: object, *, allow_float: bool = True) -> None:
    """``kind`` is ``"bool"``, ``"float"`` or ``"other"``; ``dtype`` is quoted in the message."""
    if kind == "bool" or (allow_float and kind == "float"):
        return
    expected = "boolean (True = attend) or floating (added to the scores)" if allow_float else "boolean"
    raise DTypeError(f"`{name}` must be {expected}, received dtype {dtype}")


def check_features(name: str, shape: Shape, width: int) -> None:
    """A batch-first sequence of feature vectors: ``(B, L, width)``."""
    if len(shape) != 3:
        raise ValueError(f"`{name}` must be 3-D (B, L, {width}), received {name}.shape={shape}")
    if not _agree(shape[-1], width):
        raise ValueError(f"`{name}` must have {width} features in its last dim, received {name}.shape={shape}")


def check_same_batch(names: Sequence[str], shapes: Sequence[Shape]) -> None:
    if not _agree(*(shape[0] for shape in shapes)):
        received = ", ".join(f"{name}.shape={shape}" for name, shape in zip(names, shapes, strict=True))
        raise ValueError(f"{', '.join(f'`{name}`' for name in names)} must share the batch size B, received {received}")


def check_positions(name: str, offset: int, length: int, max_len: int) -> None:
    """Tokens at positions ``offset .. offset + length - 1`` must lie within the positional table."""
    if offset + length > max_len:
        raise ValueError(
            f"`{name}` would take positions {offset}..{offset + length - 1}, beyond the model's max_len={max_len}; "
            f"received {name} of length {length}"
        )


def check_module_inputs(query: Shape, key: Shape, value: Shape, qdim: int, kdim: int, vdim: int) -> None:
    """Batch-first module inputs: query ``(B, Lq, qdim)``, key ``(B, Lk, kdim)``, value ``(B, Lk, vdim)``."""
    for name, shape, dim in (("query", query, qdim), ("key", key, kdim), ("value", value, vdim)):
        check_features(name, shape, dim)
    check_same_batch(("query", "key", "value"), (query, key, value))
    if not _agree(key[1], value[1]):
        raise ValueError(
            f"`key` and `value` must have the same length Lk, received key.shape={key}, value.shape={value}"
        )


def check_padding_mask_shape(name: str, shape: Shape, batch: int | None, length: int | None) -> None:
    """A ``key_mask`` is ``(B, Lk)``, a ``query_mask`` ``(B, Lq)``."""
    layout = {"query_mask": "(B, Lq)", "key_mask": "(B, Lk)"}.get(name, "(B, L)")
    if len(shape) != 2 or not (_agree(shape[0], batch) and _agree(shape[1], length)):
        raise ValueError(f"`{name}` must have shape {layout}={(batch, length)}, received {name}.shape={tuple(shape)}")


def module_mask_shape(shape: Sequence[int]) -> Shape:
    """The 4-D ``(B, H, Lq, Lk)``-broadcastable shape of a module-level mask.

    Modules take ``(Lq, Lk)``, ``(B, Lq, Lk)`` (one mask per sequence, shared by the heads) and the functional
    ``(B, H, Lq, Lk)`` forms. A 3-D mask is per batch, not per head: that is what a module user means by it.
    """
    shape = tuple(shape)
    if len(shape) == 2:
        return (1, 1, *shape)
    if len(shape) == 3:
        return (shape[0], 1, shape[1], shape[2])
    if len(shape) == 4:
        return shape
    raise ValueError(f"`mask` must be 2-D (Lq, Lk), 3-D (B, Lq, Lk) or 4-D (B, H, Lq, Lk), received mask.shape={shape}")


WEIGHTLESS_PATHS = {
    "fused": "no fused kernel computes them",
    "blocked": "the scores exist a block at a time, never all at once",
}
"""Attention paths that cannot return the weights, and why."""


def check_implementation(value: object, choices: Sequence[str], *, return_weights: bool = False) -> str:
    """One of a front end's attention paths; the fused and blocked paths cannot return the weights."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"`implementation` must be one of {tuple(choices)}, received {value!r}")
    if value in WEIGHTLESS_PATHS and return_weights:
        raise ValueError(
            f"`implementation`={value!r} cannot return the weights ({WEIGHTLESS_PATHS[value]}); "
            "use 'explicit' or 'auto' with return_weights=True"
        )
    return value


def check_packed_lengths(name: str, lengths: object, total: int, total_name: str) -> list[int]:
    """The lengths of packed sequences: non-negative ints (a list or a 1-D integer tensor) summing to ``total``."""
    values = lengths.tolist() if hasattr(lengths, "tolist") else lengths
    if not isinstance(values, Sequence) or isinstance(values, str):
        raise TypeError(f"`{name}` must be a sequence of ints, received {type(lengths).__name__}")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in values):
        raise ValueError(f"`{name}` must hold non-negative ints, received {list(values)[:8]}")
    if sum(values) != total:
        raise ValueError(f"`{name}` must sum to {total_name}={total}, received {list(values)[:8]} (sum {sum(values)})")
    return list(values)
