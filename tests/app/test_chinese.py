"""Chinese end to end: BLEU into Chinese tokenized for Chinese (sacreBLEU's ``zh``: every Chinese character a token),
chosen by the run's languages, and ``evaluate --bleu-tokenize`` to choose another; subwords that never span two
Chinese characters; attention plots of Chinese, one column a character, without font warnings.

The corpus is a hand-made English→Chinese of six subjects, five verbs and five adverbs (150 pairs), like the German
one in ``support.py``; a model of 16 dimensions learns much of it in a few seconds."""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU

from app.support import CORPUS_FLAGS, Cli, assert_refused, write_lines
from multihead.app import plot
from multihead.app.cli import main
from multihead.app.languages import bleu_tokenizer
from multihead.app.plot import plot_cross_attention, words
from multihead.app.tokenizers import SubwordTokenizer
from multihead.app.translate import Translator

SUBJECTS = [("The dog", "狗"), ("The cat", "猫"), ("The child", "孩子"), ("The man", "男人"), ("The woman", "女人"),
            ("The bear", "熊")]  # fmt: skip
VERBS = [("runs", "跑"), ("sleeps", "睡觉"), ("eats", "吃饭"), ("plays", "玩"), ("sings", "唱歌")]
ADVERBS = [("today", "今天"), ("here", "在这里"), ("often", "常常"), ("now", "现在"), ("again", "又")]
PAIRS = [
    (f"{s} {v} {a}.", f"{ts}{ta}{tv}。") for (s, ts), (v, tv), (a, ta) in itertools.product(SUBJECTS, VERBS, ADVERBS)
]
TEST = PAIRS[2::9]  # training pairs: the test is of the scores, not of generalisation


@pytest.mark.parametrize(
    ("target", "tokenizer"), [("zh", "zh"), ("zh-Hant", "zh"), ("en", "13a"), ("de", "13a"), (None, "13a")]
)
def test_the_bleu_tokenizer_follows_the_target_language(target: str | None, tokenizer: str) -> None:
    assert bleu_tokenizer(target) == tokenizer


def test_evaluate_into_chinese_scores_with_the_zh_tokenizer(tmp_path: Path, cli: Callable[..., Cli]) -> None:
    train = [
        write_lines(tmp_path / f"train.{lang}", [pair[side] for pair in PAIRS]) for side, lang in ((0, "en"), (1, "zh"))
    ]
    run = tmp_path / "run"
    flags = [*CORPUS_FLAGS, "--steps", "150", "--eval-every", "1000", "--checkpoint-every", "150"]
    assert cli("train", "--data", *train, "--out", run, *flags).status == 0
    assert Translator(run).langs == ["en", "zh"]
    src = write_lines(tmp_path / "test.en", [s for s, _ in TEST])
    ref = write_lines(tmp_path / "test.zh", [t for _, t in TEST])
    result = cli("evaluate", run, src, ref)
    assert result.status == 0, result.err
    summary = result.json()
    assert "tok:zh" in summary["signature"]["bleu"]
    assert summary["langs"] == ["en", "zh"]
    hypotheses = Translator(run).translate([s for s, _ in TEST])
    assert sum(h == r for h, (_, r) in zip(hypotheses, TEST, strict=True)) >= len(TEST) // 2  # learned much of it
    assert summary["bleu"] == round(BLEU(tokenize="zh").corpus_score(hypotheses, [[r for _, r in TEST]]).score, 2)
    assert summary["bleu"] > 30
    as_words = cli("evaluate", run, src, ref, "--bleu-tokenize", "13a").json()  # each sentence one "word"
    assert "tok:13a" in as_words["signature"]["bleu"]
    assert as_words["bleu"] < summary["bleu"]
    assert_refused(cli("evaluate", run, src, ref, "--bleu-tokenize", "spm"), "--bleu-tokenize", "'spm'")


# --- subwords and plots of a language written without spaces ------------------------------------------------------


