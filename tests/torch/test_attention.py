"""``multihead.torch.MultiHeadAttention`` against the oracle and against ``torch.nn.MultiheadAttention``.

Notation: B batch, Lq/Lk lengths, E d_model, H heads.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import TorchCalls, randn, state_dict_numpy, to_numpy
from multihead import reference
from multihead.torch import KVCache, MultiHeadAttention, causal_mask, padding_mask
from multihead.torch.functional import IMPLEMENTATIONS


@dataclass(frozen=True)
class Config:
    name: str
    d_model: int
    num_heads: int
    options: dict = field(default_factory=dict)
    lq: int = 5
    lk: int = 7
    cross: bool = True

    def __str__(self) -> str:
        return self.name

    def build(self, implementation: str = "auto") -> MultiHeadAttention:
        module = MultiHeadAttention(self.d_model, self.num_heads, implementation=implementation, **self.options)
        module = module.double().eval()
        with torch.no_grad():  # non-zero biases, so a dropped bias would show
            for parameter in module.parameters():
                parameter.uniform_(-0.5, 0.5)
        return module

    def inputs(self, module: MultiHeadAttention, batch: int = 3) -> tuple[torch.Tensor, ...]:
        query = randn(batch, self.lq, module.qdim)
        if not self.cross:
            return query, query, query
        return query, randn(batch, self.lk, module.kdim), randn(batch, self.lk, module.vdim)


CONFIGS = [
    Config("self", 16, 4, cross=False, lk=5),
    Config("cross", 16, 4),
    Config("cross-more-queries", 16, 2, lq=9, lk=4),
    Config("gqa", 24, 6, {"num_kv_heads": 2}),
    Config("mqa", 24, 6, {"num_kv_heads": 1}),
    Config("head-dims", 10, 3, {"head_dim": 7, "value_head_dim": 5}),
    Config("input-widths", 12, 4, {"qdim": 9, "kdim": 5, "vdim": 3}),
    Config("no-bias", 16, 4, {"bias": False}),
]


def reference_call(module: MultiHeadAttention, query, key, value, **kwargs) -> tuple[np.ndarray, np.ndarray]:
    numpy_kwargs = {name: None if x is None else to_numpy(x) for name, x in kwargs.items() if name != "causal"}
    return reference.multi_head_attention(
        to_numpy(query),
        to_numpy(key),
        to_numpy(value),
        state_dict_numpy(module),
        num_heads=module.num_heads,
        num_kv_heads=module.num_kv_heads,
        causal=kwargs.get("causal", False),
        **numpy_kwargs,
    )


def mask_variants(batch: int, heads: int, lq: int, lk: int) -> dict[str, dict]:
    generator = torch.Generator().manual_seed(5)
    lengths = torch.randint(1, lk + 1, (batch,), generator=generator)
    float_mask = torch.randn(batch, lq, lk, generator=generator, dtype=torch.float64)
    query_mask = padding_mask(torch.arange(batch) % (lq + 1), lq)  # a sequence with no real query
    query_mask[-1, 0] = False  # and one whose real queries are not a prefix
    return {
        "none": {},
        "2d": {"mask": torch.rand(lq, lk, generator=generator) > 0.3},
        "3d": {"mask": torch.rand(batch, lq, lk, generator=generator) > 0.3},
        "4d": {"mask": torch.rand(batch, heads, lq, lk, generator=generator) > 0.3},
        "key-mask": {"key_mask": padding_mask(lengths, lk)},
        "float+key-mask": {"mask": float_mask, "key_mask": padding_mask(lengths, lk)},
        "causal+key-mask": {"key_mask": padding_mask(lengths, lk), "causal": True},
        "causal": {"causal": True},
        "query-mask": {"key_mask": padding_mask(lengths, lk), "query_mask": query_mask},
        "causal+query-mask": {"key_mask": padding_mask(lengths, lk), "query_mask": query_mask, "causal": True},
        "3d+query-mask": {"mask": torch.rand(batch, lq, lk, generator=generator) > 0.3, "query_mask": query_mask},
    }


@pytest.mark.parametrize("variant", list(mask_variants(1, 1, 1, 1)))
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_matches_reference_with_own_weights(config: Config, variant: str) -> None:
    module = config.build()
    query, key, value = config.inputs(module)
    kwargs = mask_variants(query.shape[0], config.num_heads, query.shape[1], key.shape[1])[variant]
    out, weights = module(query, key, value, return_weights=True, **kwargs)
    expected, expected_weights = reference_call(module, query, key, value, **kwargs)
    assert out.shape == (query.shape[0], query.shape[1], config.d_model)
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-12)
    np.testing.assert_allclose(to_numpy(weights), expected_weights, atol=1e-12)
    torch.testing.assert_close(module(query, key, value, **kwargs), out, atol=1e-12, rtol=1e-12)


def test_key_and_value_default_to_query_and_key() -> None:
    module = Config("self", 16, 4).build()
    x, y = randn(2, 5, 16), randn(2, 6, 16)
    torch.testing.assert_close(module(x), module(x, x, x))
    torch.testing.assert_close(module(x, y), module(x, y, y))


def test_implicit_padding_mask_equals_explicit_mask() -> None:
    module = Config("self", 16, 4).build()
    x = randn(3, 6, 16)
    key_mask = padding_mask([6, 2, 4], 6)
    explicit = key_mask[:, None, :].expand(3, 6, 6)  # (B, Lq, Lk)
    torch.testing.assert_close(module(x, key_mask=key_mask), module(x, mask=explicit))


def test_padded_queries_do_not_change_real_positions() -> None:
    module = Config("self", 16, 4).build()
    x = randn(1, 6, 16)
    key_mask = padding_mask([4], 6)
    padded = module(x, key_mask=key_mask)
    unpadded = module(x[:, :4])
    torch.testing.assert_close(padded[:, :4], unpadded)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_skipping_padded_queries_keeps_gradients(causal: bool) -> None:
    """The packed path (padded rows skipped) and the dense one (weights requested) agree, gradients included."""
    module = Config("self", 16, 4).build()
    lengths = padding_mask([6, 3, 0, 5], 6)
    x = randn(4, 6, 16, requires_grad=True)
    packed = module(x, key_mask=lengths, query_mask=lengths, causal=causal)
    dense, _ = module(x, key_mask=lengths, query_mask=lengths, causal=causal, return_weights=True)
    (packed_grad,) = torch.autograd.grad(packed.square().sum(), x)
    (dense_grad,) = torch.autograd.grad(dense.square().sum(), x)
    torch.testing.assert_close(packed, dense, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(packed_grad, dense_grad, atol=1e-12, rtol=1e-12)
    assert not packed[~lengths].any()
    assert not packed_grad[~lengths].any()  # padding cannot influence anything


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_off_the_packed_devices_padded_batches_take_one_kernel_call_and_agree(
    causal: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the packed path is not the faster one (a device outside ``PACKED_DEVICES``, i.e. CUDA), a padded
    self-attention batch runs the padded kernel with its key mask: the same outputs and gradients, padded query rows
    zero. Simulated here by taking the CPU out of ``PACKED_DEVICES``."""
    module = Config("self", 16, 4).build("fused")
    real = padding_mask([6, 3, 0, 5], 6)
    x = randn(4, 6, 16, requires_grad=True)
    packed = module(x, key_mask=real, query_mask=real, causal=causal)
    (packed_grad,) = torch.autograd.grad(packed.square().sum(), x)

    def packed_path(*args: object, **kwargs: object) -> None:
        raise AssertionError("the packed path ran off the packed devices")

    monkeypatch.setattr(sys.modules["multihead.torch.attention"], "PACKED_DEVICES", frozenset())
    monkeypatch.setattr(MultiHeadAttention, "_attend_packed", packed_path)
    with TorchCalls() as calls:
        padded = module(x, key_mask=real, query_mask=real, causal=causal)
    assert calls.count(F.scaled_dot_product_attention) == 1
    (padded_grad,) = torch.autograd.grad(padded.square().sum(), x)
    torch.testing.assert_close(padded, packed, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(padded_grad, packed_grad, atol=1e-12, rtol=1e-12)
    assert not padded[~real].any()
    expected, _ = reference_call(module, x, x, x, key_mask=real, query_mask=real, causal=causal)
    np.testing.assert_allclose(to_numpy(padded), expected, atol=1e-12, rtol=0)


def test_skipping_padded_queries_equals_running_each_sequence_alone() -> None:
    module = Config("self", 16, 4).build()
    lengths = [6, 2, 4]
    x = randn(3, 6, 16)
    real = padding_mask(lengths, 6)
    out = module(x, key_mask=real, query_mask=real, causal=True)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(out[b, :n], module(x[b : b + 1, :n], causal=True)[0])


def test_skipping_padded_queries_drops_out_in_training() -> None:
    module = MultiHeadAttention(16, 4, dropout=0.5).double()
    real = padding_mask([6, 3], 6)
    x = randn(2, 6, 16)
    evaluated = module.eval()(x, key_mask=real, query_mask=real)
    trained = module.train()(x, key_mask=real, query_mask=real)
    assert not torch.allclose(trained[real], evaluated[real])
    assert not trained[~real].any()


def test_causality_through_gradients() -> None:
    module = Config("self", 16, 4).build()
    x = randn(2, 6, 16, requires_grad=True)
    out = module(x, causal=True)
    for i in range(6):
        (grad,) = torch.autograd.grad(out[:, i].sum(), x, retain_graph=True)
        assert torch.all(grad[:, i + 1 :] == 0)
        assert torch.all(grad[:, : i + 1].abs().sum(-1) > 0)


def test_causal_flag_equals_causal_mask() -> None:
    module = Config("cross", 16, 4).build()
    query, key, value = Config("cross", 16, 4).inputs(module)
    torch.testing.assert_close(
        module(query, key, value, causal=True), module(query, key, value, mask=causal_mask(5, 7))
    )


# --- from_torch ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("dims", [None, (6, 10)], ids=["same-dims", "kdim-vdim"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "length-first"])
def test_from_torch_matches_nn_multihead_attention(batch_first: bool, dims: tuple | None, bias: bool) -> None:
    kdim, vdim = dims or (None, None)
    theirs = nn.MultiheadAttention(16, 4, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first).eval()
    with torch.no_grad():
        for parameter in theirs.parameters():
            parameter.uniform_(-0.5, 0.5)
    ours = MultiHeadAttention.from_torch(theirs)
    batch, lq, lk = 3, 5, 7
    query = torch.randn(batch, lq, 16)
    key = torch.randn(batch, lk, kdim or 16)
    value = torch.randn(batch, lk, vdim or 16)
    key_padding = ~padding_mask([7, 3, 5], lk)  # PyTorch's polarity: True = ignore
    blocked = torch.rand(lq, lk) > 0.7
    blocked[:, 0] = False  # nn.MultiheadAttention returns NaN for fully masked rows; keep every row alive

    def theirs_batch_first(*args: torch.Tensor, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not batch_first:
            args = tuple(x.transpose(0, 1) for x in args)
        out, weights = theirs(*args, average_attn_weights=False, **kwargs)
        return (out if batch_first else out.transpose(0, 1)), weights

    expected, expected_weights = theirs_batch_first(query, key, value, key_padding_mask=key_padding, attn_mask=blocked)
    out, weights = ours(query, key, value, key_mask=~key_padding, mask=~blocked, return_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)

    float_mask = torch.randn(lq, lk)
    expected, _ = theirs_batch_first(query, key, value, attn_mask=float_mask)
    torch.testing.assert_close(ours(query, key, value, mask=float_mask), expected, atol=1e-5, rtol=1e-5)


def test_from_torch_copies_dropout_and_dtype() -> None:
    theirs = nn.MultiheadAttention(8, 2, dropout=0.25, batch_first=True).double()
    ours = MultiHeadAttention.from_torch(theirs)
    assert ours.dropout == 0.25
    assert all(p.dtype == torch.float64 for p in ours.parameters())


# --- the tutorials' configurations -----------------------------------------------------------------------


def test_paper_sizes() -> None:
    module = MultiHeadAttention(512, 8).eval()
    x = torch.randn(64, 5, 512)
    out, weights = module(x, return_weights=True)
    assert out.shape == (64, 5, 512)
    assert weights.shape == (64, 8, 5, 5)
    assert module.head_dim == 64
    expected, _ = reference_call(module, x, x, x)
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-5)


def test_cross_attention_lq_10_lk_20() -> None:
    module = MultiHeadAttention(512, 8).eval()
    query, memory = torch.randn(32, 10, 512), torch.randn(32, 20, 512)
    out, weights = module(query, memory, return_weights=True)
    assert out.shape == (32, 10, 512)
    assert weights.shape == (32, 8, 10, 20)
    expected, _ = reference_call(module, query, memory, memory)
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-5)


