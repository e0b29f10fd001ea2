"""``multihead export``: a run as a CTranslate2 model that translates as ``multihead translate`` does (greedy,
float32), the README's lines that run as they stand, quantized exports, int8 runs of our own, and what is refused
before anything is written."""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import ctranslate2
import pytest
import safetensors
import tokenizers

from app.support import SAMPLES, Cli, CorpusRun, assert_refused, snapshot
from multihead.app.runs import latest_checkpoint, read_checkpoint
from multihead.app.translate import Translator
from multihead.decoding import SearchOptions
from multihead.io import read_weights, stored_weights, write_weights
from multihead.schema import tied
from multihead.torch.stored import Int8Rows


def ct2_translate(model: Path, texts: list[str], compute_type: str = "default", **options: object) -> list[str]:
    """``texts`` translated by CTranslate2 from an exported subword run, as its README says."""
    translator = ctranslate2.Translator(str(model), device="cpu", compute_type=compute_type)
    source = tokenizers.Tokenizer.from_file(str(model / "subwords.json"))
    results = translator.translate_batch([source.encode(text).tokens for text in texts], **options)
    return [source.decode([source.token_to_id(piece) for piece in result.hypotheses[0]]) for result in results]


def test_an_exported_run_translates_as_multihead_does(corpus_run: CorpusRun, tmp_path: Path, cli: Callable) -> None:
    result = cli("export", corpus_run.path, tmp_path / "ct2")
    assert result.status == 0, result.err
    assert {"model.bin", "config.json", "subwords.json", "README.md"} <= {p.name for p in (tmp_path / "ct2").iterdir()}
    assert ct2_translate(tmp_path / "ct2", SAMPLES, beam_size=1) == corpus_run.translations
    assert [p.name for p in tmp_path.iterdir()] == ["ct2"]  # no staging directory left


def test_the_readme_inside_translates(corpus_run: CorpusRun, tmp_path: Path, cli: Callable) -> None:
    assert cli("export", corpus_run.path, tmp_path / "ct2").status == 0
    (code,) = re.findall(r"```python\n(.*?)```", (tmp_path / "ct2" / "README.md").read_text(), flags=re.S)
    printed = io.StringIO()
    before = Path.cwd()
    os.chdir(tmp_path / "ct2")
    try:
        with contextlib.redirect_stdout(printed):
            exec(code, {})  # the README's own lines
    finally:
        os.chdir(before)
    expected = Translator(corpus_run.path, guard=False).translate(
        ["Zwei Hunde spielen im Schnee."], search=SearchOptions(beam_size=2, length_penalty=1.0)
    )
    assert printed.getvalue().splitlines() == expected


def test_the_readme_says_glossaries_need_multiheads_own_decoding(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable
) -> None:
    """CTranslate2's ``translate_batch`` takes no option for terms a translation must hold (its options read from
    the signature it documents), and the README of an export says so."""
    (signature,) = [line for line in ctranslate2.Translator.translate_batch.__doc__.splitlines() if "(" in line][:1]
    options = re.findall(r"(\w+):", signature)
    assert {"source", "target_prefix", "beam_size", "suppress_sequences"} <= set(options)
    assert not [name for name in options if re.search("constrain|glossar|terminolog|lexic", name)]
    assert cli("export", corpus_run.path, tmp_path / "ct2").status == 0
    readme = " ".join((tmp_path / "ct2" / "README.md").read_text().split())
    assert "Glossaries (`multihead translate --glossary FILE`) need multihead's own decoding" in readme
    assert "CTranslate2 has no lexically constrained decoding" in readme


def test_a_character_task_run_exports_too(task_run: Path, tmp_path: Path, cli: Callable) -> None:
    assert cli("export", task_run, tmp_path / "ct2", "--checkpoint", "latest").status == 0
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    texts = ["abc", "hello"]
    results = translator.translate_batch([list(text) for text in texts], beam_size=1)
    ours = Translator(task_run, "latest").translate(texts)
    for theirs, mine in zip(["".join(result.hypotheses[0]) for result in results], ours, strict=True):
        assert theirs.startswith(mine)  # a four-step model seldom ends: `multihead translate` stops at its limit


