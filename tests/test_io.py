"""One weight format for both front ends: round trips, refusals that change nothing, atomic saves."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch

import multihead.files
import multihead.io as mio
from keras_helpers import numpy, tensor
from multihead.io import load_weights, save_weights
from multihead.keras import MultiHeadAttention as KerasMHA
from multihead.torch import MultiHeadAttention as TorchMHA

SIZES = {"num_kv_heads": 2, "head_dim": 5, "value_head_dim": 3}


def torch_module(**overrides) -> TorchMHA:
    torch.manual_seed(0)
    return TorchMHA(16, 4, kdim=7, vdim=6, **{**SIZES, **overrides}).eval()


def inputs() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    return (
        rng.normal(size=(2, 5, 16)).astype("float32"),
        rng.normal(size=(2, 8, 7)).astype("float32"),
        rng.normal(size=(2, 8, 6)).astype("float32"),
        rng.random((2, 8)) > 0.3,
    )


def torch_out(module: TorchMHA) -> np.ndarray:
    query, key, value, key_mask = (torch.from_numpy(x) for x in inputs())
    with torch.no_grad():
        return module(query, key, value, key_mask=key_mask, causal=True).numpy()


def keras_out(layer: KerasMHA) -> np.ndarray:
    query, key, value, key_mask = (tensor(x) for x in inputs())
    return numpy(layer(query, key, value, key_mask=key_mask, causal=True))


def state(module: TorchMHA) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in module.state_dict().items()}


def test_torch_to_keras_to_torch(tmp_path: Path) -> None:
    original = torch_module()
    save_weights(original, tmp_path / "torch.safetensors")
    layer = KerasMHA(4, num_kv_heads=2)  # unbuilt: sizes come from the file
    load_weights(layer, tmp_path / "torch.safetensors")
    np.testing.assert_allclose(keras_out(layer), torch_out(original), atol=1e-5)

    save_weights(layer, tmp_path / "keras.safetensors")
    restored = TorchMHA(16, 4, kdim=7, vdim=6, **SIZES)
    load_weights(restored, tmp_path / "keras.safetensors")
    for name, value in original.state_dict().items():
        torch.testing.assert_close(restored.state_dict()[name], value, atol=0, rtol=0)


def test_file_is_keyed_like_the_torch_state_dict(tmp_path: Path) -> None:
    layer = KerasMHA(4)
    layer.build((None, None, 16), (None, None, 8), (None, None, 8))
    save_weights(layer, tmp_path / "w.safetensors")
    tensors = safetensors.numpy.load_file(tmp_path / "w.safetensors")
    np.testing.assert_array_equal(tensors["q_proj.weight"], numpy(layer.q_proj.kernel).T)
    assert tensors["k_proj.weight"].shape == (16, 8)
    assert set(tensors) == set(torch_module().state_dict())


def test_bfloat16_module_round_trips(tmp_path: Path) -> None:
    module = torch_module().to(torch.bfloat16)
    save_weights(module, tmp_path / "w.safetensors")
    restored = torch_module(head_dim=5).to(torch.bfloat16)
    torch.nn.init.zeros_(restored.q_proj.weight)
    load_weights(restored, tmp_path / "w.safetensors")
    assert torch.equal(restored.q_proj.weight, module.q_proj.weight)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "w.safetensors"
    save_weights(torch_module(), path)
    return path


def assert_refused_unchanged(target: TorchMHA, path: Path, error: type[Exception], message: str) -> None:
    before = state(target)
    with pytest.raises(error, match=message):
        load_weights(target, path)
    for name, value in target.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_wrong_shape_names_the_tensor_and_changes_nothing(saved: Path) -> None:
    assert_refused_unchanged(
        torch_module(head_dim=6),
        saved,
        ValueError,
        r"tensor 'q_proj.weight' in .* has shape \(20, 16\), the model expects \(24, 16\)",
    )


def test_wrong_names_are_listed_and_change_nothing(saved: Path) -> None:
    assert_refused_unchanged(torch_module(bias=False), saved, ValueError, r"missing none, unexpected \['k_proj.bias'")


def test_keras_layer_refuses_wrong_shapes_unchanged(saved: Path) -> None:
    layer = KerasMHA(4, num_kv_heads=2, head_dim=6)
    layer.build((None, None, 16), (None, None, 7), (None, None, 6))
    before = [numpy(w).copy() for w in layer.weights]
    with pytest.raises(ValueError, match=r"tensor 'q_proj.weight'.*has shape \(20, 16\), the model expects \(24, 16\)"):
        load_weights(layer, saved)
    for weight, old in zip(layer.weights, before, strict=True):
        np.testing.assert_array_equal(numpy(weight), old)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "pickle", "empty"])
def test_damaged_or_foreign_files_are_refused_unchanged(saved: Path, damage: str) -> None:
    data = saved.read_bytes()
    if damage == "truncated":
        saved.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        saved.write_bytes(bytes(range(256)) * 8)
    elif damage == "pickle":
        saved.write_bytes(pickle.dumps(torch_module().state_dict()))
    else:
        saved.write_bytes(b"")
    target = torch_module()
    torch.nn.init.zeros_(target.q_proj.weight)
    assert_refused_unchanged(target, saved, ValueError, r"is not a readable safetensors weights file")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no weights file at"):
        load_weights(torch_module(), tmp_path / "absent.safetensors")


def test_interrupted_save_keeps_the_previous_file(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    previous = saved.read_bytes()

    def dies_half_way(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(mio.safetensors.numpy, "save_file", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        save_weights(torch_module(head_dim=6), saved)
    assert saved.read_bytes() == previous
    assert sorted(p.name for p in saved.parent.iterdir()) == [saved.name]


def test_save_refuses_bad_targets(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"torch.nn.Module or a keras.layers.Layer, received dict"):
        save_weights({}, tmp_path / "w.safetensors")
    with pytest.raises(ValueError, match=r"must be in an existing directory"):
        save_weights(torch_module(), tmp_path / "missing" / "w.safetensors")
    with pytest.raises(ValueError, match=r"must be built"):
        save_weights(KerasMHA(2), tmp_path / "w.safetensors")


def _transformer(d_ff: int) -> torch.nn.Module:
    from multihead.torch import Transformer

    torch.manual_seed(0)
    return Transformer(10, 12, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=d_ff)


@pytest.mark.parametrize("swap", ["atomic-exchange", "two-renames"])
def test_save_model_replaces_the_directory_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str) -> None:
    if swap == "two-renames":  # systems without renameat2(RENAME_EXCHANGE)
        monkeypatch.setattr(multihead.files, "_exchange", lambda first, second: False)
    mio.save_model(_transformer(32), tmp_path / "saved")
    mio.save_model(_transformer(48), tmp_path / "saved")
    assert mio.load_model(tmp_path / "saved").config.d_ff == 48
    assert [p.name for p in tmp_path.iterdir()] == ["saved"]  # no staging or previous directory left


def test_save_model_refuses_a_directory_holding_other_files(tmp_path: Path) -> None:
    mio.save_model(_transformer(32), tmp_path / "saved")
    (tmp_path / "saved" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"also holds \['notes.txt'\]"):
        mio.save_model(_transformer(48), tmp_path / "saved")
    assert (tmp_path / "saved" / "notes.txt").read_text() == "mine"
    assert mio.load_model(tmp_path / "saved").config.d_ff == 32


def test_integer_tensor_for_a_float_weight_is_refused_by_name(saved: Path) -> None:
    tensors = safetensors.numpy.load_file(saved)
    tensors["k_proj.bias"] = tensors["k_proj.bias"].astype(np.int32)
    safetensors.numpy.save_file(tensors, saved)
    assert_refused_unchanged(torch_module(), saved, ValueError, r"tensor 'k_proj.bias' .* is stored as int32")
