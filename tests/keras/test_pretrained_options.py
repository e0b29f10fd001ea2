"""The options for models trained elsewhere (Marian / OPUS-MT), Keras front end, against the PyTorch one: SiLU, the
``[sin | cos]`` position layout, embeddings unscaled, the output tied to the target embedding, a decoder that starts
from the pad, banned tokens.

Runs under every Keras backend. Notation: B batch, Ls/Lt source/target length, V target vocabulary.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import keras
import numpy as np
import pytest
import safetensors.numpy
import torch

from keras_helpers import BACKEND, numpy, tensor
from multihead import keras as mk
from multihead import torch as mt
from multihead.decoding import Generation, SearchOptions, Specials
from multihead.io import load_weights, read_weights, save_weights
from multihead.keras.generation import COMPILED_BACKENDS
from multihead.keras.transformer import TiedProjection
from multihead.positional import sinusoidal_positions

pytestmark = pytest.mark.keras

PAD, EOS = 4, 1  # the decoder starts from the pad, as Marian's does
BANNED = (PAD, 9)  # Marian bans its pad from generation
SRC_VOCAB, TGT_VOCAB = 19, 23
SIZES = dict(d_model=12, num_heads=3, num_encoder_layers=2, num_decoder_layers=2, d_ff=20, max_len=37)
MARIAN = dict(activation="silu", positions="halves", pad_id=PAD)
GENERATION = Generation(Specials(pad=PAD, bos=PAD, eos=EOS), banned=BANNED)  # Marian's: from the pad, never to it
# The two ties, each with the embeddings scaled and not: tie_embeddings needs one vocabulary for both sides.
VARIANTS = pytest.mark.parametrize(
    ("tie", "scale_embeddings"),
    [("tie_output", False), ("tie_output", True), ("tie_embeddings", False), ("tie_embeddings", True)],
    ids=["tie-output-unscaled", "tie-output-scaled", "tie-all-unscaled", "tie-all-scaled"],
)
RNG = np.random.default_rng(0)


def options(tie: str, scale_embeddings: bool) -> dict:
    return {**SIZES, **MARIAN, tie: True, "scale_embeddings": scale_embeddings}


def vocabularies(tie: str) -> tuple[int, int]:
    return (TGT_VOCAB, TGT_VOCAB) if tie == "tie_embeddings" else (SRC_VOCAB, TGT_VOCAB)


def pair(tmp_path: Path, tie: str, scale_embeddings: bool, bias: float = 0.0) -> tuple[mt.Transformer, mk.Transformer]:
    """A torch model and a Keras model holding the same weights (through one safetensors file); ``bias`` is added to
    the banned tokens' output bias, which makes them the most likely."""
    torch.manual_seed(0)
    torch_model = mt.Transformer(*vocabularies(tie), **options(tie, scale_embeddings)).eval()
    with torch.no_grad():
        torch_model.output_proj.bias[list(BANNED)] += bias
    keras_model = mk.Transformer(*vocabularies(tie), **options(tie, scale_embeddings))
    save_weights(torch_model, tmp_path / "w.safetensors")
    load_weights(keras_model, tmp_path / "w.safetensors")
    return torch_model, keras_model


def sources(batch: int, length: int, vocab: int) -> np.ndarray:
    """Source tokens with the last rows' ends padded (their lengths differ)."""
    src = RNG.integers(PAD + 1, vocab, size=(batch, length)).astype("int32")
    for row in range(1, batch):
        src[row, length - row :] = PAD
    return src


def targets(batch: int, length: int) -> np.ndarray:
    """Decoder inputs that start with the pad, one of them padded at its end too."""
    tgt = RNG.integers(PAD + 1, TGT_VOCAB, size=(batch, length)).astype("int32")
    tgt[:, 0] = PAD
    tgt[-1, length - 2 :] = PAD
    return tgt


def torch_logits(model: mt.Transformer, src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(src).long(), torch.from_numpy(tgt).long()).numpy()


def emitted(tokens: np.ndarray, limits: list[int]) -> list[int]:
    """Every token generated before each row's first EOS and within its limit (the pad fills the rows after)."""
    rows = [row[:limit] for row, limit in zip(tokens.tolist(), limits, strict=True)]
    return [int(t) for row in rows for t in (row[: row.index(EOS)] if EOS in row else row)]


