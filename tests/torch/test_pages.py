"""Weights on the weights file's pages (multihead.torch.pages): a loaded model maps its file instead of copying it,
computes what a copied-in model computes, never writes the file, and hands back the pages of weights its inference
forms copied, but never a page that was written. Checked against the process's own page tables
(``/proc/self/maps``, ``/proc/self/pagemap``)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import mapped_from
from multihead.config import TransformerConfig
from multihead.io import load_model, read_weights, save_model
from multihead.torch import Layouts, Transformer, quantize

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="Linux's page tables only")

CONFIG = TransformerConfig(
    4000, 4000, d_model=512, num_heads=4, num_encoder_layers=1, num_decoder_layers=2, d_ff=1024, tie_embeddings=True
)


def saved(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    save_model(Transformer.from_config(CONFIG), tmp_path / "model")
    return tmp_path / "model"


def resident_pages(tensor: torch.Tensor) -> int:
    """How many of the whole pages inside ``tensor``'s bytes are in this process's memory."""
    size = mmap.PAGESIZE
    first, end = -(-tensor.data_ptr() // size), (tensor.data_ptr() + tensor.nbytes) // size
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(8 * first)
        entries = np.frombuffer(pagemap.read(8 * (end - first)), dtype=np.uint64)
    return int(((entries >> np.uint64(63)) & np.uint64(1)).sum())


def copied_in(path: Path) -> Transformer:
    """The same model with its weights copied in (``load_state_dict``), the reference."""
    model = Transformer.from_config(CONFIG).eval()
    weights = read_weights(path / "model.safetensors")
    model.load_state_dict({name: torch.from_numpy(value) for name, value in weights.items()})
    return model


def test_a_loaded_model_maps_its_file_and_computes_what_a_copied_in_one_does(tmp_path: Path) -> None:
    path = saved(tmp_path)
    model = load_model(path)
    weights = path / "model.safetensors"
    for name, tensor in model.state_dict().items():
        assert mapped_from(tensor, weights), f"{name} was copied"
    assert model.src_embed.weight is model.tgt_embed.weight is model.output_proj.weight
    src, tgt = torch.randint(1, 4000, (3, 9)), torch.randint(1, 4000, (3, 7))
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), copied_in(path)(src, tgt), rtol=0, atol=0)


def test_training_a_mapped_model_changes_its_weights_never_the_file(tmp_path: Path) -> None:
    path = saved(tmp_path)
    before = (path / "model.safetensors").read_bytes()
    model = load_model(path).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    first = model.encoder.layers[0].self_attn.q_proj.weight.detach().clone()
    model(torch.randint(1, 4000, (2, 5)), torch.randint(1, 4000, (2, 4))).square().mean().backward()
    optimizer.step()
    assert not torch.equal(model.encoder.layers[0].self_attn.q_proj.weight, first)
    assert (path / "model.safetensors").read_bytes() == before
    again = load_model(path)
    torch.testing.assert_close(again.encoder.layers[0].self_attn.q_proj.weight, first, rtol=0, atol=0)


@pytest.mark.parametrize("made_by", ["quantize", "layouts"])
def test_weights_an_inference_form_copied_leave_memory_and_read_back_the_same(tmp_path: Path, made_by: str) -> None:
    path = saved(tmp_path)
    model, reference = load_model(path), copied_in(path)
    weight = model.decoder.layers[1].feed_forward.linear1.weight  # 1024 × 512 float32: 512 pages
    assert weight.sum().item() == pytest.approx(reference.decoder.layers[1].feed_forward.linear1.weight.sum().item())
    assert resident_pages(weight) >= 500  # just read
    with torch.no_grad():
        if made_by == "quantize":
            quantize(model, "int8")
        else:
            layouts = Layouts()
            layouts[model.decoder.layers[1].feed_forward, "linear1"]
    # Reading the file's next weights maps a few of its pages again (the kernel maps the page cache's pages around a
    # page read, 16 by default): at the edges only.
    assert resident_pages(weight) <= 32
    torch.testing.assert_close(weight, reference.decoder.layers[1].feed_forward.linear1.weight, rtol=0, atol=0)
    if made_by == "quantize":
        src, tgt = torch.randint(1, 4000, (3, 9)), torch.randint(1, 4000, (3, 7))
        with torch.no_grad():
            torch.testing.assert_close(model(src, tgt), quantize(reference, "int8")(src, tgt), rtol=0, atol=0)


@pytest.mark.parametrize("how", ["in place", "through .data", "a page only"])
def test_a_weight_written_since_it_was_mapped_keeps_what_was_written(tmp_path: Path, how: str) -> None:
    """A write the tensor's version counter sees, one it does not, and one touching a single page: laying out
    after it hands back none of the weight's pages, so the written values stay."""
    path = saved(tmp_path)
    model = load_model(path)
    weight = model.decoder.layers[0].self_attn.q_proj.weight  # 512 × 512 float32: 256 pages
    with torch.no_grad():
        if how == "in place":
            weight.add_(1.0)
        elif how == "through .data":
            weight.data.add_(1.0)
        else:
            weight.view(-1)[mmap.PAGESIZE // 4 * 5] += 1.0  # the first float of the sixth page
    written = weight.detach().clone()
    with torch.no_grad():
        quantize(model, "int8")
    torch.testing.assert_close(weight, written, rtol=0, atol=0)


def test_a_model_made_uninitialised_loads_to_the_same_outputs(tmp_path: Path) -> None:
    from multihead.io import load_weights

    path = saved(tmp_path)
    model = Transformer.from_config(CONFIG, initialise=False).eval()
    load_weights(model, path / "model.safetensors")
    src, tgt = torch.randint(1, 4000, (2, 5)), torch.randint(1, 4000, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), copied_in(path)(src, tgt), rtol=0, atol=0)


