"""``multihead import`` of an M2M100 checkpoint (the architecture of M2M100 and NLLB-200): pre-norm layers with a
LayerNorm after each stack, fairseq's sinusoids counted from the pad id + 1, one vocabulary of ``vocab.json``'s pieces,
then a ``__xx__`` code of each of its 100 languages, then 8 made-up words; the source text starts with its language's
code and ends with EOS, the translation starts with the target's (``forced_bos_token_id``). Against Transformers'
``M2M100ForConditionalGeneration`` and ``M2M100Tokenizer`` on a tiny checkpoint made here, offline: a SentencePiece
model trained on the made-up German and English of ``support.py``, a random model trained for a few steps so that its
translations end, saved with ``save_pretrained``.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from app.imported import Imported, imported, train_briefly
from app.imported import generated as up_to_eos
from app.support import PAIRS, Cli, assert_refused, sentences, write_lines
from multihead.io import read_config

pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")

PAD, EOS = 1, 2  # fairseq's dictionary: <s> 0, <pad> 1, </s> 2, <unk> 3
GENERATE = 40


class M2M100(Imported):
    """A saved M2M100 checkpoint (see :class:`Imported`)."""

    def generate(self, texts: list[str], **options: object) -> torch.Tensor:
        """Transformers' tokens into English, the decoder start first."""
        src, mask = self.encode(texts)
        return self.model.generate(  # type: ignore[attr-defined]
            input_ids=src, attention_mask=mask, do_sample=False, forced_bos_token_id=self.tokenizer.get_lang_id("en"),
            **options,
        )  # fmt: skip


