"""Damaged weight files and model directories are refused by name without changing anything; saves are atomic."""

from __future__ import annotations

import json
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch

import multihead.files
import multihead.io as mio
from multihead.io import load_model, load_weights, save_model, save_weights
from multihead.torch import Transformer

SMALL = dict(d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32)


def model(**overrides: object) -> Transformer:
    torch.manual_seed(0)
    return Transformer(10, 12, **{**SMALL, **overrides}).eval()


def state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in module.state_dict().items()}


def assert_state_equal(module: torch.nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = module.state_dict()
    assert after.keys() == before.keys()
    for name, value in before.items():
        assert torch.equal(after[name], value), f"{name} changed"


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (``None`` for directories)."""
    return {
        str(path.relative_to(root)): None if path.is_dir() else path.read_bytes() for path in sorted(root.rglob("*"))
    }


def header_of(data: bytes) -> tuple[int, str]:
    size = int.from_bytes(data[:8], "little")
    return size, data[8 : 8 + size].decode("utf-8")


def with_header(data: bytes, edit: Callable[[str], str]) -> bytes:
    """``data`` with its safetensors JSON header edited (the edit must keep the header's length)."""
    size, header = header_of(data)
    edited = edit(header).encode("utf-8")
    assert len(edited) == size
    return data[:8] + edited + data[8 + size :]


def flip(data: bytes, position: int) -> bytes:
    damaged = bytearray(data)
    damaged[position] ^= 0xFF
    return bytes(damaged)


# --- load_weights: damaged and foreign files --------------------------------------------------------------


def _torch_zip(path: Path) -> None:
    torch.save(model().state_dict(), path)


def _torch_legacy_pickle(path: Path) -> None:
    torch.save(model().state_dict(), path, _use_new_zipfile_serialization=False)


def _npz(path: Path) -> None:
    with open(path, "wb") as file:
        np.savez(file, **{name: value.numpy() for name, value in model().state_dict().items()})


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


DAMAGES: dict[str, Callable[[Path], None]] = {
    "header-length-only": lambda p: p.write_bytes(p.read_bytes()[:8]),
    "header-cut": lambda p: p.write_bytes(p.read_bytes()[: 8 + header_of(p.read_bytes())[0] // 2]),
    "data-cut": lambda p: p.write_bytes(p.read_bytes()[:-10]),
    "header-length-huge": lambda p: p.write_bytes((2**40).to_bytes(8, "little") + p.read_bytes()[8:]),
    "header-length-zero": lambda p: p.write_bytes(bytes(8) + p.read_bytes()[8:]),
    "header-length-flipped": lambda p: p.write_bytes(flip(p.read_bytes(), 0)),
    "header-first-byte-flipped": lambda p: p.write_bytes(flip(p.read_bytes(), 8)),
    "header-middle-byte-flipped": lambda p: p.write_bytes(flip(p.read_bytes(), 8 + header_of(p.read_bytes())[0] // 2)),
    "header-last-byte-flipped": lambda p: p.write_bytes(flip(p.read_bytes(), 7 + header_of(p.read_bytes())[0])),
    "dtype-f16": lambda p: p.write_bytes(with_header(p.read_bytes(), lambda h: h.replace('"F32"', '"F16"', 1))),
    "dtype-i32": lambda p: p.write_bytes(with_header(p.read_bytes(), lambda h: h.replace('"F32"', '"I32"', 1))),
    "offsets-swapped": lambda p: p.write_bytes(
        with_header(p.read_bytes(), lambda h: h.replace('"data_offsets":[0,', '"data_offsets":[1,', 1))
    ),
    "torch-save-zip": _torch_zip,
    "torch-save-legacy-pickle": _torch_legacy_pickle,
    "plain-pickle": lambda p: p.write_bytes(pickle.dumps({"q_proj.weight": np.zeros((2, 2))})),
    "numpy-npz": _npz,
    "json-text": lambda p: p.write_text('{"q_proj.weight": [[0.0]]}'),
    "empty": lambda p: p.write_bytes(b""),
    "directory": _directory,
}


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_weights(model(), path)
    return path


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_weights_are_refused_and_change_nothing(weights: Path, damage: str) -> None:
    DAMAGES[damage](weights)
    target = model()
    for parameter in target.parameters():
        torch.nn.init.zeros_(parameter)
    before = state(target)
    # A directory is "no weights file", like a missing one (FileNotFoundError, as tests/test_io.py expects).
    expected = (ValueError, FileNotFoundError) if damage == "directory" else ValueError
    with pytest.raises(expected, match=re.escape(str(weights))):
        load_weights(target, weights)
    assert_state_equal(target, before)


def test_a_flipped_data_byte_loads_exactly_the_stored_bytes(weights: Path) -> None:
    """safetensors has no checksum: a flip in the data is not detectable, but must load as stored, nothing else."""
    size, _ = header_of(weights.read_bytes())
    weights.write_bytes(flip(weights.read_bytes(), 8 + size + 2))
    target = model()
    load_weights(target, weights)
    stored = safetensors.numpy.load_file(weights)
    for name, value in target.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), stored[name])


def test_loading_never_unpickles(weights: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _torch_legacy_pickle(weights)

    def unpickled(*args: object, **kwargs: object) -> None:
        raise AssertionError("load_weights unpickled a file")

    monkeypatch.setattr(pickle, "load", unpickled)
    monkeypatch.setattr(pickle, "loads", unpickled)
    monkeypatch.setattr(torch, "load", unpickled)
    with pytest.raises(ValueError, match="is not a readable safetensors weights file"):
        load_weights(model(), weights)


# --- load_model: damaged model directories ----------------------------------------------------------------


def _edit_config(directory: Path, **changes: object) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


MODEL_DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "config-binary": (lambda d: (d / "config.json").write_bytes(b"\xff\xfe\x00{"), r"config.json"),
    "config-not-json": (lambda d: (d / "config.json").write_text("{src_vocab: 10"), r"must be JSON"),
    "config-empty": (lambda d: (d / "config.json").write_text(""), r"must be JSON"),
    "config-list": (lambda d: (d / "config.json").write_text("[10, 12]"), r"must be a JSON object, received list"),
    "config-missing-field": (lambda d: (d / "config.json").write_text('{"src_vocab": 10}'), r"tgt_vocab"),
    "config-wrong-type": (lambda d: _edit_config(d, d_model="16"), r"`d_model` must be an int"),
    "config-unknown-key": (lambda d: _edit_config(d, heads=2), r"unknown Transformer config keys \['heads'\]"),
    "config-other-model": (lambda d: _edit_config(d, d_ff=48), r"the model expects"),
    "config-is-a-directory": (lambda d: ((d / "config.json").unlink(), (d / "config.json").mkdir()), r"config.json"),
    "weights-missing": (lambda d: (d / "model.safetensors").unlink(), r"model.safetensors"),
    "weights-cut": (lambda d: (d / "model.safetensors").write_bytes(b"\x10\x00"), r"model.safetensors"),
    "not-a-directory": (lambda d: (shutil.rmtree(d), d.write_text("hello")), r"config.json"),
}


@pytest.mark.parametrize("damage", list(MODEL_DAMAGES))
def test_damaged_model_directories_are_refused_by_name(tmp_path: Path, damage: str) -> None:
    directory = tmp_path / "saved"
    save_model(model(), directory)
    apply, message = MODEL_DAMAGES[damage]
    apply(directory)
    with pytest.raises((ValueError, TypeError, FileNotFoundError), match=message):
        load_model(directory)


# --- atomic writes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["fsync", "chmod", "replace"])
@pytest.mark.parametrize("error", [OSError, KeyboardInterrupt], ids=["os-error", "killed"])
def test_interrupted_save_keeps_the_previous_file_and_no_litter(
    weights: Path, monkeypatch: pytest.MonkeyPatch, stage: str, error: type[BaseException]
) -> None:
    previous = weights.read_bytes()

    def dies(*args: object, **kwargs: object) -> None:
        raise error("interrupted")

    monkeypatch.setattr(mio.os, stage, dies)
    with pytest.raises(error):
        save_weights(model(d_ff=48), weights)
    monkeypatch.undo()
    assert weights.read_bytes() == previous
    assert [p.name for p in weights.parent.iterdir()] == [weights.name]
    load_weights(model(), weights)  # still the whole previous file, in the previous shapes


def test_save_onto_a_directory_is_refused_by_name(tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    target.mkdir()
    with pytest.raises(ValueError, match=re.escape(str(target))):
        save_weights(model(), target)
    assert target.is_dir()
    assert list(target.iterdir()) == []
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


def test_save_model_onto_a_file_is_refused_by_name(tmp_path: Path) -> None:
    target = tmp_path / "saved"
    target.write_text("not a directory")
    with pytest.raises(ValueError, match=re.escape(str(target))):
        save_model(model(), target)
    assert target.read_text() == "not a directory"


@pytest.mark.parametrize("killed_at", ["model.safetensors", "config.json"])
def test_interrupted_save_model_leaves_the_previous_model_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, killed_at: str
) -> None:
    """Overwriting a saved model with one of another shape, killed at either file: the old model still loads."""
    directory = tmp_path / "saved"
    old = model()
    save_model(old, directory)
    original = mio.atomic_write

    def killed(path: Path, write: Callable[[str], None]) -> None:
        if Path(path).name == killed_at:
            raise KeyboardInterrupt
        original(path, write)

    monkeypatch.setattr(mio, "atomic_write", killed)  # the weights
    monkeypatch.setattr(multihead.files, "atomic_write", killed)  # the config (atomic_write_text)
    with pytest.raises(KeyboardInterrupt):
        save_model(model(d_ff=48), directory)
    monkeypatch.undo()
    loaded = load_model(directory)
    assert loaded.config == old.config
    assert_state_equal(loaded, state(old))
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "model.safetensors"]