def test_skipping_initialisation_holds_for_this_thread_and_this_block_only() -> None:
    """Inside the block, ``torch.nn.init``'s functions leave this thread's tensors as they are; a module another
    thread makes meanwhile is initialised as usual (the same values as the same seed gives outside); after it, the
    functions are torch's own."""
    import threading

    from torch import nn

    from multihead.torch.transformer import _uninitialised

    originals = {name: getattr(nn.init, name) for name in ("normal_", "kaiming_uniform_", "zeros_", "ones_")}
    torch.manual_seed(5)
    expected = nn.Linear(64, 32).weight.detach().clone()
    inside, built = threading.Event(), {}

    def other() -> None:
        assert inside.wait(30)
        torch.manual_seed(5)
        built["weight"] = nn.Linear(64, 32).weight.detach().clone()

    thread = threading.Thread(target=other)
    thread.start()
    with _uninitialised():
        zeros = torch.zeros(3)
        assert nn.init.normal_(zeros) is zeros
        assert not zeros.any()  # left as it was
        inside.set()
        thread.join(30)
    torch.testing.assert_close(built["weight"], expected, rtol=0, atol=0)
    assert {name: getattr(nn.init, name) for name in originals} == originals
    assert nn.init.normal_(zeros).any()


def test_quantizing_a_mapped_weight_never_holds_all_its_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """int8 quantizes a weight a block of rows at a time, handing back each block's pages once quantized: while the
    output projection (4000 × 512 float32, 2000 pages) is quantized 500 rows at a time, no more than one block's pages
    (250) and the edges the kernel maps around a read are resident; the forms compute what a model quantized whole
    does."""
    from multihead.torch import layouts

    path = saved(tmp_path)
    model, reference = load_model(path), copied_in(path)
    weight = model.output_proj.weight
    layouts.release(weight)  # whatever loading read of it handed back: each block is read while it is quantized
    assert resident_pages(weight) <= 32
    seen, released = [], layouts.release

    def releasing(tensor: torch.Tensor, part: torch.Tensor | None = None) -> None:
        released(tensor, part)
        if tensor is weight and part is not None:
            seen.append(resident_pages(weight))

    monkeypatch.setattr(layouts, "QUANTIZED_ROWS", 500)
    monkeypatch.setattr(layouts, "release", releasing)
    with torch.no_grad():
        quantize(model, "int8")
    assert len(seen) == 8
    assert max(seen) <= 250 + 32  # at most a block's pages at a time (the kernel may map the next block's ahead)
    src, tgt = torch.randint(1, 4000, (3, 9)), torch.randint(1, 4000, (3, 7))
    monkeypatch.setattr(layouts, "QUANTIZED_ROWS", 1 << 20)
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), quantize(reference, "int8")(src, tgt), rtol=0, atol=0)