def make_checkpoint(directory: Path) -> Path:
    from transformers import M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer

    spm = directory.parent / f"{directory.name}-spm"
    spm.mkdir(parents=True)
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([text for pair in PAIRS for text in pair]), model_writer=model, vocab_size=120,
        model_type="bpe", bos_id=0, pad_id=PAD, eos_id=EOS, unk_id=3, hard_vocab_limit=False, minloglevel=2,
    )  # fmt: skip
    (spm / "sentencepiece.bpe.model").write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    vocabulary = {"<s>": 0, "<pad>": PAD, "</s>": EOS, "<unk>": 3}
    for index in range(4, processor.get_piece_size()):
        vocabulary[processor.id_to_piece(index)] = len(vocabulary)
    (spm / "vocab.json").write_text(json.dumps(vocabulary), encoding="utf-8")
    tokenizer = M2M100Tokenizer(str(spm / "vocab.json"), str(spm / "sentencepiece.bpe.model"), src_lang="de",
                                tgt_lang="en")  # fmt: skip
    config = M2M100Config(
        vocab_size=len(vocabulary) + 100 + 8, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=64, dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(config)
    train_briefly(model, tokenizer, PAD)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def m2m100(tmp_path_factory: pytest.TempPathFactory) -> M2M100:
    from transformers import M2M100ForConditionalGeneration, M2M100Tokenizer

    return imported(tmp_path_factory.mktemp("m2m100"), "m2m100_tiny", make_checkpoint, M2M100,
                    M2M100ForConditionalGeneration,
                    lambda found: M2M100Tokenizer.from_pretrained(found, src_lang="de", tgt_lang="en"))  # fmt: skip


def generated(tokens: torch.Tensor) -> list[list[int]]:
    return up_to_eos(tokens, EOS)


def test_the_run_is_m2m100s_architecture_and_languages(m2m100: M2M100) -> None:
    config = read_config(m2m100.checkpoint / "config.json")
    assert (config.norm_first, config.positions, config.first_position, config.tie_embeddings) == (
        True, "fairseq", PAD + 1, True,
    )  # fmt: skip
    generation = m2m100.generation()
    assert generation.forced == (m2m100.tokenizer.get_lang_id("en"),)
    assert (generation.specials.pad, generation.specials.bos, generation.specials.eos) == (PAD, EOS, EOS)
    from multihead.app.tokenizers import load_tokenizers

    source, _ = load_tokenizers(m2m100.checkpoint)
    for text in sentences(20, seed=7):  # M2M100Tokenizer's ids: the language's code first, EOS last
        assert source.encode(text)[0] == m2m100.tokenizer(text)["input_ids"], text


def test_logits_equal_transformers(m2m100: M2M100) -> None:
    """Sources padded at their ends; decoder inputs start from the decoder start (EOS), then the target's code."""
    code = m2m100.tokenizer.get_lang_id("en")
    assert m2m100.logits_error(sentences(4, seed=1), (EOS, code), seed=0, length=7, keras=False) <= 1e-4


@pytest.mark.keras
def test_keras_logits_equal_transformers(m2m100: M2M100) -> None:
    code = m2m100.tokenizer.get_lang_id("en")
    assert m2m100.logits_error(sentences(4, seed=2), (EOS, code), seed=1, length=6, keras=True) <= 1e-4


@pytest.mark.parametrize("beams", [1, 4], ids=["greedy", "beam"])
def test_tokens_equal_generate_into_the_forced_language(m2m100: M2M100, beams: int) -> None:
    """Greedy, and beam search as test_import compares it (``early_stopping="never"``, ``renormalize_logits``)."""
    texts = sentences(30, seed=3)
    expected = m2m100.generate(texts, num_beams=beams, max_length=GENERATE + 1, early_stopping="never",
                               renormalize_logits=True)  # fmt: skip
    src, mask = m2m100.encode(texts)
    got = m2m100.ours().generate(src, src_key_mask=mask.bool(), max_len=GENERATE,
                                 generation=m2m100.generation(beam_size=beams))  # fmt: skip
    assert generated(got) == generated(expected[:, 1:])  # after the decoder start
    assert sum(row[-1] == EOS for row in generated(got)) >= 25  # the limit is not what they reach


def test_translate_gives_transformers_text(m2m100: M2M100, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    """``translate``'s text is ``M2M100Tokenizer``'s decoding of the tokens after the target's code."""
    texts = sentences(30, seed=4)
    tokens = m2m100.generate(texts, num_beams=1, max_length=GENERATE + 1)
    expected = m2m100.tokenizer.batch_decode(tokens[:, 2:], skip_special_tokens=True)  # type: ignore[attr-defined]
    result = cli("translate", m2m100.run, "--no-guard", "--input", write_lines(tmp_path / "source.de", texts))
    assert result.status == 0, result.err
    assert result.out_lines == expected


def test_import_says_the_model_and_its_languages(m2m100: M2M100, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    result = cli("import", m2m100.directory, tmp_path / "run", "--langs", "de", "en")
    assert result.status == 0, result.err
    assert result.out_lines[1].startswith("  model: M2M100 Transformer, 2 encoder and 2 decoder layers")
    assert "  generation: every translation starts with __en__" in result.out_lines


def test_a_pair_it_lacks_or_none_is_refused(m2m100: M2M100, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    assert_refused(cli("import", m2m100.directory, tmp_path / "run", "--langs", "de", "tlh"), "--langs de tlh",
                   "no language 'tlh'", "the nearest it has: tl, th")  # fmt: skip
    directory = shutil.copytree(m2m100.directory, tmp_path / "unnamed")
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    settings.pop("src_lang"), settings.pop("tgt_lang")
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    assert_refused(cli("import", directory, tmp_path / "run"), "many-to-many", "give --langs SRC TGT")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["unnamed"]  # nothing written


def test_export_translates_as_transformers(m2m100: M2M100, tmp_path: Path) -> None:
    """The exported model, given the target's code as ``target_prefix``, gives CTranslate2 Transformers' greedy tokens;
    the export's README translates as it says. (CTranslate2 4.8's own converter cannot convert this checkpoint under
    Transformers 5, whose ``M2M100Tokenizer`` no longer counts the language codes in its vocabulary.)"""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from multihead.app.export import export

    ours = export(m2m100.run, tmp_path / "ours", checkpoint=None, quantization=None)
    tokenizer = m2m100.tokenizer
    texts = sentences(30, seed=5)
    batch = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(texts)["input_ids"]]  # type: ignore[operator]
    prefix = [["__en__"]] * len(texts)
    translator = ctranslate2.Translator(str(ours), device="cpu")
    found = translator.translate_batch(batch, beam_size=1, max_decoding_length=GENERATE, target_prefix=prefix)
    expected = [row[:-1] if row[-1] == EOS else row for row in generated(m2m100.generate(texts, num_beams=1,
                max_length=GENERATE + 1)[:, 1:])]  # fmt: skip
    assert [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in found] == expected  # type: ignore[attr-defined]
    code = (ours / "README.md").read_text(encoding="utf-8").split("```python\n")[1].split("```")[0]
    done = subprocess.run([sys.executable, "-c", code], cwd=ours, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pieces = tokenizer.convert_ids_to_tokens(tokenizer("Zwei Hunde spielen im Schnee.")["input_ids"])  # type: ignore[operator]
    (result,) = translator.translate_batch([pieces], target_prefix=prefix[:1])
    assert done.stdout.strip() == tokenizer.convert_tokens_to_string(result.hypotheses[0][1:])  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("source", "target"), [("de", "en"), ("de", "zh"), ("de", "fr"), ("en", "de")],
    ids=["into-en", "into-zh", "into-fr", "en-into-de"],
)  # fmt: skip
def test_another_pair_of_its_languages_translates_as_transformers(
    m2m100: M2M100, tmp_path: Path, cli: Callable[..., Cli], source: str, target: str
) -> None:
    """``--source-lang``/``--target-lang``: the source starts with the other code, the translation is forced to start
    with the other target's, as ``M2M100Tokenizer(src_lang=...)`` and ``generate(forced_bos_token_id=...)`` do."""
    from transformers import M2M100Tokenizer

    tokenizer = M2M100Tokenizer.from_pretrained(m2m100.directory, src_lang=source, tgt_lang=target)
    texts = sentences(50, seed=8)
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    tokens = m2m100.model.generate(  # type: ignore[attr-defined]
        **batch, do_sample=False, num_beams=1, max_length=GENERATE + 1,
        forced_bos_token_id=tokenizer.get_lang_id(target),
    )  # fmt: skip
    assert (tokens[:, 1] == tokenizer.get_lang_id(target)).all()
    result = cli("translate", m2m100.run, "--no-guard", "--input", write_lines(tmp_path / "source.txt", texts),
                 "--source-lang", source, "--target-lang", target)  # fmt: skip
    assert result.status == 0, result.err
    assert result.out_lines == tokenizer.batch_decode(tokens[:, 2:], skip_special_tokens=True)


def test_the_target_language_chooses_the_bleu_tokenizer(m2m100: M2M100, tmp_path: Path, cli: Callable) -> None:
    source = write_lines(tmp_path / "source.de", sentences(3, seed=9))
    result = cli("evaluate", m2m100.run, source, source, "--target-lang", "zh")
    assert result.status == 0, result.err
    scores = result.json()
    assert (scores["langs"], scores["signature"]["bleu"].split("|")[3]) == (["de", "zh"], "tok:zh")


def test_a_language_it_lacks_or_a_model_without_languages_is_refused(
    m2m100: M2M100, task_run: Path, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    assert_refused(cli("translate", m2m100.run, "der Hund", "--target-lang", "tlh"), "--target-lang tlh",
                   "no language 'tlh'", "the nearest it has: tl, th")  # fmt: skip
    lines = write_lines(tmp_path / "lines.txt", ["der Hund"])
    assert_refused(cli("score", m2m100.run, lines, lines, "--source-lang", "xx"), "--source-lang xx")
    assert_refused(cli("translate", task_run, "abc", "--target-lang", "fr"), "--target-lang fr",
                   "translates built-in task", "marks no languages with tokens")  # fmt: skip
