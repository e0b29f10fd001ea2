"""int8 forms stored packed: oneDNN's packed int8 weights written to a file once, then mapped, not packed, at each load.

:func:`multihead.torch.quantize` makes a model's int8 forms from its float weights: each weight quantized, then packed
in the blocked format oneDNN's int8 kernel reads (:class:`~multihead.torch.layouts.Int8`), which takes most of a
quantized model's load time. :func:`save_quantized` writes those packed weights, with their scales, to a safetensors
file; :func:`load_quantized` gives a model the forms from that file, each packed weight on the file's own pages
(mapped, never copied): a load takes the time to read the file's header, the weights take memory only for the pages
decoding reads, and every process that maps the file (replicas of one service) shares those pages.

The packed format depends on the CPU's instructions (AVX512-VNNI, AMX) and on the oneDNN inside PyTorch: a file
records both (:func:`packing`), and loads only where they are the same, as it records the caller's ``key`` for the
weights it was made from (a file says nothing else about them): where either differs, :func:`load_quantized` returns
``False`` and leaves the model as it was, and the caller quantizes from the weights.

The file: for each module with forms (its name in ``model.named_modules()``) and each of its forms, ``NAME/FORM.packed``
(int8, the packed bytes, padded to :data:`ALIGN`) and ``NAME/FORM.scales`` (float32, one per output feature); its
metadata: ``packing``, ``key``, ``index`` (JSON: each form's output and input features, its packed bytes' length,
dims and oneDNN's memory descriptor, base64) and ``index_sha256``. Every packed weight starts on an
:data:`ALIGN`-byte boundary of the file, as oneDNN's kernels read their weights fastest.

Notation: O output features, I input features (of all the linears a form joins).
"""

from __future__ import annotations

import base64
import ctypes
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors
import torch
from torch import nn

from multihead import cpu
from multihead.files import PathLike, atomic_write
from multihead.torch.layouts import (
    SUBMODULE,
    Int8,
    Quantized,
    _forms_of,
    _quantized,
    hush_int8_notice,
    joined_bias,
    onednn_int8,
)

__all__ = ["load_quantized", "packing", "save_quantized", "storable"]

ALIGN = 64
"""The byte boundary every packed weight starts on in a file (a cache line: oneDNN's alignment for its buffers)."""
FORMS = "int8"
PRODUCER = "multihead"
PACKING_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8")
"""The CPU flags oneDNN's choice of an int8 weight format follows, recorded in :func:`packing`."""


@dataclass(frozen=True)
class _Runtime:
    """PyTorch's C function that makes a oneDNN tensor on memory it does not own
    (``aoti_torch_create_tensor_from_blob_v2``, of its ahead-of-time runtime), Python's that wraps the tensor it
    returns for ``torch._C._aoti`` (``PyCapsule_New``), and PyTorch's codes for int8, the CPU and oneDNN's layout."""

    from_blob: Any
    capsule: Any
    int8: int
    cpu: int
    mkldnn: int


@functools.cache
def _runtime() -> _Runtime | None:
    """:class:`_Runtime` where this build of PyTorch has it; ``None`` elsewhere."""
    try:
        library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        function = library.aoti_torch_create_tensor_from_blob_v2
        codes = [
            library[name]
            for name in ("aoti_torch_dtype_int8", "aoti_torch_device_type_cpu", "aoti_torch_layout__mkldnn")
        ]
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_int32
    function.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64), ctypes.c_int64,
        ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32,
        ctypes.c_void_p, ctypes.c_int64,
    ]  # fmt: skip
    for code in codes:
        code.restype = ctypes.c_int32
    capsule = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
        ("PyCapsule_New", ctypes.pythonapi)
    )
    return _Runtime(function, capsule, *(int(code()) for code in codes))


@functools.cache
def storable() -> bool:
    """Whether this PyTorch can store and map packed int8 forms: oneDNN's int8 kernel, its packed tensors' bytes and
    descriptor readable, and a oneDNN tensor makeable on mapped memory."""
    if not onednn_int8() or _runtime() is None:
        return False
    try:
        ops = (torch.ops.mkldnn._nbytes, torch.ops.mkldnn.data_ptr, torch.ops.mkldnn._get_mkldnn_serialized_md)
        return all(op.default is not None for op in ops) and hasattr(
            torch._C._aoti, "alloc_tensors_by_stealing_from_void_ptrs"
        )
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def packing() -> str:
    """What the packed bytes depend on, as one line: PyTorch's version and commit (its oneDNN), the CPU's vendor,
    family, model and :data:`PACKING_FLAGS`, and the descriptor oneDNN gives a small packed weight here."""
    probe = torch.ops.onednn.qlinear_prepack(torch.zeros(64, 64, dtype=torch.int8), None)
    described = hashlib.sha256(_descriptor(probe)).hexdigest()[:16]
    flags = ",".join(flag for flag in PACKING_FLAGS if flag in cpu.flags())
    kind = f"{cpu.vendor()} family {cpu.family()} model {cpu.model()}"
    return f"torch {torch.__version__} {torch.version.git_version}; {kind}; {flags}; onednn {described}"


