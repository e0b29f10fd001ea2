"""Fixtures of the application's tests: one thread, the command line run in this process, a trained corpus run.
(The helpers they use are in ``support.py``.)"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import multihead.app.training as training
from app.support import CORPUS_FLAGS, SAMPLES, SMALL, TINY, VALID, Cli, CorpusRun, no_evaluation, write_corpus
from multihead.app import devices
from multihead.app.cli import main
from multihead.app.training import TrainOptions, train


@pytest.fixture(scope="package", autouse=True)
def _one_thread() -> Iterator[None]:
    """One thread: the models here are tiny, and on a shared 2-core machine a second thread mostly waits. The command
    line, run in this process, keeps it unless a test gives ``--threads`` (its default is tested on its own)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(devices, "default_threads", lambda: None)
        yield
    torch.set_num_threads(threads)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Cli]:
    """``cli(*args)``: run ``multihead ARGS`` in this process; its exit status and what it printed."""

    def run(*args: object) -> Cli:
        capsys.readouterr()  # what came before is not this command's
        try:
            status = main([str(arg) for arg in args])
        except SystemExit as exit_:  # argparse's usage errors and --help
            status = exit_.code
        captured = capsys.readouterr()
        return Cli(status, captured.out, captured.err)

    return run


@pytest.fixture(scope="session")
def corpus_run(tmp_path_factory: pytest.TempPathFactory) -> CorpusRun:
    """A subword run trained by ``multihead train --data SRC TGT --valid SRC TGT`` for 120 steps, evaluated and
    checkpointed every 30, keeping 2 and averaging 2; then moved elsewhere, with its corpus deleted."""
    from multihead.app.translate import Translator

    root = tmp_path_factory.mktemp("corpus-run")
    data, valid = write_corpus(root / "corpus"), write_corpus(root / "corpus", VALID, "valid")
    flags = [*CORPUS_FLAGS, "--steps", "120", "--eval-every", "30", "--checkpoint-every", "30", "--keep", "2",
             "--average", "2"]  # fmt: skip
    threads = torch.get_num_threads()  # session fixtures start before the package's one-thread fixture
    torch.set_num_threads(1)
    try:
        assert main(["train", "--data", *data, "--valid", *valid, "--out", str(root / "run"), *flags]) == 0
        translations = Translator(root / "run").translate(SAMPLES)
    finally:
        torch.set_num_threads(threads)
    moved = root / "elsewhere" / "run"
    shutil.copytree(root / "run", moved)
    shutil.rmtree(root / "run")
    shutil.rmtree(root / "corpus")
    return CorpusRun(moved, flags, translations)


@pytest.fixture
def fast_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    """No held-out evaluation: only what a run writes, and how it trains, matter to the tests that use this."""
    monkeypatch.setattr(training.Training, "evaluate", no_evaluation)


@pytest.fixture(scope="module")
def task_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A four-step run of the reverse task with two checkpoints, step-0000002 and step-0000004: one per test module,
    which may damage it."""
    out = tmp_path_factory.mktemp("task") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training.Training, "evaluate", no_evaluation)
        train(TrainOptions(out=str(out), task="reverse", steps=4, checkpoint_every=2, batch_size=4, **SMALL))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000002", "step-0000004"]
    return out


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-step run of the reverse task with one checkpoint (the held-out evaluation is skipped: only the files
    matter here)."""
    out = tmp_path_factory.mktemp("runs") / "reverse"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training.Training, "evaluate", no_evaluation)
        train(TrainOptions(out=str(out), task="reverse", steps=2, checkpoint_every=2, batch_size=4, warmup=5, **SMALL))
    return out


@pytest.fixture(scope="module")
def dates_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small dates model trained for a few seconds (it learns some of the task, not all)."""
    out = tmp_path_factory.mktemp("runs") / "dates"
    train(TrainOptions(out=str(out), task="dates", steps=120, checkpoint_every=60, **{**TINY, "d_model": 32}))
    return out


@pytest.fixture(scope="module")
def marian_de_en(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny Marian checkpoint of separate vocabularies (``test_import.make_checkpoint``, SentencePiece) imported as a
    German → English run: an ``app.test_import.Marian``, with its Transformers model and tokenizer."""
    import warnings

    pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    from transformers import MarianMTModel, MarianTokenizer

    from app.test_import import Marian, make_checkpoint
    from multihead.app.pretrained import import_pretrained

    root = tmp_path_factory.mktemp("marian")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Recommended: pip install sacremoses", UserWarning)
        directory = make_checkpoint(root / "separate", shared=False)
        import_pretrained(str(directory), root / "run")
        model = MarianMTModel.from_pretrained(directory).eval()
        return Marian(
            directory, model, MarianTokenizer.from_pretrained(directory), root / "run", model.config.pad_token_id
        )
