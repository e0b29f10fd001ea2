"""``multihead import SOURCE RUN``: a Hugging Face Marian checkpoint (OPUS-MT's layout) as a run that computes what
Transformers' ``MarianMTModel`` computes: the same logits, the same greedy and beam tokens, the same translations
through ``translate``; what multihead cannot compute exactly refused in one line, nothing written.

The checkpoints are made here, offline: SentencePiece models trained on the made-up German and English of
``support.py``, a vocabulary laid out as OPUS-MT's (``</s>`` 0, ``<unk>`` 1, the pieces, ``<pad>`` last), a
``MarianTokenizer`` and a tiny ``MarianMTModel`` (swish, scaled embeddings, sinusoidal positions, the decoder starting
from the pad, the pad banned from generation), trained for a few steps so that its translations end, then given a
random ``final_logits_bias``, all saved with ``save_pretrained``: one with a shared vocabulary, one with a vocabulary
a side.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch

from app.imported import Imported, train_briefly
from app.imported import generated as up_to_eos
from app.support import PAIRS, Cli, assert_refused, sentences, subprocess_env, write_lines
from multihead.app.pretrained import import_pretrained
from multihead.decoding import Generation, Specials
from multihead.io import load_weights, read_config, read_weights

pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")

EOS, UNK = 0, 1  # OPUS-MT's
SIZES = dict(d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
             encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64)  # fmt: skip
TRAINING_STEPS = 60
GENERATE = 40  # the longest generation compared (HF's max_length: the decoder start too)
KINDS = pytest.mark.parametrize("kind", ["shared", "separate"])


@dataclass
class Marian(Imported):
    """A saved Marian checkpoint (see :class:`Imported`) and its pad id."""

    pad: int


def _pieces(lines: list[str], size: int, path: Path) -> list[str]:
    """Train a BPE SentencePiece model of about ``size`` pieces on ``lines`` into ``path``: its pieces but the
    specials, in order."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=size, model_type="bpe", eos_id=EOS,
        unk_id=UNK, bos_id=-1, pad_id=-1, eos_piece="</s>", hard_vocab_limit=False, minloglevel=2,
    )  # fmt: skip
    path.write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    return [processor.id_to_piece(index) for index in range(2, processor.get_piece_size())]


def _vocabulary(pieces: list[str], pad_at: int | None = None) -> dict[str, int]:
    """OPUS-MT's layout: ``</s>``, ``<unk>``, the pieces, ``<pad>`` last (or at ``pad_at``)."""
    symbols = ["</s>", "<unk>", *dict.fromkeys(pieces)]
    symbols.insert(len(symbols) if pad_at is None else pad_at, "<pad>")
    return {symbol: index for index, symbol in enumerate(symbols)}


