"""int8 forms stored packed (multihead.torch.packed): a model given its forms from a file computes exactly what
``quantize(model, "int8")`` makes from its weights, each packed weight on the file's own pages (``/proc/self/maps``)
on a 64-byte boundary; a file for other weights, another CPU kind, other shapes or linears is declined with the model
unchanged; a damaged one is refused in one line; the forms are made anew from the weights when weights load."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
from pathlib import Path

import pytest
import safetensors.torch
import torch
from torch import nn

from conftest import mapped_from
from multihead.config import TransformerConfig
from multihead.torch import Transformer, quantize
from multihead.torch import packed as packed_module
from multihead.torch.layouts import Int8, Quantized
from multihead.torch.packed import ALIGN, load_quantized, save_quantized, storable

pytestmark = pytest.mark.skipif(not storable(), reason="this PyTorch cannot store oneDNN's packed int8 weights")

CONFIG = TransformerConfig(
    307, 311, d_model=96, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=136, tie_embeddings=False
)


def model(seed: int = 0, config: TransformerConfig = CONFIG) -> Transformer:
    torch.manual_seed(seed)
    return Transformer.from_config(config).eval()


def forms_of(made: nn.Module) -> dict[str, dict[str, object]]:
    return {name: dict(m.forms) for name, m in made.named_modules() if isinstance(m, Quantized)}


def stored(tmp_path: Path, seed: int = 0, key: str = "weights-1") -> Path:
    path = tmp_path / "forms.safetensors"
    save_quantized(quantize(model(seed), "int8"), path, key=key)
    return path


def test_stored_forms_compute_what_quantize_makes_from_the_weights(tmp_path: Path) -> None:
    path = stored(tmp_path)
    reference = quantize(model(0), "int8")
    loaded = model(0)
    assert load_quantized(loaded, path, key="weights-1")
    mine, theirs = forms_of(loaded), forms_of(reference)
    assert mine.keys() == theirs.keys()
    assert len(mine) == 1 + 2 * 2 + 2 * 3  # the output; encoder, decoder layers
    generator = torch.Generator().manual_seed(1)
    for name, forms in mine.items():
        assert forms.keys() == theirs[name].keys()
        for form_name, form in forms.items():
            assert isinstance(form, Int8)
            assert form.pages is not None
            assert form.pages.data_ptr() % ALIGN == 0
            if os.path.exists("/proc/self/maps"):
                assert mapped_from(form.pages, path), (name, form_name)
            width = form.weight.shape[0]  # (I, O) as oneDNN keeps it
            x = torch.randn(3, 5, width, generator=generator) * 3
            torch.testing.assert_close(form(x), theirs[name][form_name](x), rtol=0, atol=0)  # type: ignore[operator]
    src, tgt = torch.randint(4, 307, (3, 11)), torch.randint(4, 311, (3, 7))
    with torch.inference_mode():
        torch.testing.assert_close(loaded(src, tgt), reference(src, tgt), rtol=0, atol=0)
        ours = loaded.generate(src, max_len=9, bos_id=1, eos_id=2, beam_size=3)
        assert torch.equal(ours, reference.generate(src, max_len=9, bos_id=1, eos_id=2, beam_size=3))
    assert "int8" in repr(loaded)


@pytest.mark.parametrize(
    "differs", ["key", "packing", "shapes", "layers", "an adapter"], ids=lambda differs: differs.replace(" ", "-")
)
def test_forms_for_other_weights_cpus_or_modules_are_declined_and_the_model_kept(
    tmp_path: Path, differs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = stored(tmp_path)
    key = "weights-2" if differs == "key" else "weights-1"
    if differs == "packing":
        monkeypatch.setattr(packed_module, "packing", lambda: "torch 0; AuthenticAMD family 26 model 2; avx2; onednn 0")
    config = {
        "shapes": dataclasses.replace(CONFIG, d_ff=144),
        "layers": dataclasses.replace(CONFIG, num_decoder_layers=3),
    }.get(differs, CONFIG)
    other = model(0, config)
    if differs == "an adapter":
        other.decoder.layers[0].feed_forward.linear1 = nn.Sequential(nn.Linear(96, 136))
    before = {name: id(m) for name, m in other.named_modules()}
    assert not load_quantized(other, path, key=key)
    assert {name: id(m) for name, m in other.named_modules()} == before  # nothing added, nothing replaced


def write_header(path: Path, change: dict[str, str], *, drop: str = "") -> None:
    """``path`` rewritten with its metadata changed as ``change`` says (the tensors as they were, but ``drop``)."""
    with safetensors.safe_open(str(path), framework="pt") as handle:
        tensors = {name: handle.get_tensor(name).clone() for name in handle.keys() if name != drop}  # noqa: SIM118
        metadata = {**(handle.metadata() or {}), **change}
    path.unlink()
    safetensors.torch.save_file(tensors, str(path), metadata)


@pytest.mark.parametrize(
    "damage",
    ["truncated", "not forms", "index changed", "descriptor too large", "tensor absent", "field absent", "not base64"],
)
def test_a_damaged_file_is_refused_in_one_line(tmp_path: Path, damage: str) -> None:
    path = stored(tmp_path)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        expected = "is not a safetensors file"
    elif damage == "not forms":
        safetensors.torch.save_file({"weight": torch.zeros(3)}, str(path), {"producer": "multihead"})
        expected = "holds no packed int8 forms"
    else:
        with safetensors.safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata()
        index = json.loads(metadata["index"])
        first = index["encoder.layers.0.self_attn"]["q"]
        if damage == "index changed":
            first["nbytes"] += 64
            write_header(path, {"index": json.dumps(index)})
            expected = "does not match its checksum"
        else:  # a checksummed index that misdescribes the tensors
            expected = "does not match its tensors"
            if damage == "descriptor too large":  # the output projection's: its dims, more bytes than these pages hold
                first["descriptor"] = index[""]["output"]["descriptor"]
                expected = "does not fit its bytes"
            elif damage == "field absent":
                del first["dims"]
            else:
                first["descriptor"] = "not base64!"
            described = json.dumps(index)
            checksum = hashlib.sha256(described.encode()).hexdigest()
            lacking = "encoder.layers.0.self_attn/q.packed" if damage == "tensor absent" else ""
            write_header(path, {"index": described, "index_sha256": checksum}, drop=lacking)
    fresh = model(0)
    with pytest.raises(ValueError, match=expected) as raised:
        load_quantized(fresh, path, key="weights-1")
    assert "\n" not in str(raised.value)
    assert not any(isinstance(m, Quantized) for m in fresh.modules())


def test_only_int8_forms_of_onednn_are_stored(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"has no int8 forms: quantize\(model, 'int8'\) first"):
        save_quantized(model(0), tmp_path / "f.safetensors")
    with pytest.raises(ValueError, match="has no int8 forms"):
        save_quantized(quantize(model(0), "bf16"), tmp_path / "f.safetensors")
    assert not (tmp_path / "f.safetensors").exists()


def test_loading_weights_makes_the_stored_forms_anew_from_them(tmp_path: Path) -> None:
    path = stored(tmp_path)
    loaded = model(0)
    assert load_quantized(loaded, path, key="weights-1")
    loaded.load_state_dict(model(5).state_dict())
    reference = quantize(model(5), "int8")
    src, tgt = torch.randint(4, 307, (2, 6)), torch.randint(4, 311, (2, 5))
    with torch.inference_mode():
        torch.testing.assert_close(loaded(src, tgt), reference(src, tgt), rtol=0, atol=0)
    assert all(getattr(form, "pages", None) is None for forms in forms_of(loaded).values() for form in forms.values())


def test_every_packed_weight_starts_on_a_cache_line_of_the_file(tmp_path: Path) -> None:
    """Read from the file's own header: whatever the names and the float32 tensors' sizes, the packed weights' data
    starts at a multiple of 64 bytes from the file's start."""
    for seed, config in [(0, CONFIG), (1, dataclasses.replace(CONFIG, d_model=40, d_ff=24, tgt_vocab=13))]:
        path = tmp_path / f"forms-{seed}.safetensors"
        save_quantized(quantize(model(seed, config), "int8"), path)
        data = path.read_bytes()
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length])
        offsets = [entry["data_offsets"][0] for name, entry in header.items() if name.endswith(".packed")]
        assert offsets
        assert all((8 + length + offset) % ALIGN == 0 for offset in offsets)


def test_mapping_a_packed_weight_again_and_again_holds_no_memory(tmp_path: Path) -> None:
    """Each load makes a oneDNN tensor per form on the file's pages: none outlives its form (10,000 of them, made and
    dropped, leave the process's resident memory within 2 MB, where keeping each would take about 16 MB)."""
    from multihead.torch.packed import _descriptor, _mkldnn_tensor

    packed = torch.ops.onednn.qlinear_prepack(torch.randint(-127, 127, (256, 96), dtype=torch.int8), None)
    pages = torch.zeros(torch.ops.mkldnn._nbytes(packed), dtype=torch.int8)
    described = _descriptor(packed)

    def resident_kib() -> int:
        return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0])

    for _ in range(1000):  # the allocator's first pools
        _mkldnn_tensor(pages, [96, 256], described)
    before = resident_kib()
    for _ in range(10_000):
        _mkldnn_tensor(pages, [96, 256], described)
    assert resident_kib() - before < 2048
