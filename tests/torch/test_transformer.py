"""KV-cache decoding and the encoder-decoder Transformer, PyTorch front end: its parts, what a call checks and
where (once, where it enters), generation, tied embeddings, saving.

Notation: B batch, Ls/Lt source/target length, E d_model, V vocabulary.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch
from torch import nn

from conftest import TorchCalls, filtered_distribution
from multihead import checks, decoding, engine, positional
from multihead.io import load_model, load_weights, read_weights, save_model, save_weights, write_weights
from multihead.reference import sinusoidal_positions
from multihead.torch import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    KVCache,
    Layouts,
    MultiHeadAttention,
    PositionalEncoding,
    Transformer,
)
from multihead.torch import transformer as transformer_module

PAD, BOS, EOS = 0, 1, 2
SMALL = dict(d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64)


def small_model(norm_first: bool = False, seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
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
    np.testing.assert_allclose(encoding(x, offset=43)[0].numpy(), table[43:50], atol=1e-6)  # up to the last position
    # A table that starts at position 2 (fairseq's models): offset 0 reads position 2.
    fairseq = PositionalEncoding(16, max_len=48, layout="fairseq", start=2)
    np.testing.assert_allclose(fairseq(x)[0].numpy(), positional.sinusoidal_positions(9, 16, "fairseq")[2:], atol=1e-6)
    # The unchecked path also takes one offset per row (decoding rows at different positions).
    y = torch.randn(3, 2, 16)
    per_row = encoding._forward(y, torch.tensor([5, 0, 48]))
    for row, offset in enumerate([5, 0, 48]):
        torch.testing.assert_close(per_row[row], encoding(y[row : row + 1], offset=offset)[0], rtol=0, atol=0)
    step = encoding._forward(y[:, :1], torch.tensor([5, 0, 49]))  # a decoding step: one position a row
    for row, offset in enumerate([5, 0, 49]):
        torch.testing.assert_close(step[row], encoding(y[row : row + 1, :1], offset=offset)[0], rtol=0, atol=0)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward(activation: str) -> None:
    block = FeedForward(8, 16, activation=activation)
    x = torch.randn(2, 3, 8)
    hidden = block.linear1(x)
    expected = block.linear2(torch.relu(hidden) if activation == "relu" else torch.nn.functional.gelu(hidden))
    torch.testing.assert_close(block(x), expected)


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


def test_weights_changed_between_calls_are_what_the_next_call_decodes_with() -> None:
    """Each call lays out the weights as they are: written in place (an optimizer step, ``load_state_dict``, under
    ``no_grad``) or replaced; checked against decoding without a cache, which reads the modules' weights
    themselves."""
    model, src = small_model(), tokens(4, 7)
    args = dict(max_len=12, bos_id=BOS, eos_id=EOS)

    def decodes_as_its_weights_say() -> torch.Tensor:
        with_cache = model.generate(src, **args)
        assert torch.equal(with_cache, model.generate(src, use_cache=False, **args))
        return with_cache

    first = decodes_as_its_weights_say()
    with torch.no_grad():
        model.decoder.layers[0].feed_forward.linear1.weight.mul_(3.0)
        model.output_proj.bias[5] += 4.0
    assert not torch.equal(decodes_as_its_weights_say(), first)
    model.load_state_dict(small_model(seed=1).state_dict())
    decodes_as_its_weights_say()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model.train()
    model(src, tokens(4, 5)).sum().backward()
    optimizer.step()
    model.eval()
    decodes_as_its_weights_say()
    model.output_proj.weight = nn.Parameter(torch.randn_like(model.output_proj.weight))
    decodes_as_its_weights_say()


@pytest.mark.parametrize("beam_size", [1, 3], ids=["greedy", "beam"])
@pytest.mark.parametrize("ends", [True, False], ids=["eos", "never-eos"])
def test_a_length_limit_per_row_gives_each_row_what_it_gives_alone(beam_size: int, ends: bool) -> None:
    """``max_len`` one per row: each row is what it would be searched alone with its own limit (so never depends on
    the rows searched with it), cut there and padded after."""
    model = small_model(pad_id=PAD)
    if not ends:
        with torch.no_grad():
            model.output_proj.bias[EOS] = -1e9  # every row runs to its limit
    src, limits = tokens(5, 7), [3, 9, 1, 6, 9]
    args = dict(bos_id=BOS, eos_id=EOS, beam_size=beam_size, length_penalty=0.6)
    together = model.generate(src, max_len=limits, **args)
    assert together.shape[1] <= max(limits)
    for row, limit in enumerate(limits):
        alone = model.generate(src[row : row + 1], max_len=limit, **args)[0]
        assert torch.equal(together[row, : len(alone)], alone)
        assert (together[row, len(alone) :] == PAD).all()
        assert len(alone) == limit or alone[-1] == EOS
    assert torch.equal(model.generate(src, max_len=np.array(limits), use_cache=False, **args), together)


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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_beam_search_normalises_the_logits_a_block_of_rows_at_a_time_as_all_at_once(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logits made in blocks of 3 rows (not dividing the 5 sentences' 4 beams), or in one, give the hypotheses and
    scores the whole logits give; in float32 on the CPU also with the output projection packed in blocks of 6 columns
    (``COLUMN_SPLIT``, ``COLUMN_BLOCK``), with blocks of rows and without."""
    from multihead.torch import layouts

    model, src = small_model(seed=4).to(dtype), tokens(5, 6, seed=5)
    search = decoding.SearchOptions(beam_size=4, n_best=3, length_penalty=0.6)
    generation = decoding.Generation(decoding.Specials(pad=PAD, bos=BOS, eos=EOS), search=search)
    cases = [(0, 3, None), (0, 1000, None)]
    if dtype == torch.float32 and layouts.onednn_linear():
        monkeypatch.setattr(layouts, "PLAIN_STEP_ELEMENTS", 0)  # packed on every CPU, as large weights are
        cases += [(0, 3, 6), (1000, 3, 6)]
    found, default = [], layouts.COLUMN_SPLIT
    for whole, rows, column_block in [*cases, (1000, 3, None)]:
        monkeypatch.setattr(transformer_module, "WHOLE_LOGIT_ROWS", whole)
        monkeypatch.setattr(transformer_module, "LOGIT_ROWS", rows)
        monkeypatch.setattr(layouts, "COLUMN_SPLIT", column_block or default)
        monkeypatch.setattr(layouts, "COLUMN_BLOCK", column_block or default)
        with torch.inference_mode():
            session = model.decoding_session(src, max_len=8)
            assert isinstance(session.steps.layouts[model, "output"], layouts.Columns) == (column_block is not None)
            found.append(engine.n_best_search(session, 5, generation, max_len=8))
    tolerance = 1e-6 if dtype == torch.float64 else 1e-5
    for other in found[:-1]:
        for blocks, whole in zip(other, found[-1], strict=True):
            assert [tokens.tolist() for _, tokens in blocks] == [tokens.tolist() for _, tokens in whole]
            np.testing.assert_allclose([rank for rank, _ in blocks], [rank for rank, _ in whole], rtol=tolerance)


