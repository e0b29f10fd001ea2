"""``translate --n-best N`` (N scored lines per input) and ``multihead score RUN SRC HYP`` (the model's
log-probability of given translations), each checked against a computation of its own: the model's full forward
pass on one sentence at a time, and the log-probability the beam search itself found."""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import multihead.app.translate as translate_module
from app.support import SAMPLES, VALID, Cli, CorpusRun, assert_refused, beam, write_lines
from multihead.app.tokenizers import BOS, EOS
from multihead.app.translate import Translator

SOURCES = [source for source, _ in VALID]
SPEED = r"(\d+\.\d) s \((\d+\.\d) {unit}s/s, (\d+) tokens/s\)"


def read_n_best(text: str) -> list[tuple[int, float | None, str]]:
    rows = []
    for line in text.splitlines():
        number, score, translation = line.split("\t")
        rows.append((int(number), float(score) if score else None, translation))
    return rows


def test_n_best_gives_n_numbered_scored_lines_per_input_best_first(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """NUMBER<TAB>SCORE<TAB>TRANSLATION, N lines per input in input order, into --output as to stdout; the first of
    each is what translate --beam gives; a blank line gives one line with neither score nor translation."""
    texts = [SOURCES[3], SOURCES[0], " ", SOURCES[5]]
    path = write_lines(tmp_path / "in.de", texts)
    result = cli("translate", corpus_run.path, "--input", path, "--beam", "3", "--n-best", "2")
    assert result.status == 0, result.err
    rows = read_n_best(result.out)
    assert [number for number, _, _ in rows] == [1, 1, 2, 2, 3, 4, 4]
    assert rows[4] == (3, None, "")
    best = cli("translate", corpus_run.path, "--input", path, "--beam", "3").out_lines
    assert [translation for number, _, translation in rows if number in (1, 2, 4)][::2] == [best[0], best[1], best[3]]
    expected = Translator(corpus_run.path).scored_hypotheses(texts, beam(3, n_best=2))
    assert [(score, text) for _, score, text in rows] == [
        (None if score is None else round(score, 4), text) for found in expected for score, text in found
    ]
    for first, second in zip(rows[0::2][:2], rows[1::2][:2], strict=True):
        assert first[1] >= second[1]  # best first
    assert all(score is None or score < 0 for _, score, _ in rows)
    written = cli("translate", corpus_run.path, "--input", path, "--beam", "3", "--n-best", "2", "--output",
                  tmp_path / "out.tsv")  # fmt: skip
    assert (written.status, written.out) == (0, "")
    assert (tmp_path / "out.tsv").read_text(encoding="utf-8") == result.out


def test_n_best_needs_a_beam_at_least_as_wide(corpus_run: CorpusRun, cli: Callable[..., Cli]) -> None:
    assert_refused(cli("translate", corpus_run.path, SAMPLES[0], "--n-best", "3"), "--n-best 3", "--beam 3")
    assert_refused(cli("translate", corpus_run.path, SAMPLES[0], "--n-best", "3", "--beam", "2"), "--beam 2")
    assert_refused(cli("translate", corpus_run.path, SAMPLES[0], "--n-best", "0"), "--n-best")
    sampled = cli("translate", corpus_run.path, SAMPLES[0], "--n-best", "2", "--beam", "2", "--sampling-topk", "0")
    assert_refused(sampled, "--sampling-topk 0", "--beam")
    one = cli("translate", corpus_run.path, SAMPLES[0], "--n-best", "1")  # greedy, scored
    assert one.status == 0, one.err
    ((number, score, translation),) = read_n_best(one.out)
    assert (number, translation) == (1, corpus_run.translations[0])
    assert score is not None
    assert score < 0


def test_score_is_the_teacher_forced_log_probability_of_each_translation(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """Against the model's full forward pass on one pair at a time, log_softmax gathered by hand: pairs of several
    lengths, out of length order, a translation that is not the model's, an empty one (its EOS alone), one read from
    standard input; LOGPROB<TAB>TOKENS<TAB>MEAN, EOS counted."""
    sources = [SOURCES[4], SOURCES[1] + " " + SOURCES[2], SOURCES[0], SOURCES[7]]
    translator = Translator(corpus_run.path)
    hypotheses = [*translator.translate(sources[:2]), "the bear sings here.", ""]
    src, hyp = write_lines(tmp_path / "src.de", sources), write_lines(tmp_path / "hyp.en", hypotheses)
    result = cli("score", corpus_run.path, src, hyp)
    assert result.status == 0, result.err
    rows = [line.split("\t") for line in result.out_lines]
    assert len(rows) == len(sources)
    model = translator.model
    for (total, tokens, mean), source, hypothesis in zip(rows, sources, hypotheses, strict=True):
        ids = translator.target.encode(hypothesis)[0]
        src_ids = torch.tensor([translator.source.encode(source)[0]])
        with torch.no_grad():
            logits = model(src_ids, torch.tensor([[BOS, *ids]]))[0]  # (Lt, V)
        log_probs = torch.log_softmax(logits.double(), dim=-1)
        expected = sum(float(log_probs[i, token]) for i, token in enumerate([*ids, EOS]))
        assert int(tokens) == len(ids) + 1
        assert float(total) == pytest.approx(expected, abs=2e-4)
        assert float(mean) == pytest.approx(expected / (len(ids) + 1), abs=2e-4)
    assert re.fullmatch(r"scored 4 sentence pairs in " + SPEED.format(unit="sentence pair"), result.err_lines[-1])
    # HYP from standard input, into --output.
    piped = tmp_path / "piped.tsv"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(hyp.read_bytes()), encoding="utf-8"))
        assert cli("score", corpus_run.path, src, "-", "--output", piped).status == 0
    assert piped.read_text(encoding="utf-8").splitlines() == result.out_lines


