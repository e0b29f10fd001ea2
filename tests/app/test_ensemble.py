"""Ensembles: ``translate``/``evaluate RUN1 RUN2 ...`` average the runs' step log-probabilities.

The reference is written here, without a cache or the searches: each model's whole forward pass over the prefix,
the mean of their log-softmaxes, renormalised over the tokens the run's generation allows.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from app.served import request, start
from app.support import CORPUS_FLAGS, SAMPLES, VALID, Cli, CorpusRun, assert_refused, beam, write_corpus, write_lines
from multihead.app.cli import main
from multihead.app.translate import Translator
from multihead.engine import n_best_search

TEXTS = [*SAMPLES, "die Katze schläft hier.", "der Bär isst gern langsam."]


@pytest.fixture(scope="module")
def other_run(corpus_run: CorpusRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second run of the corpus run's vocabulary (``--vocab-from``), trained briefly from another seed."""
    root = tmp_path_factory.mktemp("ensemble")
    data = write_corpus(root / "corpus")
    out = root / "other"
    flags = [*CORPUS_FLAGS, "--steps", "60", "--seed", "7", "--eval-every", "1000"]
    assert main(["train", "--data", *data, "--vocab-from", str(corpus_run.path), "--out", str(out), *flags]) == 0
    return out


def mean_log_probs(
    models: list[torch.nn.Module], src: torch.Tensor, prefix: list[int], banned: list[int]
) -> np.ndarray:
    """The ensemble's log-probabilities of each next token after every prefix of ``prefix``, ``(len(prefix), V)``:
    the models' log-softmaxes averaged, the banned tokens impossible, renormalised."""
    tgt = torch.tensor([prefix])
    with torch.no_grad():
        mean = torch.stack([torch.log_softmax(model(src, tgt)[0].double(), dim=-1) for model in models]).mean(dim=0)
    mean[:, banned] = -torch.inf
    return (mean - torch.logsumexp(mean, dim=-1, keepdim=True)).numpy()


def reference_greedy(translator: Translator, models: list[torch.nn.Module], text: str) -> list[int]:
    """The ensemble's greedy tokens of ``text``, the whole prefix recomputed at every step (EOS included)."""
    ids, _ = translator.source.encode(text)
    specials, banned = translator.specials, list(translator.generation.banned)
    tokens: list[int] = []
    for _ in range(translator.limit(len(ids))):
        token = int(mean_log_probs(models, torch.tensor([ids]), [specials.bos, *tokens], banned)[-1].argmax())
        tokens.append(token)
        if token == specials.eos:
            break
    return tokens


def test_an_ensemble_takes_the_most_probable_token_of_its_models_mean_log_probabilities(
    corpus_run: CorpusRun, other_run: Path
) -> None:
    ensemble = Translator(corpus_run.path, ensemble=[other_run])
    models = [ensemble.model, ensemble.loaded.others[0].model]
    expected = [ensemble.target.decode(reference_greedy(ensemble, models, text)) for text in TEXTS]
    assert ensemble.translate(TEXTS) == expected
    alone = [Translator(run).translate(TEXTS) for run in (corpus_run.path, other_run)]
    assert alone[0] != alone[1]  # the runs differ,
    assert expected != alone[1]  # and the ensemble is not the second alone


def test_an_ensembles_beam_scores_are_its_models_mean_log_probabilities_renormalised(
    corpus_run: CorpusRun, other_run: Path
) -> None:
    ensemble = Translator(corpus_run.path, ensemble=[other_run])
    models, banned = [ensemble.model, ensemble.loaded.others[0].model], list(ensemble.generation.banned)
    spec = ensemble.spec(replace(beam(4, n_best=3), length_penalty=0.0))  # ranked by log-probability alone
    sources = [ensemble.source.encode(text)[0] for text in TEXTS]
    checked = 0
    for ids in sources:
        src, limits = np.array([ids]), np.array([ensemble.limit(len(ids))])
        with torch.inference_mode():
            (found,) = n_best_search(ensemble.session(src, limits), 1, spec, max_len=limits)
        assert len(found) == 3
        for score, tokens in found:
            prefix = [ensemble.specials.bos, *tokens.tolist()]
            log_probs = mean_log_probs(models, torch.tensor([ids]), prefix[:-1], banned)  # (len(tokens), V)
            expected = float(log_probs[np.arange(len(tokens)), tokens].sum())
            assert score == pytest.approx(expected, abs=1e-4)
            checked += 1
        assert [score for score, _ in found] == sorted((score for score, _ in found), reverse=True)
    assert checked == 3 * len(TEXTS)