def _descriptor(packed: torch.Tensor) -> bytes:
    """oneDNN's serialized memory descriptor of a packed tensor: its format and dims."""
    return torch.ops.mkldnn._get_mkldnn_serialized_md(packed).numpy().tobytes()


def _mkldnn_tensor(pages: torch.Tensor, dims: list[int], descriptor: bytes) -> torch.Tensor:
    """A oneDNN tensor of ``dims`` in the format ``descriptor`` names, on ``pages``' memory (not copied: keep ``pages``
    alive as long as it)."""
    runtime = _runtime()
    assert runtime is not None
    sizes = (ctypes.c_int64 * len(dims))(*dims)
    strides = (ctypes.c_int64 * len(dims))()
    handle = ctypes.c_void_p()
    described = ctypes.create_string_buffer(descriptor, len(descriptor))
    failed = runtime.from_blob(
        pages.data_ptr(), len(dims), sizes, strides, 0, runtime.int8, runtime.cpu, 0, ctypes.byref(handle),
        runtime.mkldnn, described, len(descriptor),
    )  # fmt: skip
    if failed:
        raise ValueError("PyTorch refused a stored packed weight")
    # The list form hands the handle's tensor over and frees the handle (the one-tensor form keeps it: a leak).
    (tensor,) = torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs([runtime.capsule(handle.value, None, None)])
    return tensor


def _int8_modules(model: nn.Module) -> dict[str, nn.Module]:
    """``model``'s modules with forms, by name."""
    return {name: module for name, module in model.named_modules() if _forms_of(module)}


def _features(module: nn.Module, form: str) -> tuple[int, int] | None:
    """``(O, I)`` of ``module``'s form ``form``; ``None`` where one of its linears is not an ``nn.Linear``."""
    linears = [getattr(module, name) for name in _forms_of(module)[form]]
    if any(type(linear) is not nn.Linear for linear in linears):
        return None
    return sum(linear.out_features for linear in linears), linears[0].in_features


def save_quantized(model: nn.Module, path: PathLike, *, key: str = "") -> None:
    """Write ``model``'s int8 forms (made by ``quantize(model, "int8")``) packed as they are to the safetensors file
    ``path``, atomically, with ``key`` (what the caller calls the weights they were made from). A ``ValueError`` where
    this PyTorch cannot (:func:`storable`) or a module's forms are not all oneDNN's int8 ones."""
    if not storable():
        raise ValueError("this PyTorch cannot store packed int8 forms (it lacks oneDNN's int8 kernel or its tensors)")
    packed: dict[str, tuple[int, int]] = {}  # name: (address, bytes) of oneDNN's packed weight, written from there
    scales: dict[str, torch.Tensor] = {}
    index: dict[str, dict[str, Any]] = {}
    for name, module in _int8_modules(model).items():
        quantized = _quantized(module)
        if quantized is None or quantized.dtype != FORMS:
            raise ValueError(f"module {name!r} has no int8 forms: quantize(model, 'int8') first")
        index[name] = {}
        for form_name, form in quantized.forms.items():
            if not isinstance(form, Int8):
                raise ValueError(f"module {name!r}'s form {form_name!r} is {form.kind!r}, not oneDNN's packed int8")
            nbytes = torch.ops.mkldnn._nbytes(form.weight)
            packed[f"{name}/{form_name}.packed"] = (torch.ops.mkldnn.data_ptr(form.weight), nbytes)
            scales[f"{name}/{form_name}.scales"] = form.scales.float().contiguous()
            index[name][form_name] = {
                "features": list(_features(module, form_name) or ()), "nbytes": nbytes,
                "dims": list(form.weight.shape), "descriptor": base64.b64encode(_descriptor(form.weight)).decode(),
                "reduce_range": form.reduce_range,
            }  # fmt: skip
    described = json.dumps(index)
    metadata = {
        "producer": PRODUCER, "forms": FORMS, "packing": packing(), "key": key, "index": described,
        "index_sha256": hashlib.sha256(described.encode()).hexdigest(),
    }  # fmt: skip
    atomic_write(path, lambda tmp: _write_aligned(tmp, packed, scales, metadata))


