"""Weights stored as int8 rows (``save_weights(..., int8=True)``): the stored values against a NumPy float64 oracle,
loading them dequantized into either front end, and kept as stored (``keep_int8=True``) in PyTorch: the same outputs as
the dequantized model, int8 forms packed from the stored values, read-only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import torch

import multihead.io as mio
from multihead.io import int8_rows, load_weights, read_weights, save_weights, stored_weights
from multihead.torch import Transformer, quantize
from multihead.torch.stored import Int8Rows


def model(**overrides: object) -> Transformer:
    torch.manual_seed(0)
    sizes = {"src_vocab": 37, "tgt_vocab": 41, "d_model": 24, "num_heads": 4, "num_encoder_layers": 2,
             "num_decoder_layers": 2, "d_ff": 40}  # fmt: skip
    return Transformer(**{**sizes, "pad_id": 0, **overrides}).eval()  # type: ignore[arg-type]


@pytest.mark.parametrize("block", [2, mio.INT8_ROWS])
def test_int8_rows_hold_each_rows_scale_and_nearest_values(monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    monkeypatch.setattr(mio, "INT8_ROWS", block)  # rows quantized a block at a time give the same
    rng = np.random.default_rng(3)
    matrix = rng.normal(size=(7, 13)).astype(np.float32)
    matrix[1] = 0.0  # a row of zeros
    matrix[2, 5] = 1e4  # one large value: the rest of the row rounds to few levels
    matrix[3] = -np.abs(matrix[3])  # all negative: its scale from the smallest
    values, scales = int8_rows(matrix)
    assert values.dtype == np.int8
    assert scales.dtype == np.float32
    wide = matrix.astype(np.float64)
    expected_scales = np.maximum(np.abs(wide).max(axis=1) / 127, np.finfo(np.float32).tiny)
    np.testing.assert_allclose(scales, expected_scales, rtol=1e-6)
    assert np.abs(values).max(axis=1).tolist() == [127, 0, 127, 127, 127, 127, 127]
    error = np.abs(values * scales.astype(np.float64)[:, None] - wide)
    assert np.all(error <= scales[:, None] * (0.5 + 1e-5))  # the nearest level of each value


def test_an_int8_file_loads_dequantized_into_torch_and_keras(tmp_path: Path) -> None:
    from multihead.keras import Transformer as KerasTransformer

    ours = model(tie_embeddings=True, src_vocab=41)
    save_weights(ours, tmp_path / "int8.safetensors", int8=True)
    save_weights(ours, tmp_path / "float.safetensors")
    dequantized = read_weights(tmp_path / "int8.safetensors")
    with safetensors.safe_open(str(tmp_path / "int8.safetensors"), framework="numpy") as raw:
        for name in stored_weights(tmp_path / "int8.safetensors").int8:
            expected = raw.get_tensor(name).astype(np.float32) * raw.get_tensor(name + ":scales")[:, None]
            assert np.array_equal(dequantized[name], expected)
    floats = read_weights(tmp_path / "float.safetensors")
    assert dequantized.keys() == floats.keys()
    assert {name for name, value in floats.items() if value.ndim == 2} == {
        name for name in dequantized if stored_weights(tmp_path / "int8.safetensors").scales_name(name)
    }
    loaded = Transformer.from_config(ours.config, initialise=False)
    load_weights(loaded, tmp_path / "int8.safetensors")
    for name, value in loaded.state_dict().items():
        assert np.array_equal(value.numpy(), dequantized[name]), name
    keras_model = KerasTransformer.from_config(ours.config)
    load_weights(keras_model, tmp_path / "int8.safetensors")
    mio.write_weights(dequantized, tmp_path / "from-keras-expected.safetensors")
    save_weights(keras_model, tmp_path / "from-keras.safetensors")
    written = read_weights(tmp_path / "from-keras.safetensors")
    for name, value in dequantized.items():
        np.testing.assert_array_equal(written[name], value)


def kept_and_dequantized(path: Path, config: object) -> tuple[Transformer, Transformer]:
    kept = Transformer.from_config(config, initialise=False).eval()  # type: ignore[arg-type]
    load_weights(kept, path, keep_int8=True)
    dequantized = Transformer.from_config(config, initialise=False).eval()  # type: ignore[arg-type]
    load_weights(dequantized, path)
    return kept, dequantized


@pytest.mark.parametrize("tie", ["tie_embeddings", "tie_output", "none"])
def test_kept_int8_rows_compute_as_their_dequantized_values(tmp_path: Path, tie: str) -> None:
    overrides = {"tie_embeddings": {"tie_embeddings": True, "src_vocab": 41}, "tie_output": {"tie_output": True}}
    ours = model(**overrides.get(tie, {}))
    save_weights(ours, tmp_path / "int8.safetensors", int8=True)
    kept, dequantized = kept_and_dequantized(tmp_path / "int8.safetensors", ours.config)
    assert all(isinstance(module.weight, Int8Rows) for module in (kept.src_embed, kept.tgt_embed, kept.output_proj))
    assert (kept.tgt_embed.weight is kept.output_proj.weight) == (tie != "none")
    assert (kept.src_embed.weight is kept.tgt_embed.weight) == (tie == "tie_embeddings")
    assert kept.encoder.layers[0].self_attn.q_proj.weight.stored.dtype == torch.int8
    src = torch.randint(3, 37, (3, 9))
    src[0, 6:] = 0
    tgt = torch.randint(3, 41, (3, 5))
    with torch.no_grad():  # float forms and plain products, from the dequantized values made per call
        np.testing.assert_allclose(kept(src, tgt).numpy(), dequantized(src, tgt).numpy(), rtol=1e-5, atol=1e-5)
    quantize(kept, "int8")  # packed from the stored values
    quantize(dequantized, "int8")  # quantized again from the dequantized floats: the same values
    with torch.inference_mode():
        assert torch.equal(kept(src, tgt), dequantized(src, tgt))
        generated = kept.generate(src, max_len=7, bos_id=1, eos_id=2)
        assert torch.equal(generated, dequantized.generate(src, max_len=7, bos_id=1, eos_id=2))


def test_kept_int8_rows_are_read_only(tmp_path: Path) -> None:
    ours = model()
    save_weights(ours, tmp_path / "int8.safetensors", int8=True)
    kept, _ = kept_and_dequantized(tmp_path / "int8.safetensors", ours.config)
    weight = kept.decoder.layers[1].feed_forward.linear2.weight
    with pytest.raises(RuntimeError, match="stored in int8 and kept so"), torch.no_grad():
        weight.add_(1.0)
    with pytest.raises(RuntimeError, match="stored in int8 and kept so"):
        kept.double()
    with pytest.raises(RuntimeError, match=r"'src_embed\.weight' is stored in int8 and kept so"):
        load_weights(kept, tmp_path / "int8.safetensors")
    save_weights(kept, tmp_path / "saved.safetensors")  # what it stands for, in float32
    written, expected = read_weights(tmp_path / "saved.safetensors"), read_weights(tmp_path / "int8.safetensors")
    assert written.keys() == expected.keys()
    assert all(np.array_equal(written[name], expected[name]) for name in expected)


def test_keep_int8_is_refused_for_keras_and_bad_files_name_the_tensor(tmp_path: Path) -> None:
    from multihead.keras import Transformer as KerasTransformer

    ours = model()
    save_weights(ours, tmp_path / "int8.safetensors", int8=True)
    with pytest.raises(ValueError, match="`keep_int8` is for torch modules"):
        load_weights(KerasTransformer.from_config(ours.config), tmp_path / "int8.safetensors", keep_int8=True)
    with safetensors.safe_open(str(tmp_path / "int8.safetensors"), framework="numpy") as raw:
        tensors = {name: raw.get_tensor(name) for name in raw.keys()}  # noqa: SIM118
        metadata = raw.metadata()
    del tensors["output_proj.weight:scales"]
    safetensors.numpy.save_file(tensors, tmp_path / "damaged.safetensors", metadata=metadata)
    fresh = model()
    before = {name: value.clone() for name, value in fresh.state_dict().items()}
    with pytest.raises(ValueError, match=r"'output_proj\.weight' is listed as stored in int8"):
        load_weights(fresh, tmp_path / "damaged.safetensors", keep_int8=True)
    assert all(torch.equal(value, before[name]) for name, value in fresh.state_dict().items())
