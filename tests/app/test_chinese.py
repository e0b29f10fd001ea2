"""Chinese as a target language: BLEU tokenized for Chinese (sacreBLEU's ``zh``: every Chinese character a token),
chosen by the run's languages, and ``evaluate --bleu-tokenize`` to choose another.

The corpus is a hand-made English→Chinese of six subjects, five verbs and five adverbs (150 pairs), like the German
one in ``support.py``; a model of 16 dimensions learns much of it in a few seconds."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU

from app.support import CORPUS_FLAGS, Cli, assert_refused, write_lines
from multihead.app.languages import bleu_tokenizer
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
