"""``multihead import`` of an NLLB-200 checkpoint: M2M100's architecture with ``NllbTokenizer``'s ids, which
``tokenizer.json`` holds (``<s>``, ``<pad>``, ``</s>``, ``<unk>``, SentencePiece's pieces one id on, the ``deu_Latn``
language codes and ``<mask>`` as added tokens), an embedding with rows beyond them (NLLB-200's has two). The source
starts with its language's code and ends with EOS; the translation starts with the target's. Against Transformers'
``M2M100ForConditionalGeneration`` and ``NllbTokenizer`` on a tiny checkpoint made here, offline: a SentencePiece
model trained on ``support.py``'s made-up German and English beside five of NLLB's codes, saved with
``save_pretrained`` beside ``sentencepiece.bpe.model``, as the Hub's NLLB checkpoints hold it.
"""

from __future__ import annotations

import io
import itertools
import json
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from app.imported import Imported, imported, train_briefly
from app.imported import generated as up_to_eos
from app.support import PAIRS, Cli, assert_refused, sentences, write_lines

pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")

PAD, EOS = 1, 2  # fairseq's dictionary: <s> 0, <pad> 1, </s> 2, <unk> 3
CODES = ["deu_Latn", "eng_Latn", "fra_Latn", "zho_Hans", "zho_Hant"]
GENERATE = 40
EXTRA_ROWS = 2  # the model's vocabulary beyond the tokenizer's, as NLLB-200's 256,206 beside 256,204


class Nllb(Imported):
    """A saved NLLB-style checkpoint (see :class:`Imported`)."""

    def tokenizer_for(self, source: str, target: str) -> object:
        from transformers import NllbTokenizer

        return NllbTokenizer.from_pretrained(self.directory, src_lang=source, tgt_lang=target)

    def trainer(self) -> dict:
        return json.loads((self.checkpoint / "trainer.json").read_text())

    def generate(
        self, texts: list[str], source: str = "deu_Latn", target: str = "eng_Latn", **options: object
    ) -> torch.Tensor:
        """Transformers' tokens from ``source`` into ``target``, the decoder start first."""
        tokenizer = self.tokenizer_for(source, target)
        batch = tokenizer(texts, return_tensors="pt", padding=True)  # type: ignore[operator]
        return self.model.generate(  # type: ignore[attr-defined]
            **batch, do_sample=False, max_length=GENERATE + 1,
            forced_bos_token_id=tokenizer.convert_tokens_to_ids(target), **options,  # type: ignore[attr-defined]
        )  # fmt: skip


