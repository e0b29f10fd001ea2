"""KV-cache decoding and the encoder-decoder Transformer, PyTorch front end.

Notation: B batch, Ls/Lt source/target length, E d_model, V vocabulary.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from multihead.config import TransformerConfig
from multihead.io import load_model, save_model
from multihead.reference import sinusoidal_positions
from multihead.torch import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    KVCache,
    MultiHeadAttention,
    PositionalEncoding,
    Transformer,
)

PAD, BOS, EOS = 0, 1, 2
SMALL = dict(d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64)


def small_model(norm_first: bool = False, **overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(20, 23, **{**SMALL, "norm_first": norm_first, **overrides}).double().eval()


def tokens(batch: int, length: int, vocab: int = 20, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


# --- KVCache ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [None, 12], ids=["growing", "preallocated"])
def test_token_by_token_equals_full_causal_attention(capacity: int | None) -> None:
    module = MultiHeadAttention(32, 4, num_kv_heads=2).double().eval()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    cache = KVCache(capacity)
    steps = [module(x[:, t : t + 1], cache=cache, causal=True) for t in range(9)]
    torch.testing.assert_close(torch.cat(steps, 1), module(x, causal=True), atol=1e-12, rtol=0)
    assert cache.length == 9
    assert cache.keys.shape == (2, 2, 9, 8)


def test_chunks_with_key_mask_over_everything_cached() -> None:
    module = MultiHeadAttention(32, 4).double().eval()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    key_mask = torch.tensor([[True] * 7, [True, False, True, True, True, False, True]])
    cache = KVCache()
    first = module(x[:, :3], cache=cache, causal=True, key_mask=key_mask[:, :3])
    second = module(x[:, 3:], cache=cache, causal=True, key_mask=key_mask)
    torch.testing.assert_close(torch.cat([first, second], 1), module(x, causal=True, key_mask=key_mask))


def test_cross_attention_cache_projects_memory_once() -> None:
    module = MultiHeadAttention(32, 4).double().eval()
    x, memory = torch.randn(2, 5, 32, dtype=torch.float64), torch.randn(2, 6, 32, dtype=torch.float64)
    calls = []
    module.k_proj.register_forward_hook(lambda *_: calls.append(True))
    cache = KVCache()
    steps = [module(x[:, t : t + 1], memory, cache=cache) for t in range(5)]
    assert len(calls) == 1
    torch.testing.assert_close(torch.cat(steps, 1), module(x, memory))


def test_cache_refuses_overflow_and_mismatched_shapes() -> None:
    cache = KVCache(capacity=2)
    cache.append(torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4))
    with pytest.raises(ValueError, match="capacity 2 exceeded: 2 cached \\+ 1 new"):
        cache.append(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    growing = KVCache()
    growing.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"received new keys of shape \(1, 3, 1, 4\)"):
        growing.append(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    with pytest.raises(TypeError, match="`cache` must be a KVCache"):
        MultiHeadAttention(8, 2)(torch.zeros(1, 1, 8), cache={})
    with pytest.raises(ValueError, match="`capacity` must be a positive int, received 0"):
        KVCache(0)


def test_cache_reorder_keeps_rows() -> None:
    cache = KVCache()
    keys = torch.arange(3.0)[:, None, None, None].expand(3, 1, 2, 2)
    cache.append(keys, keys)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.keys[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]


# --- parts -----------------------------------------------------------------------------------------------


def test_positional_encoding_is_the_papers_table() -> None:
    table = sinusoidal_positions(50, 16)
    assert table[3, 4] == pytest.approx(math.sin(3 / 10000 ** (4 / 16)))
    assert table[3, 5] == pytest.approx(math.cos(3 / 10000 ** (4 / 16)))
    encoding = PositionalEncoding(16, max_len=50)
    x = torch.zeros(2, 7, 16)
    np.testing.assert_allclose(encoding(x, offset=3)[0].numpy(), table[3:10], atol=1e-6)
    with pytest.raises(ValueError, match=r"positions 45..51 exceed max_len=50"):
        encoding(x, offset=45)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward(activation: str) -> None:
    block = FeedForward(8, 16, activation=activation)
    x = torch.randn(2, 3, 8)
    hidden = block.linear1(x)
    expected = block.linear2(torch.relu(hidden) if activation == "relu" else torch.nn.functional.gelu(hidden))
    torch.testing.assert_close(block(x), expected)
    with pytest.raises(ValueError, match=r"`activation` must be one of \('relu', 'gelu'\), received 'tanh'"):
        FeedForward(8, 16, activation="tanh")


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_encoder_layer_residuals_and_norms(norm_first: bool) -> None:
    layer = EncoderLayer(16, 4, 32, dropout=0.0, norm_first=norm_first).eval()
    x = torch.randn(2, 5, 16)
    if norm_first:  # x + Sublayer(LayerNorm(x))
        h = x + layer.self_attn(layer.norm1(x))
        expected = h + layer.feed_forward(layer.norm2(h))
    else:  # LayerNorm(x + Sublayer(x)), as in the paper
        h = layer.norm1(x + layer.self_attn(x))
        expected = layer.norm2(h + layer.feed_forward(h))
    torch.testing.assert_close(layer(x), expected)


def test_decoder_layer_is_causal_then_cross_then_feed_forward() -> None:
    layer = DecoderLayer(16, 4, 32, dropout=0.0).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 6, 16)
    h = layer.norm1(x + layer.self_attn(x, causal=True))
    h = layer.norm2(h + layer.cross_attn(h, memory))
    torch.testing.assert_close(layer(x, memory), layer.norm3(h + layer.feed_forward(h)))


def test_pre_norm_stacks_end_with_a_layer_norm() -> None:
    model = Transformer(10, 10, **SMALL, norm_first=True)
    assert isinstance(model.encoder.norm, torch.nn.LayerNorm)
    assert isinstance(model.decoder.norm, torch.nn.LayerNorm)
    assert Transformer(10, 10, **SMALL).encoder.norm is None


# --- the model -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("capacity", [None, 16], ids=["growing", "preallocated"])
def test_cached_decode_equals_full_decode(norm_first: bool, capacity: int | None) -> None:
    model = small_model(norm_first)
    src, tgt = tokens(3, 7), tokens(3, 6, vocab=23, seed=1)
    full = model(src, tgt)
    memory = model.encode(src)
    cache = model.new_cache(capacity)
    steps = [model.decode(tgt[:, t : t + 1], memory, cache=cache) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-12, rtol=0)


def test_decoder_is_causal() -> None:
    model = small_model()
    src, tgt = tokens(2, 7), tokens(2, 8, vocab=23, seed=1)
    changed = tgt.clone()
    changed[:, 5:] = tokens(2, 3, vocab=23, seed=2)
    torch.testing.assert_close(model(src, changed)[:, :5], model(src, tgt)[:, :5])
    assert not torch.allclose(model(src, changed)[:, 5:], model(src, tgt)[:, 5:])


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_source_padding_never_changes_real_positions(norm_first: bool) -> None:
    model = small_model(norm_first)
    src, tgt = tokens(1, 5), tokens(1, 6, vocab=23, seed=1)
    padded = torch.cat([src, torch.full((1, 4), 7)], 1)  # any token id in the padding
    key_mask = torch.tensor([[True] * 5 + [False] * 4])
    torch.testing.assert_close(model(padded, tgt, src_key_mask=key_mask), model(src, tgt))
    torch.testing.assert_close(model.encode(padded, src_key_mask=key_mask)[:, :5], model.encode(src))


def test_target_padding_keys_are_masked() -> None:
    model = small_model()
    src, tgt = tokens(1, 5), tokens(1, 4, vocab=23, seed=1)
    padded = torch.cat([tgt, torch.full((1, 3), 9)], 1)
    tgt_key_mask = torch.tensor([[True] * 4 + [False] * 3])
    torch.testing.assert_close(model(src, padded, tgt_key_mask=tgt_key_mask)[:, :4], model(src, tgt))


def test_pad_id_gives_the_masks_implicitly() -> None:
    model = small_model(pad_id=PAD)
    src = torch.tensor([[5, 6, 7, PAD, PAD], [8, 9, 10, 11, 12]])
    tgt = torch.tensor([[3, 4, PAD], [5, 6, 7]])
    explicit = small_model()(src, tgt, src_key_mask=src != PAD, tgt_key_mask=tgt != PAD)
    torch.testing.assert_close(model(src, tgt), explicit)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_greedy_with_cache_equals_without(norm_first: bool) -> None:
    model = small_model(norm_first)
    src = tokens(4, 7)
    with_cache = model.generate(src, max_len=12, bos_id=BOS, eos_id=EOS)
    without = model.generate(src, max_len=12, bos_id=BOS, eos_id=EOS, use_cache=False)
    assert with_cache.dtype == torch.long
    assert torch.equal(with_cache, without)


def test_greedy_equals_argmax_of_full_decoding() -> None:
    model = small_model()
    src = tokens(2, 6)
    out = model.generate(src, max_len=5, bos_id=BOS, eos_id=99 % 23)
    prefix = torch.full((2, 1), BOS)
    for _ in range(out.shape[1]):
        prefix = torch.cat([prefix, model(src, prefix)[:, -1:].argmax(-1)], 1)
    assert torch.equal(out, prefix[:, 1:])


def test_beam_search_with_beam_one_is_greedy_and_cache_does_not_matter() -> None:
    model = small_model()
    src = tokens(3, 7)
    greedy = model.generate(src, max_len=10, bos_id=BOS, eos_id=EOS)
    assert torch.equal(model.generate(src, max_len=10, bos_id=BOS, eos_id=EOS, beam_size=1), greedy)
    beams = model.generate(src, max_len=10, bos_id=BOS, eos_id=EOS, beam_size=4)
    assert torch.equal(beams, model.generate(src, max_len=10, bos_id=BOS, eos_id=EOS, beam_size=4, use_cache=False))


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_generate_stops_per_sequence_at_eos_and_pads(use_cache: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    model = small_model(pad_id=PAD)
    decode = model._decode  # what generate calls at every step

    def row_0_ends_at_step_2(tgt, memory, memory_key_mask, tgt_key_mask, cache, return_weights=False):
        logits = decode(tgt, memory, memory_key_mask, tgt_key_mask, cache, return_weights)
        position = cache.length if cache is not None else tgt.shape[1]  # tokens decoded, BOS included
        logits[:, -1, EOS] = -1e9
        if position == 2:
            logits[0, -1, EOS] = 1e9
        return logits

    monkeypatch.setattr(model, "_decode", row_0_ends_at_step_2)
    out = model.generate(tokens(3, 7), max_len=6, bos_id=BOS, eos_id=EOS, use_cache=use_cache)
    assert out.shape == (3, 6)
    assert out[0, 1] == EOS
    assert torch.all(out[0, 2:] == PAD)
    assert torch.all(out[1:] != EOS)


def test_generate_ends_when_every_sequence_has_ended() -> None:
    model = small_model()
    with torch.no_grad():
        model.output_proj.bias[EOS] = 1e6
    assert torch.equal(model.generate(tokens(3, 7), max_len=5, bos_id=BOS, eos_id=EOS), torch.full((3, 1), EOS))


def test_learns_to_reverse_sequences() -> None:
    torch.manual_seed(0)
    vocab, length = 13, 8
    model = Transformer(vocab, vocab, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64,
                        dropout=0.0, pad_id=PAD)  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    generator = torch.Generator().manual_seed(1)

    def batch(n: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        src = torch.randint(3, vocab, (n, length), generator=gen)
        target = torch.cat([src.flip(1), torch.full((n, 1), EOS)], 1)
        return src, torch.cat([torch.full((n, 1), BOS), target[:, :-1]], 1), target

    for _ in range(400):
        src, tgt_in, tgt_out = batch(64, generator)
        loss = torch.nn.functional.cross_entropy(model(src, tgt_in).reshape(-1, vocab), tgt_out.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    src, _, tgt_out = batch(500, torch.Generator().manual_seed(99))
    exact = (model.generate(src, max_len=length + 1, bos_id=BOS, eos_id=EOS) == tgt_out).all(1).float().mean()
    assert exact > 0.9


# --- configuration and saving ----------------------------------------------------------------------------


def test_config_json_round_trip() -> None:
    config = TransformerConfig(11, 12, d_model=16, num_heads=2, norm_first=True, activation="gelu", pad_id=0)
    assert TransformerConfig.from_json(config.to_json()) == config
    assert Transformer.from_config(config).config == config


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"d_model": 30, "num_heads": 4}, r"d_model=30, num_heads=4"),
        ({"activation": "tanh"}, r"`activation` must be one of"),
        ({"dropout": 1.5}, r"`dropout` must be in \[0, 1\)"),
        ({"pad_id": 50}, r"`pad_id` must be a token of both vocabularies \(< 10\), received 50"),
        ({"max_len": 0}, r"`max_len` must be a positive int"),
    ],
)
def test_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Transformer(10, 12, **kwargs)


def test_config_rejects_unknown_keys_and_bad_json() -> None:
    with pytest.raises(ValueError, match=r"unknown Transformer config keys \['heads'\]"):
        TransformerConfig.from_dict({"src_vocab": 3, "tgt_vocab": 3, "heads": 2})
    with pytest.raises(ValueError, match="must be JSON"):
        TransformerConfig.from_json("{not json")


def test_save_and_load_model(tmp_path) -> None:
    model = small_model(norm_first=True, pad_id=PAD).float()
    save_model(model, tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_model(tmp_path / "run")
    assert loaded.config == model.config
    assert not loaded.training
    src, tgt = tokens(2, 6), tokens(2, 5, vocab=23, seed=1)
    torch.testing.assert_close(loaded(src, tgt), model(src, tgt))


def test_token_validation() -> None:
    model = small_model()
    with pytest.raises(ValueError, match=r"`src` must hold ids in \[0, 20\), received ids from 3 to 25"):
        model(torch.tensor([[3, 25]]), tokens(1, 2))
    with pytest.raises(TypeError, match="`tgt` must hold integer token ids"):
        model(tokens(1, 2), torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"`src` must be 2-D \(B, L\)"):
        model.encode(torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="`eos_id` must be < tgt_vocab=23, received eos_id=30"):
        model.generate(tokens(1, 3), max_len=3, bos_id=1, eos_id=30)