def _write_aligned(
    path: str, packed: dict[str, tuple[int, int]], scales: dict[str, torch.Tensor], metadata: dict[str, str]
) -> None:
    """A safetensors file (its format: an 8-byte little-endian header length, the JSON header, the tensors' bytes one
    after another) of the packed weights, each padded to :data:`ALIGN` bytes, then the scales; the header padded with
    spaces so that the data, and so every packed weight, starts on an :data:`ALIGN`-byte boundary. The packed bytes are
    written from oneDNN's memory as they are: no copy of them is made."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, (_, nbytes) in packed.items():
        size = -(-nbytes // ALIGN) * ALIGN
        header[name] = {"dtype": "I8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    for name, tensor in scales.items():
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + tensor.nbytes]}
        offset += tensor.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN)
    with open(path, "wb") as out:
        out.write(len(text).to_bytes(8, "little") + text)
        for address, nbytes in packed.values():
            out.write((ctypes.c_char * nbytes).from_address(address))
            out.write(bytes(-nbytes % ALIGN))
        for tensor in scales.values():
            out.write(tensor.numpy().tobytes())


def load_quantized(model: nn.Module, path: PathLike, *, key: str = "") -> bool:
    """Give ``model``'s modules the int8 forms stored in ``path`` by :func:`save_quantized`, each packed weight on the
    file's pages (mapped), as ``quantize(model, "int8")`` would make them from the weights those were made from:
    ``True``. ``False``, the model unchanged, where the file was packed elsewhere (:func:`packing`), for another
    ``key``, or for other modules or shapes, or this PyTorch cannot map them (:func:`storable`). An ``OSError`` where
    the file cannot be read, a ``ValueError`` where it is not such a file. As with any forms, loading weights into the
    model or moving it makes them anew from its weights."""
    if not storable():
        return False
    try:
        handle = safetensors.safe_open(os.fspath(path), framework="pt")
        metadata = handle.metadata() or {}
        if metadata.get("producer") != PRODUCER or metadata.get("forms") != FORMS:
            raise ValueError(f"{os.fspath(path)!r} holds no packed int8 forms")
        if metadata.get("packing") != packing() or metadata.get("key") != key:
            return False
        if hashlib.sha256(metadata["index"].encode()).hexdigest() != metadata["index_sha256"]:
            raise ValueError(f"{os.fspath(path)!r} is damaged: its index of forms does not match its checksum")
        index = json.loads(metadata["index"])
    except safetensors.SafetensorError as error:
        raise ValueError(f"{os.fspath(path)!r} is not a safetensors file: {error}") from None
    except (KeyError, json.JSONDecodeError):
        raise ValueError(f"{os.fspath(path)!r} has no readable index of its forms") from None
    modules = _int8_modules(model)
    try:
        made = _stored_forms(handle, index, modules, os.fspath(path))
    except _Damaged:
        raise
    except (KeyError, TypeError, ValueError, safetensors.SafetensorError):
        raise ValueError(f"{os.fspath(path)!r} is damaged: its index of forms does not match its tensors") from None
    if made is None:
        return False
    hush_int8_notice()
    for name, module in modules.items():
        module.register_module(SUBMODULE, Quantized(module, FORMS, forms=made[name]))
    return True


class _Damaged(ValueError):
    """A stored form whose bytes do not fit what its index says (the message names it)."""


def _stored_forms(
    handle: Any, index: dict[str, Any], modules: dict[str, nn.Module], where: str
) -> dict[str, dict[str, Int8]] | None:
    """Each module's int8 forms made on the pages ``handle`` maps, as ``index`` describes them; ``None`` where they were
    made for other modules, shapes or kernels. Index entries that name absent tensors or fields raise ``KeyError``,
    ``TypeError`` or safetensors' error; bytes that do not fit raise :class:`_Damaged`."""
    if set(index) != set(modules) or any(set(index[name]) != set(_forms_of(m)) for name, m in modules.items()):
        return None
    if any(
        index[name][form]["features"] != list(_features(modules[name], form) or ())
        for name in index
        for form in index[name]
    ):
        return None
    reduce_range = not cpu.has_vnni()
    made: dict[str, dict[str, Int8]] = {}
    for name, module in modules.items():
        made[name] = {}
        for form_name, entry in index[name].items():
            pages = handle.get_tensor(f"{name}/{form_name}.packed")
            scales = handle.get_tensor(f"{name}/{form_name}.scales")
            out_features, in_features = entry["features"]
            if entry["reduce_range"] != reduce_range or scales.shape != (out_features,):
                return None
            if entry["dims"] != [in_features, out_features] or pages.nbytes < entry["nbytes"]:
                raise _Damaged(f"{where!r} is damaged: its form {name}/{form_name} does not fit its bytes")
            weight = _mkldnn_tensor(pages, entry["dims"], base64.b64decode(entry["descriptor"], validate=True))
            if list(weight.shape) != entry["dims"] or torch.ops.mkldnn._nbytes(weight) > pages.nbytes:
                raise _Damaged(f"{where!r} is damaged: its form {name}/{form_name} does not fit its bytes")
            linears = [getattr(module, linear) for linear in _forms_of(module)[form_name]]
            with torch.no_grad():
                bias = joined_bias(linears)
            bias = None if bias is None else bias.float()
            zeros = torch.zeros(out_features, dtype=torch.int32)
            made[name][form_name] = Int8(weight, scales, zeros, bias, reduce_range, pages=pages)
    return made