def test_the_score_of_a_translation_is_the_log_probability_its_search_found(
    dates_run: Path, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """Independent of the forward pass: a beam search without length penalty ranks each hypothesis by the sum of the
    log-probabilities of the tokens it chose, one cached decoding step at a time; score finds the same sum."""
    texts = ["21 November 2026", "the 4th of July 1976", "Tue Mar 9 2021", "March 3, 1999", "1 jan 2000"]
    path = write_lines(tmp_path / "dates.txt", texts)
    listed = cli("translate", dates_run, "--input", path, "--beam", "3", "--n-best", "3", "--length-penalty", "0")
    assert listed.status == 0, listed.err
    rows = [row for row in read_n_best(listed.out) if "<unk>" not in row[2]]  # <unk> does not read back as itself
    assert len(rows) >= 8
    write_lines(tmp_path / "src.txt", [texts[number - 1] for number, _, _ in rows])
    write_lines(tmp_path / "hyp.txt", [translation for _, _, translation in rows])
    scored = cli("score", dates_run, tmp_path / "src.txt", tmp_path / "hyp.txt")
    assert scored.status == 0, scored.err
    totals = [float(line.split("\t")[0]) for line in scored.out_lines]
    np.testing.assert_allclose(totals, [score for _, score, _ in rows], atol=2e-4)


def test_score_refuses_what_it_cannot_score_in_one_line(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, hyp = write_lines(tmp_path / "src.de", SOURCES[:3]), write_lines(tmp_path / "hyp.en", ["a", "b"])
    with monkeypatch.context() as patch:
        patch.setattr(translate_module.Translator, "__init__", lambda *args: pytest.fail("the model was loaded"))
        result = cli("score", corpus_run.path, src, hyp)
        assert_refused(result, f"SRC '{src}' has 3 lines", f"HYP '{hyp}' has 2", "line-aligned")
        assert result.out == ""
        assert_refused(cli("score", corpus_run.path, "-", "-"), "both be -")
        assert_refused(cli("score", corpus_run.path, src, src, "--output", src), "--output")
    # A blank source is scored nan, a side longer than the model reads is cut: each said once, the lines kept.
    sources, hypotheses = [SOURCES[0], " ", SOURCES[1]], ["the dog.", "the cat.", "the dog " * 300]
    result = cli(
        "score", corpus_run.path, write_lines(tmp_path / "s", sources), write_lines(tmp_path / "h", hypotheses)
    )
    assert result.status == 0, result.err
    rows = [line.split("\t") for line in result.out_lines]
    assert [math.isnan(float(total)) for total, _, _ in rows] == [False, True, False]
    assert int(rows[2][1]) == 256  # the model's positions
    assert any("line 3 is longer than this model reads" in line for line in result.err_lines), result.err
    assert any("line 2 is blank" in line for line in result.err_lines), result.err
