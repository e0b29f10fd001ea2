"""One weight format for both front ends: safetensors files keyed like the PyTorch state dict.

``q_proj.weight`` is stored ``(out, in)`` as ``torch.nn.Linear`` keeps it (a Keras ``Dense`` kernel is its
transpose). A file written from either front end loads into the other. Loading never unpickles anything, checks
every tensor's name and shape before it changes a single weight, and saving replaces the file atomically, so an
interrupted save leaves the previous file whole.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import safetensors
import safetensors.numpy

from multihead import __version__
from multihead.config import TransformerConfig

__all__ = ["atomic_write", "load_model", "load_weights", "save_model", "save_weights"]

PathLike = str | os.PathLike[str]
METADATA = {"producer": "multihead", "layout": "torch-state-dict"}


class StateAdapter(Protocol):
    """How one front end exposes its weights in the PyTorch state-dict layout, as NumPy arrays."""

    def export(self) -> dict[str, np.ndarray]: ...

    def shapes(self, stored: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """Expected name → shape; may first create unbuilt weights with the stored shapes as a guide."""
        ...

    def assign(self, tensors: Mapping[str, np.ndarray]) -> None: ...


class _TorchAdapter:
    def __init__(self, module: Any) -> None:
        self.module = module

    def export(self) -> dict[str, np.ndarray]:
        import torch

        # bfloat16 has no NumPy dtype: widen it to float32, which loads back exactly.
        return {
            name: (t.float() if t.dtype == torch.bfloat16 else t).detach().cpu().contiguous().numpy()
            for name, t in self.module.state_dict().items()
        }

    def shapes(self, stored: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in self.module.state_dict().items()}

    def assign(self, tensors: Mapping[str, np.ndarray]) -> None:
        import torch

        current = self.module.state_dict()
        converted = {
            name: torch.from_numpy(np.ascontiguousarray(array)).to(current[name].dtype)
            for name, array in tensors.items()
        }
        self.module.load_state_dict(converted, strict=True)


def _adapter(module_or_layer: object) -> StateAdapter:
    # Keras first: on the torch backend a Keras layer is also a torch.nn.Module.
    keras = sys.modules.get("keras")
    if keras is not None and isinstance(module_or_layer, keras.layers.Layer):
        from multihead.keras.state import KerasAdapter

        return KerasAdapter(module_or_layer)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(module_or_layer, torch.nn.Module):
        return _TorchAdapter(module_or_layer)
    raise TypeError(
        "`module_or_layer` must be a torch.nn.Module or a keras.layers.Layer, "
        f"received {type(module_or_layer).__name__}"
    )


def umask_mode(directory: bool = False) -> int:
    """The mode a plain ``open()``/``mkdir()`` would give: temporary files start private (0600/0700)."""
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


def atomic_write(path: PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(temporary_path)``, then move the result onto ``path`` in one step.

    A crash or kill at any moment leaves either the previous file or the new one, never part of one.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"`path` must be in an existing directory, received {str(path)!r}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_weights(module_or_layer: object, path: PathLike) -> None:
    """Write the weights of a torch module or Keras layer to a safetensors file, atomically."""
    tensors = _adapter(module_or_layer).export()
    atomic_write(
        path, lambda tmp: safetensors.numpy.save_file(tensors, tmp, metadata={**METADATA, "version": __version__})
    )


def read_weights(path: PathLike) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file as NumPy arrays; a clear ``ValueError`` if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weights file at {str(path)!r}")
    try:
        return safetensors.numpy.load_file(path)
    except (safetensors.SafetensorError, ValueError, TypeError) as error:
        raise ValueError(f"{str(path)!r} is not a readable safetensors weights file ({error})") from None


def load_weights(module_or_layer: object, path: PathLike) -> None:
    """Load a safetensors file (from either front end) into a torch module or Keras layer.

    Every name and shape is checked first: a missing, unexpected or wrongly shaped tensor raises ``ValueError``
    naming it, and no weight is changed.
    """
    adapter = _adapter(module_or_layer)
    tensors = read_weights(path)
    expected = adapter.shapes({name: array.shape for name, array in tensors.items()})
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"weights in {str(path)!r} do not match the model: missing {missing or 'none'}, "
            f"unexpected {unexpected or 'none'}"
        )
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != tuple(shape):
            raise ValueError(
                f"tensor {name!r} in {str(path)!r} has shape {tuple(tensors[name].shape)}, "
                f"the model expects {tuple(shape)}"
            )
    adapter.assign(tensors)


CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
FRAMEWORKS = ("torch", "keras")


def save_model(model: object, directory: PathLike) -> None:
    """Save a Transformer (either front end) as ``config.json`` and ``model.safetensors`` in ``directory``."""
    config = getattr(model, "config", None)
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"`model` must be a multihead Transformer, received {type(model).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_weights(model, directory / WEIGHTS_FILE)
    atomic_write(directory / CONFIG_FILE, lambda tmp: Path(tmp).write_text(config.to_json() + "\n", encoding="utf-8"))


def load_model(directory: PathLike, framework: str = "torch") -> Any:
    """Rebuild a Transformer saved by :func:`save_model` in ``framework`` (``"torch"`` or ``"keras"``).

    A torch model comes back in evaluation mode.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"`framework` must be one of {FRAMEWORKS}, received {framework!r}")
    config_path = Path(directory) / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {str(directory)!r}: not a saved multihead model")
    config = TransformerConfig.from_json(config_path.read_text(encoding="utf-8"))
    if framework == "torch":
        from multihead.torch import Transformer
    else:
        from multihead.keras import Transformer
    model = Transformer.from_config(config)
    load_weights(model, Path(directory) / WEIGHTS_FILE)
    return model.eval() if framework == "torch" else model
