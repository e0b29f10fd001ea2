"""Linear layers on oneDNN's kernels on the CPU, and their inference forms: what a projection runs.

On the CPU in float32 every linear layer's products run on oneDNN's kernel (:func:`linear`), and training's, with
their gradients, too on the CPUs where that measured faster (:data:`ONEDNN_TRAINING_VENDORS`): PyTorch's
``nn.Linear`` calls the BLAS it was built with, Intel's MKL, which AMD's CPUs run on 256-bit vectors only; oneDNN,
also inside PyTorch, uses every vector width the CPU has (docs/performance.md: about twice the speed on a 2-core AMD
EPYC), while on Intel's MKL trains faster. Under autocast or ``torch.compile`` the modules run as they are.

Inference (no gradients) also takes *forms* of the same products. A module's class names its forms in
``INFERENCE_FORMS`` (a :class:`HasForms`): each form, the linears (attribute names) that read one input, computed as
one product with their outputs side by side (a self-attention's query, key and value). :func:`apply_form` computes a
form; a form laid out is an :class:`Affine`, one class per way of computing it:

- a decoding session's (one token per row a step; on the CPU its sources' encoding and their memory's projection
  too, a self-attention's query, key and value as one product), laid out for such rows by a :class:`Layouts`, which
  keeps them for a stretch of inference in which the weights stay fixed (one session, or a translator's life): on the
  CPU packed in oneDNN's blocked format (:class:`OneDNN`), but small weights on the CPUs where MKL multiplies them
  faster (:data:`PLAIN_STEP_VENDORS`); elsewhere ``(in, out)`` row-major (:class:`Plain`), which some BLAS multiply
  faster by a few rows; a weight of more than :data:`COLUMN_SPLIT` outputs (an output projection over a large
  vocabulary) packed in blocks of columns (:class:`Columns`), which a step reads one at a time. This cache, which lives
  as long as its session, is the only state kept out of the framework's sight.
- quantized ones (:func:`quantize`), for every inference call, not only steps: :class:`Int8`, weights in int8 with
  one scale per output feature, inputs quantized as they come (dynamic quantization: oneDNN's int8 kernel, which
  keeps the packed weights alone, where PyTorch has it; else PyTorch's own, :class:`DynamicInt8`); :class:`BFloat16`,
  weights and inputs rounded to bfloat16, outputs back in the inputs' dtype (oneDNN's kernel, which uses the CPU's
  bfloat16 instructions where it has them), on the CPU. They are a submodule of each
  module with forms, ``quantized`` (a :class:`Quantized`), which ``print(model)`` shows. Made from the weights, they
  hold none of their own: the state dict is the weights alone (a float model's loads into a quantized one and the
  reverse), and loading weights (``load_state_dict``, :func:`multihead.io.load_weights`) or moving the model
  (``.to()``, ``.double()``, ``.cuda()``) makes them anew from the weights as they then are; weights changed in place
  otherwise (an optimizer's steps) keep the forms made before: quantize again.

A linear replaced by another module (an adapter's, which computes more) runs as it is in every form
(:class:`Modules`). Forms compute without calling the linears, so the linears' forward hooks do not run in them (nor
on oneDNN's path of :func:`linear`). Each form computes what its linears do; tests check each against them.

Notation: N rows, I input features, O output features (of all the linears a form joins).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from multihead import cpu
from multihead.config import QUANTIZED
from multihead.torch.pages import release
from multihead.torch.stored import Int8Rows

__all__ = [
    "Affine",
    "BFloat16",
    "Columns",
    "DynamicInt8",
    "HasForms",
    "Int8",
    "Layouts",
    "Modules",
    "OneDNN",
    "Plain",
    "Quantized",
    "apply_form",
    "lay_out",
    "linear",
    "product",
    "quantize",
    "remake",
]

SUBMODULE = "quantized"
"""The name of a module's :class:`Quantized` submodule."""