def test_input_width_64_to_8_heads_of_8_with_output_512() -> None:
    module = MultiHeadAttention(512, 8, head_dim=8, qdim=64, kdim=64, vdim=64).eval()
    assert module.q_proj.weight.shape == (64, 64)
    assert module.out_proj.weight.shape == (512, 64)
    x = torch.randn(4, 6, 64)
    assert module(x).shape == (4, 6, 512)


def test_value_head_dim_differs_from_key_head_dim() -> None:
    module = MultiHeadAttention(32, 4, head_dim=6, value_head_dim=10).double().eval()
    assert module.v_proj.weight.shape == (40, 32)
    assert module.out_proj.weight.shape == (32, 40)
    x = randn(2, 3, 32)
    expected, _ = reference_call(module, x, x, x)
    np.testing.assert_allclose(to_numpy(module(x)), expected, atol=1e-12)


def test_projections_are_registered_trainable_parameters() -> None:
    module = MultiHeadAttention(16, 4, dropout=0.1)
    names = {name for name, _ in module.named_parameters()}
    assert names == {f"{p}_proj.{t}" for p in ("q", "k", "v", "out") for t in ("weight", "bias")}
    assert all(p.requires_grad for p in module.parameters())
    x = torch.randn(2, 5, 16)
    target = torch.randn(2, 5, 16)
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(module(x), target).backward()
    # The key bias adds q·b to every score of a query alike; softmax ignores such shifts, so it gets no gradient.
    torch.testing.assert_close(module.k_proj.bias.grad, torch.zeros(16), atol=1e-6, rtol=0)
    optimizer.step()
    for name, p in module.named_parameters():
        if name != "k_proj.bias":
            assert not torch.equal(p, before[name]), name


