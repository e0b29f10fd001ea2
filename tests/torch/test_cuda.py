"""``multihead.torch`` on a CUDA device, in every dtype and implementation (the ``cuda`` marker: ``pytest -m cuda``).

Skipped where PyTorch sees no CUDA device. Outputs are compared with the float64 oracle computed from the same
values rounded to the dtype (weights and inputs), so the error measured is the computation's alone; gradients with
the float64 module on the CPU (itself checked against the oracle in test_attention.py). PyTorch computes float32
matrix products on CUDA in full float32 unless told otherwise; its fused kernels may not, hence the float32
tolerance.

Notation: B batch, Lq/Lk lengths, E d_model, H heads.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import randn, state_dict_numpy, to_numpy
from multihead import reference
from multihead.torch import MultiHeadAttention, Transformer, padding_mask
from multihead.torch.functional import IMPLEMENTATIONS

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA device")]

# The largest error allowed, relative to the largest expected magnitude.
TOLERANCE = {torch.float32: 2e-3, torch.bfloat16: 4e-2, torch.float16: 5e-3}
DTYPES = pytest.mark.parametrize("dtype", list(TOLERANCE), ids=["fp32", "bf16", "fp16"])
B, LQ, LK, E, H, HKV = 3, 5, 9, 24, 6, 2


def variants() -> dict[str, dict]:
    """Masks of every kind for a (B, LQ) query over (B, LK) keys; ``self`` ones are for LQ = LK self-attention."""
    generator = torch.Generator().manual_seed(1)
    keys = padding_mask(torch.tensor([LK, 4, 1]), LK)
    dead = torch.rand(B, LQ, LK, generator=generator) > 0.3
    dead[1, 2] = False  # a query row that may attend nothing
    return {
        "none": {},
        "key-mask": {"key_mask": keys},
        "causal-lq-lt-lk": {"causal": True, "key_mask": keys},
        "bool-3d-dead-row": {"mask": dead},
        "float-2d": {"mask": torch.randn(LQ, LK, generator=generator, dtype=torch.float64)},
    }


SELF_VARIANTS = {
    "causal": {"causal": True},
    "padded-self": {"key_mask": padding_mask(torch.tensor([LK, 6, 0]), LK), "causal": True, "query_mask": True},
}


def module_pair(implementation: str, dtype: torch.dtype) -> tuple[MultiHeadAttention, MultiHeadAttention]:
    """A GQA module on CUDA in ``dtype``, and its float64 CPU twin holding the same (rounded) weights."""
    torch.manual_seed(0)
    module = MultiHeadAttention(E, H, num_kv_heads=HKV, implementation=implementation).eval()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.uniform_(-0.5, 0.5)
    module = module.to(dtype).double()  # weights rounded to dtype
    return copy.deepcopy(module).to("cuda", dtype), module


def rounded(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).double()


def assert_close_to(actual: torch.Tensor, expected: np.ndarray, dtype: torch.dtype) -> None:
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(to_numpy(actual.float().cpu()), expected, atol=TOLERANCE[dtype] * scale, rtol=0)


@DTYPES
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("variant", [*variants(), *SELF_VARIANTS])
def test_the_module_on_cuda_matches_the_float64_oracle(variant: str, implementation: str, dtype: torch.dtype) -> None:
    cuda, cpu = module_pair(implementation, dtype)
    self_attention = variant in SELF_VARIANTS
    query = rounded(randn(B, LK if self_attention else LQ, E), dtype)
    memory = query if self_attention else rounded(randn(B, LK, E), dtype)
    kwargs = dict({**variants(), **SELF_VARIANTS}[variant])
    if kwargs.get("query_mask") is True:
        kwargs["query_mask"] = kwargs["key_mask"]
    on_cuda = {name: value.cuda() if isinstance(value, torch.Tensor) else value for name, value in kwargs.items()}
    with torch.no_grad():
        out = cuda(query.to("cuda", dtype), memory.to("cuda", dtype), memory.to("cuda", dtype), **on_cuda)
    assert out.device.type == "cuda"
    assert out.dtype == dtype
    numpy_kwargs = {name: to_numpy(value) for name, value in kwargs.items() if isinstance(value, torch.Tensor)}
    expected, _ = reference.multi_head_attention(
        to_numpy(query), to_numpy(memory), to_numpy(memory), state_dict_numpy(cpu), num_heads=H, num_kv_heads=HKV,
        causal=kwargs.get("causal", False), **numpy_kwargs,
    )  # fmt: skip
    assert_close_to(out, expected, dtype)
    if "query_mask" in kwargs:
        assert not out[~kwargs["query_mask"].cuda()].any()  # padded query rows are zero


@DTYPES
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_padded_self_attention_gradients_on_cuda(implementation: str, dtype: torch.dtype) -> None:
    """A padded training batch (key and query masks, causal) on CUDA: the fused kernel with the key mask, never the
    packed path, with the float64 CPU module's gradients."""
    cuda, cpu = module_pair(implementation, dtype)
    real = padding_mask(torch.tensor([LK, 5, 1]), LK)
    x = rounded(randn(B, LK, E), dtype)
    cotangent = randn(B, LK, E)
    leaves = [x.clone().requires_grad_(), x.to("cuda", dtype).requires_grad_()]
    outs = [
        cpu(leaves[0], key_mask=real, query_mask=real, causal=True),
        cuda(leaves[1], key_mask=real.cuda(), query_mask=real.cuda(), causal=True),
    ]
    grads = [torch.autograd.grad((out * c).sum(), leaf)[0] for out, c, leaf in
             zip(outs, [cotangent, cotangent.to("cuda", dtype)], leaves, strict=True)]  # fmt: skip
    assert_close_to(outs[1], to_numpy(outs[0]), dtype)
    assert_close_to(grads[1], to_numpy(grads[0]), dtype)
    assert not outs[1][~real.cuda()].any()