@pytest.mark.parametrize(
    ("chunk", "column_block", "whole_rows"),
    [(64, None, 2), (4, None, 2), (64, 6, 2), (4, 6, 2), (64, 6, 1000), (4, 22, 1000)],
)
def test_logits_made_in_blocks_are_read_as_the_whole_logits(
    chunk: int, column_block: int | None, whole_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step of more rows than ``WHOLE_LOGIT_ROWS`` projects its logits a block at a time, where they are read: the
    best tokens, the best continuations of some rows, chosen tokens' log-probabilities and the tokens suppressed (in
    every row, in some, all but one in a row) are those of the whole logits, against a float64 log-softmax of the
    model's own call. Rows' best found whole (23 ids) and through chunks of 4 ids (``row_top_k``: 5 chunks and 3 ids
    after them). A float32 model on the CPU whose output projection is packed in blocks of columns (``COLUMN_SPLIT``,
    ``COLUMN_BLOCK``: 23 ids as 6 + 6 + 6 + 5, or 12 + 11) reads its logits a block of columns at a time, with blocks of
    rows or all rows at once."""
    from multihead.torch import layouts

    monkeypatch.setattr(transformer_module, "TOP_K_CHUNK", chunk)
    model = small_model(seed=6)
    if column_block is not None:
        if not layouts.onednn_linear():
            pytest.skip("blocks of columns are oneDNN's packed forms: this PyTorch build has no oneDNN")  # x86 has
        monkeypatch.setattr(layouts, "COLUMN_SPLIT", column_block)
        monkeypatch.setattr(layouts, "COLUMN_BLOCK", column_block)
        monkeypatch.setattr(layouts, "PLAIN_STEP_ELEMENTS", 0)  # packed on every CPU, as large weights are
        model = model.float()
    src = tokens(7, 5, seed=7)
    prefix = torch.full((7, 1), BOS)
    with torch.no_grad():
        full = model(src, prefix)[:, -1].double()  # (7, V)
    banned, some = np.array([3, 8]), np.array([1, 4, 6])
    forced = np.delete(np.arange(full.shape[1]), 9)  # row 2 must take token 9: every other suppressed
    full[:, banned] = -np.inf
    full[torch.from_numpy(some)[:, None], torch.tensor([EOS])] = -np.inf
    full[2, forced] = -np.inf
    expected = torch.log_softmax(full, dim=-1).numpy()
    monkeypatch.setattr(transformer_module, "WHOLE_LOGIT_ROWS", whole_rows)
    monkeypatch.setattr(transformer_module, "LOGIT_ROWS", 3)  # blocks of 3, 2, 2 (but all 7 with whole_rows 1000)
    with torch.inference_mode():
        session = model.decoding_session(src, max_len=4)
        logits = session.step(prefix[:, -1].numpy())
        assert isinstance(logits, transformer_module.StepLogits)  # made a block at a time
        if column_block is not None:
            assert logits.columns is not None
            assert logits.columns.starts == ((0, 6, 12, 18) if column_block == 6 else (0, 12))
        logits = session.suppress(session.suppress(logits, banned), np.array([EOS]), some)
        logits = session.suppress(logits, forced, np.array([2]))
        assert np.array_equal(session.argmax(logits), expected.argmax(axis=-1))
        rows, scores = np.array([6, 0, 2, 5]), np.array([0.0, -0.5, -1.0, 0.25], dtype=np.float32)
        values, indices = session.top_k(logits, scores, 2, 3, rows)  # sentences of rows (6, 0) and (2, 5)
        for sentence, (first, second) in enumerate(rows.reshape(2, 2)):
            pair = scores[2 * sentence : 2 * sentence + 2]
            candidates = np.concatenate([expected[first] + pair[0], expected[second] + pair[1]])
            best = np.argsort(-candidates, kind="stable")[:3]
            np.testing.assert_allclose(values[sentence], candidates[best], rtol=0, atol=1e-5)
            assert indices[sentence].tolist() == best.tolist()
        at = session.log_probs_at(logits, np.array([4, 0]), np.array([EOS, 9, 3]))
    np.testing.assert_allclose(at, expected[[4, 0]][:, [EOS, 9, 3]], rtol=0, atol=1e-5)


@pytest.mark.parametrize(("rows", "vocab", "k", "chunk"), [(5, 1000, 8, 64), (3, 4099, 1, 64), (4, 300, 3, 7),
                                                        (2, 64, 8, 8), (6, 40, 8, 4), (1, 9, 2, 4)])  # fmt: skip
def test_row_top_k_finds_each_rows_largest_as_topk_does(
    rows: int, vocab: int, k: int, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through chunks (more than ``k`` of them, whole or with ids after the last) or whole: each row's ``k`` largest
    values, best first, and their columns, as ``torch.topk``; the largest all in one chunk, in the ids after the last
    chunk; rows mostly ``-inf`` (suppressed tokens) give the same values; a NaN comes first, as in ``topk``."""
    monkeypatch.setattr(transformer_module, "TOP_K_CHUNK", chunk)
    generator = torch.Generator().manual_seed(vocab)
    x = torch.randn(rows, vocab, generator=generator, dtype=torch.float64).float()
    x[0, :k] += 10.0  # the first chunk holds them all
    x[-1, vocab - k :] += 10.0  # the last ids
    values, columns = transformer_module.row_top_k(x, k)
    expected = x.topk(k, dim=-1)
    assert torch.equal(values, expected.values)
    assert torch.equal(columns, expected.indices)
    suppressed = torch.full_like(x, -torch.inf)
    suppressed[:, vocab // 2] = 1.0  # a forced token: one id left
    suppressed[0, 1] = torch.nan
    values, columns = transformer_module.row_top_k(suppressed, k)
    same = suppressed.topk(k, dim=-1).values
    assert torch.equal(values.nan_to_num(nan=99.0), same.nan_to_num(nan=99.0))
    assert torch.isnan(values[0, 0])
    assert columns[0, 0] == 1
    assert (values[1:, 0] == 1.0).all()
    assert (columns[1:, 0] == vocab // 2).all()
    assert (torch.gather(suppressed, 1, columns).nan_to_num(nan=99.0) == values.nan_to_num(nan=99.0)).all()


@pytest.mark.parametrize("starts", [(0,), (0, 3), (0, 2, 5, 6)], ids=["whole", "two-blocks", "four-blocks"])
def test_the_best_token_found_a_block_of_columns_at_a_time_is_numpys_argmax(starts: tuple[int, ...]) -> None:
    """Read whole or a block of columns at a time: each row's first largest, as NumPy's ``argmax`` of the whole row
    finds it, where equal maxima lie in different blocks, a NaN comes after a number, a row is all ``-inf`` (every
    token suppressed) or all but one, and suppressed tokens span blocks."""
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([
        [0.5, 2.0, 1.0, 2.0, 0.0, 2.0, 1.0, -1.0],  # equal maxima in three blocks
        [0.0, 1.0, 3.0, 2.0, 3.0, 1.0, 3.0, 0.0],
        [0.0, 1.0, 2.0, 9.0, nan, 0.0, 5.0, 9.0],  # a NaN after the largest number
        [-inf] * 8,
        [-inf, -inf, -inf, -inf, -inf, -inf, 4.0, -inf],
        [7.0, 1.0, 2.0, 8.0, 0.0, 3.0, 9.0, 6.0],
    ])  # fmt: skip
    suppressed = (np.array([6]), np.array([5]))  # the last row's largest
    expected = x.clone()
    expected[5, 6] = -inf
    columns = None
    if len(starts) > 1:
        bounds = [*starts, 8]
        columns = transformer_module.ColumnLogits(
            lambda rows, block: x[rows, bounds[block] : bounds[block + 1]].clone(), starts
        )
    logits = transformer_module.StepLogits(lambda rows: x[rows].clone(), (6, 8), owned=True, columns=columns)
    logits.suppressed.append(suppressed)
    assert logits.argmax().tolist() == expected.numpy().argmax(axis=-1).tolist()


@pytest.mark.parametrize("n_best", [1, 2])
def test_beam_search_holds_each_sources_memory_once(n_best: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cross-attention caches hold one memory per source whatever the beams reading it, down to the sources
    still searched; the scores and tokens are the recomputed prefix's (no cache) and those of a cache holding one
    memory per row. Sources of different lengths, one ending early."""
    model = small_model(seed=3)
    src = tokens(5, 9, seed=2)
    src[1, 4:] = PAD
    src[3, 2:] = PAD
    limits = [9, 2, 9, 9, 6]
    search = decoding.SearchOptions(beam_size=4, n_best=n_best, length_penalty=0.6)
    generation = decoding.Generation(decoding.Specials(pad=PAD, bos=BOS, eos=EOS), search=search)

    def hypotheses(use_cache: bool, shares: bool) -> tuple[list, list[tuple[int, int]]]:
        held: list[tuple[int, int]] = []  # each step's (rows, memory slots)
        with torch.inference_mode(), monkeypatch.context() as patched:
            if not shares:  # one memory row per row, reordered with them
                patched.setattr(KVCache, "shares_memory", False)
            session = model.decoding_session(src, max_len=max(limits), use_cache=use_cache)
            step = session.step

            def counted(tokens: np.ndarray) -> torch.Tensor:
                if session.cache is not None:
                    held.append((len(tokens), int(session.cache.cross_attention[0].keys.shape[0])))
                return step(tokens)

            session.step = counted  # type: ignore[method-assign]
            found = engine.n_best_search(session, src.shape[0], generation, max_len=limits)
        return [[(rank, tokens.tolist()) for rank, tokens in one] for one in found], held

    shared, held = hypotheses(True, True)
    per_row, held_per_row = hypotheses(True, False)
    recomputed, _ = hypotheses(False, False)
    for got in (per_row, recomputed):
        assert [[tokens for _, tokens in one] for one in got] == [[tokens for _, tokens in one] for one in shared]
        ranks = [rank for one in got for rank, _ in one]
        np.testing.assert_allclose(ranks, [rank for one in shared for rank, _ in one], rtol=1e-9)
    assert max(rows for rows, _ in held) == 20
    assert all(slots <= 5 for _, slots in held)
    assert [slots for _, slots in held][-1] < 5  # the sentences that ended let their memory go
    assert max(slots for _, slots in held_per_row) == 20  # where each row holds its own


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_generate_stops_per_sequence_at_eos_and_pads(use_cache: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    model = small_model(pad_id=PAD)
    step = decoding.DecodingSession.step  # the next-token log-probabilities at every step, cache or not

    steps_taken = []

    def row_0_ends_at_step_2(session: decoding.DecodingSession, newest: np.ndarray) -> torch.Tensor:
        log_probs = step(session, newest).whole()
        steps_taken.append(len(newest))
        log_probs[:, EOS] = -1e9
        if len(steps_taken) == 2:  # the second step
            log_probs[0, EOS] = 1e9
        return log_probs

    monkeypatch.setattr(decoding.DecodingSession, "step", row_0_ends_at_step_2)
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


# --- saving ----------------------------------------------------------------------------------------------


def test_save_and_load_model(tmp_path) -> None:
    model = small_model(norm_first=True, pad_id=PAD).float()
    save_model(model, tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_model(tmp_path / "run")
    assert loaded.config == model.config
    assert not loaded.training
    src, tgt = tokens(2, 6), tokens(2, 5, vocab=23, seed=1)
    torch.testing.assert_close(loaded(src, tgt), model(src, tgt))


# --- tied embeddings ---------------------------------------------------------------------------------------

VOCAB = 23


def tied_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(VOCAB, VOCAB, **SMALL, tie_embeddings=True).double().eval()


def test_tied_embeddings_are_one_matrix() -> None:
    model = tied_model()
    assert model.src_embed.weight is model.tgt_embed.weight
    assert model.output_proj.weight is model.src_embed.weight
    untied = Transformer(VOCAB, VOCAB, **SMALL)
    shared = VOCAB * SMALL["d_model"]
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in untied.parameters()) - 2 * shared
    assert {"src_embed.weight", "tgt_embed.weight", "output_proj.weight"} <= set(model.state_dict())  # the file format
    assert torch.equal(model.output_proj.bias, torch.zeros(VOCAB))


def test_tied_embeddings_get_the_gradients_of_all_three_uses() -> None:
    """The shared matrix's gradient is the sum of those of the source embedding, the target embedding and the
    output projection, each non-zero: an untied copy of the same weights shows them apart."""
    tied = tied_model()
    untied = Transformer(VOCAB, VOCAB, **SMALL).double().eval()
    untied.load_state_dict(tied.state_dict())
    src, tgt = tokens(2, 6, vocab=VOCAB), tokens(2, 5, vocab=VOCAB, seed=1)
    tied_loss, untied_loss = tied(src, tgt).square().mean(), untied(src, tgt).square().mean()
    torch.testing.assert_close(tied_loss, untied_loss)
    (shared,) = torch.autograd.grad(tied_loss, tied.src_embed.weight)
    uses = torch.autograd.grad(
        untied_loss, (untied.src_embed.weight, untied.tgt_embed.weight, untied.output_proj.weight)
    )
    for grad in uses:
        assert grad.abs().sum() > 0
    torch.testing.assert_close(shared, sum(uses), atol=1e-12, rtol=1e-10)


def test_tied_model_round_trips_through_weights_files_and_model_directories(tmp_path: Path) -> None:
    model = tied_model()
    with torch.no_grad():
        model.src_embed.weight.add_(torch.randn(VOCAB, SMALL["d_model"], dtype=torch.float64))
        model.output_proj.bias.normal_()
    src, tgt = tokens(2, 6, vocab=VOCAB), tokens(2, 5, vocab=VOCAB, seed=1)

    save_weights(model, tmp_path / "tied.safetensors")
    other = tied_model(seed=1)
    load_weights(other, tmp_path / "tied.safetensors")
    assert other.src_embed.weight is other.tgt_embed.weight is other.output_proj.weight  # still one matrix
    torch.testing.assert_close(other(src, tgt), model(src, tgt))

    save_model(model, tmp_path / "run")
    loaded = load_model(tmp_path / "run")
    assert loaded.config.tie_embeddings
    assert loaded.src_embed.weight is loaded.tgt_embed.weight is loaded.output_proj.weight
    torch.testing.assert_close(loaded(src.long(), tgt), model.float()(src, tgt))

    untied = Transformer(VOCAB, VOCAB, **SMALL).double().eval()  # a tied file is also an untied model's
    load_weights(untied, tmp_path / "tied.safetensors")
    torch.testing.assert_close(untied(src, tgt), other(src, tgt))


def test_a_tied_matrix_is_stored_once_and_an_older_file_with_every_copy_loads_the_same(tmp_path: Path) -> None:
    """``save_weights`` writes a tied matrix under its first name only, the others as aliases in the metadata; a
    file that stores every name (as files before aliases did), or one rewritten without the aliases, loads into the
    same model."""
    model = tied_model()
    save_weights(model, tmp_path / "tied.safetensors")
    with safetensors.safe_open(str(tmp_path / "tied.safetensors"), framework="numpy") as stored:
        names, metadata = set(stored.keys()), stored.metadata()
    assert names == set(model.state_dict()) - {"tgt_embed.weight", "output_proj.weight"}
    assert json.loads(metadata["aliases"]) == {"tgt_embed.weight": "src_embed.weight",
                                               "output_proj.weight": "src_embed.weight"}  # fmt: skip
    every = read_weights(tmp_path / "tied.safetensors")
    assert set(every) == set(model.state_dict())
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(every[name], value.numpy())
    safetensors.numpy.save_file(every, tmp_path / "every-copy.safetensors")
    # Rewritten by safetensors' own functions, which keep no metadata: the aliases' names are gone from the file.
    safetensors.numpy.save_file(
        safetensors.numpy.load_file(tmp_path / "tied.safetensors"), tmp_path / "bare.safetensors"
    )
    src, tgt = tokens(2, 6, vocab=VOCAB), tokens(2, 5, vocab=VOCAB, seed=1)
    for name in ("tied.safetensors", "every-copy.safetensors", "bare.safetensors"):
        other = tied_model(seed=3)
        load_weights(other, tmp_path / name)
        assert other.src_embed.weight is other.tgt_embed.weight is other.output_proj.weight
        torch.testing.assert_close(other(src, tgt), model(src, tgt))
    untied = Transformer(VOCAB, VOCAB, **SMALL).double().eval()
    with pytest.raises(ValueError, match=r"tensors 'src_embed.weight' and 'tgt_embed.weight' are tied but hold"):
        write_weights(
            {name: value.numpy() for name, value in untied.state_dict().items()}, tmp_path / "refused.safetensors",
            tied=[("src_embed.weight", "tgt_embed.weight")],
        )  # fmt: skip
    assert not (tmp_path / "refused.safetensors").exists()


@pytest.mark.parametrize("source", ["edited-copy", "untied-model"])
def test_a_file_whose_tied_copies_differ_is_refused_by_name(tmp_path: Path, source: str) -> None:
    path = tmp_path / "weights.safetensors"
    if source == "edited-copy":
        save_weights(tied_model(), path)
        tensors = read_weights(path)  # every name, as files store them with no aliases
        tensors["output_proj.weight"] = tensors["output_proj.weight"] + 1.0
        safetensors.numpy.save_file(tensors, path)
        match = r"tensors \['src_embed.weight', 'output_proj.weight'\] in .* differ, but the model ties them"
    else:
        save_weights(Transformer(VOCAB, VOCAB, **SMALL), path)
        match = r"tensors \['src_embed.weight', 'tgt_embed.weight', 'output_proj.weight'\] in .* differ"
    target = tied_model(seed=2)
    before = {name: value.clone() for name, value in target.state_dict().items()}
    with pytest.raises(ValueError, match=match):
        load_weights(target, path)
    for name, value in target.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed by a refused load"


# --- validate once: a call is checked where it enters --------------------------------------------------------

OUR_MODULES = (MultiHeadAttention, EncoderLayer, DecoderLayer, Encoder, Decoder, FeedForward, PositionalEncoding)


@contextmanager
def public_entries(model: nn.Module) -> Iterator[list[str]]:
    """Record every checked entry point (a public ``forward``) of ``model``'s own submodules that runs."""
    entered: list[str] = []
    handles = [
        sub.register_forward_pre_hook(lambda *_, name=name: entered.append(name))
        for name, sub in model.named_modules()
        if name and isinstance(sub, OUR_MODULES)
    ]
    try:
        yield entered
    finally:
        for handle in handles:
            handle.remove()


def count_calls(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> Counter:
    """Count the calls of ``module.name`` by its first argument (an argument name, for the checks)."""
    original: Callable = getattr(module, name)
    calls: Counter = Counter()

    def counting(*args: object, **kwargs: object) -> object:
        calls[args[0]] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def test_a_transformer_call_checks_its_inputs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    model = small_model(pad_id=PAD)
    src, tgt = tokens(3, 7), tokens(3, 6, vocab=23, seed=1)
    token_checks = count_calls(monkeypatch, checks, "check_token_ids")
    mask_checks = count_calls(monkeypatch, checks, "check_key_mask")
    with public_entries(model) as entered, TorchCalls() as calls:
        model(src, tgt, src_key_mask=src != PAD)
    assert token_checks == {"src": 1, "tgt": 1}
    assert mask_checks == {"src_key_mask": 1, "tgt_key_mask": 1}
    assert entered == []  # the layers ran through their unchecked paths
    assert calls.count(torch.aminmax, torch.Tensor.aminmax) == 2  # one range check per token tensor ...
    assert calls.count(torch.Tensor.min, torch.Tensor.max, torch.min, torch.max) == 0  # ... and no other


@pytest.mark.parametrize("method", ["encode", "decode", "decode-cached"])
def test_the_other_entry_points_check_once_too(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = small_model()
    src, tgt = tokens(2, 7), tokens(2, 4, vocab=23, seed=1)
    memory = model.encode(src)
    token_checks = count_calls(monkeypatch, checks, "check_token_ids")
    with public_entries(model) as entered:
        if method == "encode":
            model.encode(src)
        else:
            model.decode(tgt, memory, cache=model.new_cache() if method == "decode-cached" else None)
    assert token_checks == {"src" if method == "encode" else "tgt": 1}
    assert entered == []


# What makes the host wait for the device: reading a tensor's values into Python (min and max over a whole tensor:
# over one dimension they give tensors).
SYNCS = (
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__bool__,
    torch.Tensor.__index__,
    torch.Tensor.min,
    torch.Tensor.max,
    torch.min,
    torch.max,
    torch.aminmax,
    torch.Tensor.aminmax,
    torch.Tensor.nonzero,
    torch.nonzero,
)


@pytest.mark.parametrize("beam_size", [1, 3], ids=["greedy", "beam"])
def test_generate_checks_once_however_many_tokens_it_makes(beam_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks and their host synchronisations happen once per call, none per generated token (the search's
    own reading of each step's log-probabilities aside)."""
    model = small_model(pad_id=PAD)
    with torch.no_grad():
        model.output_proj.bias[EOS] = -1e9  # no sequence ends early: every call makes max_len tokens
    src = tokens(2, 7)
    token_checks = count_calls(monkeypatch, checks, "check_token_ids")
    syncs, entries = [], []
    for max_len in (2, 9):
        token_checks.clear()
        with public_entries(model) as entered, TorchCalls() as calls:
            out = model.generate(src, max_len=max_len, bos_id=BOS, eos_id=EOS, beam_size=beam_size)
        assert out.shape == (2, max_len)
        assert token_checks == {"src": 1}
        syncs.append(calls.count_whole(*SYNCS))
        entries.append(entered)
    assert syncs[0] == syncs[1], f"{syncs[1] - syncs[0]} more host synchronisations for 7 more tokens"
    assert entries == [[], []]


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_the_model_equals_its_public_parts_called_one_by_one(norm_first: bool) -> None:
    """The unchecked internal paths compute what the checked public calls of each part compute."""
    model = small_model(norm_first, pad_id=PAD)
    src, tgt = tokens(3, 7), tokens(3, 6, vocab=23, seed=1)
    src[1, 4:], tgt[2, 3:] = PAD, PAD
    src_mask, tgt_mask = src != PAD, tgt != PAD
    scale = math.sqrt(SMALL["d_model"])

    x = model.positional(model.src_embed(src) * scale)
    encoder_in = x
    for layer in model.encoder.layers:
        x = layer(x, key_mask=src_mask)
    memory = x if model.encoder.norm is None else model.encoder.norm(x)
    torch.testing.assert_close(model.encoder(encoder_in, key_mask=src_mask), memory)
    torch.testing.assert_close(model.encode(src), memory)

    y = model.positional(model.tgt_embed(tgt) * scale)
    decoder_in = y
    for layer in model.decoder.layers:
        y = layer(y, memory, tgt_key_mask=tgt_mask, memory_key_mask=src_mask)
    y = y if model.decoder.norm is None else model.decoder.norm(y)
    torch.testing.assert_close(model.decoder(decoder_in, memory, tgt_key_mask=tgt_mask, memory_key_mask=src_mask), y)
    logits = model.output_proj(y)
    torch.testing.assert_close(model(src, tgt), logits)
    torch.testing.assert_close(model.decode(tgt, memory, memory_key_mask=src_mask, tgt_key_mask=tgt_mask), logits)

    # Token by token through each layer's public call with its caches, and through the model's.
    caches = [(KVCache(), KVCache()) for _ in model.decoder.layers]
    model_cache = model.new_cache()
    for t in range(tgt.shape[1]):
        h = model.positional(model.tgt_embed(tgt[:, t : t + 1]) * scale, offset=t)
        for layer, (self_cache, cross_cache) in zip(model.decoder.layers, caches, strict=True):
            h = layer(h, memory, memory_key_mask=src_mask, self_cache=self_cache, cross_cache=cross_cache)
        h = h if model.decoder.norm is None else model.decoder.norm(h)
        step = model.decode(tgt[:, t : t + 1], memory, memory_key_mask=src_mask, cache=model_cache)
        torch.testing.assert_close(step, model.output_proj(h), atol=1e-12, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_layers_with_masks_equal_their_sublayers(norm_first: bool) -> None:
    encoder_layer = EncoderLayer(16, 4, 32, dropout=0.0, norm_first=norm_first).eval()
    decoder_layer = DecoderLayer(16, 4, 32, dropout=0.0, norm_first=norm_first).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 6, 16)
    x_mask, memory_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2]), torch.rand(2, 6) > 0.3
    memory_mask[:, 0] = True

    def residual(layer: nn.Module, h: torch.Tensor, norm: nn.LayerNorm, sublayer: Callable) -> torch.Tensor:
        return h + sublayer(norm(h)) if layer.norm_first else norm(h + sublayer(h))

    h = residual(encoder_layer, x, encoder_layer.norm1, lambda h: encoder_layer.self_attn(h, key_mask=x_mask))
    h = residual(encoder_layer, h, encoder_layer.norm2, encoder_layer.feed_forward)
    torch.testing.assert_close(encoder_layer(x, key_mask=x_mask), h)

    d = decoder_layer
    h = residual(d, x, d.norm1, lambda h: d.self_attn(h, key_mask=x_mask, causal=True))
    h = residual(d, h, d.norm2, lambda h: d.cross_attn(h, memory, key_mask=memory_mask))
    h = residual(d, h, d.norm3, d.feed_forward)
    torch.testing.assert_close(d(x, memory, tgt_key_mask=x_mask, memory_key_mask=memory_mask), h)


# --- generate over a preallocated cache ---------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_generate_equals_greedy_decoding_step_by_step(norm_first: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``generate`` (one preallocated cache of max_len positions) gives the tokens of a hand-written greedy loop
    over ``decode`` with a cache that grows."""
    model = small_model(norm_first)
    src = tokens(4, 7)
    capacities = []
    new_cache = model.new_cache
    monkeypatch.setattr(model, "new_cache", lambda capacity=None: capacities.append(capacity) or new_cache(capacity))
    out = model.generate(src, max_len=8, bos_id=BOS, eos_id=EOS)
    assert capacities == [8]

    memory, cache = model.encode(src), new_cache()
    token = torch.full((4, 1), BOS)
    finished = torch.zeros(4, dtype=torch.bool)
    expected = []
    for _ in range(8):
        logits = model.decode(token, memory, cache=cache)  # only the new token: the cache holds the rest
        token = torch.where(finished, EOS, logits[:, -1].argmax(-1))[:, None]  # padded with eos_id after EOS
        expected.append(token)
        finished |= token[:, 0] == EOS
        if finished.all():
            break
    expected = torch.cat(expected, 1)
    assert len(set((expected == EOS).int().argmax(1).tolist())) > 1  # rows end at different steps: some are padded
    assert torch.equal(out, expected)


# --- decoding steps: the forward pass with a cache, projections laid out for one-token rows ----------------------


@pytest.mark.parametrize(
    "options",
    [{}, {"norm_first": True}, {"activation": "gelu"}, {"tie_embeddings": True, "pad_id": PAD}],
    ids=["post-norm", "pre-norm", "gelu", "tied-padded"],
)
def test_decoding_steps_give_the_logits_of_full_decoding(options: dict) -> None:
    """``generate``'s steps (one token per row, projections laid out for it, the memory projected into the cache
    once) give the logits of teacher-forced calls on the whole prefix, also after beam-style reordering that repeats
    and drops rows; padded sources (``pad_id``) mask the memory as a full call does. Their top-k gives the best
    log-probabilities, the scores added."""
    torch.manual_seed(0)
    model = Transformer(23, 23, **{**SMALL, **options}).double().eval()
    src = tokens(3, 7, vocab=23)
    src[0, 4:] = PAD  # padding, read as such when pad_id is set
    with torch.inference_mode():  # as in generate
        steps = model.decoder_steps()
        memory, key_mask = steps.encode(src)
        cache = model.new_cache(capacity=8)
        session = decoding.DecodingSession(steps, memory, key_mask, cache)
        prefix, rows = torch.full((3, 1), BOS), torch.arange(3)
        for step in range(6):
            full = model(src[rows], prefix, src_key_mask=None if key_mask is None else key_mask[rows])[:, -1]
            logits = session.step(prefix[:, -1].numpy())
            np.testing.assert_allclose(logits.whole(), full.numpy(), rtol=0, atol=1e-5)  # float32 out
            scores = np.arange(3, dtype=np.float32)
            values, indices = session.top_k(logits, scores, 1, 4)
            expected = torch.log_softmax(full, dim=-1).numpy() + scores[:, None]
            np.testing.assert_allclose(values, -np.sort(-expected, axis=1)[:, :4], rtol=0, atol=1e-5)
            np.testing.assert_allclose(np.take_along_axis(expected, indices, axis=1), values, rtol=0, atol=1e-5)
            if step == 2:  # rows 2, 0, 0 go on, as beam search may keep them
                order = torch.tensor([2, 0, 0])
                session.keep(order.numpy())
                prefix, rows = prefix[order], rows[order]
            prefix = torch.cat([prefix, tokens(3, 1, vocab=23, seed=step)], 1)


@pytest.mark.parametrize(
    "options", [{}, {"num_kv_heads": 2, "value_head_dim": 5, "bias": False}], ids=["mha", "gqa-dv5-no-bias"]
)
def test_an_attention_step_equals_a_cached_call(options: dict) -> None:
    """A decoding session's step (one query per row, a cache, the session's layouts, no gradients) projects with the
    weights laid out for such rows; that equals the same cached public call, which runs the linears themselves:
    self-attention appending to its cache, cross-attention reading the projected memory with a key mask."""
    module = MultiHeadAttention(32, 4, **options).double().eval()
    x, memory = torch.randn(3, 5, 32, dtype=torch.float64), torch.randn(3, 6, 32, dtype=torch.float64)
    key_mask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3, [False] * 6])  # the last row attends nothing
    self_cache, step_cache, cross_cache, memory_cache = KVCache(8), KVCache(8), KVCache(), KVCache()
    session = Layouts()
    for t in range(5):
        token = x[:, t : t + 1]  # (B, 1, E)
        expected = module(token, cache=self_cache, causal=True)
        with torch.no_grad():
            stepped, _ = module._attend(
                token, token, token, mask=None, causal=True, cache=step_cache, self_attention=True, layouts=session
            )
        torch.testing.assert_close(stepped, expected.detach())
        expected = module(token, memory, key_mask=key_mask, cache=cross_cache)
        with torch.no_grad():
            stepped, _ = module._attend(
                token, memory, memory, mask=key_mask[:, None, None, :], cache=memory_cache, self_attention=False,
                layouts=session,
            )  # fmt: skip
        torch.testing.assert_close(stepped, expected.detach())
    assert step_cache.length == self_cache.length == 5
    assert {(module, name) for name in ("qkv", "q", "out")} <= set(session._built)  # steps took them


# --- sampling, and continuous batching --------------------------------------------------------------------------


def known_model(logits: np.ndarray) -> Transformer:
    """A model whose next-token log-probabilities are ``log_softmax(logits)`` whatever it reads: the output
    projection's weight zero, its bias ``logits``."""
    model = small_model().float()
    with torch.no_grad():
        model.output_proj.weight.zero_()
        model.output_proj.bias.copy_(torch.from_numpy(logits))
    return model


def test_sampled_first_tokens_follow_the_models_probabilities() -> None:
    """4,000 first tokens sampled by ``generate`` (top-k 5, top-p 0.8, temperature 0.7) from a model whose
    probabilities are known: each token's frequency within 5 standard deviations of the filtered distribution's
    (``filtered_distribution``, the plain statement of the filters)."""
    logits = np.random.default_rng(3).normal(size=23).astype(np.float32) * 1.5
    search = decoding.SearchOptions(sampling_topk=5, sampling_topp=0.8, sampling_temperature=0.7, seed=5)
    draws = 4000
    out = known_model(logits).generate(tokens(draws, 3), max_len=1, bos_id=BOS, eos_id=EOS, search=search)
    frequencies = np.bincount(out[:, 0].numpy(), minlength=23) / draws
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    expected = filtered_distribution(probs.astype(np.float64), 5, 0.8, 0.7)
    assert (np.abs(frequencies - expected) <= 5 * np.sqrt(expected * (1 - expected) / draws)).all()
    assert (frequencies[expected == 0] == 0).all()


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "recompute"])
def test_sampling_is_reproducible_and_top_1_is_greedy(use_cache: bool) -> None:
    model, src = small_model(), tokens(6, 7)
    args = dict(max_len=10, bos_id=BOS, eos_id=EOS, use_cache=use_cache)
    search = decoding.SearchOptions(sampling_topk=0, sampling_temperature=1.5, seed=4)
    sampled = model.generate(src, search=search, **args)
    assert torch.equal(model.generate(src, search=search, **args), sampled)
    assert not torch.equal(sampled, model.generate(src, **args))  # not greedy's: it did sample
    alone = model.generate(src[:1], search=search, **args)[0]  # key 0, as row 0's: the same draws
    assert torch.equal(alone, sampled[0, : len(alone)])
    with torch.inference_mode():
        session = model.decoding_session(src, max_len=10, use_cache=use_cache)
        greedy = decoding.SearchOptions(sampling_topk=1, seed=4)
        specials = decoding.Specials(pad=EOS, bos=BOS, eos=EOS)
        top_1 = engine.generate(session, 6, decoding.Generation(specials, search=greedy), max_len=10)
    assert torch.equal(torch.from_numpy(top_1), model.generate(src, **args))


def test_a_kept_layouts_serves_many_calls_with_the_same_tokens() -> None:
    """``generate(layouts=...)``: the caller's :class:`Layouts`, laid out on the first call and kept for the next
    (the weights fixed between them), gives the tokens a call of its own gives."""
    model, src, kept = small_model(), tokens(4, 7), Layouts()
    args = dict(max_len=12, bos_id=BOS, eos_id=EOS, beam_size=2)
    first = model.generate(src, layouts=kept, **args)
    built = dict(kept._built)
    assert built  # the steps took their layouts from it
    assert torch.equal(model.generate(src, layouts=kept, **args), first)
    assert kept._built == built  # laid out once
    assert torch.equal(model.generate(src, **args), first)


@pytest.mark.parametrize("unpadded", [True, False], ids=["real-positions", "padded"])
@pytest.mark.parametrize("form", ["plain", "onednn", "int8"])
def test_a_session_encodes_its_sources_and_projects_their_memory_through_its_layouts(
    form: str, unpadded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU a decoding session's encoding and memory projection take its layouts' forms (each encoder
    self-attention's query, key and value as one product; row-major, packed for oneDNN, or int8): the memory at the
    sources' real positions and every decoder layer's cross-attention keys and values there equal the float64 model's
    own (``model.encode``, its ``k_proj`` and ``v_proj``), padded sources among them; a batch of at most
    ``UNPADDED_POSITIONS`` positions is computed on its real positions alone (the padded ones zeros), a larger one
    padded."""
    from multihead import cpu
    from multihead.torch import layouts, quantize
    from multihead.torch import transformer as transformer_module

    monkeypatch.setattr(transformer_module, "UNPADDED_POSITIONS", 21 if unpadded else 20)  # the batch: 3 x 7

    if form != "plain" and not layouts.onednn_linear():
        pytest.skip("packed and int8 forms are oneDNN's: this PyTorch build has no oneDNN")  # x86 builds have it
    monkeypatch.setattr(cpu, "vendor", lambda: "GenuineIntel")
    monkeypatch.setattr(layouts, "PLAIN_STEP_ELEMENTS", 10**9 if form == "plain" else 0)
    reference = small_model(seed=8)
    src = tokens(3, 7, seed=9)
    src[1, 4:] = PAD
    src[2, 1:] = PAD
    key_mask = src != PAD
    with torch.no_grad():
        memory = reference.encode(src, src_key_mask=key_mask)
        expected = [
            tuple(
                proj(memory).view(3, 7, layer.cross_attn.num_kv_heads, -1).transpose(1, 2)
                for proj in (layer.cross_attn.k_proj, layer.cross_attn.v_proj)
            )
            for layer in reference.decoder.layers
        ]  # (B, Hkv, Ls, D) each
    model = small_model(seed=8).float()
    if form == "int8":
        model = quantize(model, "int8")
    asked: list[tuple[nn.Module, str]] = []
    lookup = layouts.Layouts.__getitem__
    monkeypatch.setattr(layouts.Layouts, "__getitem__", lambda self, key: asked.append(key) or lookup(self, key))
    steps = model.decoder_steps()
    with torch.inference_mode():
        found, _ = steps.encode(src, key_mask)
        projected = steps.project_memory(found)
    assert {(layer.self_attn, "qkv") for layer in model.encoder.layers} <= set(asked)
    assert {(layer.cross_attn, "k") for layer in model.decoder.layers} <= set(asked)
    tolerance = 0.05 if form == "int8" else 1e-5  # int8 against the float64 model's own values
    real = key_mask[..., None].expand_as(memory)
    torch.testing.assert_close(found.double()[real], memory[real], rtol=tolerance, atol=tolerance)
    assert bool(torch.all(found[~real] == 0)) == unpadded
    for (keys, values), (want_keys, want_values) in zip(projected, expected, strict=True):
        at = key_mask[:, None, :, None]  # (B, 1, Ls, 1): the real positions, the only ones attended
        for got, want in ((keys, want_keys), (values, want_values)):
            torch.testing.assert_close(got.double()[at.expand_as(got)], want[at.expand_as(want)], rtol=tolerance,
                                       atol=tolerance)  # fmt: skip


@pytest.mark.parametrize(
    "options", [{}, {"num_kv_heads": 2, "value_head_dim": 5, "bias": False}], ids=["mha", "gqa-dv5-no-bias"]
)
def test_a_self_attention_through_layouts_projects_query_key_and_value_as_one_product(options: dict) -> None:
    """Self-attention over laid-out weights (a session's encoder: query, key and value the same input, no cache)
    projects them with the ``qkv`` form, one product, and gives the module's own output, grouped heads and a value
    head size of its own among them."""
    module = MultiHeadAttention(32, 4, **options).eval()
    x = torch.randn(2, 6, 32)
    kept = Layouts()
    with torch.inference_mode():
        expected = module(x)
        found, _ = module._attend(x, x, x, mask=None, self_attention=True, layouts=kept)
    assert set(kept._built) == {(module, "qkv"), (module, "out")}
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-5)
