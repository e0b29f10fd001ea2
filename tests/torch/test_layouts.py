"""The linear layers' inference forms (multihead.torch.layouts) against the linears themselves and, for int8, against
a NumPy float64 simulation of the quantization: per output feature symmetric int8 weights, the input quantized as
a whole to unsigned 8 (or 7) bits."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from multihead.torch import Layouts, Transformer, quantize
from multihead.torch.layouts import Affine, StepLayout, layouts, linear, onednn_linear

pytestmark = pytest.mark.skipif(not onednn_linear(), reason="this PyTorch build has no oneDNN")


def linears(*outs: int, bias: bool = True, seed: int = 0) -> list[nn.Linear]:
    torch.manual_seed(seed)
    return [nn.Linear(59, out, bias=bias) for out in outs]


@pytest.mark.parametrize("shape", [(7, 59), (3, 5, 59), (4, 1, 59)], ids=["2d", "3d", "step"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_onednn_linear_and_its_gradients_equal_the_modules(shape: tuple[int, ...], bias: bool) -> None:
    """oneDNN's products, forward and backward (input, weight and bias gradients), against ``nn.Linear``'s, and the
    module's own call under autocast."""
    (module,) = linears(113, bias=bias)
    x = torch.randn(shape)
    with torch.no_grad():
        torch.testing.assert_close(linear(module, x), module(x), rtol=1e-5, atol=1e-5)
    results = []
    for run in (linear, lambda m, t: m(t)):
        module.zero_grad()
        given = x.clone().requires_grad_()
        out = run(module, given)
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()  # a gradient that differs by feature
        results.append([out.detach(), given.grad, module.weight.grad, module.bias.grad if bias else None])
    for ours, expected in zip(*results, strict=True):
        if expected is None:
            assert ours is None
        else:
            torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear(module, x).dtype == torch.bfloat16  # autocast's: the module's own call


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_a_layout_computes_its_linears_side_by_side(bias: bool, dtype: torch.dtype) -> None:
    """Three linears as one product (oneDNN's packed float32 on the CPU, ``(in, out)`` otherwise)."""
    parts = [module.to(dtype) for module in linears(5, 113, 64, bias=bias)]
    x = torch.randn(4, 3, 59, dtype=dtype)
    with torch.no_grad():
        affine = Affine.of(*parts)
        assert affine.kind == ("onednn" if dtype == torch.float32 else "plain")
        expected = torch.cat([module(x) for module in parts], dim=-1)
        torch.testing.assert_close(affine(x), expected, rtol=1e-5, atol=1e-5)


def simulated_int8(modules: list[nn.Linear], x: torch.Tensor, reduce_range: bool) -> np.ndarray:
    """What int8 inference computes, in float64: each weight row ``round(w / s)`` with ``s = max |w| / 127``; the
    input quantized as a whole, ``round(x / sx) + zero`` in ``0..levels`` over the range ``[min(x, 0), max(x, 0)]``."""
    weight = np.concatenate([module.weight.detach().double().numpy() for module in modules])  # (O, I)
    bias = np.concatenate([module.bias.detach().double().numpy() for module in modules])  # (O,)
    scale = np.abs(weight).max(axis=1) / 127.0
    quantized = np.clip(np.round(weight / scale[:, None]), -128, 127) * scale[:, None]
    flat = x.double().numpy().reshape(-1, weight.shape[1])
    low, high = min(flat.min(), 0.0), max(flat.max(), 0.0)
    levels = 127 if reduce_range else 255
    step = (high - low) / levels
    zero = np.clip(np.round(-low / step), 0, levels)
    inputs = (np.clip(np.round(flat / step) + zero, 0, levels) - zero) * step
    return (inputs @ quantized.T + bias).reshape(*x.shape[:-1], -1)


def test_int8_equals_its_numpy_simulation_and_is_near_float() -> None:
    parts = linears(5, 113, 64)
    x = torch.randn(6, 4, 59) * 3.0
    with torch.no_grad():
        affine = Affine.of(*parts, dtype="int8")
        out = affine(x)
        exact = torch.cat([module(x) for module in parts], dim=-1)
    assert affine.kind == "int8"
    np.testing.assert_allclose(out.double().numpy(), simulated_int8(parts, x, affine.reduce_range), rtol=0, atol=2e-5)
    assert ((out - exact).norm() / exact.norm()).item() < 0.03  # int8's error, well below the outputs
    # One scale per output feature: laid out together or apart, the same numbers.
    with torch.no_grad():
        apart = torch.cat([Affine.of(module, dtype="int8")(x) for module in parts], dim=-1)
    assert torch.equal(out, apart)


def test_bf16_equals_the_product_of_rounded_inputs_and_weights() -> None:
    """bfloat16 layouts: inputs and weights rounded to bfloat16, products summed in float32, the output rounded to
    bfloat16 and given back in float32 (as oneDNN computes it), compared in float64."""
    parts = linears(5, 113)
    x = torch.randn(6, 4, 59)
    with torch.no_grad():
        affine = Affine.of(*parts, dtype="bf16")
        out = affine(x)
    assert out.dtype == torch.float32
    weight = torch.cat([module.weight.detach() for module in parts]).bfloat16().double()
    bias = torch.cat([module.bias.detach() for module in parts]).bfloat16().double()
    expected = x.bfloat16().double() @ weight.t() + bias
    # One rounding of the output to bfloat16 (8 bits): within 2^-8 of each value, and some more for the sums' order.
    torch.testing.assert_close(out.double(), expected, rtol=2**-8, atol=1e-3)