@pytest.mark.parametrize("quantization", ["int8", "int8_float32", "float16", "bfloat16"])
def test_quantized_exports_translate(corpus_run: CorpusRun, tmp_path: Path, cli: Callable, quantization: str) -> None:
    """Stored in 16 bits and computed in float32 on the CPU, the translations stay; int8 runs (this test model of
    16 dimensions is too small for int8 to keep its translations: the Multi30k figures are in docs/translation.md)."""
    result = cli("export", corpus_run.path, tmp_path / "ct2", "--quantization", quantization)
    assert result.status == 0, result.err
    assert f"weights stored as {quantization}" in (tmp_path / "ct2" / "README.md").read_text()
    translations = ct2_translate(tmp_path / "ct2", SAMPLES, beam_size=1)
    assert len(translations) == len(SAMPLES)
    assert all(translations)
    if not quantization.startswith("int8"):
        assert translations == corpus_run.translations


def test_bad_exports_are_refused_before_anything_is_written(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_refused(cli("export", corpus_run.path, tmp_path / "a", "--format", "onnx"), "--format", "'onnx'")
    assert_refused(cli("export", corpus_run.path, tmp_path / "a", "--quantization", "int4"), "--quantization")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep me")
    assert_refused(cli("export", corpus_run.path, tmp_path / "taken"), "exists", "choose another OUT")
    assert_refused(cli("export", tmp_path / "nothing", tmp_path / "a"), "nothing")
    real_import = builtins.__import__

    def without_ctranslate2(name: str, *args: object, **kwargs: object) -> object:
        if name == "ctranslate2" or name.startswith("ctranslate2."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_ctranslate2)
    assert_refused(cli("export", corpus_run.path, tmp_path / "a"), "needs the ctranslate2 package",
                   "pip install 'multihead[export]'")  # fmt: skip
    assert snapshot(tmp_path) == {"taken": None, "taken/mine.txt": b"keep me"}


@pytest.mark.parametrize("beam_size", [1, 2], ids=["greedy", "beam"])
def test_min_length_is_ctranslate2s_min_decoding_length(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable, beam_size: int
) -> None:
    """``translate --min-length N`` translates as CTranslate2's ``min_decoding_length=N`` on the exported model,
    where it binds (the translations grow)."""
    assert cli("export", corpus_run.path, tmp_path / "ct2").status == 0
    result = cli("translate", corpus_run.path, "--no-guard", *SAMPLES, "--min-length", "12", "--beam", beam_size,
                 "--length-penalty", "1")  # fmt: skip
    assert result.status == 0, result.err
    expected = ct2_translate(tmp_path / "ct2", SAMPLES, beam_size=beam_size, min_decoding_length=12)
    assert result.out_lines == expected
    if beam_size == 1:
        assert all(len(held) > len(free) for held, free in zip(expected, corpus_run.translations, strict=True))


@pytest.mark.parametrize("beam_size", [1, 2], ids=["greedy", "beam"])
def test_forced_and_banned_tokens_export_to_ctranslate2(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable, beam_size: int
) -> None:
    """A run whose generation forces a first token and bans another (the first one it translates with) exports a
    model that CTranslate2 never lets choose the banned one, and a README that gives the forced one as
    ``target_prefix``: with it, CTranslate2's translations are ``multihead translate``'s (beam search without a length
    penalty: CTranslate2 scores the prefix with the model's probability, multihead's search gives a forced token
    probability 1, which a length penalty ranks differently)."""
    run = shutil.copytree(corpus_run.path, tmp_path / "run")
    target = Translator(run, guard=False).target
    tokens = target.encode(" ".join(corpus_run.translations))[0]
    banned = tokens[0]
    forced = next(token for token in tokens if token != banned)
    stored = latest_checkpoint(run) / "generation.json"
    stored.write_text(json.dumps({**json.loads(stored.read_text()), "banned": [banned], "forced": [forced]}))
    assert cli("export", run, tmp_path / "ct2").status == 0
    (piece,) = target.pieces([forced])
    assert f"target_prefix=[['{piece}']]" in (tmp_path / "ct2" / "README.md").read_text()
    result = cli("translate", run, "--no-guard", *SAMPLES, "--beam", beam_size, "--length-penalty", "0")
    assert result.status == 0, result.err
    assert result.out_lines != corpus_run.translations  # the ban binds
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    source = tokenizers.Tokenizer.from_file(str(tmp_path / "ct2" / "subwords.json"))
    found = translator.translate_batch([source.encode(text).tokens for text in SAMPLES], beam_size=beam_size,
                                       length_penalty=0.0, target_prefix=[[piece]] * len(SAMPLES))  # fmt: skip
    hypotheses = [[source.token_to_id(piece) for piece in result.hypotheses[0]] for result in found]
    assert all(ids[0] == forced and banned not in ids for ids in hypotheses)
    assert [source.decode(ids[1:]) for ids in hypotheses] == result.out_lines


def test_fairseq_positions_from_a_later_position_export(corpus_run: CorpusRun, tmp_path: Path, cli: Callable) -> None:
    """A model whose sinusoid table is fairseq's, counted from position 2 (M2M100's and NLLB's): the exported model
    translates as ``multihead translate`` does (the same weights read with that table give other translations)."""
    run = shutil.copytree(corpus_run.path, tmp_path / "run")
    config = latest_checkpoint(run) / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "positions": "fairseq", "first_position": 2}))
    assert cli("export", run, tmp_path / "ct2").status == 0
    result = cli("translate", run, "--no-guard", *SAMPLES)
    assert result.status == 0, result.err
    assert result.out_lines != corpus_run.translations  # another table
    assert ct2_translate(tmp_path / "ct2", SAMPLES, beam_size=1) == result.out_lines


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="Linux's /proc, where no directory can be made")
def test_an_unwritable_place_is_named_as_given(task_run: Path, cli: Callable) -> None:
    """Not the hidden staging directory beside it, which the user never named."""
    for command, place in (("export", "/proc/exported"), ("average", "--out /proc/averaged")):
        result = cli(command, task_run, *place.split(), *(["--last", "2"] if command == "average" else []))
        assert result.status == 2
        assert f"cannot write '{place.split()[-1]}'" in result.err
        assert ".tmp" not in result.err