@functools.cache
def onednn_linear() -> bool:
    """Whether this PyTorch build has oneDNN's linear kernel (x86 builds do)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return torch.ops.mkldnn._linear_pointwise.default is not None
    except (AttributeError, RuntimeError):
        return False


ONEDNN_TRAINING_VENDORS = ("AuthenticAMD",)
"""The CPU vendors whose training products (float32, with gradients) run faster on oneDNN's kernel than on MKL's, by
``benchmarks/train_step.py`` (docs/performance.md): AMD's. On an Intel Xeon with AMX MKL's step was faster; other
CPUs keep PyTorch's own."""


@functools.cache
def onednn_trains_faster() -> bool:
    """Whether training's float32 products run on oneDNN's kernel on this CPU (:data:`ONEDNN_TRAINING_VENDORS`)."""
    return onednn_linear() and cpu.vendor() in ONEDNN_TRAINING_VENDORS


@functools.cache
def int8_engine() -> str | None:
    """The quantized engine whose int8 weights a form packs: oneDNN's where PyTorch has it (faster than FBGEMM on
    the large output projections of translation models), else PyTorch's default."""
    return "onednn" if "onednn" in torch.backends.quantized.supported_engines else None


def _on_cpu_in_float32(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether oneDNN's kernel computes ``x`` by ``weight``: on the CPU in float32, not inside ``torch.compile``
    (which compiles the module's own call, and stops at the backend query)."""
    if torch.compiler.is_compiling():
        return False
    return x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and onednn_linear()


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` by oneDNN: ``x (..., I)``, ``weight (O, I)`` (a strided view, or packed by
    :func:`_packed`)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _packed(weight: torch.Tensor) -> torch.Tensor:
    """``weight (O, I)`` in oneDNN's blocked format, which its kernel multiplies fastest."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())


class _OneDNNLinear(torch.autograd.Function):
    """``F.linear`` whose products, forward and backward, run on oneDNN's kernel (float32 on the CPU)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.biased = bias is not None
        return _product(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad_x = _product(grad, weight.t()) if ctx.needs_input_grad[0] else None  # (..., O) @ (O, I)
        rows = grad.reshape(-1, grad.shape[-1])  # (N, O)
        grad_weight = _product(rows.t(), x.reshape(-1, x.shape[-1]).t()) if ctx.needs_input_grad[1] else None
        grad_bias = rows.sum(0) if ctx.biased and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` without autograd (for code that computes its own gradients): ``x (..., I)``,
    ``weight (O, I)``, either a strided view (a transpose) if need be; on oneDNN's kernel on the CPU in float32 where
    it trains faster (:func:`onednn_trains_faster`), else ``F.linear``."""
    if _on_cpu_in_float32(x, weight) and onednn_trains_faster():
        return _product(x, weight, bias)
    return F.linear(x, weight, bias)


def linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` for ``x (..., I)``; for an ``nn.Linear`` itself (not a subclass or a replacement, such as an
    adapter's, that computes more) on the CPU in float32, through oneDNN's kernel (the module's forward hooks do not
    run); with gradients only where that trains faster (:func:`onednn_trains_faster`), and not under autocast or
    ``torch.compile``, which take the module's own call."""
    if type(module) is not nn.Linear or not _on_cpu_in_float32(x, module.weight):
        return module(x)
    if not torch.is_grad_enabled():
        return _product(x, module.weight, module.bias)
    if torch.is_autocast_enabled("cpu") or not onednn_trains_faster():
        return module(x)
    return _OneDNNLinear.apply(x, module.weight, module.bias)


class Affine(Protocol):
    """Linears that read the same input laid out as one: ``x (..., I)`` → their outputs side by side ``(..., O)``.
    ``kind`` names the way, one class each."""

    kind: ClassVar[str]

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True, eq=False)
class OneDNN:
    """A float32 ``weight (O, I)`` packed for oneDNN's kernel (:func:`_packed`)."""

    kind: ClassVar[str] = "onednn"
    weight: torch.Tensor
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _product(x, self.weight, self.bias)


@dataclass(frozen=True, eq=False)
class BFloat16:
    """A bfloat16 ``weight (O, I)`` packed for oneDNN's kernel: inputs rounded to bfloat16, outputs back in their
    dtype."""

    kind: ClassVar[str] = "bf16"
    weight: torch.Tensor
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _product(x.bfloat16(), self.weight, self.bias).to(x.dtype)


def _bytes_of(quantized: torch.Tensor) -> torch.Tensor:
    """A quantized tensor's values as the uint8 tensor oneDNN's int8 kernel takes, on the same memory (``int_repr``
    would copy them)."""
    storage, offset = quantized.untyped_storage(), quantized.storage_offset()
    return torch.empty(0, dtype=torch.uint8).set_(storage, offset, quantized.shape, quantized.stride())


@dataclass(frozen=True, eq=False)
class Int8:
    """An int8 ``weight (O, I)`` packed for oneDNN's int8 kernel, the only copy kept, with one scale per output feature
    (``scales``) and the float ``bias``: inputs quantized as a whole as they come, to uint8 with the scale and zero
    point PyTorch's dynamic quantization chooses (7 bits with ``reduce_range``), outputs back in their dtype."""

    kind: ClassVar[str] = "int8"
    weight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    bias: torch.Tensor | None
    reduce_range: bool
    pages: torch.Tensor | None = None
    """The file pages ``weight`` lies on where it was mapped (:func:`multihead.torch.packed.load_quantized`), kept as
    long as it."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).float()  # (N, I)
        quantized = torch.quantize_per_tensor_dynamic(flat, torch.quint8, self.reduce_range)
        scale, zero = quantized.q_scale(), quantized.q_zero_point()
        out = torch.ops.onednn.qlinear_pointwise(
            _bytes_of(quantized), scale, zero, self.weight, self.scales, self.zeros, self.bias, 1.0, 0, torch.float32,
            "none", [], "",
        )  # fmt: skip
        return out.view(*x.shape[:-1], out.shape[-1]).to(x.dtype)  # (..., O)


@dataclass(frozen=True, eq=False)
class DynamicInt8:
    """PyTorch's packed int8 weight (its bias inside), where oneDNN's int8 kernel is missing (FBGEMM, QNNPACK):
    inputs quantized as a whole as they come, to 7 bits with ``reduce_range``, outputs back in their dtype."""

    kind: ClassVar[str] = "int8"
    packed: Any
    reduce_range: bool

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x.float(), self.packed, self.reduce_range).to(x.dtype)


@dataclass(frozen=True, eq=False)
class Plain:
    """``x @ weight + bias`` with ``weight (I, O)`` in its own dtype (the inputs cast to it, outputs back)."""

    kind: ClassVar[str] = "plain"
    weight: torch.Tensor
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # (N, I): a decoding step's rows as they come
        if flat.dtype != self.weight.dtype:
            flat = flat.to(self.weight.dtype)
        out = flat @ self.weight if self.bias is None else torch.addmm(self.bias, flat, self.weight)
        if x.dim() != 2:
            out = out.view(*x.shape[:-1], out.shape[-1])  # (..., O)
        return out if out.dtype == x.dtype else out.to(x.dtype)


@dataclass(frozen=True, eq=False)
class Modules:
    """The linears run as they are: modules other than ``nn.Linear``, which compute more than their weights say."""

    kind: ClassVar[str] = "modules"
    modules: tuple[nn.Module, ...]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([module(x) for module in self.modules], dim=-1)


@dataclass(frozen=True, eq=False)
class Columns:
    """Outputs computed in blocks of columns, each a form of its own (``parts``; ``starts``, the first column of each):
    ``x (..., I)`` → ``(..., O)``, the blocks side by side. A reader that takes one block at a time (a decoding step's
    best token) never holds the whole output."""

    kind: ClassVar[str] = "columns"
    parts: tuple[Affine, ...]
    starts: tuple[int, ...]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)


COLUMN_SPLIT = 65536
"""The most outputs a float32 form packs as one weight on the CPU: a larger weight (the output projection of a model
with a vocabulary of hundreds of thousands, such as NLLB's) is packed in blocks of columns (:data:`COLUMN_BLOCK`,
:class:`Columns`), so that a step of a few hundred rows makes its logits a block at a time, not a matrix of hundreds
of megabytes. Smaller ones (OPUS-MT's 58,101) stay whole: there, blocks took as long and made the peak higher, not
lower (``benchmarks/deployed_sizes.py``, docs/performance.md)."""

COLUMN_BLOCK = 32768
"""The most output columns of each block of a weight packed in blocks (:data:`COLUMN_SPLIT`), as even as they can
be: the blocks' products are as fast as the whole's."""


PLAIN_STEP_VENDORS = ("GenuineIntel",)
"""The CPU vendors on which a decoding step's small products (weights of at most :data:`PLAIN_STEP_ELEMENTS`, a side
of at most :data:`PLAIN_STEP_SIDE`) run faster on MKL with the weight ``(I, O)`` row-major (:class:`Plain`) than on
oneDNN's packed kernel, whose every call carries a fixed cost that outweighs a small product on a few rows
(``benchmarks/step_products.py``, docs/performance.md): Intel's. On AMD's, where MKL uses 256-bit vectors only, the
packed forms measured faster."""

PLAIN_STEP_ELEMENTS = 256 * 1024
"""The largest weight (``I * O`` elements) laid out ``(I, O)`` on :data:`PLAIN_STEP_VENDORS`' CPUs: a 256-wide model's
query-key-value and feed-forward products (256 → 1,024 and back), faster row-major on up to 16 rows (a service's
stream at 16 clients) and within a few percent on more; with :data:`PLAIN_STEP_SIDE`."""

PLAIN_STEP_SIDE = 256
"""The most features the shorter side of a weight laid out ``(I, O)`` has (:data:`PLAIN_STEP_ELEMENTS`): 512 → 512,
as many elements as 256 → 1,024, is faster packed from 32 rows a step up."""


def _float(weight: torch.Tensor, bias: torch.Tensor | None) -> Affine:
    """The weights in their own dtype: packed for oneDNN on the CPU in float32 (but small ones on
    :data:`PLAIN_STEP_VENDORS`' CPUs; large ones in blocks of columns, :data:`COLUMN_SPLIT`), else ``(I, O)``."""
    if not _on_cpu_in_float32(weight, weight) or _plain_on_this_cpu(weight):
        return Plain(weight.t().contiguous(), bias)
    if len(weight) <= COLUMN_SPLIT:
        return OneDNN(_packed(weight), bias)
    count = -(-len(weight) // COLUMN_BLOCK)
    size = -(-len(weight) // count)  # the columns of each block but the last
    starts = tuple(range(0, len(weight), size))
    parts = tuple(
        OneDNN(_packed(weight[start : start + size]), None if bias is None else bias[start : start + size])
        for start in starts
    )  # fmt: skip
    return Columns(parts, starts)


def _plain_on_this_cpu(weight: torch.Tensor) -> bool:
    """Whether ``weight (O, I)`` is small enough for :class:`Plain` on this CPU (:data:`PLAIN_STEP_VENDORS`)."""
    small = weight.numel() <= PLAIN_STEP_ELEMENTS and min(weight.shape) <= PLAIN_STEP_SIDE
    return small and cpu.vendor() in PLAIN_STEP_VENDORS


def _bf16(weight: torch.Tensor, bias: torch.Tensor | None) -> Affine:
    """The weights rounded to bfloat16: packed for oneDNN on the CPU, else ``(I, O)``."""
    weight, bias = weight.bfloat16(), None if bias is None else bias.bfloat16()
    if weight.device.type == "cpu" and onednn_linear():
        return BFloat16(_packed(weight), bias)
    return Plain(weight.t().contiguous(), bias)


@functools.cache
def onednn_int8() -> bool:
    """Whether this PyTorch build has oneDNN's int8 linear kernel on weights it packs alone (x86 builds do)."""
    try:
        ops = (torch.ops.onednn.qlinear_pointwise, torch.ops.onednn.qlinear_prepack)
        return all(op.default is not None for op in ops)
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def hush_int8_notice() -> None:
    """Take PyTorch's notice that its int8 tensors are deprecated (the kernels are not), which it gives once a process
    at the first int8 tensor made, here where it is ignored, rather than at a form's first product (:class:`Int8`
    quantizes its inputs so)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.quantize_per_tensor(torch.zeros(1), 1.0, 0, torch.quint8)


QUANTIZED_ROWS = 8192
"""Rows of a weight quantized at a time: a weight on a file's pages hands them back block by block, so that quantizing
the largest (an output projection's) never holds all of its float32 pages at once."""


def _int8(weight: torch.Tensor, bias: torch.Tensor | None) -> Affine:
    """Per output feature: ``scale = max |w| / 127``, weight ``round(w / scale)``; packed (:func:`_packed_int8`)."""
    weight = weight.float().cpu()
    bias = None if bias is None else bias.float().cpu()
    scales = torch.empty(len(weight), dtype=torch.float64)  # (O,)
    zeros = torch.zeros(len(weight), dtype=torch.long)  # (O,)
    quantized = torch.empty(weight.shape, dtype=torch.int8)  # (O, I)
    with warnings.catch_warnings():  # PyTorch's notices that its int8 tensors are deprecated (the kernels are not)
        warnings.simplefilter("ignore", UserWarning)
        for start in range(0, len(weight), QUANTIZED_ROWS):
            rows = slice(start, start + QUANTIZED_ROWS)
            block = weight[rows]  # (R, I)
            largest = torch.maximum(block.amax(dim=1), -block.amin(dim=1))  # (R,) max |w|, without a copy of |w|
            scales[rows] = (largest / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
            quantized[rows] = torch.quantize_per_channel(block, scales[rows], zeros[rows], 0, torch.qint8).int_repr()
            release(weight, block)
    return _packed_int8(quantized, scales, bias)


def _packed_int8(quantized: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> Affine:
    """An int8 weight ``(O, I)`` with one scale per output feature, packed for oneDNN's int8 kernel (:class:`Int8`),
    else as PyTorch's quantized engine packs it (:class:`DynamicInt8`)."""
    bias = None if bias is None else bias.float().cpu()
    engine = int8_engine()
    with warnings.catch_warnings(), _quantized_engine(engine):
        warnings.simplefilter("ignore", UserWarning)
        if engine == "onednn" and onednn_int8():
            # Without VNNI, int8 products of full-range inputs may saturate: inputs then take 7 bits.
            packed = torch.ops.onednn.qlinear_prepack(quantized, None)
            zeros = torch.zeros(len(quantized), dtype=torch.int)
            return Int8(packed, scales.float(), zeros, bias, reduce_range=not cpu.has_vnni())
        zeros = torch.zeros(len(quantized), dtype=torch.long)
        per_channel = torch._make_per_channel_quantized_tensor(quantized, scales.double(), zeros, 0)
        packed = torch.ops.quantized.linear_prepack(per_channel, bias)
    return DynamicInt8(packed, reduce_range=not (engine == "onednn" and cpu.has_vnni()))


LAYOUTS: dict[str | None, Callable[[torch.Tensor, torch.Tensor | None], Affine]] = {
    None: _float, "bf16": _bf16, "int8": _int8,
}  # fmt: skip
"""How weights ``(O, I)`` and a bias ``(O,)`` are laid out, by the type inference computes them in (``None``: their
own)."""


def lay_out(*linears: nn.Linear, dtype: str | None = None) -> Affine:
    """``linears`` (all ``nn.Linear``) as one, laid out from their weights as they are; ``dtype``: computed in
    ``"int8"`` or ``"bf16"`` (see :func:`quantize`). Weights on a file's pages hand those back once laid out
    (:func:`multihead.torch.pages.release`): the form holds its own copy."""
    form = _laid_out(linears, dtype)
    for linear in linears:
        weight = linear.weight
        release(weight.stored if isinstance(weight, Int8Rows) else weight)
    return form


def _laid_out(linears: tuple[nn.Linear, ...], dtype: str | None) -> Affine:
    weights = tuple(linear.weight for linear in linears)
    if dtype == "int8" and all(isinstance(weight, Int8Rows) for weight in weights):  # packed as stored
        values, scales = (_joined([getattr(weight, part) for weight in weights]) for part in ("stored", "scales"))
        return _packed_int8(values, scales, joined_bias(linears))
    plain = [weight.dequantized() if isinstance(weight, Int8Rows) else weight for weight in weights]
    return LAYOUTS[dtype](_joined(plain), joined_bias(linears))


def _joined(weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """``weights`` one after the other along their first dimension (one alone as it is)."""
    return weights[0] if len(weights) == 1 else torch.cat(tuple(weights))


def joined_bias(linears: Sequence[nn.Linear]) -> torch.Tensor | None:
    """The biases of ``linears`` side by side ``(O,)``, zeros for a linear without one; ``None`` where none has one."""
    biases = [linear.bias for linear in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat([
        torch.zeros(linear.out_features, dtype=linear.weight.dtype, device=linear.weight.device) if b is None else b
        for linear, b in zip(linears, biases, strict=True)
    ])  # fmt: skip


@contextlib.contextmanager
def _quantized_engine(engine: str | None) -> Iterator[None]:
    """PyTorch's quantized engine set to ``engine`` (``None``: as it is) for the block: int8 weights are packed for
    the engine set when they are packed, and keep it wherever they run."""
    before = torch.backends.quantized.engine
    if engine is not None:
        torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


class HasForms(Protocol):
    """A module whose linears have inference forms: ``INFERENCE_FORMS`` maps each form's name to the attribute names
    of the linears it computes as one product (one input, their outputs side by side in that order)."""

    INFERENCE_FORMS: ClassVar[Mapping[str, tuple[str, ...]]]


def _forms_of(module: nn.Module) -> Mapping[str, tuple[str, ...]]:
    """``module``'s forms (see :class:`HasForms`); none for other modules."""
    forms: Mapping[str, tuple[str, ...]] = getattr(type(module), "INFERENCE_FORMS", {})
    return forms


def _form(module: nn.Module, name: str, dtype: str | None) -> Affine:
    """``module``'s form ``name`` laid out from the weights as they are now (computed in ``dtype``, see
    :func:`lay_out`); its linears as they are if one is not an ``nn.Linear``."""
    modules = [getattr(module, linear_name) for linear_name in _forms_of(module)[name]]
    linears = [module for module in modules if type(module) is nn.Linear]
    if len(linears) < len(modules):
        return Modules(tuple(modules))
    with torch.inference_mode(False), torch.no_grad():  # plain tensors, usable by any later call
        return lay_out(*linears, dtype=dtype)


class Quantized(nn.Module):
    """The quantized forms of a module's linears (:func:`quantize`): its submodule ``quantized``, which every inference
    call of the module takes. Made from the weights, they are made anew whenever the module's weights load
    (``load_state_dict``, :func:`multihead.io.load_weights`) or it moves (``.to()``): the state dict holds the weights
    alone. The module's linears come before it (it is registered after them), so they have loaded or moved first.
    ``forms``, where given, are taken as they are (stored ones, :func:`multihead.torch.packed.load_quantized`) until
    then."""

    def __init__(self, owner: nn.Module, dtype: str, forms: Mapping[str, Affine] | None = None) -> None:
        super().__init__()
        self.dtype = dtype
        self._owner = (owner,)  # the module whose forms these are: its parent, not a submodule
        self._forms: dict[str, Affine] | None = self._made() if forms is None else dict(forms)

    def _made(self) -> dict[str, Affine]:
        owner = self._owner[0]
        return {name: _form(owner, name, self.dtype) for name in _forms_of(owner)}

    @property
    def forms(self) -> dict[str, Affine]:
        """Each form by name (a copy's made from its weights when first asked for: see :meth:`__getstate__`)."""
        if self._forms is None:
            self._forms = self._made()
        return self._forms

    def remake(self) -> None:
        """The forms made anew from the weights as they are now."""
        self._forms = self._made()

    def __getstate__(self) -> dict[str, Any]:
        """What a copy (``copy.deepcopy``, pickling) takes: no forms (oneDNN's packed weights cannot be copied), which
        it makes from its own weights, the same values, when first used."""
        return {**self.__dict__, "_forms": None}

    def extra_repr(self) -> str:
        linears = _forms_of(self._owner[0])
        return ", ".join(f"{name}={form.kind}({', '.join(linears[name])})" for name, form in self.forms.items())

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Quantized:
        self.remake()  # the owner's linears have moved
        return self

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        self.remake()  # the owner's linears have loaded


def _quantized(module: nn.Module) -> Quantized | None:
    """``module``'s quantized forms, if :func:`quantize` made them."""
    found = module._modules.get(SUBMODULE)
    return found if isinstance(found, Quantized) else None


def apply_form(module: nn.Module, name: str, x: torch.Tensor, layouts: Layouts | None = None) -> torch.Tensor:
    """``x (..., I)`` through ``module``'s form ``name`` ``(..., O)``. Without gradients: as ``layouts`` laid it out
    when given (a decoding session's), in its quantized form when :func:`quantize` made one; else (and with gradients)
    through its linears (:func:`linear`)."""
    if not torch.is_grad_enabled():
        if layouts is not None:
            return layouts[module, name](x)
        quantized = _quantized(module)
        if quantized is not None:
            return quantized.forms[name](x)
    linears = [getattr(module, linear_name) for linear_name in _forms_of(module)[name]]
    return linear(linears[0], x) if len(linears) == 1 else torch.cat([linear(m, x) for m in linears], dim=-1)


class Layouts:
    """The forms of a stretch of inference in which the weights do not change, each laid out when first asked for
    (``layouts[module, name]``) and kept: a quantized form as :func:`quantize` made it, any other from the weights as
    they are then. A decoding session makes one (``model.decoder_steps()``), or takes its caller's
    (``decoding_session(..., layouts=...)``): a translator keeps one for its whole life."""

    def __init__(self) -> None:
        self._built: dict[tuple[nn.Module, str], Affine] = {}

    def __getitem__(self, key: tuple[nn.Module, str]) -> Affine:
        built = self._built.get(key)
        if built is None:
            module, name = key
            quantized = _quantized(module)
            built = self._built[key] = _form(module, name, None) if quantized is None else quantized.forms[name]
        return built


class KeptLayouts:
    """:class:`Layouts` kept for a model between the calls that lay out its weights (its plain ``generate()``), made
    anew once the weights change: a tensor in another's place (``load_state_dict(assign=True)``, ``model.to(...)``,
    :func:`quantize`) or one written in place (``load_state_dict``, an optimizer's step, anything under
    ``torch.no_grad()``: PyTorch counts each such write in the tensor's version). A write through ``tensor.data``
    escapes that count: write under ``torch.no_grad()`` instead, or pass ``layouts=`` of your own."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._layouts = Layouts()

    def of(self, model: nn.Module) -> Layouts:
        """The layouts of ``model``'s weights as they are now."""
        tensors = itertools.chain(model.parameters(), model.buffers())
        key = (*map(id, model.modules()), *((t.data_ptr(), _version(t), t.dtype, t.device) for t in tensors))
        if key != self._key:
            self._key, self._layouts = key, Layouts()
        return self._layouts


def _version(tensor: torch.Tensor) -> int:
    """How many times ``tensor`` has been written in place (-1 for a tensor made in inference mode, which PyTorch
    does not count: such a tensor is made anew, not written, when weights change)."""
    return -1 if tensor.is_inference() else tensor._version


def quantize(model: nn.Module, dtype: str = "int8") -> nn.Module:
    """Make ``model``'s inference (no gradients) compute its linear layers in ``dtype``: ``"int8"``, weights quantized
    to int8 with one scale per output feature, inputs as they come; ``"bf16"``, weights and inputs rounded to
    bfloat16, outputs back in float32 (fast on CPUs with bfloat16 instructions: AVX512-BF16, AMX). Each module with
    forms gets a submodule ``quantized`` (:class:`Quantized`; ``print(model)`` shows them), made from the weights as
    they are, and anew when they load or the model moves; after changing them otherwise (an optimizer's steps),
    quantize again. Training (gradients on) still runs the float weights. On the CPU, float32 models. Returns
    ``model``."""
    if dtype not in QUANTIZED:
        raise ValueError(f"`dtype` must be one of {QUANTIZED}, received {dtype!r}")
    for module in [module for module in model.modules() if _forms_of(module)]:
        module.register_module(SUBMODULE, Quantized(module, dtype))
    return model


def remake(model: nn.Module) -> None:
    """Make the quantized forms of ``model``'s modules anew from the weights as they are (after writing them in
    place)."""
    for module in model.modules():
        if isinstance(module, Quantized):
            module.remake()