def test_eval_is_deterministic_and_training_drops_out() -> None:
    module = MultiHeadAttention(16, 4, dropout=0.5)
    x = torch.randn(2, 9, 16)
    module.eval()
    first, second = module(x), module(x)
    assert torch.equal(first, second)
    module.train()
    torch.manual_seed(1)
    dropped = module(x)
    assert not torch.allclose(dropped, first)
    torch.manual_seed(1)
    assert torch.equal(module(x), dropped)


@pytest.mark.parametrize(
    "options",
    [{"num_kv_heads": 2}, {"head_dim": 7, "value_head_dim": 5, "dropout": 0.25, "implementation": "explicit"}],
    ids=["gqa", "head-dims-dropout-explicit"],
)
def test_repr_reports_the_configuration(options: dict) -> None:
    """The repr holds every size and choice of the module as ``name=value``, values as Python literals."""
    module = MultiHeadAttention(512, 8, **options)
    reported = dict(item.split("=", 1) for item in module.extra_repr().split(", "))
    names = ["d_model", "num_heads", "num_kv_heads", "head_dim", "value_head_dim", "dropout"]
    expected = {name: getattr(module, name) for name in names}
    if module.implementation != "auto":  # the default goes unsaid
        expected["implementation"] = module.implementation
    assert {name: ast.literal_eval(value) for name, value in reported.items()} == expected


