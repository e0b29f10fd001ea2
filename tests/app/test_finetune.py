"""``train --init RUN``: a new run that starts from another run's weights, vocabulary and model (fine-tuning)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from app.support import VALID, Cli, CorpusRun, assert_refused, run_ranks, write_corpus
from multihead.app.options import FINE_TUNING
from multihead.app.runs import TOKENIZER, WEIGHTS, open_checkpoint, read_log
from multihead.app.training import TrainOptions, train
from multihead.io import read_weights

# The corpus run's model sizes and vocabulary come with --init: the flags without them.
FLAGS = ["--batch-tokens", "200", "--dropout", "0", "--no-progress"]
# What the corpus run never learned: its validation pairs (which it translates perfectly) with the words of each
# translation in reverse order, in its vocabulary.
TUNE = [(source, " ".join(reversed(target.rstrip(".").split())) + ".") for source, target in VALID]


def vocabulary_files(checkpoint: Path) -> dict[str, bytes]:
    names = [TOKENIZER, *(path.name for path in checkpoint.glob("subwords*.json"))]
    return {name: (checkpoint / name).read_bytes() for name in names}


@pytest.fixture(scope="module")
def fine_tuned(corpus_run: CorpusRun, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The corpus run fine-tuned for 24 steps on ``TUNE`` (and validated on it): the new run and the corpus
    directory."""
    from multihead.app.cli import main

    root = tmp_path_factory.mktemp("fine-tuned")
    data = write_corpus(root / "corpus", TUNE, "tune")
    flags = [*FLAGS, "--steps", "24", "--eval-every", "12", "--checkpoint-every", "12", "--lr", "3e-3", "--warmup", "4"]
    command = ["train", "--init", str(corpus_run.path), "--data", *data, "--valid", *data, "--out", str(root / "run")]
    assert main([*command, *flags]) == 0
    return root / "run", root / "corpus"


def test_init_starts_from_the_run_and_learns(corpus_run: CorpusRun, fine_tuned: tuple[Path, Path]) -> None:
    run, _ = fine_tuned
    start, _ = open_checkpoint(corpus_run.path, None, lambda found: None)  # what translate takes: best, else latest
    step0, _ = open_checkpoint(run, "step-0", lambda found: None)
    mine, theirs = read_weights(step0.path / WEIGHTS), read_weights(start.path / WEIGHTS)
    assert mine.keys() == theirs.keys()
    assert all(np.array_equal(mine[name], theirs[name]) for name in mine), "step 0 holds the starting weights"
    assert vocabulary_files(step0.path) == vocabulary_files(start.path)  # the same files, byte for byte
    latest, _ = open_checkpoint(run, "latest", lambda found: None)
    assert latest.config == start.config  # the whole model (dropout 0 in both)
    assert latest.options["init"] == str(corpus_run.path)
    assert (latest.options["d_model"], latest.options["layers"]) == (start.options["d_model"], start.options["layers"])
    evaluations = [entry for entry in read_log(run) if entry["event"] == "evaluation"]
    assert evaluations[0]["step"] == 0, "the curve starts at the starting model's score"
    assert evaluations[-1]["valid_loss"] < evaluations[0]["valid_loss"] - 0.1, evaluations