def make_checkpoint(directory: Path, *, shared: bool, codes: Sequence[str] = ()) -> Path:
    """A Marian checkpoint as ``save_pretrained`` writes it, into ``directory``; ``codes``: target languages' codes
    (``>>fra<<``), pieces of the (shared) vocabulary, as a multilingual OPUS-MT model's."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    spm = directory.parent / f"{directory.name}-spm"
    spm.mkdir(parents=True)
    source = _pieces([de for de, _ in PAIRS], 90, spm / "source.spm")
    target = _pieces([en for _, en in PAIRS], 70, spm / "target.spm")
    if shared:
        vocabularies = [_vocabulary([*codes, *source, *target])]
    else:
        # One pad id for both sides (multihead pads both with the config's pad_id): the target's last id, which the
        # longer source vocabulary also gives <pad>.
        target_vocabulary = _vocabulary(target)
        vocabularies = [_vocabulary(source, pad_at=len(target_vocabulary) - 1), target_vocabulary]
    for vocabulary, name in zip(vocabularies, ("vocab.json", "target_vocab.json"), strict=False):
        (spm / name).write_text(json.dumps(vocabulary), encoding="utf-8")
    pad = vocabularies[-1]["<pad>"]
    tokenizer = MarianTokenizer(
        str(spm / "source.spm"), str(spm / "target.spm"), str(spm / "vocab.json"),
        target_vocab_file=None if shared else str(spm / "target_vocab.json"), separate_vocabs=not shared,
        **({} if shared else {"source_lang": "de", "target_lang": "en"}),
    )  # fmt: skip
    config = MarianConfig(
        **SIZES, vocab_size=len(vocabularies[0]), decoder_vocab_size=len(vocabularies[-1]),
        activation_function="swish", scale_embedding=True, pad_token_id=pad, decoder_start_token_id=pad,
        eos_token_id=EOS, forced_eos_token_id=EOS, share_encoder_decoder_embeddings=shared,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MarianMTModel(config)
    model.generation_config.bad_words_ids = [[pad]]  # as OPUS-MT's generation configs ban the pad
    train_briefly(model, tokenizer, pad, TRAINING_STEPS)
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.3)  # a bias the import must carry
        model.final_logits_bias[0, EOS] = 0.0
        for code in codes:  # each code changes the translation, as a multilingual model's do, and is never written
            model.model.shared.weight[vocabularies[0][code]] = torch.randn(SIZES["d_model"]) * 2.0
            model.final_logits_bias[0, vocabularies[0][code]] = -30.0
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def marian(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Marian]:
    """Both checkpoints, loaded by Transformers, and imported (the shared one under an OPUS-MT name, which gives its
    languages; the other has them in its tokenizer's settings)."""
    from transformers import MarianMTModel, MarianTokenizer

    root = tmp_path_factory.mktemp("marian")
    made = {}
    with warnings.catch_warnings():  # MarianTokenizer recommends Moses' punctuation normalizer, which it goes without
        warnings.filterwarnings("ignore", "Recommended: pip install sacremoses", UserWarning)
        for kind, name in (("shared", "opus-mt-de-en"), ("separate", "separate")):
            directory = make_checkpoint(root / kind / name, shared=kind == "shared")
            run = root / kind / "run"
            import_pretrained(str(directory), run)
            tokenizer = MarianTokenizer.from_pretrained(directory)
            model = MarianMTModel.from_pretrained(directory).eval()
            made[kind] = Marian(directory, model, tokenizer, run, model.config.pad_token_id)
    return made


def generated(tokens: torch.Tensor, eos: int = EOS) -> list[list[int]]:
    return up_to_eos(tokens, eos)


def _edit(file: str, **changes: object) -> Callable[[Path], None]:
    def edit(directory: Path) -> None:
        values = json.loads((directory / file).read_text())
        (directory / file).write_text(json.dumps({**values, **changes}))

    return edit


def _tensors(change: Callable[[dict[str, np.ndarray]], None]) -> Callable[[Path], None]:
    def edit(directory: Path) -> None:
        tensors = safetensors.numpy.load_file(directory / "model.safetensors")
        change(tensors)
        safetensors.numpy.save_file(tensors, directory / "model.safetensors")

    return edit


def _swap_specials(directory: Path) -> None:
    vocabulary = json.loads((directory / "vocab.json").read_text())
    vocabulary["</s>"], vocabulary["<pad>"] = vocabulary["<pad>"], vocabulary["</s>"]
    (directory / "vocab.json").write_text(json.dumps(vocabulary))


RNG = np.random.default_rng(0)

# --- the model ----------------------------------------------------------------------------------------------


@KINDS
def test_logits_equal_transformers(marian: dict[str, Marian], kind: str) -> None:
    """Decoder inputs start with the pad (Marian's decoder start); sources and targets padded at their ends."""
    checkpoint = marian[kind]
    ours = checkpoint.ours()
    src, mask = checkpoint.encode(sentences(4, seed=1))
    generator = torch.Generator().manual_seed(0)
    tgt = torch.randint(2, ours.config.tgt_vocab - 1, (4, 7), generator=generator)
    tgt[:, 0] = checkpoint.pad
    with torch.no_grad():
        expected = checkpoint.model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        got = ours(src, tgt)
    assert got.shape == expected.shape
    assert float((got - expected).abs().max()) <= 1e-4


def test_an_output_layer_of_its_own_imports(marian: dict[str, Marian], tmp_path: Path) -> None:
    """Two vocabularies and ``tie_word_embeddings=False``: the output layer is not the target embedding."""
    from transformers import MarianMTModel

    directory = shutil.copytree(marian["separate"].directory, tmp_path / "separate")
    _edit("config.json", tie_word_embeddings=False)(directory)
    tensors = safetensors.numpy.load_file(directory / "model.safetensors")
    assert "lm_head.weight" not in tensors  # tied, so left out
    embedding = tensors["model.decoder.embed_tokens.weight"]
    tensors["lm_head.weight"] = embedding + RNG.normal(size=embedding.shape).astype("f4")
    safetensors.numpy.save_file(tensors, directory / "model.safetensors")
    import_pretrained(str(directory), tmp_path / "run")
    checkpoint = Marian(directory, MarianMTModel.from_pretrained(directory).eval(), marian["separate"].tokenizer,
                        tmp_path / "run", marian["separate"].pad)  # fmt: skip
    ours = checkpoint.ours()
    assert not ours.config.tie_output
    assert not ours.config.tie_embeddings
    src, mask = checkpoint.encode(sentences(3, seed=5))
    tgt = torch.full((3, 1), checkpoint.pad)
    with torch.no_grad():
        expected = checkpoint.model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        assert float((ours(src, tgt) - expected).abs().max()) <= 1e-4


@pytest.mark.keras
@KINDS
def test_keras_logits_equal_transformers(marian: dict[str, Marian], kind: str) -> None:
    from keras_helpers import numpy, tensor
    from multihead.keras import Transformer as KerasTransformer

    checkpoint = marian[kind]
    model = KerasTransformer.from_config(read_config(checkpoint.checkpoint / "config.json"))
    load_weights(model, checkpoint.checkpoint / "model.safetensors")
    src, mask = checkpoint.encode(sentences(4, seed=2))
    tgt = torch.randint(2, model.config.tgt_vocab - 1, (4, 6), generator=torch.Generator().manual_seed(1))
    tgt[:, 0] = checkpoint.pad
    with torch.no_grad():
        expected = checkpoint.model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits.numpy()
    got = numpy(model(tensor(src.numpy().astype("int32")), tensor(tgt.numpy().astype("int32"))))
    assert float(np.abs(got - expected).max()) <= 1e-4


@KINDS
def test_greedy_tokens_equal_generate(marian: dict[str, Marian], kind: str) -> None:
    checkpoint = marian[kind]
    src, mask = checkpoint.encode(sentences(50))
    expected = checkpoint.model.generate(
        input_ids=src, attention_mask=mask, num_beams=1, do_sample=False, max_length=GENERATE + 1
    )
    got = checkpoint.ours().generate(src, max_len=GENERATE, generation=checkpoint.generation())
    assert generated(got) == generated(expected[:, 1:])  # after the decoder start
    assert sum(len(row) < GENERATE for row in generated(got)) >= 40  # the limit is not what they reach
    assert len({len(row) for row in generated(got)}) >= 3  # of various lengths


LIMITED = 6  # fewer tokens than most translations take


@pytest.mark.parametrize("beams", [1, 4], ids=["greedy", "beam"])
def test_forced_eos_ends_translations_at_the_limit_as_transformers(marian: dict[str, Marian], beams: int) -> None:
    """``forced_eos_token_id`` imports as the run's ``eos_at_limit``: a translation that reaches the length limit
    takes EOS as its last token, as Transformers' ``generate`` forces it at ``max_length`` (greedy, beam search as in
    the beam test, and a stream, which ``serve`` decodes with)."""
    from multihead.torch.streaming import Stream

    checkpoint = marian["shared"]
    generation = checkpoint.generation(beam_size=beams)
    assert generation.eos_at_limit
    texts = sentences(40, seed=8)
    src, mask = checkpoint.encode(texts)
    expected = generated(checkpoint.model.generate(
        input_ids=src, attention_mask=mask, num_beams=beams, do_sample=False, max_length=LIMITED + 1,
        early_stopping="never", length_penalty=1.0, renormalize_logits=True,
    )[:, 1:])  # fmt: skip
    ours = checkpoint.ours()
    got = generated(ours.generate(src, max_len=LIMITED, generation=generation))
    assert got == expected
    assert sum(len(row) == LIMITED and row[-1] == EOS for row in got) >= 30  # most end at the limit, with EOS
    stream: Stream[int] = Stream(ours, rows=8, generation=generation)  # beam search 2 sentences at a time
    for index, ids in enumerate(checkpoint.tokenizer(texts)["input_ids"]):
        stream.add(ids, index, limit=LIMITED)
    streamed: dict[int, list[int]] = {}
    while len(stream):
        streamed.update((finished.owner, finished.tokens.tolist()) for finished in stream.step())
    assert [streamed[index] for index in range(len(texts))] == expected


@KINDS
def test_beam_tokens_equal_generate(marian: dict[str, Marian], kind: str) -> None:
    """Beam search of 4 with length penalty 1 gives Transformers' tokens with ``early_stopping="never"`` and
    ``renormalize_logits=True``.

    Both rank a hypothesis of n tokens (EOS included) by its log-probability / n ** length_penalty, take the
    finished ones among the best ``beam`` of ``2 * beam`` candidates a step, and keep ``beam`` unfinished ones. Ours
    stops a sentence when its best finished hypothesis ranks at least as high as any continuation could (bounded at
    the longest length, since the penalty is positive); with ``early_stopping="never"`` Transformers bounds a
    continuation the same way but stops only once it has ``beam`` finished hypotheses: it searches on, but can find
    none better, so the best is the same. They may differ otherwise: with Transformers' default
    ``early_stopping=False`` it bounds continuations at the current length, which a positive penalty makes too low,
    and may stop before a longer hypothesis that would rank higher; ``early_stopping=True`` stops at ``beam``
    finished hypotheses whatever their scores; and unless ``renormalize_logits`` is set, it bans the pad after the
    softmax, where we ban it before (so that the other tokens' probabilities sum to 1, as CTranslate2 does), which
    shifts every score by log(1 - p(pad)). Here every sentence ends before the limit."""
    checkpoint = marian[kind]
    src, mask = checkpoint.encode(sentences(20, seed=3))
    expected = checkpoint.model.generate(
        input_ids=src, attention_mask=mask, num_beams=4, do_sample=False, max_length=GENERATE + 1,
        early_stopping="never", length_penalty=1.0, renormalize_logits=True,
    )  # fmt: skip
    ours = checkpoint.ours()
    got = ours.generate(src, max_len=GENERATE, generation=checkpoint.generation(beam_size=4))
    assert all(row[-1] == EOS for row in generated(got))
    assert generated(got) == generated(expected[:, 1:])
    greedy = ours.generate(src, max_len=GENERATE, generation=checkpoint.generation())
    assert generated(got) != generated(greedy)  # the beams found other translations


# --- the command line -----------------------------------------------------------------------------------------


def test_import_writes_a_run_and_says_what_it_imported(
    marian: dict[str, Marian], tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    directory, run = marian["shared"].directory, tmp_path / "runs" / "de-en"  # its parent made too
    result = cli("import", directory, run)
    assert result.status == 0, result.err
    lines = result.out_lines
    assert lines[0] == f"imported {directory} into {run}"
    assert "Marian Transformer, 2 encoder and 2 decoder layers, d_model 16, 2 heads, feed-forward 32 (silu)" in lines[1]
    size = marian["shared"].model.config.vocab_size
    assert lines[2] == f"  vocabulary: {size} SentencePiece pieces, one for both sides"
    assert lines[3] == "  languages: de → en (German to English)"  # from the name, opus-mt-de-en
    assert lines[4] == "  generation: never <pad>"  # OPUS-MT's bad_words_ids
    assert lines[5] == (
        "  default search: greedy (--beam K: length penalty 1), EOS at the length limit, as Transformers' "
        "generate (translate --beam, --length-penalty, --max-length override it)"
    )  # its defaults
    assert lines[6] == f"translate with: multihead translate {run} TEXT..."
    assert (run / "latest").read_text().strip() == "step-0000000"
    checkpoint = run / "checkpoints" / "step-0000000"
    assert not (checkpoint / "optimizer.safetensors").exists()  # nothing to resume
    trainer = json.loads((checkpoint / "trainer.json").read_text())
    assert {key: trainer[key] for key in ("format", "framework", "step", "optimizer", "data", "losses", "evals")} == {
        "format": 2, "framework": "torch", "step": 0, "optimizer": {}, "data": {}, "losses": [], "evals": [],
    }  # fmt: skip
    options = trainer["options"]
    assert {key: options[key] for key in ("task", "data", "tokenizer", "langs", "imported", "search")} == {
        "task": None, "data": None, "tokenizer": "sentencepiece", "langs": ["de", "en"], "imported": str(directory),
        "search": {"beam_size": 1, "length_penalty": 1.0},
    }  # fmt: skip
    assert trainer["imported"]["source"] == str(directory)
    assert trainer["imported"]["config"] == json.loads((directory / "config.json").read_text())
    stored = read_weights(checkpoint / "model.safetensors")
    assert all(array.dtype == np.float32 for array in stored.values())
    assert sorted(stored) == sorted(read_weights(marian["shared"].checkpoint / "model.safetensors"))
    with safetensors.safe_open(str(checkpoint / "model.safetensors"), framework="numpy") as file:
        names = set(file.keys())
    assert "src_embed.weight" in names  # the shared matrix once, its other names aliases
    assert not {"tgt_embed.weight", "output_proj.weight"} & names

    result = cli("import", directory, tmp_path / "chosen", "--langs", "fr", "it")
    assert result.status == 0, result.err
    assert "  languages: fr → it (French to Italian)" in result.out_lines


def test_languages_from_the_tokenizer_settings_or_none(
    marian: dict[str, Marian], tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    separate = json.loads((marian["separate"].checkpoint / "trainer.json").read_text())
    assert separate["options"]["langs"] == ["de", "en"]  # its tokenizer_config.json's source_lang and target_lang
    unnamed = shutil.copytree(marian["shared"].directory, tmp_path / "model")  # no name, no languages recorded
    result = cli("import", unnamed, tmp_path / "run")
    assert result.status == 0, result.err
    assert "  vocabularies" not in result.out
    assert "  languages: not recorded (import again with --langs SRC TGT)" in result.out_lines
    assert "  vocabularies: source " in cli("import", marian["separate"].directory, tmp_path / "other").out


def test_a_pickled_checkpoint_imports_to_the_same_weights(
    marian: dict[str, Marian], tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """``pytorch_model.bin`` alone, holding every tied copy and the position tables (a state dict, as older
    Transformers saved them): read with ``weights_only``, the copies and tables checked."""
    checkpoint = marian["shared"]
    pickled = shutil.copytree(checkpoint.directory, tmp_path / "opus-mt-de-en")
    (pickled / "model.safetensors").unlink()
    state = checkpoint.model.state_dict()
    assert {"model.encoder.embed_positions.weight", "lm_head.weight"} <= set(state)
    torch.save(state, pickled / "pytorch_model.bin")
    result = cli("import", pickled, tmp_path / "run")
    assert result.status == 0, result.err
    got = read_weights(tmp_path / "run" / "checkpoints" / "step-0000000" / "model.safetensors")
    expected = read_weights(checkpoint.checkpoint / "model.safetensors")
    assert got.keys() == expected.keys()
    for name, array in expected.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)


REFUSALS = {
    "pre-norm": (_edit("config.json", normalize_before=True), ["config.json", "normalize_before=True"]),
    "final-norm": (_edit("config.json", add_final_layer_norm=True), ["add_final_layer_norm=True"]),
    "embedding-norm": (_edit("config.json", normalize_embedding=True), ["normalize_embedding=True"]),
    "learned-positions-config": (_edit("config.json", static_position_embeddings=False),
                                 ["static_position_embeddings=False"]),
    "activation": (_edit("config.json", activation_function="gelu_new"), ["activation_function='gelu_new'"]),
    "heads": (_edit("config.json", decoder_attention_heads=4),
              ["encoder_attention_heads=2", "decoder_attention_heads=4"]),
    "ffn": (_edit("config.json", decoder_ffn_dim=64), ["decoder_ffn_dim=64"]),
    "model-type": (_edit("config.json", model_type="bart"), ["model_type='bart'"]),
    "untied-output": (_edit("config.json", tie_word_embeddings=False), ["tie_word_embeddings=False"]),
    "banned-sequence": (_edit("generation_config.json", bad_words_ids=[[3, 4]]),
                        ["generation_config.json", "bad_words_ids=[[3, 4]]"]),
    "forced-out-of-vocabulary": (_edit("generation_config.json", forced_bos_token_id=10**4),
                                 ["generation_config.json", "`forced` must be a target token", "received 10000"]),
    "forced-and-banned": (_edit("generation_config.json", forced_bos_token_id=3, bad_words_ids=[[3]]),
                          ["generation_config.json", "`banned` holds [3], which `forced` makes every"]),
    "forced-eos-not-eos": (_edit("generation_config.json", forced_eos_token_id=3),
                           ["generation_config.json", "forced_eos_token_id=3", "the model's EOS only, 0"]),
    "no-beams": (_edit("generation_config.json", num_beams=0), ["generation_config.json", "num_beams=0"]),
    "limits-crossed": (_edit("generation_config.json", min_length=9, max_length=5),
                       ["generation_config.json", "no search", "`min_length`=8 is above `max_length`=4"]),
    "learned-positions": (
        _tensors(lambda t: t.update({"model.encoder.embed_positions.weight": RNG.normal(size=(64, 16)).astype("f4")})),
        ["model.safetensors", "'model.encoder.embed_positions.weight'", "learned positions"],
    ),
    "unknown-weight": (_tensors(lambda t: t.update({"model.encoder.layernorm_embedding.weight": np.ones(16, "f4")})),
                       ["no place for", "model.encoder.layernorm_embedding.weight"]),
    "missing-weight": (_tensors(lambda t: t.pop("model.decoder.layers.1.fc2.bias")),
                       ["lacks the weight 'model.decoder.layers.1.fc2.bias'"]),
    "tokenizer-misfit": (_swap_specials, ["vocab.json", "'</s>'", "does not fit the model"]),
}  # fmt: skip


@pytest.mark.parametrize("damage", REFUSALS.values(), ids=REFUSALS.keys())
def test_what_multihead_cannot_compute_exactly_is_refused(
    marian: dict[str, Marian], tmp_path: Path, cli: Callable[..., Cli], damage: tuple
) -> None:
    edit, fragments = damage
    source = shutil.copytree(marian["shared"].directory, tmp_path / "opus-mt-de-en")
    edit(source)
    assert_refused(cli("import", source, tmp_path / "run"), *fragments)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["opus-mt-de-en"]  # nothing written


def test_an_existing_run_is_refused(marian: dict[str, Marian], tmp_path: Path, cli: Callable[..., Cli]) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "file").write_text("mine")
    for existing in ("run", "file"):
        assert_refused(cli("import", marian["shared"].directory, tmp_path / existing), "exists", "another")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file", "run"]
    assert not any((tmp_path / "run").iterdir())
    assert (tmp_path / "file").read_text() == "mine"


def test_what_is_no_checkpoint_is_refused(tmp_path: Path, cli: Callable[..., Cli]) -> None:
    (tmp_path / "empty").mkdir()
    assert_refused(cli("import", tmp_path / "empty", tmp_path / "run"), "holds no config.json")
    assert_refused(cli("import", tmp_path / "no" / "such" / "model", tmp_path / "run"), "not a directory",
                   "Hub name such as Helsinki-NLP/opus-mt-de-en")  # fmt: skip
    assert sorted(path.name for path in tmp_path.iterdir()) == ["empty"]


def test_a_hub_name_without_network_is_one_line(tmp_path: Path) -> None:
    """The Hub cannot be reached (HF_HUB_OFFLINE fails at once, as no network would) and the cache is empty."""
    env = subprocess_env(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    result = subprocess.run(
        [sys.executable, "-m", "multihead", "import", "Helsinki-NLP/opus-mt-de-en", str(tmp_path / "run")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert_refused(
        Cli(result.returncode, result.stdout, result.stderr), "cannot download Helsinki-NLP/opus-mt-de-en",
        "hf download Helsinki-NLP/opus-mt-de-en --local-dir DIR", "multihead import DIR RUN",
    )  # fmt: skip
    assert not (tmp_path / "run").exists()


def transformers_translations(checkpoint: Marian, texts: list[str], forced: int | None = None) -> list[str]:
    """Transformers' greedy translations of ``texts``, each searched within ``translate``'s length limit for it
    (``max_length`` one more: the decoder start), ``forced`` the first token (left out of the text, as ``translate``
    leaves it)."""
    from multihead.app.translate import length_limit

    limits: dict[int, list[int]] = {}
    for index, text in enumerate(texts):
        length = len(checkpoint.tokenizer(text)["input_ids"])  # EOS included
        limits.setdefault(length_limit(length, 0, checkpoint.model.config.max_position_embeddings), []).append(index)
    expected = [""] * len(texts)
    for limit, indices in limits.items():
        src, mask = checkpoint.encode([texts[index] for index in indices])
        tokens = checkpoint.model.generate(
            input_ids=src, attention_mask=mask, num_beams=1, do_sample=False, max_length=limit + 1,
            forced_bos_token_id=forced,
        )  # fmt: skip
        if forced is not None:
            assert (tokens[:, 1] == forced).all()
            tokens = tokens[:, 2:]
        for index, text in zip(indices, checkpoint.tokenizer.batch_decode(tokens, skip_special_tokens=True),
                               strict=True):  # fmt: skip
            expected[index] = text
    return expected


def test_a_forced_first_token_imports_and_generates_as_transformers(
    marian: dict[str, Marian], tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """``forced_bos_token_id`` (a multilingual model's target language) imports as the run's forced token: greedy and
    beam search give Transformers' tokens with it (beam search as in the beam test), and ``translate`` gives its
    texts without it."""
    checkpoint = marian["shared"]
    forced = 7
    directory = shutil.copytree(checkpoint.directory, tmp_path / "opus-mt-de-en")
    _edit("generation_config.json", forced_bos_token_id=forced)(directory)
    result = cli("import", directory, tmp_path / "run")
    assert result.status == 0, result.err
    piece = checkpoint.tokenizer.convert_ids_to_tokens(forced)
    assert f"  generation: never <pad>, every translation starts with {piece}" in result.out_lines
    imported = replace(checkpoint, directory=directory, run=tmp_path / "run")
    assert imported.generation().forced == (forced,)
    texts = sentences(30, seed=6)
    src, mask = checkpoint.encode(texts)
    for beams in (1, 4):
        expected = checkpoint.model.generate(
            input_ids=src, attention_mask=mask, num_beams=beams, do_sample=False, max_length=GENERATE + 1,
            early_stopping="never", length_penalty=1.0, renormalize_logits=True,
            forced_bos_token_id=forced,
        )  # fmt: skip
        got = imported.ours().generate(src, max_len=GENERATE, generation=imported.generation(beam_size=beams))
        assert generated(got) == generated(expected[:, 1:])
        assert (got[:, 0] == forced).all()
    source = write_lines(tmp_path / "source.de", texts)
    result = cli("translate", imported.run, "--no-guard", "--input", source)
    assert result.status == 0, result.err
    assert result.out_lines == transformers_translations(checkpoint, texts, forced)
    # score counts the forced token with probability 1, as the search does: an n-best score is score's mean.
    listed = cli("translate", imported.run, "--input", source, "--beam", "2", "--n-best", "2", "--length-penalty", "1")
    assert listed.status == 0, listed.err
    rows = [line.split("\t") for line in listed.out_lines]
    write_lines(tmp_path / "src.txt", [texts[int(number) - 1] for number, _, _ in rows])
    write_lines(tmp_path / "hyp.txt", [translation for _, _, translation in rows])
    scored = cli("score", imported.run, tmp_path / "src.txt", tmp_path / "hyp.txt")
    assert scored.status == 0, scored.err
    means = [float(total) / int(count) for total, count, _ in (line.split("\t") for line in scored.out_lines)]
    np.testing.assert_allclose(means, [float(score) for _, score, _ in rows], atol=2e-4)
    for flag in ("--init", "--vocab-from"):  # training's targets start with the forced token too
        tuned = tmp_path / f"tuned{flag}"
        result = cli("train", flag, imported.run, "--data", source, source, "--out", tuned, "--steps", "2",
                     "--no-progress")  # fmt: skip
        assert result.status == 0, result.err
        encoded = np.load(tuned / "encoded" / "target.tokens.npy"), np.load(tuned / "encoded" / "target.offsets.npy")
        assert (encoded[0][encoded[1][:-1]] == forced).all()  # every target's first token
        assert Generation.from_dict(json.loads((tuned / "checkpoints" / "step-0000002" / "generation.json")
                                               .read_text())).forced == (forced,)  # fmt: skip


def test_translate_and_evaluate_give_transformers_translations(
    marian: dict[str, Marian], tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """Each sentence is searched within ``translate``'s length limit for it (Transformers' ``max_length`` one more:
    the decoder start); the text is ``MarianTokenizer``'s."""
    checkpoint = marian["separate"]
    texts = sentences(50, seed=4)
    expected = transformers_translations(checkpoint, texts)
    source = write_lines(tmp_path / "source.de", texts)
    result = cli("translate", checkpoint.run, "--no-guard", "--input", source)
    assert result.status == 0, result.err
    assert result.out_lines == expected

    reference = write_lines(tmp_path / "reference.en", expected)
    result = cli("evaluate", checkpoint.run, "--no-guard", source, reference)
    assert result.status == 0, result.err
    scores = result.json()
    assert scores["bleu"] == pytest.approx(100.0)
    assert (scores["sentences"], scores["langs"]) == (50, ["de", "en"])


def test_translate_searches_as_the_generation_config_says(
    marian: dict[str, Marian], tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """The generation config's ``num_beams``, ``length_penalty`` and ``max_length`` (which counts the decoder start)
    import as the run's default search, which ``import`` names: ``translate`` gives ``generate()``'s default
    translations (here its best hypotheses, ``--n-best 1``); ``--beam`` and ``--max-length`` choose others, as
    ``generate``'s arguments do. (Transformers' default ``early_stopping=False`` may stop a beam search before ours
    would: see the beam test. On these sentences it does not.)"""
    checkpoint = marian["shared"]
    directory = shutil.copytree(checkpoint.directory, tmp_path / "opus-mt-de-en")
    _edit("generation_config.json", num_beams=4, length_penalty=0.8, max_length=10)(directory)
    result = cli("import", directory, tmp_path / "run")
    assert result.status == 0, result.err
    assert (
        "  default search: beam 4, length penalty 0.8, at most 9 tokens, EOS at the length limit, as "
        "Transformers' generate (translate --beam, --length-penalty, --max-length override it)"
    ) in result.out_lines
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(directory).eval()
    texts = sentences(40, seed=9)
    source = write_lines(tmp_path / "source.de", texts)
    for flags, options in (((), {}), (("--beam", "2", "--max-length", "20"), {"num_beams": 2, "max_length": 21})):
        with torch.no_grad():
            tokens = model.generate(**checkpoint.tokenizer(texts, return_tensors="pt", padding=True), **options)
        expected = checkpoint.tokenizer.batch_decode(tokens, skip_special_tokens=True)
        result = cli("translate", tmp_path / "run", "--input", source, "--n-best", "1", *flags)
        assert result.status == 0, result.err
        assert [line.split("\t")[2] for line in result.out_lines] == expected, flags
        if not flags:  # the default search's limit ends many translations, not all
            assert 10 <= sum(len(row) == 9 for row in generated(tokens[:, 1:])) <= 30


def test_a_recorded_search_multihead_cannot_run_is_damage(
    marian: dict[str, Marian], tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    run = shutil.copytree(marian["shared"].run, tmp_path / "run")
    trainer = run / "checkpoints" / "step-0000000" / "trainer.json"
    values = json.loads(trainer.read_text())
    trainer.write_text(json.dumps({**values, "options": {**values["options"], "search": {"beam_size": 0}}}))
    assert_refused(cli("translate", run, "Hund"), "trainer.json", "is damaged: its search is none multihead can run",
                   "`beam_size` must be")  # fmt: skip


def test_a_config_that_pads_otherwise_than_its_tokenizers_is_refused(
    marian: dict[str, Marian], tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    run = shutil.copytree(marian["shared"].run, tmp_path / "run")
    config = run / "checkpoints" / "step-0000000" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "pad_id": 3}))
    assert_refused(cli("translate", run, "der Hund"), "pad_id=3", f"pad with {marian['shared'].pad}")


# --- export, fine-tuning ------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses:UserWarning")
def test_export_translates_as_ctranslate2s_own_converter(marian: dict[str, Marian], tmp_path: Path) -> None:
    """The exported model gives CTranslate2 the greedy tokens that CTranslate2's own Transformers converter gives on
    the checkpoint, and the export's README translates as it says. (The shared vocabulary only: CTranslate2's Marian
    converter registers one vocabulary for both sides.) CTranslate2's converter drops the pad from the vocabulary and
    starts the decoder from a zero vector, where Transformers (and multihead) start from the pad's embedding: the same
    for OPUS-MT's checkpoints, whose pad embedding is zero (Marian has no pad; the conversion appended a zero row), so
    the checkpoint's pad embedding is made zero here (the tests' training gave it values through the tied output
    layer). The export keeps the pad, starts from it and gives it an output bias that bans it."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from multihead.app.export import export
    from multihead.app.pretrained import import_pretrained

    checkpoint = marian["shared"]
    directory = tmp_path / "opus-mt-de-en"
    shutil.copytree(checkpoint.directory, directory)
    _tensors(lambda tensors: tensors["model.shared.weight"].__setitem__(checkpoint.pad, 0.0))(directory)
    import_pretrained(str(directory), tmp_path / "run")
    theirs = tmp_path / "theirs"
    ctranslate2.converters.TransformersConverter(str(directory)).convert(str(theirs))
    ours = export(tmp_path / "run", tmp_path / "ours", checkpoint=None, quantization=None)
    texts = sentences(50, seed=5)
    batch = [checkpoint.tokenizer.convert_ids_to_tokens(ids) for ids in checkpoint.tokenizer(texts)["input_ids"]]
    results = {}
    for name, converted in (("ours", ours), ("theirs", theirs)):
        translator = ctranslate2.Translator(str(converted), device="cpu")
        found = translator.translate_batch(batch, beam_size=1, max_decoding_length=GENERATE)
        results[name] = [result.hypotheses[0] for result in found]
    assert results["ours"] == results["theirs"]
    assert len({len(tokens) for tokens in results["ours"]}) >= 3
    readme = (ours / "README.md").read_text(encoding="utf-8")
    assert "`translate_batch` translates each input as it is given: give it sentences." in readme
    assert "which CTranslate2 does not: there its translation stops without one." in readme  # forced_eos_token_id
    code = readme.split("```python\n")[1].split("```")[0]
    done = subprocess.run([sys.executable, "-c", code], cwd=ours, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    tokenizer = checkpoint.tokenizer
    pieces = tokenizer.convert_ids_to_tokens(tokenizer("Zwei Hunde spielen im Schnee.")["input_ids"])
    (result,) = ctranslate2.Translator(str(ours), device="cpu").translate_batch([pieces])
    assert done.stdout.strip() == tokenizer.convert_tokens_to_string(result.hypotheses[0])


@pytest.fixture(scope="module")
def tuning_corpus(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """German to English pairs the checkpoints never saw: the training pairs' translations in reverse word order."""
    root = tmp_path_factory.mktemp("tuning")
    pairs = [(de, " ".join(reversed(en.rstrip(".").split())) + ".") for de, en in PAIRS[::3]]
    return [str(write_lines(root / "tune.de", [de for de, _ in pairs])),
            str(write_lines(root / "tune.en", [en for _, en in pairs]))]  # fmt: skip


TUNING = ["--steps", "20", "--eval-every", "10", "--checkpoint-every", "10", "--batch-tokens", "300", "--lr", "3e-3",
          "--warmup", "4", "--no-progress"]  # fmt: skip


@pytest.mark.parametrize("framework", ["torch", pytest.param("keras", marks=pytest.mark.keras)])
def test_an_imported_model_fine_tunes_and_resumes(
    framework: str, marian: dict[str, Marian], tuning_corpus: list[str], tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """``train --init`` of an imported run starts from its weights (the first evaluation, before any step, is the
    imported model's), keeps its model and vocabulary files, lowers the validation loss, and resumes."""
    from multihead.app.runs import open_checkpoint, read_log

    checkpoint = marian["separate"]
    out = tmp_path / "tuned"
    data = ["--data", *tuning_corpus, "--valid", *tuning_corpus]
    result = cli("train", "--init", checkpoint.run, *data, "--out", out, "--framework", framework, *TUNING)
    assert result.status == 0, result.err
    evaluations = [entry for entry in read_log(out) if entry["event"] == "evaluation"]
    assert [entry["step"] for entry in evaluations][:3] == [0, 10, 20]
    assert evaluations[-1]["valid_loss"] < evaluations[0]["valid_loss"] - 0.2, evaluations
    start = read_weights(checkpoint.checkpoint / "model.safetensors")
    first = read_weights(out / "checkpoints" / "step-0000000" / "model.safetensors")
    assert all(np.array_equal(start[name], first[name]) for name in start)
    latest, _ = open_checkpoint(out, "latest", lambda found: None)
    assert latest.config == read_config(checkpoint.checkpoint / "config.json")
    assert (latest.options["tokenizer"], latest.options["vocab_size"]) == ("sentencepiece", None)
    for name in ("tokenizer.json", "source.spm", "target.spm", "vocab.source.json", "vocab.target.json"):
        assert (latest.path / name).read_bytes() == (checkpoint.checkpoint / name).read_bytes(), name
    resumed = cli("train", "--resume", "--out", out, *data, "--steps", "24", "--no-progress")
    assert resumed.status == 0, resumed.err
    assert open_checkpoint(out, "latest", lambda found: None)[0].step == 24
    assert cli("translate", out, "der Hund läuft").status == 0


def test_an_imported_run_is_not_resumed_but_fine_tuned(
    marian: dict[str, Marian], tuning_corpus: list[str], tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(marian["shared"].run, run)
    result = cli("train", "--resume", "--out", run, "--data", *tuning_corpus, "--steps", "5")
    assert_refused(result, "is a model multihead import made", f"multihead train --init {run}")
    assert sorted(path.name for path in run.iterdir()) == sorted(path.name for path in marian["shared"].run.iterdir())


def test_fine_tuning_an_imported_model_refuses_a_conflicting_option(
    marian: dict[str, Marian], tuning_corpus: list[str], tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    for flags, fragment in ((["--d-model", "32"], "--d-model 16"), (["--vocab-size", "8000"], "no --vocab-size"),
                            (["--tokenizer", "subword"], "--tokenizer sentencepiece")):  # fmt: skip
        result = cli("train", "--init", marian["shared"].run, "--data", *tuning_corpus, "--out", tmp_path / "x",
                     "--steps", "1", *flags)  # fmt: skip
        assert_refused(result, f"{' '.join(flags)} conflicts with --init", fragment)
    assert not (tmp_path / "x").exists()


def test_a_new_model_learns_with_an_imported_vocabulary(
    marian: dict[str, Marian], tuning_corpus: list[str], tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """``--vocab-from`` an imported run: a new model pads with the vocabulary's pad, starts its decoder from it (that
    first position kept by the target mask), never generates it and ends with EOS at the length limit, as the
    imported model does."""
    from multihead.app.runs import open_checkpoint

    checkpoint = marian["shared"]
    out = tmp_path / "new"
    result = cli("train", "--vocab-from", checkpoint.run, "--data", *tuning_corpus, "--out", out, "--steps", "4",
                 "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "32", "--no-progress")  # fmt: skip
    assert result.status == 0, result.err
    latest, _ = open_checkpoint(out, "latest", lambda found: None)
    pad = checkpoint.pad
    assert latest.config.pad_id == pad
    assert latest.generation == Generation(Specials(pad=pad, bos=pad, eos=EOS, unk=UNK), banned=(pad,),
                                           eos_at_limit=True)  # fmt: skip
    assert (latest.options["tokenizer"], latest.options["vocab_size"]) == ("sentencepiece", None)
    assert (latest.path / "vocab.json").read_bytes() == (checkpoint.checkpoint / "vocab.json").read_bytes()
    assert cli("translate", out, "der Hund läuft").status == 0


MARIAN_CODES = [">>cmn_Hans<<", ">>cmn_Hant<<", ">>fra<<", ">>deu<<"]


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory: pytest.TempPathFactory) -> Marian:
    """A multilingual OPUS-MT-style checkpoint, whose sources open with their target's code, named as
    ``opus-mt-de-zh`` is (its languages: de, zh), imported."""
    from transformers import MarianMTModel, MarianTokenizer

    root = tmp_path_factory.mktemp("multilingual")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Recommended: pip install sacremoses", UserWarning)
        directory = make_checkpoint(root / "opus-mt-de-zh", shared=True, codes=MARIAN_CODES)
        tokenizer = MarianTokenizer.from_pretrained(directory)
    import_pretrained(str(directory), root / "run")
    model = MarianMTModel.from_pretrained(directory).eval()
    return Marian(directory, model, tokenizer, root / "run", model.config.pad_token_id)


@pytest.mark.parametrize(
    ("flags", "code"),
    [((), ">>cmn_Hans<<"), (("--target-lang", "zh-Hant"), ">>cmn_Hant<<"), (("--target-lang", "fr"), ">>fra<<"),
     (("--source-lang", "de", "--target-lang", "deu"), ">>deu<<")],
    ids=["run's", "zh-Hant", "fr", "deu"],
)  # fmt: skip
def test_a_multilingual_marian_target_opens_the_source_as_its_users_write_it(
    multilingual: Marian, tmp_path: Path, cli: Callable[..., Cli], flags: tuple[str, ...], code: str
) -> None:
    """The run's target (``zh``: Simplified Chinese), or ``--target-lang``'s, as the code ``MarianTokenizer``'s users
    write before each source; a text that opens with a code of its own keeps it."""
    texts = sentences(50, seed=11)
    expected = transformers_translations(multilingual, [f"{code} {text}" for text in texts])
    source = write_lines(tmp_path / "source.de", texts)
    result = cli("translate", multilingual.run, "--no-guard", "--input", source, *flags)
    assert result.status == 0, result.err
    assert result.out_lines == expected
    own = cli("translate", multilingual.run, "--no-guard", f">>fra<< {texts[0]}", *flags)
    assert own.out_lines == transformers_translations(multilingual, [f">>fra<< {texts[0]}"])


def test_imports_of_one_multilingual_model_for_other_pairs_ensemble(
    multilingual: Marian, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """Their models read and write the same tokens whatever pair each run chose (``--langs``): they ensemble,
    translating the first run's pair (one model twice translates as the model alone)."""
    other = tmp_path / "de-fr"
    import_pretrained(str(multilingual.directory), other, langs=["de", "fr"])
    source = write_lines(tmp_path / "source.de", sentences(20, seed=11))
    alone, ensemble = (
        cli("translate", *runs, "--input", source) for runs in ([multilingual.run], [multilingual.run, other])
    )
    assert ensemble.status == 0, ensemble.err
    assert ensemble.out_lines == alone.out_lines


def test_a_multilingual_marian_import_says_its_languages(
    multilingual: Marian, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    result = cli("import", multilingual.directory, tmp_path / "run")
    assert result.status == 0, result.err
    assert "  4 target languages: translate --target-lang CODE; every source starts with >>cmn_Hans<<" \
        in result.out_lines  # fmt: skip
    assert_refused(cli("translate", multilingual.run, "Hund", "--source-lang", "fr"), "--source-lang fr",
                   "this model reads de (its sources carry no language token)")  # fmt: skip
    assert_refused(cli("translate", multilingual.run, "Hund", "--target-lang", "ja"), "--target-lang ja",
                   "no language 'ja'", "it has 4, such as cmn_Hans, cmn_Hant, fra, deu")  # fmt: skip
    unnamed = shutil.copytree(multilingual.directory, tmp_path / "unnamed")
    result = cli("import", unnamed, tmp_path / "unnamed-run")
    assert result.status == 0, result.err
    assert "give translate --target-lang CODE, or open each source with >>CODE<<" in result.err
    assert "no source starts with a language code" in result.out


def test_serve_answers_each_target_of_a_multilingual_marian(multilingual: Marian) -> None:
    """The run's source into each of the model's targets (the codes clients know: ``cmn_Hant`` is ``zh-Hant``), as
    ``translate --target-lang`` translates."""
    from app.served import request, serving
    from multihead.app.serve import Limits, Service, create_app
    from multihead.app.translate import Translator

    translator = Translator(multilingual.run, guard=False)
    texts = sentences(6, seed=13)
    with serving(create_app(Service(translator, translator.langs or []), Limits())) as url:
        status, languages = request(url, "/languages")
        assert (status, languages[0]) == (200, {"code": "de", "name": "German", "targets": ["zh", "zh-Hant", "fr"],
                                                "model_codes": {"run": "deu"}})  # >>deu<<, a target  # fmt: skip
        for target in ("zh", "zh-Hant", "fr"):
            expected = translator.for_languages(None, target).translate(texts)
            assert request(url, "/translate", {"q": texts, "source": "de", "target": target}) == (
                200, {"translatedText": expected}
            )  # fmt: skip
        assert request(url, "/translate", {"q": "Hund", "source": "fr", "target": "zh"}) == (
            400, {"error": "Chinese (zh) is not available as a target language from French (fr)"}
        )  # fmt: skip


def test_a_multilingual_marian_export_translates_as_ctranslate2s_own_converter(
    multilingual: Marian, tmp_path: Path
) -> None:
    """Sources opened with a target's code: our export's tokens are those of CTranslate2's converter (the pad's
    embedding made zero, as in the export test above), and its README opens the source with the run's code."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from multihead.app.export import export

    directory = shutil.copytree(multilingual.directory, tmp_path / "opus-mt-de-zh")
    _tensors(lambda tensors: tensors["model.shared.weight"].__setitem__(multilingual.pad, 0.0))(directory)
    import_pretrained(str(directory), tmp_path / "run")
    theirs = tmp_path / "theirs"
    ctranslate2.converters.TransformersConverter(str(directory)).convert(str(theirs))
    ours = export(tmp_path / "run", tmp_path / "ours", checkpoint=None, quantization=None)
    tokenizer = multilingual.tokenizer
    for code in (">>cmn_Hans<<", ">>fra<<"):
        texts = [f"{code} {text}" for text in sentences(30, seed=15)]
        batch = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(texts)["input_ids"]]
        found = [
            [result.hypotheses[0] for result in ctranslate2.Translator(str(converted)).translate_batch(
                batch, beam_size=1, max_decoding_length=GENERATE)]
            for converted in (ours, theirs)
        ]  # fmt: skip
        assert found[0] == found[1]
    assert "['>>cmn_Hans<<'] + source.encode(" in (ours / "README.md").read_text(encoding="utf-8")