def test_an_int8_run_translates_as_its_dequantized_weights_do(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """``--format multihead --quantization int8`` writes a run of the checkpoint alone, its matrices as int8 rows with
    a float32 scale each; it translates (in int8, on the CPU, its weights kept as
    stored) as a float32 run of the values those rows stand for translates with ``--quantize int8``."""
    result = cli("export", corpus_run.path, tmp_path / "int8", "--format", "multihead", "--quantization", "int8")
    assert result.status == 0, result.err
    assert "wrote an int8 run" in result.out
    source = latest_checkpoint(corpus_run.path)
    checkpoint = latest_checkpoint(tmp_path / "int8")
    assert source is not None
    assert checkpoint is not None
    assert checkpoint.name == source.name
    assert "optimizer.safetensors" not in {path.name for path in checkpoint.iterdir()}
    trainer = json.loads((checkpoint / "trainer.json").read_text())
    assert trainer["exported"] == {"run": str(corpus_run.path.resolve()), "checkpoint": source.name,
                                   "quantization": "int8"}  # fmt: skip
    floats = read_weights(source / "model.safetensors")
    stored = stored_weights(checkpoint / "model.safetensors")
    assert stored.int8 == {stored.stored_name(name) for name, value in floats.items() if value.ndim == 2}
    with safetensors.safe_open(str(checkpoint / "model.safetensors"), framework="numpy") as raw:
        assert {raw.get_slice(name).get_dtype() for name in stored.int8} == {"I8"}
        assert {raw.get_slice(name + ":scales").get_dtype() for name in stored.int8} == {"F32"}

    dequantized = tmp_path / "dequantized"
    shutil.copytree(tmp_path / "int8", dequantized)
    config = read_checkpoint(checkpoint).config
    write_weights(read_weights(checkpoint / "model.safetensors"), dequantized / "checkpoints" / checkpoint.name /
                  "model.safetensors", tied=tied(config))  # fmt: skip
    assert not stored_weights(dequantized / "checkpoints" / checkpoint.name / "model.safetensors").int8
    ours = cli("translate", tmp_path / "int8", "--no-guard", *SAMPLES, "--beam", 2)
    theirs = cli("translate", dequantized, "--no-guard", *SAMPLES, "--beam", 2, "--quantize", "int8")
    assert ours.status == theirs.status == 0, ours.err + theirs.err
    assert ours.out_lines == theirs.out_lines
    assert len(ours.out_lines) == len(SAMPLES)
    assert_refused(cli("train", "--out", tmp_path / "int8", "--resume"), "is an int8 run exported from",
                   "no training to resume", "multihead train --init")  # fmt: skip
    model = Translator(tmp_path / "int8").loaded.model
    assert isinstance(model.src_embed.weight, Int8Rows)  # kept as stored: no float32 copy of any matrix
    assert all(isinstance(getattr(model, name).weight, Int8Rows) for name in ("tgt_embed", "output_proj"))


def test_int8_runs_are_refused_without_int8(corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    assert_refused(cli("export", corpus_run.path, tmp_path / "a", "--format", "multihead"), "--quantization int8",
                   "received none")  # fmt: skip
    assert_refused(cli("export", corpus_run.path, tmp_path / "a", "--format", "multihead", "--quantization",
                       "float16"), "--quantization int8", "received float16")  # fmt: skip
    assert list(tmp_path.iterdir()) == []
