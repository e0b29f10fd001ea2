"""Linear layers on oneDNN's kernels on the CPU, and laid out for inference: what a projection runs.

On the CPU in float32 every linear layer's products, training's gradients included, run on oneDNN's kernel
(:func:`linear`): PyTorch's ``nn.Linear`` calls the BLAS it was built with, Intel's MKL, which some CPUs (AMD's) run
on 256-bit vectors only; oneDNN, also inside PyTorch, uses every vector width the CPU has (docs/performance.md: about
twice the speed on a 2-core AMD EPYC). Under autocast or ``torch.compile`` the modules run as they are. Inference (no
gradients) also takes laid-out forms of the same products:

- In a decoding session (one token per row a step), the weights laid out for such rows (:class:`StepLayout`): on the CPU
  packed in oneDNN's blocked format; elsewhere ``(in, out)`` row-major, which some BLAS multiply faster by a few rows;
  linears that read the same input as one product (a self-attention's query, key and value).
- Quantized layouts (:func:`quantize`), for every inference call, not only steps: ``int8``, weights in int8 with one
  scale per output feature, inputs quantized as they come (dynamic quantization, oneDNN's kernels where PyTorch has
  them); ``bf16``, weights and inputs rounded to bfloat16, outputs back in the inputs' dtype (oneDNN's kernel, which
  uses the CPU's bfloat16 instructions where it has them), on the CPU.

Nothing here watches the weights: a layout is laid out afresh for each stretch of inference in which they stay fixed
(a :class:`Layouts`: one decoding session, or a translator's life), and a quantized one when :func:`quantize` runs.
Each form computes what its linears do; tests check each against them.

Notation: N rows, I input features, O output features (of all the linears a layout joins), V vocabulary.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from multihead.config import QUANTIZED
from multihead.cpu import has_vnni

__all__ = ["Affine", "Layouts", "StepLayout", "linear", "product", "quantize"]


@functools.cache
def onednn_linear() -> bool:
    """Whether this PyTorch build has oneDNN's linear kernel (x86 builds do)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return torch.ops.mkldnn._linear_pointwise.default is not None
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def int8_engine() -> str | None:
    """The quantized engine whose int8 weights a layout packs: oneDNN's where PyTorch has it (faster than FBGEMM on
    the large output projections of translation models), else PyTorch's default."""
    return "onednn" if "onednn" in torch.backends.quantized.supported_engines else None


