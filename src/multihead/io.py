"""One weight format for both front ends: safetensors files keyed like the PyTorch state dict.

``q_proj.weight`` is stored ``(out, in)`` as ``torch.nn.Linear`` keeps it (a Keras ``Dense`` kernel is its
transpose). A tied weight (one matrix under several names: tied embeddings) is stored once, under its first name; the
file's metadata (``aliases``) names the others, which read as it does. A file written from either front end loads into
the other.

A file may store its matrices in int8 (``write_weights(..., int8=True)``, an int8 run: a quarter of the size): each
2-D floating tensor as int8 rows and one float32 scale a row (:func:`int8_rows`: the int8 forms' rule, one scale per
output feature), listed in the metadata (``int8``), its scales under ``NAME:scales``. It reads as its dequantized
values, ``int8 * scale`` in float32, into either front end; a PyTorch model on the CPU can keep the int8 rows as they
are stored instead (``load_weights(..., keep_int8=True)``, :mod:`multihead.torch.stored`).

Loading never unpickles anything, checks every tensor's name, shape and kind of dtype before it changes a single
weight, and saving replaces the file atomically, so an interrupted save leaves the previous file whole.
:func:`save_model` replaces the model directory as a whole, so an interrupted save leaves the previous model loadable.

Each front end reads and writes its own weights through an adapter (``multihead.torch.state``,
``multihead.keras.state``), chosen by the kind of object given (``ADAPTERS``).
"""

from __future__ import annotations

import glob
import json
import operator
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import safetensors
import safetensors.numpy

from multihead import __version__
from multihead.config import TransformerConfig
from multihead.files import PathLike, atomic_write, atomic_write_text, fsync_directory, replace_directory, umask_mode

__all__ = [
    "FRAMEWORKS", "StoredWeights", "int8_rows", "load_model", "load_weights", "read_weights", "save_model",
    "save_weights", "stored_weights", "write_weights",
]  # fmt: skip

METADATA = {"producer": "multihead", "layout": "torch-state-dict"}
ALIASES = "aliases"
"""The metadata entry naming a file's aliases: JSON, each alias → the name its tensor is stored under."""
INT8 = "int8"
"""The metadata entry listing the tensors stored as int8 rows (JSON, their stored names), each with its rows' scales
under its name + :data:`SCALES`."""
SCALES = ":scales"
INT8_ROWS = 8192
"""Rows of a matrix quantized at a time (the largest, an NLLB-sized embedding, takes no float copy of itself)."""