@VARIANTS
def test_same_logits_as_torch_through_one_weights_file_both_ways(
    tmp_path: Path, tie: str, scale_embeddings: bool
) -> None:
    """A file written by the torch model loads into the Keras one and gives its logits, and the Keras model's file
    gives them back to another torch model, for targets that start with the pad, which the default target key mask
    keeps (the same logits as with that mask given)."""
    torch_model, keras_model = pair(tmp_path, tie, scale_embeddings)
    src, tgt = sources(3, 7, vocabularies(tie)[0]), targets(3, 6)
    expected = torch_logits(torch_model, src, tgt)
    got = numpy(keras_model(tensor(src), tensor(tgt)))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    memory = keras_model.encode(tensor(src))
    decoded = keras_model.decode(tensor(tgt), memory, memory_key_mask=tensor(src != PAD))
    np.testing.assert_allclose(numpy(decoded), got, rtol=0, atol=1e-6)
    kept = (tgt != PAD) | (np.arange(6) == 0)
    given = numpy(keras_model(tensor(src), tensor(tgt), tgt_key_mask=tensor(kept)))
    np.testing.assert_allclose(given, got, rtol=0, atol=1e-6)

    save_weights(keras_model, tmp_path / "keras.safetensors")
    stored = read_weights(tmp_path / "keras.safetensors")
    np.testing.assert_array_equal(stored["output_proj.weight"], stored["tgt_embed.weight"])
    assert np.array_equal(stored["src_embed.weight"], stored["tgt_embed.weight"]) == (tie == "tie_embeddings")
    torch.manual_seed(1)
    other = mt.Transformer(*vocabularies(tie), **options(tie, scale_embeddings)).eval()
    load_weights(other, tmp_path / "keras.safetensors")
    np.testing.assert_allclose(torch_logits(other, src, tgt), expected, rtol=0, atol=1e-6)


def test_a_file_whose_tied_tensors_differ_is_refused(tmp_path: Path) -> None:
    _, keras_model = pair(tmp_path, "tie_output", False)
    tensors = read_weights(tmp_path / "w.safetensors")
    tensors["output_proj.weight"] = tensors["output_proj.weight"] + 1
    safetensors.numpy.save_file(tensors, tmp_path / "untied.safetensors")
    with pytest.raises(ValueError, match=r"ties them into one weight \(tie_embeddings or tie_output\)"):
        load_weights(keras_model, tmp_path / "untied.safetensors")


@pytest.mark.parametrize(
    ("tie", "scale_embeddings"),
    [("tie_output", False), ("tie_embeddings", True)],
    ids=["tie-output-unscaled", "tie-all-scaled"],
)
def test_generation_as_torch_never_chooses_a_banned_token(tmp_path: Path, tie: str, scale_embeddings: bool) -> None:
    """Greedy and beam search start from the pad and give PyTorch's tokens (compiled where the backend compiles),
    though the banned tokens' bias makes them the most likely: a model that bans none chooses them."""
    torch_model, keras_model = pair(tmp_path, tie, scale_embeddings, bias=50.0)
    src = sources(3, 7, vocabularies(tie)[0])
    for beam_size in (1, 3):
        generation = replace(GENERATION, search=SearchOptions(beam_size=beam_size))
        expected = torch_model.generate(torch.from_numpy(src).long(), max_len=8, generation=generation).numpy()
        got = keras_model.generate(tensor(src), max_len=8, generation=generation)
        np.testing.assert_array_equal(got, expected)
        assert not set(emitted(got, [8] * 3)) & set(BANNED)
        assert len(emitted(got, [8] * 3)) > 3  # not a search that ended at once
    unbanned = torch_model.generate(torch.from_numpy(src).long(), max_len=8, bos_id=PAD, eos_id=EOS)  # bans none
    assert set(unbanned[:, 0].tolist()) <= set(BANNED)


@pytest.mark.skipif(BACKEND not in COMPILED_BACKENDS, reason=f"generation on the {BACKEND} backend is eager only")
@pytest.mark.parametrize(
    ("beam_size", "use_cache", "on_host"),
    [(1, False, False), (3, True, True)],
    ids=["greedy-recompute-chosen-in-program", "beam-cache"],
)
def test_compiled_generation_gives_the_eager_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, beam_size: int, use_cache: bool, on_host: bool
) -> None:
    """The compiled steps (XLA) ban the tokens as the eager ones do, with the cache and without, the greedy token
    chosen inside the program (as on an accelerator) or on the host, rows stopping at different limits."""
    from multihead.keras import generation

    monkeypatch.setattr(generation, "chooses_on_host", lambda: on_host)
    _, model = pair(tmp_path, "tie_output", False, bias=50.0)
    src = sources(3, 7, SRC_VOCAB)
    limits = [9, 4, 9]
    generation = replace(GENERATION, search=SearchOptions(beam_size=beam_size))
    args = dict(max_len=limits, generation=generation, use_cache=use_cache)
    eager = model.generate(tensor(src), compiled=False, **args)
    assert not set(emitted(eager, limits)) & set(BANNED)
    np.testing.assert_array_equal(model.generate(tensor(src), compiled=True, **args), eager)