def test_a_run_ensembled_with_itself_translates_as_it_does_alone(corpus_run: CorpusRun) -> None:
    alone, twice = Translator(corpus_run.path), Translator(corpus_run.path, ensemble=[corpus_run.path])
    for search in (beam(1), beam(4)):
        assert twice.translate(TEXTS, search=search) == alone.translate(TEXTS, search=search)
    found, expected = (translator.scored_hypotheses(TEXTS, beam(4, n_best=2)) for translator in (twice, alone))
    assert [[text for _, text in best] for best in found] == [[text for _, text in best] for best in expected]
    scores = [[score for score, _ in best] for best in found]
    assert np.array(scores) == pytest.approx(np.array([[score for score, _ in best] for best in expected]), abs=1e-4)


def test_translate_and_evaluate_take_several_runs(
    corpus_run: CorpusRun, other_run: Path, cli: Callable[..., Cli], tmp_path: Path
) -> None:
    expected = Translator(corpus_run.path, ensemble=[other_run]).translate(TEXTS, search=beam(3))
    done = cli("translate", corpus_run.path, other_run, *TEXTS, "--beam", "3")
    assert done.status == 0
    assert done.out.splitlines() == expected
    source = write_lines(tmp_path / "in.de", TEXTS)
    done = cli("translate", "--beam", "3", corpus_run.path, other_run, "--input", source)
    assert done.status == 0
    assert done.out.splitlines() == expected
    src, ref = write_corpus(tmp_path, VALID, "valid")
    done = cli("evaluate", corpus_run.path, other_run, src, ref, "--output", tmp_path / "hyp.en")
    assert done.status == 0, done.err
    summary = json.loads(done.out.splitlines()[-1])
    assert [Path(run["run"]) for run in summary["runs"]] == [corpus_run.path, other_run]
    assert "an ensemble of 2 runs" in done.out
    ensemble = Translator(corpus_run.path, ensemble=[other_run])
    assert (tmp_path / "hyp.en").read_text().splitlines() == ensemble.translate([pair[0] for pair in VALID])


def test_runs_of_other_vocabularies_are_refused_before_any_work(
    corpus_run: CorpusRun, task_run: Path, other_run: Path, cli: Callable[..., Cli], tmp_path: Path
) -> None:
    out = tmp_path / "out.en"
    for args in (
        ("translate", corpus_run.path, task_run, "der Hund läuft.", "--output", out),
        ("evaluate", task_run, corpus_run.path, write_lines(tmp_path / "s", ["a"]), write_lines(tmp_path / "r", ["a"])),
    ):
        done = cli(*args)
        assert (done.status, done.out, out.exists()) == (2, "", False)
        assert len(done.err.strip().splitlines()) == 1
        assert "their vocabularies differ" in done.err
        assert str(corpus_run.path) in done.err
        assert str(task_run) in done.err
    done = cli("translate", corpus_run.path, other_run, "der Hund läuft.", "--plot", tmp_path / "a.png")
    assert done.status == 2
    assert "--plot draws one model's attention" in done.err
    assert not (tmp_path / "a.png").exists()


def test_serve_serves_an_ensemble_whose_requests_step_together(
    corpus_run: CorpusRun, other_run: Path, cli: Callable[..., Cli]
) -> None:
    """``serve RUN OTHER --ensemble``: one service of both models, each text translated as ``translate`` translates it
    with the ensemble (greedy), alternatives as its n-best lists, greedy and beam requests sharing one stream."""
    ensemble = Translator(corpus_run.path, ensemble=[other_run])
    expected = ensemble.translate(TEXTS)
    best = ensemble.hypotheses(TEXTS[:1], beam(2, n_best=2))[0]
    process, url, line = start(corpus_run.path, str(other_run), "--ensemble")
    try:
        assert "an ensemble of 2 runs" in line
        status, answer = request(url, "/translate", {"q": TEXTS, "source": "de", "target": "en"})
        assert (status, answer["translatedText"]) == (200, expected)
        status, answer = request(url, "/translate", {"q": TEXTS[0], "source": "de", "target": "en", "alternatives": 1})
        assert status == 200
        assert [answer["translatedText"], *answer["alternatives"]] == best
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert_refused(cli("serve", corpus_run.path, "--ensemble", "--port", "0"), "--ensemble", "received 1 run")