def _on_cpu_in_float32(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether oneDNN's kernel computes ``x`` by ``weight``: on the CPU in float32, not inside ``torch.compile``
    (which compiles the module's own call, and stops at the backend query)."""
    if torch.compiler.is_compiling():
        return False
    return x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and onednn_linear()


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` by oneDNN: ``x (..., I)``, ``weight (O, I)``, either may be a strided view."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


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
    ``weight (O, I)``, either a strided view (a transpose) if need be; on oneDNN's kernel on the CPU in float32, else
    ``F.linear``."""
    if _on_cpu_in_float32(x, weight):
        return _product(x, weight, bias)
    return F.linear(x, weight, bias)


def linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` for ``x (..., I)``; for an ``nn.Linear`` itself (not a subclass or a replacement, such as an
    adapter's, that computes more) on the CPU in float32, through oneDNN's kernel (its gradients too; the module's
    forward hooks do not run), unless autocast or ``torch.compile`` is at work, which take the module's own call."""
    if type(module) is not nn.Linear or not _on_cpu_in_float32(x, module.weight):
        return module(x)
    if not torch.is_grad_enabled():
        return _product(x, module.weight, module.bias)
    if torch.is_autocast_enabled("cpu"):
        return module(x)
    return _OneDNNLinear.apply(x, module.weight, module.bias)


@dataclass(frozen=True)
class Affine:
    """Linears that read the same input laid out as one: ``x (..., I)`` → their outputs side by side ``(..., O)``.

    ``kind`` says how: ``"onednn"`` a float32 weight packed for oneDNN ``(O, I)``; ``"bf16"`` the same in bfloat16
    (inputs rounded to it, outputs back in their dtype); ``"int8"`` PyTorch's packed int8 weight (``weight`` is then
    its packed parameters); ``"plain"`` ``x @ weight + bias`` with ``weight (I, O)``; ``"modules"`` the linears run as
    they are (modules other than ``nn.Linear``, weights made in inference mode, which cannot be laid out).
    """

    kind: str
    weight: Any
    bias: torch.Tensor | None
    modules: tuple[nn.Module, ...] = ()
    reduce_range: bool = True

    @classmethod
    def of(cls, *linears: nn.Linear, dtype: str | None = None) -> Affine:
        """``linears`` (all ``nn.Linear``) as one; ``dtype``: computed in ``"int8"`` or ``"bf16"`` (see
        :func:`quantize`)."""
        weight = torch.cat(tuple(linear.weight for linear in linears))  # (O, I)
        biases = [linear.bias for linear in linears]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat([
                torch.zeros(linear.out_features, dtype=weight.dtype, device=weight.device) if b is None else b
                for linear, b in zip(linears, biases, strict=True)
            ])  # fmt: skip
        if dtype == "int8":
            return cls._int8(weight, bias)
        if dtype == "bf16":
            weight, bias = weight.bfloat16(), None if bias is None else bias.bfloat16()
            if weight.device.type == "cpu" and onednn_linear():
                return cls("bf16", torch.ops.mkldnn._reorder_linear_weight(weight.contiguous()), bias)
        elif _on_cpu_in_float32(weight, weight):
            return cls("onednn", torch.ops.mkldnn._reorder_linear_weight(weight.contiguous()), bias)
        return cls("plain", weight.t().contiguous(), bias)

    @classmethod
    def _int8(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> Affine:
        """Per output feature: ``scale = max |w| / 127``, weight ``round(w / scale)``."""
        weight = weight.float().cpu()
        scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny).double()  # (O,)
        zeros = torch.zeros(len(scales), dtype=torch.long)
        engine = int8_engine()
        with warnings.catch_warnings(), _quantized_engine(engine):  # PyTorch's notices that its int8 tensors are
            warnings.simplefilter("ignore", UserWarning)  # deprecated (the kernels are not)
            quantized = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
            packed = torch.ops.quantized.linear_prepack(quantized, None if bias is None else bias.float().cpu())
        # Without VNNI, int8 products of full-range inputs may saturate: inputs then take 7 bits, as FBGEMM wants.
        return cls("int8", packed, None, reduce_range=not (engine == "onednn" and has_vnni()))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x (..., I)`` → ``(..., O)``."""
        if self.kind == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if self.kind == "bf16":
            out = torch.ops.mkldnn._linear_pointwise(x.bfloat16(), self.weight, self.bias, "none", [], "")
            return out.to(x.dtype)
        if self.kind == "int8":
            out = torch.ops.quantized.linear_dynamic(x.float(), self.weight, self.reduce_range)
            return out.to(x.dtype)
        if self.kind == "modules":
            return torch.cat([module(x) for module in self.modules], dim=-1)
        flat = x.reshape(-1, x.shape[-1]).to(self.weight.dtype)  # (N, I)
        out = flat @ self.weight if self.bias is None else torch.addmm(self.bias, flat, self.weight)
        return out.view(*x.shape[:-1], out.shape[-1]).to(x.dtype)  # (..., O)


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


class StepLayout:
    """Linears of ``owner`` (named ``names``) that read one input, laid out as one :class:`Affine` for inference:
    :meth:`build` lays out the weights as they are; a :class:`Layouts` keeps what it built while the weights stay
    fixed (a decoding session, a translator's life). A linear replaced by another module (an adapter's, which computes
    more) makes the layout run the modules as they are.

    ``dtype`` and ``quantized`` (set by :func:`quantize`): the layout is quantized (``"int8"`` or ``"bf16"``), laid
    out when :func:`quantize` ran, and every inference call takes it.
    """

    def __init__(self, owner: nn.Module, *names: str) -> None:
        self.owner, self.names = owner, names
        self.dtype: str | None = None
        self.quantized: Affine | None = None

    def linears(self) -> list[nn.Module]:
        return [getattr(self.owner, name) for name in self.names]

    def build(self) -> Affine:
        """The linears laid out from their weights as they are now (in ``dtype`` when quantized)."""
        modules = self.linears()
        linears = [module for module in modules if type(module) is nn.Linear]
        if len(linears) < len(modules):
            return Affine("modules", None, None, tuple(modules))
        with torch.inference_mode(False), torch.no_grad():  # plain tensors, usable by any later call
            return Affine.of(*linears, dtype=self.dtype)

    def apply(self, x: torch.Tensor, layouts: Layouts | None = None) -> torch.Tensor:
        """``x (..., I)`` through the linears. Without gradients: laid out by ``layouts`` when given (a decoding
        session's), quantized when :func:`quantize` made the layout so; else (and with gradients) through
        :func:`linear`."""
        if not torch.is_grad_enabled():
            if layouts is not None:
                return layouts[self](x)
            if self.quantized is not None:
                return self.quantized(x)
        linears = self.linears()
        return linear(linears[0], x) if len(linears) == 1 else torch.cat([linear(m, x) for m in linears], dim=-1)


class Layouts:
    """The laid-out weights of a stretch of inference in which the weights do not change: each :class:`StepLayout`'s
    :class:`Affine`, built when first asked for and kept. A decoding session makes one (``model.decoder_steps()``),
    or takes its caller's (``decoding_session(..., layouts=...)``): a translator keeps one for its whole life.
    Quantized layouts are :func:`quantize`'s."""

    def __init__(self) -> None:
        self._built: dict[int, tuple[StepLayout, Affine]] = {}

    def __getitem__(self, layout: StepLayout) -> Affine:
        if layout.quantized is not None:
            return layout.quantized
        kept = self._built.get(id(layout))
        if kept is None:
            kept = self._built[id(layout)] = (layout, layout.build())
        return kept[1]


def layouts(model: nn.Module) -> Iterator[StepLayout]:
    """Every :class:`StepLayout` of ``model``'s modules (kept in their ``_layouts`` dicts)."""
    for module in model.modules():
        yield from getattr(module, "_layouts", {}).values()


def quantize(model: nn.Module, dtype: str = "int8") -> nn.Module:
    """Make ``model``'s inference (no gradients) compute its linear layers in ``dtype``: ``"int8"``, weights quantized
    to int8 with one scale per output feature, inputs as they come; ``"bf16"``, weights and inputs rounded to
    bfloat16, outputs back in float32 (fast on CPUs with bfloat16 instructions: AVX512-BF16, AMX). The weights are
    quantized as they are when it runs: after changing them, quantize again. Training (gradients on) still runs the
    float weights. On the CPU, float32 models. Returns ``model``."""
    if dtype not in QUANTIZED:
        raise ValueError(f"`dtype` must be one of {QUANTIZED}, received {dtype!r}")
    for layout in layouts(model):
        layout.dtype = dtype
        layout.quantized = layout.build()
    return model