def make_checkpoint(directory: Path, codes: Sequence[str] = CODES) -> Path:
    """An NLLB-style checkpoint whose tokenizer has the language ``codes``, saved into ``directory``."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer

    spm = directory.parent / f"{directory.name}-spm"
    spm.mkdir(parents=True)
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([text for pair in PAIRS for text in pair]), model_writer=model, vocab_size=120,
        model_type="bpe", hard_vocab_limit=False, minloglevel=2,
    )  # fmt: skip
    (spm / "sentencepiece.bpe.model").write_bytes(model.getvalue())
    tokenizer = NllbTokenizer.from_pretrained(
        spm, src_lang="deu_Latn", tgt_lang="eng_Latn", extra_special_tokens=list(codes)
    )
    config = M2M100Config(
        vocab_size=len(tokenizer) + EXTRA_ROWS, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=64, dropout=0.0, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=EOS,
    )  # fmt: skip
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(config)
    train_briefly(model, tokenizer, PAD)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    shutil.copy(spm / "sentencepiece.bpe.model", directory)
    return directory


@pytest.fixture(scope="module")
def nllb(tmp_path_factory: pytest.TempPathFactory) -> Nllb:
    from transformers import M2M100ForConditionalGeneration, NllbTokenizer

    def tokenizer(found: Path) -> object:
        return NllbTokenizer.from_pretrained(found, src_lang="deu_Latn", tgt_lang="eng_Latn")

    return imported(tmp_path_factory.mktemp("nllb"), "nllb_tiny", make_checkpoint, Nllb,
                    M2M100ForConditionalGeneration, tokenizer)  # fmt: skip


def generated(tokens: torch.Tensor) -> list[list[int]]:
    return up_to_eos(tokens, EOS)


def test_the_run_reads_nllbs_ids_and_records_iso_codes(nllb: Nllb) -> None:
    generation = nllb.generation()
    assert generation.forced == (nllb.tokenizer.convert_tokens_to_ids("eng_Latn"),)
    assert nllb.trainer()["options"]["langs"] == ["de", "en"]
    from multihead.app.tokenizers import load_tokenizers

    source, _ = load_tokenizers(nllb.checkpoint)
    assert len(source) == len(nllb.tokenizer) + EXTRA_ROWS
    for text in [*sentences(20, seed=7), "zwei   Hunde"]:  # NllbTokenizer's ids
        assert source.encode(text)[0] == nllb.tokenizer(text)["input_ids"], text  # type: ignore[operator]


AWKWARD = ["zwei   Hunde", "ÄÖÜ ß ﬁ ① Ｈｕｎｄ", "x\ty\nz", "日本語 テスト", "a▁b", "Qualle!!  ,;", "Hund.Katze"]
"""Texts that try a tokenizer's normalizer and whitespace rules, and characters it lacks."""


def test_a_checkpoint_without_its_sentencepiece_model_imports(nllb: Nllb, tmp_path: Path) -> None:
    """As Transformers 5 saves an NLLB checkpoint: ``tokenizer.json`` and no ``sentencepiece.bpe.model``. The run's
    SentencePiece model, made from ``tokenizer.json``, gives the ids of the model it was made from and
    ``NllbTokenizer``'s (the tokenizer Transformers loads from that directory alone; SentencePiece drops spaces around
    a text, where it makes a piece of a space at the end); greedy search gives ``generate``'s tokens and text."""
    from transformers import NllbTokenizer

    from multihead.app.pretrained import import_pretrained
    from multihead.app.tokenizers import load_tokenizers

    directory = shutil.copytree(nllb.directory, tmp_path / "saved", ignore=shutil.ignore_patterns("*.model"))
    import_pretrained(str(directory), tmp_path / "run", langs=["de", "en"])
    tokenizer = NllbTokenizer.from_pretrained(directory, src_lang="deu_Latn", tgt_lang="eng_Latn")
    made = Nllb(directory, nllb.model, tokenizer, tmp_path / "run")
    source, target = load_tokenizers(made.checkpoint)
    original, _ = load_tokenizers(nllb.checkpoint)
    for text in [*sentences(200, seed=15), *AWKWARD]:
        expected = made.tokenizer(text)["input_ids"]  # type: ignore[operator]
        assert source.encode(text)[0] == expected == original.encode(text)[0], text
        assert source.encode(f"  {text} ")[0] == original.encode(f"  {text} ")[0]
    texts = sentences(20, seed=16)
    src, mask = made.encode(texts)
    expected = generated(made.generate(texts, num_beams=1)[:, 1:])
    got = generated(made.ours().generate(src, src_key_mask=mask.bool(), max_len=GENERATE,
                                         generation=made.generation()))  # fmt: skip
    assert got == expected
    assert sum(row[-1] == EOS and len(row) > 2 for row in got) >= 15  # they end, after the language code and a word
    decoded = made.tokenizer.batch_decode(made.generate(texts, num_beams=1)[:, 2:], skip_special_tokens=True)
    assert [target.decode(row[1:]) for row in got] == decoded  # type: ignore[attr-defined]


def test_logits_equal_transformers(nllb: Nllb) -> None:
    code = nllb.tokenizer.convert_tokens_to_ids("zho_Hans")
    assert nllb.logits_error(sentences(4, seed=1), (EOS, code), seed=0, length=7, keras=False) <= 1e-4


