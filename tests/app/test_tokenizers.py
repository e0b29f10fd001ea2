"""Subwords from a well-kept library: BPE learned with Hugging Face ``tokenizers``, joint by default
for a corpus with one matrix for both embeddings and the output projection, its size an option, saved in the
library's own format, detokenized output; characters and words stay for the built-in tasks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import hypothesis
import pytest
import tokenizers
import torch
from hypothesis import strategies as st

from app.support import SMALL, TRAIN, VALID, Cli, CorpusRun, assert_refused, snapshot, write_corpus
from multihead.app.runs import latest_checkpoint
from multihead.app.tokenizers import EOS, SubwordTokenizer, WordIds, load_tokenizers
from multihead.app.tokenizers import SymbolTokenizer as Tokenizer
from multihead.app.training import TrainOptions, train
from multihead.app.translate import Translator


def test_the_subword_vocabulary_is_saved_in_hugging_face_format_and_is_joint(corpus_run: CorpusRun) -> None:
    checkpoint = latest_checkpoint(corpus_run.path)
    manifest = json.loads((checkpoint / "tokenizer.json").read_text(encoding="utf-8"))
    assert manifest == {
        "joint": True,
        "source": {"kind": "subword", "file": "subwords.json"},
        "target": {"kind": "subword", "file": "subwords.json"},
    }
    library = tokenizers.Tokenizer.from_file(str(checkpoint / "subwords.json"))
    assert library.get_vocab_size() == 120  # --vocab-size 120
    source, target = load_tokenizers(checkpoint)
    assert source is target
    assert isinstance(source, SubwordTokenizer)
    for sentence in ("der Hund läuft schnell.", "the cat sleeps here."):  # one vocabulary, both languages
        assert source.encode(sentence) == (library.encode(sentence, add_special_tokens=False).ids, [])
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    assert (config["src_vocab"], config["tgt_vocab"], config["tie_embeddings"]) == (120, 120, True)


def test_one_matrix_embeds_both_languages_and_projects_the_output(corpus_run: CorpusRun) -> None:
    model = Translator(corpus_run.path).model
    assert model.src_embed.weight is model.tgt_embed.weight
    assert model.output_proj.weight is model.src_embed.weight
    matrices = [name for name, parameter in model.named_parameters() if parameter.shape == (120, 16)]
    assert matrices == ["src_embed.weight"]  # named_parameters lists a shared parameter once


def test_decoding_gives_plain_text_back(corpus_run: CorpusRun) -> None:
    tokenizer, _ = load_tokenizers(latest_checkpoint(corpus_run.path))
    for source, target in VALID:
        for text in (source, target):
            ids, unknown = tokenizer.encode(text)
            assert unknown == []
            assert tokenizer.decode([*ids, EOS, *ids]) == text  # lossless, up to the first EOS
    for translation in corpus_run.translations:
        assert "▁" not in translation
        assert "<unk>" not in translation
        assert "@@" not in translation
    assert any(" " in translation for translation in corpus_run.translations)


def test_unknown_characters_are_reported_one_by_one(corpus_run: CorpusRun) -> None:
    tokenizer, _ = load_tokenizers(latest_checkpoint(corpus_run.path))
    ids, unknown = tokenizer.encode("Ωβ der Hund")
    assert unknown == ["Ω", "β"]
    assert ids.count(3) == 2  # <unk>


@pytest.mark.usefixtures("fast_evaluation")
def test_separate_vocabularies_of_the_size_asked_for(tmp_path: Path, cli: Callable[..., Cli]) -> None:
    data, out = write_corpus(tmp_path / "corpus"), tmp_path / "run"
    args = ["--data", *data, "--out", out, "--steps", "1", "--no-joint-vocab", "--vocab-size", "60", "--average", "0"]
    assert cli("train", *args, "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "32").status == 0
    checkpoint = latest_checkpoint(out)
    manifest = json.loads((checkpoint / "tokenizer.json").read_text(encoding="utf-8"))
    assert manifest["joint"] is False
    assert (manifest["source"]["file"], manifest["target"]["file"]) == ("subwords.source.json", "subwords.target.json")
    source, target = load_tokenizers(checkpoint)
    assert (len(source), len(target)) == (60, 60)
    assert source.encode("läuft")[1] == []
    assert target.encode("läuft")[1] == ["ä"]  # English never saw an umlaut
    model = Translator(out).model
    assert model.src_embed.weight is not model.tgt_embed.weight
    assert not torch.equal(model.src_embed.weight, model.tgt_embed.weight)


@pytest.mark.usefixtures("fast_evaluation")
@pytest.mark.parametrize(("tokenizer", "kind"), [(None, "char"), ("word", "word")])
def test_built_in_tasks_keep_characters_and_words(tmp_path: Path, tokenizer: str | None, kind: str) -> None:
    out = tmp_path / "run"
    train(TrainOptions(out=str(out), task="dates", tokenizer=tokenizer, steps=1, batch_size=4, **SMALL))
    checkpoint = latest_checkpoint(out)
    manifest = json.loads((checkpoint / "tokenizer.json").read_text(encoding="utf-8"))
    assert (manifest["source"]["kind"], manifest["target"]["kind"], manifest["joint"]) == (kind, kind, False)
    assert not list(checkpoint.glob("subwords*.json"))
    source, _ = load_tokenizers(checkpoint)
    text = "21 November 2026"
    assert source.pieces(source.encode(text)[0]) == (list(text) if kind == "char" else text.split())


@pytest.mark.usefixtures("fast_evaluation")
def test_char_and_word_tokenizers_work_on_a_corpus_too(tmp_path: Path) -> None:
    """Joint by default there as well, so the embeddings are tied."""
    data = write_corpus(tmp_path / "corpus", TRAIN[:20])
    train(TrainOptions(out=str(tmp_path / "run"), data=data, tokenizer="word", steps=1, average=0, **SMALL))
    source, target = load_tokenizers(latest_checkpoint(tmp_path / "run"))
    assert source is target
    assert source.kind == "word"
    assert source.encode("der Hund läuft schnell.")[1] == []


BAD = (ValueError, TypeError)


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"kind": "char", "symbols": [1, 2]}, r"symbols"),
        ({"kind": "word", "symbols": [None]}, r"symbols"),
    ],
    ids=["integer-symbols", "none-symbol"],
)
def test_tokenizer_from_damaged_dict_refused(values: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Tokenizer.from_dict(values)


# Pieces of awkward text: combining marks, what NFKC changes (ligature, circled digit, no-break and ideographic
# spaces, the angstrom sign), spaces single, double and outer, tabs, Chinese, punctuation, specials' text.
AWKWARD = ["Ein", "Hund", "läuft", "e\u0301", "ﬁ", "①", "\u212b", "\u00a0", "\u3000", " ", "  ", "\t", "中文", "。",
           ".", ",", "<", "<unk>", "<pad>x", "zz", "Q"]  # fmt: skip


@pytest.fixture(scope="module")
def awkward_tokenizer() -> SubwordTokenizer:
    texts = [*(text for pair in TRAIN for text in pair), "中文 。 e\u0301 ﬁ ① \u212b", "<unk> < Hund"]
    return SubwordTokenizer.train(texts, vocab_size=90)


@hypothesis.settings(max_examples=300, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(texts=st.lists(st.lists(st.sampled_from(AWKWARD), max_size=8).map("".join), max_size=12))
def test_a_corpus_is_encoded_word_by_word_exactly_as_hugging_face_encodes_it(
    awkward_tokenizer: SubwordTokenizer, texts: list[str]
) -> None:
    ids, lengths = awkward_tokenizer.corpus_encoder()(texts)
    expected = awkward_tokenizer.encode_all(texts)
    assert lengths.tolist() == [len(one) for one in expected]
    assert ids.tolist() == [index for one in expected for index in one]


def test_the_words_met_are_bounded_and_encoding_stays_exact(
    awkward_tokenizer: SubwordTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(WordIds, "LIMIT", 5)
    words = WordIds(awkward_tokenizer.model)
    texts = ["Ein Hund läuft", "zz Q Ein", "Hund Hund Hund", "a b c d e f g", "läuft"]
    for text in texts:
        ids, lengths = words.encode([text])
        assert ids.tolist() == awkward_tokenizer.encode_all([text])[0]
        assert lengths.tolist() == [len(ids)]
        assert len(words.index) <= 7  # a text's own words may exceed the limit; earlier ones are forgotten
    assert set(words.index) == {"läuft"}


def test_word_by_word_encoding_only_for_the_rules_it_relies_on(awkward_tokenizer: SubwordTokenizer) -> None:
    assert WordIds.applies(awkward_tokenizer.model)
    other = tokenizers.Tokenizer.from_str(awkward_tokenizer.to_json())
    other.normalizer = tokenizers.normalizers.Lowercase()
    assert not WordIds.applies(other)
    other = SubwordTokenizer(tokenizers.Tokenizer.from_str(awkward_tokenizer.to_json()))
    other.model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    texts = ["Ein Hund", "Hund. Ein"]
    ids, _lengths = other.corpus_encoder()(texts)
    assert ids.tolist() == [i for one in other.encode_all(texts) for i in one]


# --- another run's vocabulary -------------------------------------------------------------------------------


@pytest.mark.usefixtures("fast_evaluation")
def test_a_run_takes_another_runs_vocabulary_with_vocab_from(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """The same tokenizer files, byte for byte, whatever the new run's corpus (here half of the other's, without
    --valid), so that the two runs' models can be compared or ensembled; the run records where they came from."""
    theirs = latest_checkpoint(corpus_run.path)
    data, out = write_corpus(tmp_path / "corpus", TRAIN[::2]), tmp_path / "run"
    small = ["--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "32", "--no-progress"]
    result = cli("train", "--data", *data, "--out", out, "--steps", "1", "--vocab-from", corpus_run.path, *small)
    assert result.status == 0, result.err
    assert "learning a" not in result.out
    assert f"taking the subword vocabulary of {corpus_run.path} ({theirs.name})" in result.out
    ours = latest_checkpoint(out)
    for name in ("tokenizer.json", "subwords.json"):
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    (source, target), (their_source, _) = load_tokenizers(ours), load_tokenizers(theirs)
    assert source is target  # joint, as theirs
    ids, _ = source.encode(VALID[0][0])
    assert source.pieces(ids) == their_source.pieces(their_source.encode(VALID[0][0])[0])
    options = json.loads((ours / "trainer.json").read_text(encoding="utf-8"))["options"]
    assert options["vocab_from"] == str(corpus_run.path)
    assert (options["tokenizer"], options["vocab_size"], options["joint"]) == ("subword", 120, True)
    resumed = cli("train", "--data", *data, "--out", out, "--resume", "--steps", "2", "--vocab-from", corpus_run.path,
                  "--no-progress")  # fmt: skip
    assert resumed.status == 0, resumed.err  # the same --vocab-from again: nothing changes


@pytest.mark.parametrize(
    ("given", "fragments"),
    [
        (["--vocab-from", "MISSING"], ["--vocab-from: ", "absent' does not exist"]),
        (["--vocab-from", "EMPTY"], ["--vocab-from: ", "is not a multihead run"]),
        (["--vocab-from", "RUN", "--tokenizer", "word"],
         ["--tokenizer word conflicts with --vocab-from", "whose vocabulary has --tokenizer subword"]),
        (["--vocab-from", "RUN", "--vocab-size", "100"],
         ["--vocab-size 100 conflicts with --vocab-from", "whose vocabulary has --vocab-size 120"]),
        (["--vocab-from", "RUN", "--no-joint-vocab"],
         ["--no-joint-vocab conflicts with --vocab-from", "whose vocabulary has --joint-vocab"]),
        (["--vocab-from", "RUN", "--vocab-sample", "50"], ["--vocab-sample 50", "with --vocab-from the run learns"]),
        (["--resume", "--out", "RUN", "--vocab-from", "RUN"],
         ["--vocab-from RUN would change the run, which has no --vocab-from"]),
    ],
    ids=["missing", "not-a-run", "tokenizer", "vocab-size", "joint", "vocab-sample", "resume"],
)  # fmt: skip
def test_a_bad_vocab_from_is_refused_in_one_line(
    given: list[str], fragments: list[str], corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    run = corpus_run.copy(tmp_path / "other")
    (tmp_path / "empty").mkdir()
    before = snapshot(run)
    paths = {"MISSING": str(tmp_path / "absent"), "EMPTY": str(tmp_path / "empty"), "RUN": str(run)}
    data, valid = write_corpus(tmp_path / "corpus"), write_corpus(tmp_path / "corpus", VALID, "valid")
    out = [] if "--out" in given else ["--out", str(tmp_path / "new")]
    args = [paths.get(arg, arg) for arg in given]
    result = cli("train", "--data", *data, "--valid", *valid, *out, *args, "--steps", "200", "--no-progress")
    assert_refused(result, *[fragment.replace("RUN", str(run)) for fragment in fragments])
    assert not (tmp_path / "new").exists()
    assert snapshot(run) == before