# --- implementation ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "gradients"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("variant", ["causal+key-mask", "float+key-mask", "causal+query-mask", "4d"])
def test_every_implementation_matches_reference(variant: str, implementation: str, grad: bool) -> None:
    config = Config("gqa", 24, 6, {"num_kv_heads": 2}, lq=7, lk=7, cross=False)
    module = config.build(implementation)
    query, key, value = config.inputs(module)
    kwargs = mask_variants(query.shape[0], config.num_heads, query.shape[1], key.shape[1])[variant]
    with torch.set_grad_enabled(grad):
        out = module(query, key, value, **kwargs)
    expected, _ = reference_call(module, query, key, value, **kwargs)
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_every_implementation_decodes_token_by_token_like_the_reference(implementation: str) -> None:
    config = Config("gqa", 24, 6, {"num_kv_heads": 2}, lq=6, cross=False)
    module = config.build(implementation)
    x = randn(2, 6, 24)
    cache = KVCache()
    with torch.no_grad():
        steps = torch.cat([module(x[:, t : t + 1], cache=cache, causal=True) for t in range(6)], 1)
    expected, _ = reference_call(module, x, x, x, causal=True)
    np.testing.assert_allclose(to_numpy(steps), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "packed-query-mask"])
def test_the_module_takes_the_path_it_is_given(padded: bool) -> None:
    x = randn(2, 5, 16)
    real = padding_mask([5, 3], 5)
    kwargs = {"key_mask": real, "query_mask": real} if padded else {}

    def kernel_ran(implementation: str, grad: bool) -> bool:
        module = Config("self", 16, 4).build(implementation)
        with TorchCalls() as calls, torch.set_grad_enabled(grad):
            module(x, causal=True, **kwargs)
        return calls.count(F.scaled_dot_product_attention) > 0

    assert kernel_ran("fused", grad=False)
    assert not kernel_ran("explicit", grad=True)
    assert not kernel_ran("auto", grad=False)  # a small inference call on CPU: the explicit math
    assert kernel_ran("auto", grad=True)  # gradients: the kernel


def test_explicit_module_can_return_weights_and_fused_equals_it() -> None:
    config = Config("cross", 16, 4)
    explicit, fused = config.build("explicit"), config.build("fused")
    fused.load_state_dict(explicit.state_dict())
    query, key, value = config.inputs(explicit)
    out, weights = explicit(query, key, value, return_weights=True)
    assert weights.shape == (3, 4, 5, 7)
    torch.testing.assert_close(fused(query, key, value), out, atol=1e-12, rtol=0)