@pytest.mark.keras
def test_keras_logits_equal_transformers(nllb: Nllb) -> None:
    code = nllb.tokenizer.convert_tokens_to_ids("eng_Latn")
    assert nllb.logits_error(sentences(4, seed=2), (EOS, code), seed=1, length=6, keras=True) <= 1e-4


@pytest.mark.parametrize("beams", [1, 4], ids=["greedy", "beam"])
def test_tokens_equal_generate(nllb: Nllb, beams: int) -> None:
    texts = sentences(30, seed=3)
    expected = nllb.generate(texts, num_beams=beams, early_stopping="never", renormalize_logits=True)
    src, mask = nllb.encode(texts)
    got = nllb.ours().generate(src, src_key_mask=mask.bool(), max_len=GENERATE,
                               generation=nllb.generation(beam_size=beams))  # fmt: skip
    assert generated(got) == generated(expected[:, 1:])  # after the decoder start
    assert sum(row[-1] == EOS for row in generated(got)) >= 25  # the limit is not what they reach


@pytest.mark.parametrize(
    ("flags", "source", "target"),
    [((), "deu_Latn", "eng_Latn"), (("--target-lang", "zh"), "deu_Latn", "zho_Hans"),
     (("--target-lang", "zh-TW", "--source-lang", "en"), "eng_Latn", "zho_Hant"),
     (("--source-lang", "fra_Latn", "--target-lang", "deu_Latn"), "fra_Latn", "deu_Latn")],
    ids=["run's", "zh", "zh-TW-from-en", "nllb-codes"],
)  # fmt: skip
def test_translate_into_each_target_gives_transformers_text(
    nllb: Nllb, tmp_path: Path, cli: Callable[..., Cli], flags: tuple[str, ...], source: str, target: str
) -> None:
    """``--source-lang``/``--target-lang`` as ISO codes (``zh`` is Simplified Chinese, ``zh-TW`` Traditional) or
    NLLB's own: the text is ``NllbTokenizer(src_lang=...)``'s input, ``generate(forced_bos_token_id=...)``'s tokens
    after the target's code, decoded by ``batch_decode``."""
    texts = sentences(50, seed=4)
    tokens = nllb.generate(texts, source, target, num_beams=1)
    assert (tokens[:, 1] == nllb.tokenizer.convert_tokens_to_ids(target)).all()
    expected = nllb.tokenizer.batch_decode(tokens[:, 2:], skip_special_tokens=True)  # type: ignore[attr-defined]
    result = cli("translate", nllb.run, "--no-guard", "--input", write_lines(tmp_path / "source.txt", texts), *flags)
    assert result.status == 0, result.err
    assert result.out_lines == expected


