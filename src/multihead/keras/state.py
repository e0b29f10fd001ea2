"""Keras weights in the PyTorch state-dict layout (the one weight format, see :mod:`multihead.io`).

A ``Dense`` kernel is ``(in, out)``; ``torch.nn.Linear.weight`` is ``(out, in)``: the file holds the transpose.
Composite layers of this package list their children in ``state_children()`` (name → sublayer), which gives
the dotted names, ``q_proj.weight`` and so on; a layer of ours with weights of its own lists them in
``state_variables()``. Tied weights appear under each of their names, as in a PyTorch state dict.
"""

from __future__ import annotations

from collections.abc import Mapping

import keras
import numpy as np
from keras import ops


def _leaf_variables(layer: keras.layers.Layer) -> dict[str, tuple[keras.Variable, bool]] | None:
    """name → (variable, stored transposed) for the Keras layers that have a PyTorch counterpart."""
    if isinstance(layer, keras.layers.Dense):
        variables = {"weight": (layer.kernel, True)}
        if layer.bias is not None:
            variables["bias"] = (layer.bias, False)
        return variables
    if isinstance(layer, keras.layers.LayerNormalization):
        return {"weight": (layer.gamma, False), "bias": (layer.beta, False)}
    if isinstance(layer, keras.layers.Embedding):
        return {"weight": (layer.embeddings, False)}
    if hasattr(layer, "state_variables"):  # a layer of ours with weights of its own
        return layer.state_variables()
    return None


def torch_layout_variables(layer: keras.layers.Layer, prefix: str = "") -> dict[str, tuple[keras.Variable, bool]]:
    """Every weight of ``layer`` under its PyTorch state-dict name, with whether the file stores it transposed."""
    leaf = _leaf_variables(layer)
    if leaf is not None:
        return {prefix + name: entry for name, entry in leaf.items()}
    if not hasattr(layer, "state_children"):
        raise TypeError(f"layer {layer.name!r} of type {type(layer).__name__} has no PyTorch state-dict layout")
    variables = {}
    for name, child in layer.state_children().items():
        variables.update(torch_layout_variables(child, f"{prefix}{name}."))
    return variables


class KerasAdapter:
    """The :class:`multihead.io.StateAdapter` of Keras layers."""

    def __init__(self, layer: keras.layers.Layer) -> None:
        self.layer = layer
        self._build_from: Mapping[str, tuple[int, ...]] | None = None
        self._probe: keras.layers.Layer | None = None  # an unbuilt layer's copy, built from a file's shapes

    def export(self) -> dict[str, np.ndarray]:
        layer = self.layer if self.layer.built or self._probe is None else self._probe
        if not layer.built:
            self._require_built()
        return {
            name: np.ascontiguousarray(
                ops.convert_to_numpy(variable).T if transposed else ops.convert_to_numpy(variable)
            )
            for name, (variable, transposed) in torch_layout_variables(layer).items()
        }

    def shapes(self, stored: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        layer = self.layer
        if not layer.built and hasattr(layer, "build_from_state"):
            # A copy is built from the file's shapes to check them: a refused file leaves the layer unbuilt.
            layer = self._probe = type(layer).from_config(layer.get_config())
            layer.build_from_state(stored)
            self._build_from = stored
        elif not layer.built:
            self._require_built()
        return {
            name: tuple(reversed(variable.shape)) if transposed else tuple(variable.shape)
            for name, (variable, transposed) in torch_layout_variables(layer).items()
        }

    def assign(self, tensors: Mapping[str, np.ndarray]) -> None:
        if self._build_from is not None:
            self.layer.build_from_state(self._build_from)
        for name, (variable, transposed) in torch_layout_variables(self.layer).items():
            value = tensors[name].T if transposed else tensors[name]
            variable.assign(np.asarray(value, dtype=variable.dtype))

    def weight_objects(self) -> dict[str, keras.Variable]:
        layer = self.layer if self.layer.built or self._probe is None else self._probe
        return {name: variable for name, (variable, _) in torch_layout_variables(layer).items()}

    def _require_built(self) -> None:
        if not self.layer.built:
            raise ValueError(
                f"layer {self.layer.name!r} must be built (called once) before its weights are saved or loaded"
            )