def test_no_subword_spans_two_chinese_characters_and_latin_text_is_split_as_before() -> None:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    texts = [text for pair in PAIRS for text in pair]
    ours = SubwordTokenizer.train(texts, 200)
    for _, chinese in PAIRS[:20]:
        ids, unknown = ours.encode(chinese)
        assert unknown == []
        assert all(len(piece.removeprefix("▁")) == 1 for piece in ours.pieces(ids))  # each one character
        assert all(ours.word_starts(ids))
        assert ours.decode(ids) == chinese  # no spaces added
    # Without the split of Chinese characters (the pipeline before it), Latin text gets the same subwords.
    before = Tokenizer(models.BPE(unk_token="<unk>"))
    before.normalizer = normalizers.NFKC()
    before.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation(behavior="isolated")]
    )
    before.decoder = decoders.Metaspace()
    english = [english for english, _ in PAIRS]
    before.train_from_iterator(english, trainers.BpeTrainer(vocab_size=120, special_tokens=["<pad>", "<s>", "</s>",
                                                                                            "<unk>"]))  # fmt: skip
    latin = SubwordTokenizer.train(english, 120)
    for text in english[:30]:
        assert latin.pieces(latin.encode(text)[0]) == before.encode(text).tokens


@pytest.fixture(scope="module")
def chinese_to_english(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zh-en")
    train = [
        write_lines(root / f"train.{lang}", [pair[side] for pair in PAIRS]) for side, lang in ((1, "zh"), (0, "en"))
    ]
    flags = [*CORPUS_FLAGS, "--steps", "60", "--eval-every", "1000", "--checkpoint-every", "60"]
    assert main(["train", "--data", *map(str, train), "--out", str(root / "run"), *flags]) == 0
    return root / "run"


def test_a_chinese_sentence_is_plotted_one_column_a_character_without_warnings(
    chinese_to_english: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sentence = PAIRS[7][1]
    translation = Translator(chinese_to_english).attention(sentence)
    assert [word for word, _ in words(translation.source_tokens, translation.source_word_starts)] == list(sentence)
    if plot.cjk_font() is None:
        message = "no CJK font: apt-get install fonts-noto-cjk"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI installs it)")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # matplotlib's "Glyph ... missing from font(s)" would fail here
            plot_cross_attention(translation, tmp_path / "font.png")
        assert plot.shown(sentence) == sentence
    # Without such a font: code points, and still no warning.
    monkeypatch.setattr(plot, "cjk_font", lambda: None)
    plot._drawable.cache_clear()
    try:
        assert plot.shown("狗 ran") == "U+72D7 ran"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            plot_cross_attention(translation, tmp_path / "code-points.png")
    finally:
        plot._drawable.cache_clear()
    assert (tmp_path / "code-points.png").stat().st_size > 0


def test_every_column_and_row_is_labelled_with_what_the_model_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Chinese sentence is one word to the word mark (no spaces): BPE keeps ``▁`` with its first character only where
    it learned that merge, so a sentence beginning with a character that began no training sentence reads as a bare
    ``▁`` first (a column that often takes much of a head's attention), and that column says ``▁``."""
    import matplotlib.pyplot as plt
    import numpy as np

    from multihead.app.translate import Translation

    tokenizer = SubwordTokenizer.train([text for pair in PAIRS for text in pair], 200)
    source, target = "今天狗跑。", "The dog runs today ."  # "今" began no training sentence; a space before "."
    source_ids, target_ids = tokenizer.encode(source)[0], tokenizer.encode(target)[0]
    assert tokenizer.pieces(source_ids)[:2] == ["▁", "今"]  # the bare mark the model reads
    target_tokens = [*tokenizer.pieces(target_ids), "<eos>"]
    uniform = np.full((2, len(target_tokens), len(source_ids)), 1 / len(source_ids))  # (H, Lt, Ls)
    translation = Translation(
        source, target, tokenizer.pieces(source_ids), target_tokens, tokenizer.word_starts(source_ids),
        [*tokenizer.word_starts(target_ids), True], [uniform, uniform],
    )  # fmt: skip
    figures: list = []
    monkeypatch.setattr(plot, "_save", lambda figure, path: figures.append(figure))
    plot_cross_attention(translation, tmp_path / "marks.png")
    try:
        for axis in figures[0].axes:
            columns = [label.get_text() for label in axis.get_xticklabels()]
            rows = [label.get_text() for label in axis.get_yticklabels()]
            assert columns == [plot.shown(word) for word in ["▁", "今", "天", "狗", "跑", "。"]]
            assert rows == ["The", "dog", "runs", "today", "▁", ".", "⟨eos⟩"]
    finally:
        plt.close(figures[0])
