"""The linear layers' inference forms (multihead.torch.layouts) against the linears themselves and, for int8, against
a NumPy float64 simulation of the quantization: per output feature symmetric int8 weights, the input quantized as
a whole to unsigned 8 (or 7) bits; a quantized model's forms as PyTorch shows, saves, loads and moves it."""

from __future__ import annotations

import copy
from pathlib import Path
from unittest.mock import Mock

import numpy as np
import pytest
import torch
from torch import nn

from multihead.io import load_weights, save_weights
from multihead.torch import Layouts, Transformer, quantize
from multihead.torch.layouts import Quantized, apply_form, lay_out, linear, onednn_linear

pytestmark = pytest.mark.skipif(not onednn_linear(), reason="this PyTorch build has no oneDNN")


def linears(*outs: int, bias: bool = True, seed: int = 0) -> list[nn.Linear]:
    torch.manual_seed(seed)
    return [nn.Linear(59, out, bias=bias) for out in outs]


@pytest.mark.parametrize("shape", [(7, 59), (3, 5, 59), (4, 1, 59)], ids=["2d", "3d", "step"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("trains_on_onednn", [True, False], ids=["onednn-training", "mkl-training"])
def test_onednn_linear_and_its_gradients_equal_the_modules(
    shape: tuple[int, ...], bias: bool, trains_on_onednn: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """oneDNN's products, forward and backward (input, weight and bias gradients), against ``nn.Linear``'s, and the
    module's own call under autocast; on either CPU kind's training kernel."""
    from multihead.torch import layouts

    monkeypatch.setattr(layouts, "onednn_trains_faster", lambda: trains_on_onednn)
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


@pytest.mark.parametrize(("vendor", "onednn"), [("AuthenticAMD", True), ("GenuineIntel", False), ("", False)])
def test_training_products_take_onednn_on_the_cpus_it_trains_faster_on(
    vendor: str, onednn: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With gradients, a linear's product runs on oneDNN's kernel on AMD's CPUs and on the module's own call (MKL's)
    elsewhere; without, on oneDNN's everywhere."""
    from multihead import cpu
    from multihead.torch import layouts

    monkeypatch.setattr(cpu, "vendor", lambda: vendor)
    layouts.onednn_trains_faster.cache_clear()
    monkeypatch.setattr(layouts, "_product", calls := Mock(wraps=layouts._product))
    try:
        (module,) = linears(113)
        linear(module, torch.randn(3, 59, requires_grad=True)).sum().backward()
        assert calls.call_count == (3 if onednn else 0)  # forward, then the input's and the weight's gradients
        with torch.no_grad():
            linear(module, torch.randn(3, 59))
        assert calls.call_count == (4 if onednn else 1)
    finally:
        layouts.onednn_trains_faster.cache_clear()


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("vendor", ["AuthenticAMD", "GenuineIntel"])
def test_a_layout_computes_its_linears_side_by_side(
    bias: bool, dtype: torch.dtype, vendor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three linears as one product: in float32 on the CPU oneDNN's packed weight, but ``(in, out)`` row-major on
    Intel's CPUs while the weight has at most ``PLAIN_STEP_ELEMENTS`` and its shorter side at most ``PLAIN_STEP_SIDE``;
    in other dtypes ``(in, out)``."""
    from multihead import cpu
    from multihead.torch import layouts

    monkeypatch.setattr(cpu, "vendor", lambda: vendor)
    monkeypatch.setattr(layouts, "PLAIN_STEP_ELEMENTS", 59 * 182)  # the three linears' outputs: 5 + 113 + 64
    for outs, small, side in [((5, 113, 64), True, 59), ((5, 113, 65), False, 59), ((5, 113, 64), False, 58)]:
        monkeypatch.setattr(layouts, "PLAIN_STEP_SIDE", side)  # the 59 inputs
        parts = [module.to(dtype) for module in linears(*outs, bias=bias)]
        x = torch.randn(4, 3, 59, dtype=dtype)
        with torch.no_grad():
            affine = lay_out(*parts)
            packed = dtype == torch.float32 and not (small and vendor == "GenuineIntel")
            assert affine.kind == ("onednn" if packed else "plain")
            expected = torch.cat([module(x) for module in parts], dim=-1)
            torch.testing.assert_close(affine(x), expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(affine(x[0]), expected[0], rtol=1e-5, atol=1e-5)  # 2-d rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_a_layout_of_many_outputs_computes_them_in_blocks_of_columns(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A linear of more than ``COLUMN_SPLIT`` outputs, in float32 on the CPU, is packed in blocks of at most
    ``COLUMN_BLOCK`` columns as even as they can be (113 as 38 + 38 + 37), each the module's outputs in its columns; at
    ``COLUMN_SPLIT`` outputs, or in float64, one weight."""
    from multihead.torch import layouts

    if not layouts.onednn_linear():
        pytest.skip("blocks of columns are oneDNN's packed forms: this PyTorch build has no oneDNN")  # x86 has it
    monkeypatch.setattr(layouts, "PLAIN_STEP_ELEMENTS", 0)
    (module,) = (part.to(dtype) for part in linears(113))
    x = torch.randn(4, 3, 59, dtype=dtype)
    with torch.no_grad():
        expected = module(x)
        for split, kind in [(60, "columns"), (113, "onednn")]:
            monkeypatch.setattr(layouts, "COLUMN_SPLIT", split)
            monkeypatch.setattr(layouts, "COLUMN_BLOCK", 50)
            affine = lay_out(module)
            assert affine.kind == (kind if dtype == torch.float32 else "plain")
            torch.testing.assert_close(affine(x), expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(affine(x[0]), expected[0], rtol=1e-5, atol=1e-5)  # 2-d rows
            if isinstance(affine, layouts.Columns):
                assert affine.starts == (0, 38, 76)
                for part, start, stop in zip(affine.parts, affine.starts, (38, 76, 113), strict=True):
                    torch.testing.assert_close(part(x[0]), expected[0, :, start:stop], rtol=1e-5, atol=1e-5)


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


@pytest.mark.parametrize("kernel", ["Int8", "DynamicInt8"])
def test_int8_equals_its_numpy_simulation_and_is_near_float(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both int8 forms (oneDNN's int8 kernel on the packed weights alone; PyTorch's dynamic quantization where the
    former is missing) compute what the NumPy simulation does."""
    from multihead.torch import layouts

    if kernel == "Int8" and not layouts.onednn_int8():
        pytest.skip("this PyTorch build has no oneDNN int8 kernel")  # x86 builds have it: CI runs this case
    monkeypatch.setattr(layouts, "onednn_int8", lambda: kernel == "Int8")
    parts = linears(5, 113, 64)
    x = torch.randn(6, 4, 59) * 3.0
    with torch.no_grad():
        affine = lay_out(*parts, dtype="int8")
        out = affine(x)
        exact = torch.cat([module(x) for module in parts], dim=-1)
    assert affine.kind == "int8"
    assert type(affine).__name__ == kernel
    np.testing.assert_allclose(out.double().numpy(), simulated_int8(parts, x, affine.reduce_range), rtol=0, atol=2e-5)
    assert ((out - exact).norm() / exact.norm()).item() < 0.03  # int8's error, well below the outputs
    strided = torch.cat([x, torch.randn(6, 4, 11)], dim=-1)[..., :59]  # rows 70 apart: a non-contiguous (N, I) view
    with torch.no_grad():
        np.testing.assert_allclose(affine(strided).double().numpy(), out.double().numpy(), rtol=0, atol=1e-6)
    # One scale per output feature: laid out together or apart, the same numbers up to the last float32 rounding
    # (oneDNN's AMX kernels apply the scales in an order that depends on the output width).
    with torch.no_grad():
        apart = torch.cat([lay_out(module, dtype="int8")(x) for module in parts], dim=-1)
    torch.testing.assert_close(out, apart, rtol=1e-6, atol=1e-6)


def test_bf16_equals_the_product_of_rounded_inputs_and_weights() -> None:
    """bfloat16 layouts: inputs and weights rounded to bfloat16, products summed in float32, the output rounded to
    bfloat16 and given back in float32 (as oneDNN computes it), compared in float64."""
    parts = linears(5, 113)
    x = torch.randn(6, 4, 59)
    with torch.no_grad():
        affine = lay_out(*parts, dtype="bf16")
        out = affine(x)
    assert out.dtype == torch.float32
    weight = torch.cat([module.weight.detach() for module in parts]).bfloat16().double()
    bias = torch.cat([module.bias.detach() for module in parts]).bfloat16().double()
    expected = x.bfloat16().double() @ weight.t() + bias
    # One rounding of the output to bfloat16 (8 bits): within 2^-8 of each value, and some more for the sums' order.
    torch.testing.assert_close(out.double(), expected, rtol=2**-8, atol=1e-3)


def small_model(seed: int = 0, layers: int = 2) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(31, 31, d_model=32, num_heads=4, num_encoder_layers=layers, num_decoder_layers=layers, d_ff=64,
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
    kinds = {form.kind for module in model.modules() if isinstance(module, Quantized) for form in module.forms.values()}
    assert kinds == {"int8"}
    session = Layouts()  # every layer of a search takes the int8 forms
    assert session[model, "output"].kind == "int8"
    assert session[model.decoder.layers[0].self_attn, "qkv"].kind == "int8"
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
    assert Layouts()[model, "output"].kind == "bf16"


def quantized_forms(model: nn.Module) -> list[str]:
    """The lines of ``print(model)`` that show quantized forms."""
    return [line.strip() for line in str(model).splitlines() if "(quantized): Quantized(" in line]


def test_print_shows_every_quantized_form_and_the_state_dict_is_the_weights() -> None:
    """One line per attention (its projections alone and a step's query, key and value as one), per feed-forward
    block (each linear) and for the output projection (one layer a stack: ``print`` shows equal layers once); the
    state dict holds the same weights as the float model's, which load into the quantized model and back."""
    model, reference = quantize(small_model(layers=1)), small_model(layers=1)
    attention = "q=int8(q_proj), k=int8(k_proj), v=int8(v_proj), out=int8(out_proj), qkv=int8(q_proj, k_proj, v_proj)"
    feed_forward = "linear1=int8(linear1), linear2=int8(linear2)"
    expected = [attention, feed_forward, attention, feed_forward, attention, "output=int8(output_proj)"]
    assert quantized_forms(model) == [f"(quantized): Quantized({forms})" for forms in expected]
    assert quantized_forms(reference) == []
    assert model.state_dict().keys() == reference.state_dict().keys()
    reference.load_state_dict(model.state_dict())
    model.load_state_dict(reference.state_dict())


def test_loading_weights_makes_the_forms_anew_from_them(tmp_path: Path) -> None:
    """``load_state_dict`` and :func:`multihead.io.load_weights` into a quantized model: it then computes what a model
    quantized with those weights computes, in its forward pass and in its decoding steps."""
    src, tgt = torch.randint(3, 31, (2, 5)), torch.randint(3, 31, (2, 4))
    other = small_model(seed=1)
    with torch.inference_mode():
        expected = quantize(copy.deepcopy(other))(src, tgt)
        tokens = quantize(copy.deepcopy(other)).generate(src, max_len=6, bos_id=1, eos_id=3)
    by_state_dict = quantize(small_model())
    by_state_dict.load_state_dict(other.state_dict())
    path = tmp_path / "weights.safetensors"
    save_weights(other, path)
    by_file = quantize(small_model())
    load_weights(by_file, path)
    for model in (by_state_dict, by_file):
        with torch.inference_mode():
            assert torch.equal(model(src, tgt), expected)
            assert torch.equal(model.generate(src, max_len=6, bos_id=1, eos_id=3), tokens)


def test_weights_changed_in_place_are_quantized_when_quantize_runs_again_or_the_model_moves() -> None:
    """An optimizer's step (weights changed in place) leaves the forms as :func:`quantize` made them; quantizing again,
    or moving the model (``.to()``), makes them from the weights as they are."""
    model, changed = quantize(small_model()), small_model()
    src, tgt = torch.randint(3, 31, (2, 5)), torch.randint(3, 31, (2, 4))
    with torch.no_grad():
        before = model(src, tgt)
        for module in (*model.modules(), *changed.modules()):
            if isinstance(module, nn.Linear):  # every weight the forms are made from
                module.weight.mul_(1.5)
        stale = model(src, tgt)
        expected = quantize(copy.deepcopy(changed))(src, tgt)
        assert torch.equal(stale, before)
        assert not torch.equal(stale, expected)
        assert torch.equal(quantize(copy.deepcopy(model))(src, tgt), expected)
        assert torch.equal(model.to(torch.float64)(src, tgt), quantize(changed.to(torch.float64))(src, tgt))


def test_quantize_takes_int8_or_bf16() -> None:
    with pytest.raises(ValueError, match=r"`dtype` must be one of \('int8', 'bf16'\), received 'int4'"):
        quantize(small_model(), "int4")


class Owner(nn.Module):
    """A module with one linear, ``proj``, and its form."""

    INFERENCE_FORMS = {"proj": ("proj",)}  # noqa: RUF012

    def __init__(self, proj: nn.Module) -> None:
        super().__init__()
        self.proj = proj


def test_a_form_of_weights_made_in_inference_mode_computes_its_linears() -> None:
    with torch.inference_mode():
        (module,) = linears(20)
        owner = Owner(module)
        x = torch.randn(3, 1, 59)
        torch.testing.assert_close(apply_form(owner, "proj", x), module(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(apply_form(owner, "proj", x, Layouts()), module(x), rtol=1e-5, atol=1e-5)


def test_layouts_lay_out_each_form_once_from_the_weights_as_they_are() -> None:
    """A :class:`Layouts` lays out a form when first asked and keeps it (the weights fixed while it is used); a new
    one lays out the weights as they are then."""
    (module,) = linears(20)
    owner = Owner(module)
    kept, x = Layouts(), torch.randn(3, 59)
    first = kept[owner, "proj"]
    assert kept[owner, "proj"] is first
    with torch.no_grad():
        module.weight.mul_(2.0)
        torch.testing.assert_close(Layouts()[owner, "proj"](x), module(x), rtol=1e-5, atol=1e-5)
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
        torch.testing.assert_close(apply_form(layer.feed_forward, "linear2", x, Layouts()), adapted(x))  # a step's
    assert not torch.allclose(before, after)
    torch.testing.assert_close(apply_form(model, "output", torch.ones(2, 32)), model.output_proj(torch.ones(2, 32)))
    x = torch.randn(3, 4, plain.in_features, requires_grad=True)
    torch.testing.assert_close(apply_form(layer.feed_forward, "linear2", x), adapted(x))


def test_a_plain_generate_keeps_its_layouts_until_the_weights_change() -> None:
    """``generate()`` without ``layouts=`` lays the weights out once and keeps them while they stay: the same
    layouts call after call; after an optimizer's step, ``load_state_dict``, ``to()`` or :func:`quantize`, new ones,
    and the tokens a model made afresh from the same weights generates."""
    from multihead.torch.layouts import KeptLayouts

    def fresh(model: Transformer) -> Transformer:
        made = Transformer(23, 29, d_model=32, num_heads=4, num_encoder_layers=1, num_decoder_layers=2, d_ff=48).eval()
        made.load_state_dict(model.state_dict())
        return made

    torch.manual_seed(0)
    model = Transformer(23, 29, d_model=32, num_heads=4, num_encoder_layers=1, num_decoder_layers=2, d_ff=48).eval()
    src, tgt = torch.randint(3, 23, (3, 5)), torch.randint(3, 29, (3, 6))
    kept = KeptLayouts()
    first = kept.of(model)
    assert kept.of(model) is first
    model.generate(src, max_len=7, bos_id=1, eos_id=2)
    assert kept.of(model) is first  # generating changes no weight

    def same_as_fresh() -> None:
        out = model.generate(src, max_len=7, bos_id=1, eos_id=2)
        assert torch.equal(out, fresh(model).generate(src, max_len=7, bos_id=1, eos_id=2))

    same_as_fresh()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model.train()
    model(src, tgt).logsumexp(-1).sum().backward()
    optimizer.step()
    model.eval()
    assert kept.of(model) is not first
    same_as_fresh()
    torch.manual_seed(1)
    other = Transformer(23, 29, d_model=32, num_heads=4, num_encoder_layers=1, num_decoder_layers=2, d_ff=48).eval()
    second = kept.of(model)
    model.load_state_dict(other.state_dict())
    assert kept.of(model) is not second
    same_as_fresh()
    third = kept.of(model)
    model.to(torch.float64).to(torch.float32)
    assert kept.of(model) is not third
    same_as_fresh()
    quantize(model, "bf16")
    out = model.generate(src, max_len=7, bos_id=1, eos_id=2)
    assert torch.equal(out, quantize(fresh(model), "bf16").generate(src, max_len=7, bos_id=1, eos_id=2))