def test_cuda_is_not_a_packed_device(monkeypatch: pytest.MonkeyPatch) -> None:
    def packed_path(*args: object, **kwargs: object) -> None:
        raise AssertionError("the packed path ran on CUDA")

    monkeypatch.setattr(MultiHeadAttention, "_attend_packed", packed_path)
    module = MultiHeadAttention(E, H).cuda()
    real = padding_mask(torch.tensor([LK, 2, 5]), LK).cuda()
    out = module(torch.randn(B, LK, E, device="cuda"), key_mask=real, query_mask=real)
    assert not out[~real].any()


def small_transformer() -> Transformer:
    torch.manual_seed(0)
    return Transformer(src_vocab=40, tgt_vocab=40, d_model=32, num_heads=4, num_encoder_layers=2,
                       num_decoder_layers=2, d_ff=64, dropout=0.0, max_len=32, pad_id=0).eval()  # fmt: skip


@pytest.mark.parametrize("beam", [1, 3], ids=["greedy", "beam"])
def test_generation_on_cuda_equals_recomputation_and_the_cpu(beam: int) -> None:
    model = small_transformer()
    src = torch.randint(3, 40, (4, 11), generator=torch.Generator().manual_seed(2))
    src[1, 7:] = 0  # padding
    kwargs = dict(max_len=12, bos_id=1, eos_id=2, beam_size=beam)
    on_cpu = model.generate(src, **kwargs)
    model.cuda()
    cached = model.generate(src.cuda(), **kwargs)
    recomputed = model.generate(src.cuda(), use_cache=False, **kwargs)
    assert cached.device.type == "cuda"
    assert torch.equal(cached, recomputed)
    assert torch.equal(cached.cpu(), on_cpu)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_an_autocast_training_step_on_cuda_is_finite_and_close_to_float32(dtype: torch.dtype) -> None:
    model = small_transformer().train().cuda()
    src = torch.randint(3, 40, (8, 10), device="cuda")
    tgt = torch.randint(3, 40, (8, 9), device="cuda")
    loss32 = torch.nn.functional.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten())
    with torch.autocast("cuda", dtype=dtype):
        logits = model(src, tgt[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    torch.testing.assert_close(loss, loss32.detach(), rtol=3e-2, atol=0)