def test_import_says_the_model(nllb: Nllb, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    result = cli("import", nllb.directory, tmp_path / "run", "--langs", "zh-Hant", "de")
    assert result.status == 0, result.err
    assert result.out_lines[1].startswith("  model: NLLB-200 Transformer, 2 encoder and 2 decoder layers")
    assert "  generation: every translation starts with deu_Latn" in result.out_lines
    trainer = json.loads((tmp_path / "run" / "checkpoints" / "step-0000000" / "trainer.json").read_text())
    assert trainer["options"]["langs"] == ["zh-Hant", "de"]


def test_what_it_cannot_read_is_refused(nllb: Nllb, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    assert_refused(cli("import", nllb.directory, tmp_path / "run", "--langs", "de", "ja"), "--langs de ja",
                   "no language 'ja'", "it has 5, such as deu_Latn")  # fmt: skip
    legacy = shutil.copytree(nllb.directory, tmp_path / "legacy")
    settings = json.loads((legacy / "tokenizer_config.json").read_text())
    (legacy / "tokenizer_config.json").write_text(json.dumps(settings | {"legacy_behaviour": True}))
    assert_refused(cli("import", legacy, tmp_path / "run"), "tokenizer_config.json", "legacy_behaviour=true")
    bare = shutil.copytree(nllb.directory, tmp_path / "bare")
    (bare / "tokenizer.json").unlink()
    assert_refused(cli("import", bare, tmp_path / "run"), "holds no tokenizer.json")
    unmerged = shutil.copytree(nllb.directory, tmp_path / "unmerged", ignore=shutil.ignore_patterns("*.model"))
    settings = json.loads((unmerged / "tokenizer.json").read_text())
    settings["model"]["merges"] = settings["model"]["merges"][1:]  # a piece Transformers never makes
    (unmerged / "tokenizer.json").write_text(json.dumps(settings))
    assert_refused(cli("import", unmerged, tmp_path / "run"), "tokenizer.json", "not the BPE model of a SentencePiece",
                   "no sentencepiece.bpe.model", "its merges are not every pair")  # fmt: skip
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bare", "legacy", "unmerged"]  # nothing written
    assert_refused(cli("translate", nllb.run, "Hund", "--target-lang", "zh-Hang"), "--target-lang zh-Hang",
                   "no language 'zh-Hang'", "the nearest it has: zho_Hans, zho_Hant")  # fmt: skip
    assert_refused(cli("serve", nllb.run, "--port", "0", "--langs", "de", "tlh"), "--langs de tlh",
                   "no language 'tlh'")  # fmt: skip


def test_export_translates_as_ctranslate2s_own_conversion(nllb: Nllb, tmp_path: Path) -> None:
    """Our export and CTranslate2's converter of the checkpoint give the same tokens, given the target's code as
    ``target_prefix``: Transformers' greedy tokens, into each of two targets."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from ctranslate2.converters import TransformersConverter

    from multihead.app.export import export

    ours = ctranslate2.Translator(str(export(nllb.run, tmp_path / "ours", checkpoint=None, quantization=None)))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        converted = TransformersConverter(str(nllb.directory)).convert(str(tmp_path / "theirs"))
    theirs = ctranslate2.Translator(converted)
    texts = sentences(30, seed=5)
    tokenizer = nllb.tokenizer
    batch = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(texts)["input_ids"]]  # type: ignore[operator]
    for target in ("eng_Latn", "zho_Hant"):
        prefix = [[target]] * len(texts)
        found = [
            [result.hypotheses[0] for result in translator.translate_batch(
                batch, beam_size=1, max_decoding_length=GENERATE, target_prefix=prefix)]
            for translator in (ours, theirs)
        ]  # fmt: skip
        assert found[0] == found[1]
        expected = generated(nllb.generate(texts, "deu_Latn", target, num_beams=1)[:, 1:])
        assert [tokenizer.convert_tokens_to_ids(tokens) for tokens in found[0]] == [
            row[:-1] if row[-1] == EOS else row for row in expected
        ]  # type: ignore[attr-defined]


@pytest.mark.parametrize("beams", [1, 2], ids=["greedy", "beam"])
def test_serve_answers_every_pair_of_its_languages_as_translate(nllb: Nllb, beams: int) -> None:
    """``/languages`` lists each of the model's languages (as ISO codes) with every other as a target; ``/translate``
    answers any pair as ``translate --source-lang --target-lang`` does, requests into different languages at once
    sharing the batch, greedy or beam search."""
    from concurrent.futures import ThreadPoolExecutor

    from app.served import request, serving
    from multihead.app.serve import Limits, Service, create_app
    from multihead.app.translate import Translator
    from multihead.decoding import SearchOptions

    translator = Translator(nllb.run, guard=False)
    search = SearchOptions(beam_size=beams)
    codes = ["de", "en", "fr", "zh", "zh-Hant"]
    texts = sentences(6, seed=12)
    pairs = [("de", "en"), ("de", "zh"), ("en", "zh-Hant"), ("fr", "de"), ("zh-Hant", "fr")] * 2
    expected = {pair: translator.for_languages(*pair).translate(texts, search=search) for pair in set(pairs)}
    with serving(create_app(Service(translator, translator.langs or [], search=search), Limits())) as url:
        status, languages = request(url, "/languages")
        assert status == 200
        assert [(entry["code"], entry["name"], entry["targets"]) for entry in languages] == [
            (code, name, [other for other in codes if other != code])
            for code, name in zip(codes, ["German", "English", "French", "Chinese", "Chinese (Traditional)"],
                                  strict=True)
        ]  # fmt: skip

        def ask(pair: tuple[str, str]) -> tuple[int, object]:
            return request(url, "/translate", {"q": texts, "source": pair[0], "target": pair[1]})

        with ThreadPoolExecutor(len(pairs)) as pool:
            answers = list(pool.map(ask, pairs, timeout=120))
        assert answers == [(200, {"translatedText": expected[pair]}) for pair in pairs]
        traditional = translator.for_languages("de", "zh-Hant").translate(texts, search=search)
        assert request(url, "/translate", {"q": texts, "source": "de", "target": "zh-TW"}) == (
            200, {"translatedText": traditional}
        )  # fmt: skip
        assert request(url, "/translate", {"q": "Hund", "source": "de", "target": "ja"}) == (
            400, {"error": "ja is not supported"}
        )  # fmt: skip
        assert request(url, "/translate", {"q": "Hund", "source": "de", "target": "de"}) == (
            400, {"error": "German (de) is not available as a target language from German (de)"}
        )  # fmt: skip
        status, view = request(url, "/attention", {"q": texts[0], "source": "de", "target": "zh"})
        assert status == 200
        assert view["target"] == expected[("de", "zh")][0]


def test_fine_tuning_on_one_pair_keeps_its_language_tokens(nllb: Nllb, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    """``train --init`` on a corpus whose file names (or ``--langs``) give the pair: every source starts with its
    language's code and every target with the target's, as Transformers' ``NllbTokenizer(src_lang, tgt_lang)``
    labels them; the tuned run translates that pair."""
    from multihead.app.tokenizers import load_tokenizers

    texts = sentences(40, seed=14)
    corpus = [write_lines(tmp_path / f"train.{side}", texts) for side in ("de", "fr")]
    tuned = tmp_path / "tuned"
    result = cli("train", "--init", nllb.run, "--data", *corpus, "--out", tuned, "--steps", "2", "--no-progress")
    assert result.status == 0, result.err
    tokenizer = nllb.tokenizer_for("deu_Latn", "fra_Latn")
    labelled = tokenizer(texts, text_target=texts)  # type: ignore[operator]
    for side, key in (("source", "input_ids"), ("target", "labels")):
        tokens, offsets = (np.load(tuned / "encoded" / f"{side}.{part}.npy") for part in ("tokens", "offsets"))
        ours = [tokens[start:end].tolist() for start, end in itertools.pairwise(offsets)]
        expected = [row if side == "source" else row[:-1] for row in labelled[key]]  # the batches add targets' EOS
        assert len(ours) >= 30  # a tenth held out to validate
        assert all(row in expected for row in ours)
    checkpoint = tuned / "checkpoints" / "step-0000002"
    source, _ = load_tokenizers(checkpoint)
    assert source.encode(texts[0])[0] == tokenizer(texts[0])["input_ids"]  # type: ignore[operator]
    generation = json.loads((checkpoint / "generation.json").read_text())
    assert generation["forced"] == [tokenizer.convert_tokens_to_ids("fra_Latn")]  # type: ignore[attr-defined]
    assert_refused(cli("train", "--init", nllb.run, "--data", *corpus, "--langs", "de", "ja", "--out",
                       tmp_path / "other", "--steps", "2"), "--langs de ja", "no language 'ja'")  # fmt: skip
    assert not (tmp_path / "other").exists()