def small_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(31, 31, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64,
                       dropout=0.0).eval()  # fmt: skip


def test_a_quantized_model_infers_in_int8_and_trains_in_float() -> None:
    model = small_model()
    reference = copy.deepcopy(model)
    assert quantize(model) is model
    src, tgt = torch.randint(3, 31, (4, 9)), torch.randint(3, 31, (4, 6))
    with torch.inference_mode():
        exact, near = reference(src, tgt), model(src, tgt)
    assert not torch.equal(near, exact)  # computed in int8 ...
    assert ((near - exact).norm() / exact.norm()).item() < 0.05  # ... close to float
    assert all(layout.dtype == "int8" for layout in layouts(model))
    session = Layouts()  # every layer of a search takes the int8 layouts
    assert session[model._layouts["output"]].kind == "int8"
    assert session[model.decoder.layers[0].self_attn._layouts["qkv"]].kind == "int8"
    with torch.inference_mode():
        model.generate(src, max_len=5, bos_id=1, eos_id=3, beam_size=2)
    # With gradients, the float weights: the same logits and gradients as the model never quantized.
    model.train(), reference.train()
    out, expected = model(src, tgt), reference(src, tgt)
    assert torch.equal(out, expected)
    out.sum().backward(), expected.sum().backward()
    assert torch.equal(model.output_proj.weight.grad, reference.output_proj.weight.grad)


def test_a_bf16_model_infers_near_float() -> None:
    model = small_model()
    reference = copy.deepcopy(model)
    quantize(model, "bf16")
    src, tgt = torch.randint(3, 31, (4, 9)), torch.randint(3, 31, (4, 6))
    with torch.inference_mode():
        exact, near = reference(src, tgt), model(src, tgt)
        model.generate(src, max_len=5, bos_id=1, eos_id=3)
    assert near.dtype == torch.float32
    assert not torch.equal(near, exact)
    assert ((near - exact).norm() / exact.norm()).item() < 0.02
    assert Layouts()[model._layouts["output"]].kind == "bf16"


def test_int8_layouts_are_the_weights_quantize_saw_until_it_runs_again() -> None:
    model = quantize(small_model())
    src, tgt = torch.randint(3, 31, (2, 5)), torch.randint(3, 31, (2, 4))
    with torch.no_grad():
        before = model(src, tgt)
        model.load_state_dict(small_model(seed=1).state_dict())
        stale = model(src, tgt)  # the linears: the weights quantize saw
        after = quantize(model)(src, tgt)
        expected = quantize(small_model(seed=1))(src, tgt)
    assert not torch.equal(before, after)
    assert not torch.equal(stale, expected)
    assert torch.equal(after, expected)


def test_quantize_takes_int8_or_bf16() -> None:
    with pytest.raises(ValueError, match=r"`dtype` must be one of \('int8', 'bf16'\), received 'int4'"):
        quantize(small_model(), "int4")


def test_a_layout_of_weights_made_in_inference_mode_computes_its_linears() -> None:
    with torch.inference_mode():
        (module,) = linears(20)
        layout = StepLayout(nn.ModuleDict({"proj": module}), "proj")
        x = torch.randn(3, 1, 59)
        torch.testing.assert_close(layout.apply(x), module(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layout.apply(x, Layouts()), module(x), rtol=1e-5, atol=1e-5)


def test_layouts_lay_out_each_layout_once_from_the_weights_as_they_are() -> None:
    """A :class:`Layouts` builds a layout when first asked and keeps it (the weights fixed while it is used); a new
    one lays out the weights as they are then."""
    (module,) = linears(20)
    layout = StepLayout(nn.ModuleDict({"proj": module}), "proj")
    kept, x = Layouts(), torch.randn(3, 59)
    first = kept[layout]
    assert kept[layout] is first
    with torch.no_grad():
        module.weight.mul_(2.0)
        torch.testing.assert_close(Layouts()[layout](x), module(x), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(first(x), module(x))


class Adapted(nn.Linear):
    """A linear that computes more than ``nn.Linear`` (as a low-rank adapter's does): its own call must run."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + 1.0


def test_a_replaced_linear_runs_itself_in_training_inference_and_steps() -> None:
    model = small_model()
    layer = model.decoder.layers[0]
    plain = layer.feed_forward.linear2
    adapted = Adapted(plain.in_features, plain.out_features)
    adapted.load_state_dict(plain.state_dict())
    src, tgt = torch.randint(3, 31, (2, 5)), torch.randint(3, 31, (2, 4))
    with torch.no_grad():
        before = model(src, tgt)
        layer.feed_forward.linear2 = adapted
        after = model(src, tgt)
        x = torch.randn(3, 1, plain.in_features)
        torch.testing.assert_close(layer.feed_forward._layouts["linear2"].apply(x, Layouts()), adapted(x))  # a step's
    assert not torch.allclose(before, after)
    torch.testing.assert_close(model._layouts["output"].apply(torch.ones(2, 32)), model.output_proj(torch.ones(2, 32)))
    x = torch.randn(3, 4, plain.in_features, requires_grad=True)
    torch.testing.assert_close(layer.feed_forward._layouts["linear2"].apply(x), adapted(x))