def test_halves_table_is_the_sines_then_the_cosines() -> None:
    """The ``"halves"`` table against a plain float64 construction: sines in the first ceil(E/2) columns, cosines in
    the rest, of frequencies 1 / 10000^(2i / E); and the Keras layer adds it."""
    for max_len, d_model in ((37, 12), (9, 7)):
        plain = np.zeros((max_len, d_model))
        sines = (d_model + 1) // 2
        for pos in range(max_len):
            for i in range(sines):
                plain[pos, i] = math.sin(pos / 10000 ** (2 * i / d_model))
            for i in range(d_model // 2):
                plain[pos, sines + i] = math.cos(pos / 10000 ** (2 * i / d_model))
        table = sinusoidal_positions(max_len, d_model, "halves")
        assert table.dtype == np.float64
        np.testing.assert_allclose(table, plain, rtol=0, atol=1e-12)
        layer = mk.PositionalEncoding(d_model, max_len, layout="halves")
        added = layer(tensor(np.zeros((2, 5, d_model), "float32")), offset=3)
        np.testing.assert_allclose(numpy(added), np.broadcast_to(plain[3:8], (2, 5, d_model)), rtol=0, atol=1e-6)


def test_silu_feed_forward() -> None:
    layer = mk.FeedForward(12, 20, activation="silu")
    x = RNG.normal(size=(2, 3, 12)).astype("float32")
    out = numpy(layer(tensor(x)))
    kernel1, bias1, kernel2, bias2 = (numpy(w) for w in layer.weights)
    hidden = x @ kernel1 + bias1
    np.testing.assert_allclose(out, (hidden / (1 + np.exp(-hidden))) @ kernel2 + bias2, rtol=0, atol=1e-5)


def test_configs_and_keras_files_round_trip(tmp_path: Path) -> None:
    """The new fields survive ``get_config`` through JSON and a ``.keras`` file, which gives the same logits and
    generations."""
    for layer in (
        mk.PositionalEncoding(12, max_len=37, dropout=0.1, layout="halves"),
        mk.PositionalEncoding(12, max_len=37, layout="fairseq", start=2),
        mk.FeedForward(12, 20, activation="silu"),
    ):
        assert type(layer).from_config(layer.get_config()).get_config() == layer.get_config()
    _, model = pair(tmp_path, "tie_output", False, bias=50.0)
    config = json.loads(json.dumps(model.get_config()))
    rebuilt = mk.Transformer.from_config(config)
    assert rebuilt.config == model.config
    assert rebuilt.get_config() == model.get_config()
    assert rebuilt.positional.layout == "halves"
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.config == model.config
    assert isinstance(loaded.output_proj, TiedProjection)
    assert loaded.output_proj.embedding is loaded.tgt_embed
    assert loaded.tgt_embed is not loaded.src_embed
    src, tgt = sources(2, 6, SRC_VOCAB), targets(2, 5)
    np.testing.assert_array_equal(numpy(loaded(tensor(src), tensor(tgt))), numpy(model(tensor(src), tensor(tgt))))
    args = dict(max_len=6, generation=GENERATION, compiled=False)
    np.testing.assert_array_equal(loaded.generate(tensor(src), **args), model.generate(tensor(src), **args))


def test_options_validate() -> None:
    with pytest.raises(ValueError, match=r"`tie_output` ties the target side only"):
        mk.Transformer(TGT_VOCAB, TGT_VOCAB, **SIZES, tie_output=True, tie_embeddings=True)
    with pytest.raises(ValueError, match=r"`positions` must be one of \('interleaved', 'halves', 'fairseq'\)"):
        mk.Transformer(SRC_VOCAB, TGT_VOCAB, **SIZES, positions="sincos")
    with pytest.raises(ValueError, match=r"`layout` must be one of"):
        mk.PositionalEncoding(12, layout="sincos")
    older = {**mk.Transformer(SRC_VOCAB, TGT_VOCAB, **SIZES).get_config(), "banned_ids": [3], "decoder_start_id": 4}
    with pytest.raises(ValueError, match=r"architecture only, received .*multihead\.decoding\.Generation"):
        mk.Transformer.from_config(older)  # a config an older version wrote, generation settings in it