class StateAdapter(Protocol):
    """How one front end exposes its weights in the PyTorch state-dict layout, as NumPy arrays."""

    def export(self) -> dict[str, np.ndarray]: ...

    def shapes(self, stored: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """Expected name → shape; may first create unbuilt weights with the stored shapes as a guide."""
        ...

    def assign(self, tensors: Mapping[str, np.ndarray]) -> None: ...

    def weight_objects(self) -> Mapping[str, object]:
        """name → the framework object holding that weight; tied weights (one object, several names) share one."""
        ...


def _aliases(adapter: StateAdapter) -> list[list[str]]:
    """Groups of names that are one weight (tied embeddings); the file holds it under each of them."""
    groups: dict[int, list[str]] = {}
    for name, weight in adapter.weight_objects().items():
        groups.setdefault(id(weight), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


FRAMEWORKS = ("torch", "keras")
"""The front ends, by the name ``load_model`` and the application take."""


def _keras_adapter(layer: Any) -> StateAdapter:
    from multihead.keras.state import KerasAdapter

    return KerasAdapter(layer)


def _torch_adapter(module: Any, *, keep_int8: bool = False) -> StateAdapter:
    from multihead.torch.state import TorchAdapter

    return TorchAdapter(module, keep_int8=keep_int8)


# Each front end's adapter, in the order they are tried: (framework module, its base class, our adapter). Keras comes
# first: on its torch backend a Keras layer is also a torch.nn.Module. An object can only be of a framework that is
# imported already, so no framework is imported to find out.
ADAPTERS = (("keras", "layers.Layer", _keras_adapter), ("torch", "nn.Module", _torch_adapter))


def _adapter(module_or_layer: object, *, keep_int8: bool = False) -> StateAdapter:
    for framework_name, base_name, adapter in ADAPTERS:
        framework = sys.modules.get(framework_name)
        if framework is not None and isinstance(module_or_layer, operator.attrgetter(base_name)(framework)):
            if not keep_int8:
                return adapter(module_or_layer)
            if framework_name != "torch":
                raise ValueError(f"`keep_int8` is for torch modules, received a {type(module_or_layer).__name__}")
            return _torch_adapter(module_or_layer, keep_int8=True)
    raise TypeError(
        "`module_or_layer` must be a torch.nn.Module or a keras.layers.Layer, "
        f"received {type(module_or_layer).__name__}"
    )


def save_weights(module_or_layer: object, path: PathLike, *, int8: bool = False) -> None:
    """Write the weights of a torch module or Keras layer to a safetensors file, atomically; a tied weight once;
    ``int8``: its matrices as int8 rows (see :func:`write_weights`)."""
    adapter = _adapter(module_or_layer)
    write_weights(adapter.export(), path, tied=_aliases(adapter), int8=int8)


def write_weights(
    tensors: Mapping[str, np.ndarray], path: PathLike, *, tied: Iterable[Sequence[str]] = (), int8: bool = False
) -> None:
    """Write ``tensors`` (named as the model's state dict) to a safetensors file, atomically. Each group of names in
    ``tied`` is one weight: stored once, under its first name, the others recorded as its aliases; a ``ValueError``
    if their values differ. ``int8``: every 2-D floating tensor stored as int8 rows with their scales
    (:func:`int8_rows`)."""
    aliases: dict[str, str] = {}
    for group in tied:
        present = [name for name in group if name in tensors]
        for name in present[1:]:
            if not np.array_equal(tensors[present[0]], tensors[name]):
                raise ValueError(f"tensors {present[0]!r} and {name!r} are tied but hold different values")
            aliases[name] = present[0]
    stored = {name: array for name, array in tensors.items() if name not in aliases}
    metadata = {**METADATA, "version": __version__}
    if aliases:
        metadata[ALIASES] = json.dumps(aliases, sort_keys=True)
    if int8:
        rows = sorted(name for name, array in stored.items() if array.ndim == 2 and array.dtype.kind == "f")
        for name in rows:
            stored[name], stored[name + SCALES] = int8_rows(stored[name])
        metadata[INT8] = json.dumps(rows)
    atomic_write(path, lambda tmp: safetensors.numpy.save_file(stored, tmp, metadata=metadata))


def int8_rows(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``matrix (R, C)`` as int8 rows ``(R, C)`` and their float32 scales ``(R,)``: ``scale = max |row| / 127`` (at
    least float32's smallest normal number), values ``round(row / scale)``, halves to even."""
    values = np.empty(matrix.shape, dtype=np.int8)  # (R, C)
    scales = np.empty(len(matrix), dtype=np.float32)  # (R,)
    tiny = np.finfo(np.float32).tiny
    for start in range(0, len(matrix), INT8_ROWS):
        block = np.asarray(matrix[start : start + INT8_ROWS], dtype=np.float32)  # (B, C)
        largest = np.maximum(block.max(axis=1, initial=0.0), -block.min(axis=1, initial=0.0))  # (B,)
        scales[start : start + len(block)] = np.maximum(largest / np.float32(127.0), tiny)
        quotient = block / scales[start : start + len(block), None]
        values[start : start + len(block)] = np.clip(np.rint(quotient), -127, 127)
    return values, scales


def read_weights(path: PathLike) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file as NumPy arrays; a clear ``ValueError`` if it is not one."""
    stored = stored_weights(path)
    return {name: stored[name] for name in stored}


_SAFETENSORS_KINDS = {"F": "f", "B": "f", "I": "i", "U": "u"}  # F32, BF16, I64, U8 ...; BOOL is "b"


class StoredWeights(Mapping[str, np.ndarray]):
    """The tensors of a safetensors file (memory-mapped), each read when asked for, a fresh array every time, an alias
    as the tensor it names; their names, shapes and dtypes come from the file's header alone. A model loads from it
    one tensor at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file = safetensors.safe_open(str(path), framework="numpy")
            stored = tuple(self._file.keys())
            aliases = json.loads((self._file.metadata() or {}).get(ALIASES, "{}"))
        except (safetensors.SafetensorError, ValueError, TypeError, OSError) as error:
            raise ValueError(f"{str(path)!r} is not a readable safetensors weights file ({error})") from None
        if not isinstance(aliases, dict) or not all(
            isinstance(alias, str) and target in stored for alias, target in aliases.items()
        ):
            raise ValueError(f"{str(path)!r}: its metadata's {ALIASES!r} must name stored tensors, received {aliases}")
        self.aliases: dict[str, str] = aliases
        """Each alias → the name its tensor is stored under."""
        self.int8: frozenset[str] = self._int8_rows(stored)
        """The stored names of the tensors stored as int8 rows (each with its scales under name + ``:scales``)."""
        scales = {name + SCALES for name in self.int8}
        self._names = tuple(name for name in stored if name not in scales)
        self._names += tuple(alias for alias in aliases if alias not in stored)

    def _int8_rows(self, stored: tuple[str, ...]) -> frozenset[str]:
        """The metadata's :data:`INT8` list, each entry checked: an int8 matrix with a float32 scale a row."""
        listed = json.loads((self._file.metadata() or {}).get(INT8, "[]"))
        if not isinstance(listed, list):
            raise ValueError(f"{str(self.path)!r}: its metadata's {INT8!r} must list stored tensors, received {listed}")
        for name in listed:
            values = self._file.get_slice(name) if name in stored else None
            scales = self._file.get_slice(name + SCALES) if name + SCALES in stored else None
            if (
                values is None or scales is None or values.get_dtype() != "I8" or scales.get_dtype() != "F32"
                or len(values.get_shape()) != 2 or scales.get_shape() != values.get_shape()[:1]
            ):  # fmt: skip
                raise ValueError(
                    f"{str(self.path)!r}: {name!r} is listed as stored in int8, but the file does not hold it as an "
                    f"int8 matrix with {name + SCALES!r}, a float32 scale for each of its rows"
                )
        return frozenset(listed)

    def scales_name(self, name: str) -> str | None:
        """The stored name of ``name``'s rows' scales where it is stored as int8 rows; else ``None``."""
        stored = self.stored_name(name)
        return stored + SCALES if stored in self.int8 else None

    def tie(self, groups: Iterable[Sequence[str]]) -> None:
        """Read each name of ``groups`` (names a model ties into one weight) that the file lacks as one of its group
        that it holds: a file rewritten by tools that drop the metadata's aliases still loads into the tied model."""
        for group in groups:
            held = [name for name in group if name in self._names]
            for name in group:
                if held and name not in self._names:
                    self.aliases[name] = self.stored_name(held[0])
                    self._names += (name,)

    def stored_name(self, name: str) -> str:
        """The name ``name``'s tensor is stored under: its own, or the one it is an alias of."""
        return self.aliases.get(name, name)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(name)
        try:
            scales = self.scales_name(name)
            values = self._file.get_tensor(self.stored_name(name))
            return values if scales is None else values.astype(np.float32) * self._file.get_tensor(scales)[:, None]
        except (safetensors.SafetensorError, ValueError, TypeError, OSError) as error:
            raise ValueError(f"{str(self.path)!r}: tensor {name!r} cannot be read ({error})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file.get_slice(self.stored_name(name)).get_shape())

    def dtype_kind(self, name: str) -> str:
        """The NumPy kind of the tensor's dtype: ``"f"`` floating (bfloat16 too, and int8 rows), ``"i"``, ``"u"`` or
        ``"b"``."""
        if self.scales_name(name) is not None:
            return "f"
        dtype = self._file.get_slice(self.stored_name(name)).get_dtype()
        return "b" if dtype == "BOOL" else _SAFETENSORS_KINDS.get(dtype[0], "?")

    def equal(self, first: str, second: str, rows: int = 4096) -> bool:
        """Whether two tensors hold the same values, compared ``rows`` rows at a time."""
        first, second = self.stored_name(first), self.stored_name(second)
        if first == second:
            return True
        if self.shape(first) != self.shape(second) or self.dtype_kind(first) != self.dtype_kind(second):
            return False
        if not self.shape(first) or first in self.int8 or second in self.int8:
            return bool(np.array_equal(self[first], self[second]))
        a, b, length = self._file.get_slice(first), self._file.get_slice(second), self.shape(first)[0]
        return all(
            np.array_equal(a[start : min(start + rows, length)], b[start : min(start + rows, length)])
            for start in range(0, length, rows)
        )


def stored_weights(path: PathLike) -> StoredWeights:
    """The tensors of a safetensors file, read as they are asked for (:class:`StoredWeights`); a clear
    ``ValueError`` if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weights file at {str(path)!r}")
    return StoredWeights(path)


_KIND_NAMES = {"f": "floating", "i": "signed integer", "u": "unsigned integer", "b": "boolean"}


def load_weights(module_or_layer: object, path: PathLike, *, keep_int8: bool = False) -> None:
    """Load a safetensors file (from either front end) into a torch module or Keras layer.

    Every name, shape and kind of dtype is checked first: a missing, unexpected, wrongly shaped or wrongly typed
    tensor raises ``ValueError`` naming it, and no weight is changed. Floating tensors load into floating weights
    of any precision; an integer tensor where the model holds floats (or the reverse) is refused, since its bytes
    would be read as other numbers. Matrices stored as int8 rows load as their dequantized values; with
    ``keep_int8`` a torch module's float32 weights on the CPU keep them as stored instead, for inference
    (:mod:`multihead.torch.stored`: read-only, no float32 copy).
    """
    adapter = _adapter(module_or_layer, keep_int8=keep_int8)
    tensors = stored_weights(path)  # one tensor in memory at a time: a large model loads without a second copy
    expected = adapter.shapes({name: tensors.shape(name) for name in tensors})
    tensors.tie(_aliases(adapter))
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"weights in {str(path)!r} do not match the model: missing {missing or 'none'}, "
            f"unexpected {unexpected or 'none'}"
        )
    for name, shape in expected.items():
        if tensors.shape(name) != tuple(shape):
            raise ValueError(
                f"tensor {name!r} in {str(path)!r} has shape {tensors.shape(name)}, the model expects {tuple(shape)}"
            )
    # The export is the one view of the weights' dtypes that every front end's adapter offers.
    for name, current in adapter.export().items():
        if tensors.dtype_kind(name) != current.dtype.kind:
            raise ValueError(
                f"tensor {name!r} in {str(path)!r} is stored as {tensors[name].dtype}, "
                f"the model expects a {_KIND_NAMES.get(current.dtype.kind, current.dtype.kind)} dtype "
                f"({current.dtype})"
            )
    for names in _aliases(adapter):
        different = [name for name in names[1:] if not tensors.equal(names[0], name)]
        if different:
            raise ValueError(
                f"tensors {[names[0], *different]} in {str(path)!r} differ, but the model ties them into one weight "
                "(tie_embeddings or tie_output): the file is not of this model"
            )
    adapter.assign(tensors)


CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MODEL_FILES = (CONFIG_FILE, WEIGHTS_FILE)


def save_model(model: object, directory: PathLike) -> None:
    """Save a Transformer (either front end) as ``config.json`` and ``model.safetensors`` in ``directory``.

    Both files are written into a hidden sibling directory, which then takes the place of ``directory`` in one
    step: a kill at any moment leaves the previous model or the new one loadable, never new weights under an old
    config.
    A ``directory`` holding anything else is refused, since replacing it would lose those files.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"`model` must be a multihead Transformer, received {type(model).__name__}")
    given = Path(directory)
    if given.exists() and not given.is_dir():
        raise ValueError(f"`directory` must be a directory or a new path, received {str(given)!r}, which is a file")
    target = given.resolve()  # a symlinked directory is replaced where it really lies
    if target.is_dir():
        foreign = sorted(entry.name for entry in target.iterdir() if entry.name not in MODEL_FILES)
        if foreign:
            raise ValueError(
                f"`directory` must be new or hold only a saved model ({', '.join(MODEL_FILES)}), "
                f"received {str(given)!r}, which also holds {foreign}"
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f"{glob.escape('.' + target.name)}.saving-*"):  # left by a killed save
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.saving-", dir=target.parent))
    try:
        save_weights(model, staging / WEIGHTS_FILE)
        atomic_write_text(staging / CONFIG_FILE, config.to_json() + "\n")
        os.chmod(staging, umask_mode(directory=True))
        fsync_directory(staging)
        replace_directory(staging, target)
        fsync_directory(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # after a swap it holds the previous model


def load_model(directory: PathLike, framework: str = "torch") -> Any:
    """Rebuild a Transformer saved by :func:`save_model` in ``framework`` (``"torch"`` or ``"keras"``).

    A torch model comes back in evaluation mode.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"`framework` must be one of {FRAMEWORKS}, received {framework!r}")
    config_path = Path(directory) / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {str(directory)!r}: not a saved multihead model")
    config = read_config(config_path)
    if framework == "torch":
        from multihead.torch import Transformer

        model = Transformer.from_config(config, initialise=False)  # every weight loaded next
    else:
        from multihead.keras import Transformer as KerasTransformer

        model = KerasTransformer.from_config(config)
    load_weights(model, Path(directory) / WEIGHTS_FILE)
    return model.eval() if framework == "torch" else model


def read_config(path: Path) -> TransformerConfig:
    """The :class:`TransformerConfig` in the JSON file ``path``; every refusal names the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{str(path)!r} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    try:
        return TransformerConfig.from_json(text)
    except TypeError as error:
        raise TypeError(f"{str(path)!r}: {error}") from None
    except ValueError as error:
        raise ValueError(f"{str(path)!r}: {error}") from None