def test_init_takes_the_fine_tuning_defaults(corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    data = write_corpus(tmp_path / "corpus", TUNE, "tune")
    result = cli("train", "--init", corpus_run.path, "--data", *data, "--out", tmp_path / "run", "--steps", "1",
                 *FLAGS)  # fmt: skip
    assert result.status == 0, result.err
    assert f"starting from {corpus_run.path}" in result.out
    options = json.loads(next((tmp_path / "run" / "checkpoints").glob("step-*/trainer.json")).read_text())["options"]
    assert (options["lr"], options["warmup"]) == (FINE_TUNING["lr"], FINE_TUNING["warmup"])


def test_a_fine_tuned_run_resumes(fine_tuned: tuple[Path, Path], tmp_path: Path, cli: Callable[..., Cli]) -> None:
    import shutil

    run, corpus = fine_tuned
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    data = [str(corpus / "tune.de"), str(corpus / "tune.en")]
    result = cli("train", "--resume", "--out", copy, "--data", *data, "--valid", *data, "--steps", "30",
                 "--no-progress")  # fmt: skip
    assert result.status == 0, result.err
    assert "resuming" in result.out
    latest, _ = open_checkpoint(copy, "latest", lambda found: None)
    assert latest.step == 30
    assert latest.options["init"] is not None


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (["--d-model", "32"], ["--d-model 32 conflicts with --init", "model has --d-model 16", "drop --d-model 32"]),
        (["--heads", "4"], ["--heads 4 conflicts with --init", "--heads 2"]),
        (["--layers", "3"], ["--layers 3 conflicts with --init", "--layers 1"]),
        (["--tokenizer", "char"], ["--tokenizer char conflicts with --init", "--tokenizer subword"]),
        (["--vocab-size", "50"], ["--vocab-size 50 conflicts with --init", "--vocab-size 120"]),
        (["--vocab-from", "runs/x"], ["brings its vocabulary: drop --vocab-from runs/x"]),
    ],
    ids=["d-model", "heads", "layers", "tokenizer", "vocab-size", "vocab-from"],
)
def test_init_refuses_what_conflicts_with_the_run(
    flags: list[str], fragments: list[str], corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    data = write_corpus(tmp_path / "corpus", TUNE, "tune")
    out = tmp_path / "run"
    result = cli("train", "--init", corpus_run.path, "--data", *data, "--out", out, "--steps", "1", *FLAGS, *flags)
    assert_refused(result, *fragments)
    assert not out.exists()


def test_init_of_no_run_is_one_line(tmp_path: Path, cli: Callable[..., Cli]) -> None:
    data = write_corpus(tmp_path / "corpus", TUNE, "tune")
    result = cli("train", "--init", tmp_path / "nothing", "--data", *data, "--out", tmp_path / "run", "--steps", "1")
    assert_refused(result, "--init:", "does not exist")
    assert not (tmp_path / "run").exists()


def test_init_refuses_a_model_too_short_for_the_task(task_run: Path, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    """The reverse task's model reads 64 positions; the numbers task needs 126. (A corpus leaves the pairs longer
    than the model reads out of training instead: see test_import.py's fine-tuning of a 64-position model.)"""
    result = cli("train", "--init", task_run, "--task", "numbers", "--out", tmp_path / "run", "--steps", "1")
    assert_refused(result, "--init: its model reads at most 64 tokens, and task 'numbers' needs 126")
    assert not (tmp_path / "run").exists()


def _rank(rank: int, world: int, port: int, options: dict[str, Any]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(TrainOptions(**options))
    torch.distributed.barrier()  # both ranks done before either tears the group down (gloo aborts a rank left behind)
    torch.distributed.destroy_process_group()


def test_two_processes_fine_tune_from_one_run(corpus_run: CorpusRun, tmp_path: Path) -> None:
    """Under data parallelism every rank starts from the run's weights: the run's step 0 holds them, and the two
    ranks take the batches one process takes with twice the accumulation."""
    data = write_corpus(tmp_path / "corpus", TUNE, "tune")
    base = dict(out=str(tmp_path / "ddp"), init=str(corpus_run.path), data=data, steps=3, eval_every=1000,
                eval_examples=4, batch_tokens=200, dropout=0.0, progress=False)  # fmt: skip
    run_ranks(_rank, 2, base)
    train(TrainOptions(**{**base, "out": str(tmp_path / "single"), "accumulate": 2}))
    start, _ = open_checkpoint(corpus_run.path, None, lambda found: None)
    first = read_weights(tmp_path / "ddp" / "checkpoints" / "step-0000000" / WEIGHTS)
    theirs = read_weights(start.path / WEIGHTS)
    assert all(np.array_equal(first[name], theirs[name]) for name in theirs)
    ddp, alone = (open_checkpoint(tmp_path / run, "latest", lambda found: None)[0] for run in ("ddp", "single"))
    assert (ddp.step, ddp.trainer["process"]["world_size"]) == (3, 2)
    assert ddp.trainer["tokens"] == alone.trainer["tokens"]
